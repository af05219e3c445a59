"""A weight decay that differs between the runs, said on the gradients it moves.

From a helper's ResNet port: TF1's ``λ * tf.nn.l2_loss(w)`` (adds λΣw²/2, gradient λw) ported as
Keras ``kernel_regularizer=l2(λ)`` (adds λΣw², gradient 2λw). Every gradient of a regularized
kernel moved by exactly λw and no note said so. Written as users write it: a ``None`` batch, a
Keras port trained with ``fit``; the expectation is checked with numpy on the recorded values.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, BATCH, LR, DECAY = 3, 8, 0.1, 1e-2
RNG = np.random.default_rng(21)
X = RNG.standard_normal((STEPS * BATCH, 4)).astype(np.float32)
Y = RNG.standard_normal((STEPS * BATCH, 2)).astype(np.float32)
W1 = (RNG.standard_normal((4, 5)) * 0.5).astype(np.float32)
W2 = (RNG.standard_normal((5, 2)) * 0.5).astype(np.float32)


def _tf1(run_dir: str) -> None:
    """TF1: the hidden kernel decayed with ``DECAY * tf.nn.l2_loss``, the usual 2018 way."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x, y = tf.compat.v1.placeholder(tf.float32, [None, 4]), tf.compat.v1.placeholder(tf.float32, [None, 2])
        h = rec.activation(
            "dense", tf.compat.v1.layers.dense(x, 5, tf.tanh, kernel_initializer=tf.constant_initializer(W1))
        )
        out = rec.activation("dense_1", tf.compat.v1.layers.dense(h, 2, kernel_initializer=tf.constant_initializer(W2)))
        kernel = [v for v in tf.compat.v1.trainable_variables() if v.name == "dense/kernel:0"][0]
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out) + DECAY * tf.nn.l2_loss(kernel))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
        grads_and_vars = opt.compute_gradients(loss)
        train_op = rec.apply_gradients(opt, grads_and_vars, global_step=gs)
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, BATCH)


def _keras(run_dir: str, decay: float) -> None:
    """The port: ``kernel_regularizer=l2(decay)`` on the hidden layer, trained with ``fit``."""
    tf.keras.backend.clear_session()
    model = tf.keras.Sequential(
        [
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(
                5,
                "tanh",
                kernel_initializer=tf.constant_initializer(W1),
                kernel_regularizer=tf.keras.regularizers.l2(decay),
            ),
            tf.keras.layers.Dense(2, kernel_initializer=tf.constant_initializer(W2)),
        ]
    )
    model.compile(tf.keras.optimizers.SGD(LR), loss="mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=model.layers)
    model.fit(X, Y, batch_size=BATCH, shuffle=False, verbose=0)
    rec.close()


@pytest.mark.parametrize("decay", [DECAY, DECAY / 2])
def test_a_weight_decay_of_another_size_is_named_on_the_gradient(tmp_path, decay: float) -> None:
    """``l2(λ)`` for ``λ * l2_loss``: the gradient differs by λw (numpy, on the recorded values), and
    its note says so; ``l2(λ/2)`` is the faithful port and agrees."""
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"), decay)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    if decay != DECAY:
        assert report.agree, report.first_divergence
        return
    base, cand = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    grads = [np.asarray(run[0][("grad", "dense/kernel:0")][2], np.float64) for run in (base, cand)]
    np.testing.assert_allclose(grads[1] - grads[0], DECAY * W1, rtol=1e-4, atol=1e-7)
    (grad,) = [x for x in report.divergences_at_first_step if x.kind == "grad" and x.tensor == "dense/kernel:0"]
    assert grad.step == 0 and grad.note is not None, grad
    assert f"the difference is {DECAY:.4g} times the weight dense/kernel:0 at every element" in grad.note, grad.note
    assert "regularizers.l2" in grad.note
    assert "scale_regularization_loss" not in grad.note  # one device each: no replica to divide by


def test_a_weight_of_one_value_is_not_told_weight_decay() -> None:
    """The second review: a bias of 0.1 everywhere, its gradient offset by one constant (targets
    shifted; no decay anywhere) was told "-1 times the weight ... a weight decay": a constant
    explains a difference against a constant weight as well as any factor does."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    bias = [np.full(6, 0.1, np.float32)]
    g = np.linspace(-0.3, 0.3, 6).astype(np.float32)
    base = run("tf1", [series("weight", "head/bias:0", bias), series("grad", "head/bias:0", [g], order=1)])
    cand = run("tf2", [series("weight", "head/bias:0", bias), series("grad", "head/bias:0", [g - 0.1], order=1)])
    found = Comparison(base, cand).report().first_divergence
    assert found is not None and found.kind == "grad", found
    assert "weight decay" not in (found.note or ""), found.note


def test_under_a_strategy_the_note_names_the_unscaled_regularization_loss() -> None:
    """A helper's MirroredStrategy port added the model's regularization loss in each of its 2
    replicas without ``tf.nn.scale_regularization_loss``: the all-reduce summed it twice, so each
    regularized gradient was off by exactly the decay's gradient (numpy), and the note named Keras
    ``l2`` against ``tf.nn.l2_loss`` only."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    w = [W1]
    g = (RNG.standard_normal(W1.shape) * 0.1).astype(np.float32)
    twice = (g.astype(np.float64) + DECAY * W1).astype(np.float32)  # one more copy of the decay's gradient
    base = run("tf1", [series("weight", "dense/kernel:0", w), series("grad", "dense/kernel:0", [g], order=1)])
    halves = [series("grad", f"dense/kernel:0@replica{k}", [twice / 2], order=1) for k in range(2)]
    cand = run(
        "tf2", [series("weight", "dense/kernel:0", w), series("grad", "dense/kernel:0", [twice], order=1), *halves]
    )
    found = Comparison(base, cand).report().first_divergence
    assert found is not None and found.kind == "grad", found
    assert f"the difference is {DECAY:.4g} times the weight" in (found.note or ""), found.note
    assert "the strategy's 2 replicas" in found.note and "scale_regularization_loss" in found.note, found.note
