"""A straight-through estimator for rounding: TF1's ``h + tf.stop_gradient(tf.round(h * 4) / 4 - h)``
against a Keras ``fit`` port whose layer rounds under ``tf.custom_gradient`` (the identity gradient).
The faithful port agrees (numpy replay below). A port that rounds with plain ``tf.round`` has no
gradient for the layers before it (``tape.gradient`` returns None, Keras's ``fit`` warns and leaves
them), so it records none: a trial's such port was told only that the baseline records those
gradients, with no word that the port's are None. A port whose custom gradient returns zeros was told
of rows "exactly 0" and embedding lookups for a dense kernel whose whole gradient is 0."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from keras_recipes import fit_recorded
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1

STEPS, BATCH, D, H, OUT, LR, LEVELS = 3, 8, 4, 8, 2, 0.1, 4.0
RNG = np.random.default_rng(62)
X = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
Y = RNG.standard_normal((STEPS * BATCH, OUT)).astype(np.float32)
W1 = (RNG.standard_normal((D, H)) * 0.5).astype(np.float32)
W2 = (RNG.standard_normal((H, OUT)) * 0.5).astype(np.float32)


def _numpy_first_kernel_gradient() -> np.ndarray:
    """float64: the first layer's kernel gradient at step 0 under the straight-through estimator."""
    x, y = X[:BATCH].astype(np.float64), Y[:BATCH].astype(np.float64)
    h = np.tanh(x @ W1)
    out = np.round(h * LEVELS) / LEVELS @ W2
    dh = 2 * (out - y) / y.size @ W2.T  # the estimator passes the gradient through the rounding
    return x.T @ (dh * (1 - h**2))


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.float32, [None, OUT])
        dense, init = tf.compat.v1.layers.dense, tf.constant_initializer
        h = rec.activation("dense", dense(x, H, tf.nn.tanh, kernel_initializer=init(W1), name="dense"))
        rounded = h + tf.stop_gradient(tf.round(h * LEVELS) / LEVELS - h)
        out = rec.activation("out", dense(rounded, OUT, kernel_initializer=init(W2), name="out"))
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        rec.lr(tf.constant(LR))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        train(rec, train_op, [x, y], [X, Y], STEPS, BATCH)


class _Round(tf.keras.layers.Layer):
    """``gradient``: "identity" (the estimator), "none" (plain tf.round) or "zero" (a custom gradient of 0)."""

    def __init__(self, gradient: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.gradient = gradient

    def call(self, h: tf.Tensor) -> tf.Tensor:
        if self.gradient == "none":
            return tf.round(h * LEVELS) / LEVELS
        zero = self.gradient == "zero"

        @tf.custom_gradient
        def rounded(t: tf.Tensor) -> tuple:
            return tf.round(t * LEVELS) / LEVELS, lambda dy: tf.zeros_like(dy) if zero else dy

        return rounded(h)


def _fit(run_dir: str, gradient: str = "identity") -> None:
    dense, out = tf.keras.layers.Dense(H, "tanh", name="dense"), tf.keras.layers.Dense(OUT, name="out")
    model = tf.keras.Sequential([tf.keras.Input((D,)), dense, _Round(gradient, name="round"), out])
    dense.kernel.assign(W1)
    out.kernel.assign(W2)
    fit_recorded(run_dir, model, ["dense", "out"], X, Y, BATCH, tf.keras.optimizers.SGD(LR))


def test_a_straight_through_port_agrees(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"))
    got = tensors_by_step(str(tmp_path / "tf2"))[0][("grad", "dense/kernel:0")][2]
    np.testing.assert_allclose(np.asarray(got).reshape(D, H), _numpy_first_kernel_gradient(), atol=1e-6)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    assert report.steps_compared == STEPS


def test_a_port_whose_rounding_has_no_gradient_is_told_its_gradient_is_none(tmp_path) -> None:
    assert np.abs(_numpy_first_kernel_gradient()).max() > 0.1  # numpy: the estimator's gradient is far from none
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), gradient="none")
    assert ("grad", "dense/kernel:0") not in tensors_by_step(str(tmp_path / "tf2"))[0]
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    entries = {e["tag"]: e for e in report.to_dict()["structure"]["only_in"]["tf1"]}
    assert set(entries) == {"grad/dense/kernel:0", "grad/dense/bias:0"}, entries
    for entry in entries.values():
        hint = " ".join(entry.get("hints", []))
        assert "its gradient there is None" in hint and "tf.round" in hint, entry
    first = report.first_divergence
    assert first is not None and first.tensor == "dense/kernel:0" and "its gradient there is None" in first.note, first


def test_a_port_whose_custom_gradient_returns_zeros_is_told_the_whole_gradient_is_0(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), gradient="zero")
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "grad", "dense/kernel:0"), first
    assert "the whole gradient is exactly 0 in 'tf2' alone" in first.note, first.note
    assert "positions that look them up" not in first.note, first.note  # no embedding row: every row is 0
