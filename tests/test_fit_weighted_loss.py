"""A Keras ``fit`` port with ``class_weight=`` against a TF1 loop weighting its loss by hand.

Faithful (the same weights) it agrees; a port that forgets ``class_weight`` diverges at step 0 on
the loss, and the loss's note names per-example weights among its causes (a new user's was told
of reductions, label smoothing and regularization only). The losses are checked against numpy.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(9)
X = RNG.standard_normal((16, 3)).astype(np.float32)
LABELS = RNG.integers(0, 3, 16)
Y = np.eye(3, dtype=np.float32)[LABELS]
W = (RNG.standard_normal((3, 3)) * 0.5).astype(np.float32)
CLASS_WEIGHT = {0: 1.0, 1: 3.0, 2: 0.5}
BATCH, STEPS = 8, 4


def train_tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 3])
        logits = rec.activation(
            "dense", tf.compat.v1.layers.dense(x, 3, kernel_initializer=tf.constant_initializer(W), name="dense")
        )
        table = tf.constant([CLASS_WEIGHT[k] for k in range(3)])
        weights = tf.gather(table, tf.argmax(y, axis=1))
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits, weights=weights))
        rec.lr(tf.constant(0.1))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        rec.variables()
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(STEPS):
                i = step % 2
                feed = {x: X[i * BATCH : (i + 1) * BATCH], y: Y[i * BATCH : (i + 1) * BATCH]}
                rec.write(sess.run([train_op, fetches], feed)[1])
        rec.close()


def train_fit(run_dir: str, class_weight: dict[int, float] | None) -> None:
    model = tf.keras.Sequential(
        [tf.keras.Input((3,)), tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(W), name="dense")]
    )
    model.compile(
        optimizer=tf.keras.optimizers.SGD(0.1), loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    )
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["dense"])
    model.fit(X, Y, batch_size=BATCH, epochs=STEPS // 2, shuffle=False, verbose=0, class_weight=class_weight)
    rec.close()


def numpy_step0_loss(weighted: bool) -> float:
    z = X[:BATCH].astype(np.float64) @ W.astype(np.float64)
    logp = z - z.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    per = -(Y[:BATCH] * logp).sum(1)
    w = np.array([CLASS_WEIGHT[int(k)] for k in LABELS[:BATCH]]) if weighted else np.ones(BATCH)
    return float((w * per).sum() / BATCH)  # every weight non-zero: TF1's nonzero count is the batch


def test_a_port_without_class_weight_diverges_on_the_loss_at_step_0_naming_the_weights(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_fit(str(tmp_path / "tf2"), CLASS_WEIGHT)
    train_fit(str(tmp_path / "forgot"), None)
    for run, weighted in (("tf1", True), ("tf2", True), ("forgot", False)):
        got = tensors_by_step(str(tmp_path / run))[0][("loss", "loss")][2]
        np.testing.assert_allclose(got, numpy_step0_loss(weighted), rtol=1e-5)
    assert compare(str(tmp_path), baseline="tf1", candidate="tf2").agree
    d = compare(str(tmp_path), baseline="tf1", candidate="forgot").first_divergence
    assert d is not None and (d.step, d.kind) == (0, "loss"), d
    assert "class_weight= or sample_weight=" in (d.note or ""), d.note
