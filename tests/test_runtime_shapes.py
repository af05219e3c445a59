"""Shapes are what ran: TF1 code fed through ``placeholder(tf.float32, [None, n])`` against its TF2 ports.

The TF1 model is written the way users write it (a ``None`` batch dimension, ``tf.compat.v1.layers``,
a Session loop over batches whose last one is partial); its ports run eagerly and under
``tf.function`` with an ``input_signature`` of ``None`` dimensions. Every expectation is first
checked against a numpy reference of one training step, then the tool's verdict against that.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import pytest
import tensorflow as tf

from tb_parity_plugin import api, summary_v1, summary_v2
from tb_parity_plugin.logdir.reader import LogdirReader

N_IN, N_HIDDEN, N_OUT, LR = 8, 16, 4, 0.1
BATCHES = (16, 16, 16, 12)  # 60 examples in batches of 16: the last one is partial


def data() -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((b, N_IN)).astype(np.float32) for b in BATCHES]
    ys = [np.eye(N_OUT, dtype=np.float32)[rng.integers(0, N_OUT, b)] for b in BATCHES]
    init = [
        rng.standard_normal((N_IN, N_HIDDEN)).astype(np.float32) * 0.3,
        np.zeros(N_HIDDEN, np.float32),
        rng.standard_normal((N_HIDDEN, N_OUT)).astype(np.float32) * 0.3,
        np.zeros(N_OUT, np.float32),
    ]
    return xs, ys, init


def numpy_step0() -> dict[str, np.ndarray]:
    """Hidden activation and the output kernel's gradient of step 0, in float64."""
    xs, ys, (w1, b1, w2, b2) = data()
    x, y = xs[0].astype(np.float64), ys[0].astype(np.float64)
    h = np.maximum(x @ w1 + b1, 0)
    logits = h @ w2 + b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return {"hidden": h, "grad_w2": h.T @ ((p - y) / len(x))}


def tf1_run(run_dir: str, batches: Optional[tuple[int, ...]] = None) -> None:
    xs, ys, (w1, b1, w2, b2) = data()
    if batches is not None:  # another batching of the same examples
        x_all, y_all = np.concatenate(xs), np.concatenate(ys)
        cuts = np.cumsum(batches)[:-1]
        xs, ys = np.split(x_all, cuts), np.split(y_all, cuts)
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, N_IN])
        y = tf.compat.v1.placeholder(tf.float32, [None, N_OUT])
        h = rec.activation(
            "hidden",
            tf.compat.v1.layers.dense(
                x, N_HIDDEN, tf.nn.relu, kernel_initializer=tf.constant_initializer(w1), name="dense"
            ),
        )
        logits = rec.activation(
            "logits",
            tf.compat.v1.layers.dense(h, N_OUT, kernel_initializer=tf.constant_initializer(w2), name="dense_1"),
        )
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        train = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for xb, yb in zip(xs, ys):
                _, parity = sess.run([train, rec.fetches], {x: xb, y: yb})
                rec.write(parity)
        rec.close()


def tf2_run(run_dir: str, mode: str) -> None:
    xs, ys, (w1, b1, w2, b2) = data()
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(N_HIDDEN, "relu", kernel_initializer=tf.constant_initializer(w1), name="dense"),
            tf.keras.layers.Dense(N_OUT, kernel_initializer=tf.constant_initializer(w2), name="dense_1"),
        ]
    )
    model.build((None, N_IN))
    optimizer = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)

    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(optimizer.iterations):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                h = rec.activation("hidden", model.layers[0](x))
                logits = rec.activation("logits", model.layers[1](h))
                loss = rec.loss(tf.reduce_mean(tf.keras.losses.categorical_crossentropy(y, logits, from_logits=True)))
            rec.minimize(optimizer, loss, model.trainable_variables, tape)

    if mode == "function":
        signature = [tf.TensorSpec([None, N_IN], tf.float32), tf.TensorSpec([None, N_OUT], tf.float32)]
        step = tf.function(step, input_signature=signature)
    for xb, yb in zip(xs, ys):
        step(tf.constant(xb), tf.constant(yb))
    rec.close()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("shapes")
    for pair in ("eager", "function", "rebatched"):
        tf1_run(str(root / pair / "tf1"))
    tf2_run(str(root / "eager" / "tf2"), "eager")
    tf2_run(str(root / "function" / "tf2"), "function")
    tf1_run(str(root / "rebatched" / "tf2"), batches=(16, 16, 14, 14))  # a port that batches otherwise
    return str(root)


