"""A segmentation port that leaves out TF1's class weights: its loss diverges at step 0 while its
logits agree element-wise, and the note says the loss is computed differently even when a larger
output before the logits is kept as statistics only.

A new user's TF1 U-Net weighed its per-pixel ``sparse_softmax_cross_entropy`` by class (``weights=``
gathered from the labels); the Keras port compiled the plain loss. Every recorded weight and the
logits agreed at step 0, the loss did not, and the note was left out because the encoder's output
(over the default ``full_values_limit``) was compared by its statistics only, which cannot prove it
agrees. The logits recorded just before the loss agree element-wise, so whatever differs upstream
does not reach the loss through them. Written the way users write it (a ``None`` batch,
``tf.compat.v1.layers``, ``fit`` recorded by ``instrument``); both losses are checked against numpy
from the recorded logits.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import logged_value, tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

SIDE, CH, FILTERS, CLASSES, BATCH, STEPS, LR = 8, 2, 16, 3, 8, 2, 0.1  # the encoder: 8 x 8 x 8 x 16 = 8192
CLASS_W = np.array([0.2, 1.0, 3.0], np.float32)
RNG = np.random.default_rng(11)
X = RNG.standard_normal((BATCH * STEPS, SIDE, SIDE, CH)).astype(np.float32)
Y = RNG.integers(0, CLASSES, (BATCH * STEPS, SIDE, SIDE)).astype(np.int32)
ENC = (RNG.standard_normal((3, 3, CH, FILTERS)) * 0.3).astype(np.float32)
HEAD = (RNG.standard_normal((1, 1, FILTERS, CLASSES)) * 0.3).astype(np.float32)


def _tf1(run_dir: str) -> None:
    layers = tf.compat.v1.layers
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, SIDE, SIDE, CH])
        y = tf.compat.v1.placeholder(tf.int32, [None, SIDE, SIDE])
        enc = layers.conv2d(
            x,
            FILTERS,
            3,
            padding="same",
            activation=tf.nn.relu,
            name="enc",
            kernel_initializer=tf.constant_initializer(ENC),
        )
        enc = rec.activation("enc", enc)
        logits = rec.activation(
            "logits", layers.conv2d(enc, CLASSES, 1, name="logits", kernel_initializer=tf.constant_initializer(HEAD))
        )
        weights = tf.gather(tf.constant(CLASS_W), y)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits, weights=weights))
        train_op = rec.minimize(
            tf.compat.v1.train.GradientDescentOptimizer(rec.lr(tf.constant(LR))), loss, global_step=gs
        )
        train(rec, train_op, [x, y], [X, Y], STEPS, BATCH)


def _fit(run_dir: str) -> None:
    tf.keras.backend.clear_session()
    inp = tf.keras.Input((SIDE, SIDE, CH))
    enc = tf.keras.layers.Conv2D(FILTERS, 3, padding="same", activation="relu", name="enc")(inp)
    model = tf.keras.Model(inp, tf.keras.layers.Conv2D(CLASSES, 1, name="logits")(enc))
    model.get_layer("enc").kernel.assign(ENC)
    model.get_layer("logits").kernel.assign(HEAD)
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["enc", "logits"])
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # the class weights left out
    rec.close()


def _cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]


def test_a_loss_left_without_class_weights_is_told_past_an_output_kept_as_statistics(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"))
    labels = Y[:BATCH]
    for run, weights in (("tf1", CLASS_W[labels]), ("tf2", np.ones_like(labels, np.float32))):
        logged = tensors_by_step(str(tmp_path / run))
        logits = logged_value(logged, 0, "activation", "logits").reshape(BATCH, SIDE, SIDE, CLASSES)
        # numpy: TF1's weights= divides the weighted sum by the pixels (no weight is 0), Keras the plain mean
        expected = (_cross_entropy(logits, labels) * weights).sum() / labels.size
        np.testing.assert_allclose(logged_value(logged, 0, "loss", "loss"), expected, rtol=1e-5)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "loss", "loss"), first
    assert "activation/enc" in report.unproven_before_first, report.unproven_before_first
    assert "activation/logits, the output recorded just before it, agrees element-wise" in first.note, first.note
    assert "fit's class_weight= or sample_weight= against TF1's weights=" in first.note, first.note
    assert "compared by statistics only before it: activation/enc" in first.note, first.note
