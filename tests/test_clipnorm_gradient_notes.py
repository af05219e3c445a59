"""Gradients recorded after a per-variable ``tf.clip_by_norm`` by TF1 and before clipping by a faithful
``fit`` port with ``clipnorm=``: each clipped gradient is the baseline's times its own factor, its norm
over the clip norm, and every clipped one of the recording run has the clip norm for its norm. Two
factors at one step were told of per-head loss weights (a multi-output loss weighted otherwise), which a
one-output model has none of, with no word of clipping. Expectations come from numpy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, BATCH, LR, CLIP = 2, 8, 0.01, 0.05
RNG = np.random.default_rng(11)
X = RNG.standard_normal((STEPS * BATCH, 6)).astype(np.float32)
Y = RNG.integers(0, 3, STEPS * BATCH).astype(np.int64)
W1 = (RNG.standard_normal((6, 16)) * 0.4).astype(np.float32)
W2 = (RNG.standard_normal((16, 3)) * 0.4).astype(np.float32)
NAMES = ("dense/kernel:0", "dense/bias:0", "dense_1/kernel:0", "dense_1/bias:0")


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x, y = tf.compat.v1.placeholder(tf.float32, [None, 6]), tf.compat.v1.placeholder(tf.int64, [None])
        h = tf.compat.v1.layers.dense(x, 16, tf.nn.relu, kernel_initializer=tf.constant_initializer(W1), name="dense")
        logits = tf.compat.v1.layers.dense(h, 3, kernel_initializer=tf.constant_initializer(W2), name="dense_1")
        rec.activation("dense", h), rec.activation("dense_1", logits)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
        grads, tvars = zip(*opt.compute_gradients(loss))
        clipped = [tf.clip_by_norm(g, CLIP) for g in grads]  # each variable by its own norm
        train_op = rec.apply_gradients(opt, zip(clipped, tvars), global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, BATCH)


def _keras(run_dir: str) -> None:
    tf.keras.backend.clear_session()
    model = tf.keras.Sequential(
        [
            tf.keras.Input((6,)),
            tf.keras.layers.Dense(16, "relu", kernel_initializer=tf.constant_initializer(W1)),
            tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(W2)),
        ]
    )
    model.compile(
        tf.keras.optimizers.SGD(LR, clipnorm=CLIP), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=model.layers)
    model.fit(X, Y, batch_size=BATCH, shuffle=False, verbose=0)
    rec.close()


def test_gradients_clipped_each_by_its_norm_are_not_told_of_per_head_loss_weights(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"))
    base, cand = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    b = [np.asarray(base[0][("grad", n)][2], np.float64) for n in NAMES]
    c = [np.asarray(cand[0][("grad", n)][2], np.float64) for n in NAMES]
    norms = [float(np.linalg.norm(g)) for g in c]
    assert all(n > CLIP for n in norms), norms  # every variable clips at step 0, each by its own factor
    for bg, cg, n in zip(b, c, norms):
        np.testing.assert_allclose(cg, bg * (n / CLIP), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(np.linalg.norm(bg), CLIP, rtol=1e-5)
    assert len({round(n / CLIP, 3) for n in norms}) > 1, norms
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind) == (0, "grad"), first
    assert "loss_weights" not in (first.note or ""), first.note
    assert "clipnorm" in first.note and "its own norm" in first.note, first.note