def series(logdir: str, run: str, kind: str, name: str) -> Any:
    with LogdirReader(logdir) as reader:
        return reader.run(run).tensors[(kind, name)]


def test_the_runs_hold_what_numpy_computes(logdir: str) -> None:
    ref = numpy_step0()
    for pair in ("eager", "function"):
        for run in ("tf1", "tf2"):
            hidden = series(os.path.join(logdir, pair), run, "activation", "hidden")
            assert hidden.values is not None, (pair, run)  # full values, though the batch is None
            np.testing.assert_allclose(
                hidden.values[0][: ref["hidden"].size].reshape(ref["hidden"].shape), ref["hidden"], rtol=1e-5, atol=1e-6
            )
            grad = series(os.path.join(logdir, pair), run, "grad", "dense_1/kernel:0")
            np.testing.assert_allclose(grad.values[0].reshape(N_HIDDEN, N_OUT), ref["grad_w2"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("pair", ["eager", "function"])
def test_a_none_batch_port_agrees_element_wise_including_the_partial_last_batch(logdir: str, pair: str) -> None:
    report = api.compare(os.path.join(logdir, pair))
    assert report.agree, report.first_divergence
    assert report.steps_compared == len(BATCHES)
    assert report.verdict == "agree"  # every tensor element-wise, activations included


def test_runtime_shapes_are_recorded_per_step(logdir: str) -> None:
    hidden = series(os.path.join(logdir, "eager"), "tf1", "activation", "hidden")
    assert hidden.shape == (None, N_HIDDEN)  # the static shape, as information
    assert [tuple(s) for s in hidden.runtime_shapes] == [(b, N_HIDDEN) for b in BATCHES]


def test_a_port_batching_otherwise_diverges_on_shape_naming_both_shapes(logdir: str) -> None:
    report = api.compare(os.path.join(logdir, "rebatched"), "tf1", "tf2")  # both sides are TF1 code
    first = report.first_divergence
    assert first is not None and first.step == 2 and first.reason == "shape", first
    assert first.kind == "activation" and first.tensor == "hidden"
    assert "[16, 16]" in (first.note or "") and "[14, 16]" in (first.note or "")
    # elements of a [16, 16] and a [14, 16] batch do not correspond: no figure is given
    assert (first.max_abs_diff, first.max_rel_diff, first.cosine, first.mismatch_fraction) == (None,) * 4


def test_a_layout_change_mid_run_and_a_missing_layout_are_named(tmp_path: Any) -> None:
    """Written with the pure-numpy writer: a tensor whose dtype changes at step 2, and a step
    whose layout record is lost (its stats name a layout hash nothing defines)."""
    from tb_parity_plugin.records import metadata
    from tb_parity_plugin.records.writer import BlockWriter, build_layout

    for side in ("tf1", "tf2"):
        w = BlockWriter(str(tmp_path / side), side=side)
        for step in range(4):
            dtype = np.float64 if side == "tf2" and step >= 2 else np.float32
            w.write_arrays(step, [("weight", "w:0", np.ones(3, dtype))])
        if side == "tf2":  # stats of a layout whose record was never written
            orphan = build_layout([("weight", "other:0", "float32", (3,))])
            w._layouts_written.add(orphan.hash)  # as if written, but it is not on disk
            w.write_step(4, orphan, np.zeros((1, metadata.N_STATS)))
        w.close()
    report = api.compare(str(tmp_path))
    assert any("tf2: weight/w:0 changed layout mid-run" in x and "float64" in x for x in report.warnings)
    first = report.first_divergence  # the dtype differs from step 2 on, not before
    assert first is not None and (first.step, first.reason) == (2, "dtype"), first
    (problem,) = [p for p in report.problems if "no layout record" in p["message"]]
    assert problem["run"] == "tf2" and "first 4" in problem["message"]
