"""Gradients recorded after ``tf.clip_by_global_norm`` by TF1 and before clipping by a ``fit`` port:
every gradient of a step that clips is the baseline's times one factor, the global norm over the
clip norm, and each note should say so.

A helper's TF1 original (``tf.compat.v1.layers`` with an L2 ``kernel_regularizer``,
``get_regularization_loss()``, Adam, ``rec.apply_gradients`` of the clipped gradients) against its
faithful Keras port (``Adam(global_clipnorm=...)`` under ``fit``): a batch of inputs 6x larger made
step 5 the first to clip. Three gradients got the factor note; the kernel's, the first in execution
order and so the one the verdict named, carried the two runs' own float32 differences (6.7e-6, 28
ulps of its largest element, within its tolerance) and was told of a loss term left out or a
stop_gradient. Expectations come from numpy on the recorded values.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, BATCH, LR, WD, CLIP, OUTLIER = 7, 8, 0.01, 1e-2, 2.5, 5
RNG = np.random.default_rng(7)
X = RNG.standard_normal((12 * BATCH, 6)).astype(np.float32)[: STEPS * BATCH]
X[OUTLIER * BATCH : (OUTLIER + 1) * BATCH] *= 6.0  # the one batch whose gradients clip
Y = RNG.integers(0, 3, 12 * BATCH).astype(np.int64)[: STEPS * BATCH]
W1 = (RNG.standard_normal((6, 16)) * 0.4).astype(np.float32)
W2 = (RNG.standard_normal((16, 3)) * 0.4).astype(np.float32)
NAMES = ("dense/kernel:0", "dense/bias:0", "dense_1/kernel:0", "dense_1/bias:0")


def _tf1(run_dir: str) -> None:
    """TF1: L2 through the layers' regularizer, Adam, the clipped gradients recorded by ``apply_gradients``."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x, y = tf.compat.v1.placeholder(tf.float32, [None, 6]), tf.compat.v1.placeholder(tf.int64, [None])
        reg = tf.keras.regularizers.l2(WD)
        h = tf.compat.v1.layers.dense(
            x, 16, tf.nn.relu, kernel_initializer=tf.constant_initializer(W1), kernel_regularizer=reg, name="dense"
        )
        logits = tf.compat.v1.layers.dense(
            h, 3, kernel_initializer=tf.constant_initializer(W2), kernel_regularizer=reg, name="dense_1"
        )
        rec.activation("dense", h), rec.activation("dense_1", logits)
        loss = rec.loss(
            tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits) + tf.compat.v1.losses.get_regularization_loss()
        )
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.AdamOptimizer(LR)
        grads, tvars = zip(*opt.compute_gradients(loss))
        clipped, _ = tf.clip_by_global_norm(grads, CLIP)
        train_op = rec.apply_gradients(opt, zip(clipped, tvars), global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, BATCH)


def _keras(run_dir: str) -> None:
    """The faithful port: the same regularizer, ``Adam(global_clipnorm=CLIP)`` (TF1's epsilon), ``fit``."""
    tf.keras.backend.clear_session()
    l2 = tf.keras.regularizers.l2(WD)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((6,)),
            tf.keras.layers.Dense(16, "relu", kernel_initializer=tf.constant_initializer(W1), kernel_regularizer=l2),
            tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(W2), kernel_regularizer=l2),
        ]
    )
    model.compile(
        tf.keras.optimizers.Adam(LR, epsilon=1e-8, global_clipnorm=CLIP),
        tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=model.layers)
    model.fit(X, Y, batch_size=BATCH, shuffle=False, verbose=0)
    rec.close()


def test_every_gradient_of_a_clipped_step_recorded_after_clipping_by_one_run_names_the_factor(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"))
    base, cand = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))

    def grads(run: dict, step: int) -> list:
        return [np.asarray(run[step][("grad", name)][2], np.float64) for name in NAMES]

    # numpy: the port's gradients (before clipping) pass the clip norm first at the outlier step
    norms = [np.sqrt(sum(float(np.sum(g**2)) for g in grads(cand, s))) for s in range(STEPS)]
    assert all(n < CLIP for n in norms[:OUTLIER]) and norms[OUTLIER] > CLIP, norms
    factor = norms[OUTLIER] / CLIP
    # TF1's recorded (clipped) gradients times that factor are the port's, within the gradients' atol
    for b, c in zip(grads(base, OUTLIER), grads(cand, OUTLIER)):
        np.testing.assert_allclose(c, b * factor, rtol=0, atol=1e-5)
    # the runs train alike: every weight agrees at every step
    for s in range(STEPS):
        for name in NAMES:
            np.testing.assert_allclose(cand[s][("weight", name)][2], base[s][("weight", name)][2], rtol=0, atol=1e-5)

    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and first.kind == "grad" and first.step == OUTLIER, first
    at_step = report.divergences_at_first_step
    assert {d.tensor for d in at_step} == set(NAMES), at_step
    for found in at_step:
        assert f"every element is the baseline's times {factor:.4g}" in (found.note or ""), found
        assert "recorded after clipping by one run and before it by the other" in found.note, found.note
        assert "stop_gradient" not in found.note, found.note
