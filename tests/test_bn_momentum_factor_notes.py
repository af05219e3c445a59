"""A TF1 CNN whose ``batch_normalization`` takes slim MobileNet's momentum 0.997, against a Keras
port that keeps ``keras.applications``' 0.999, from a helper's MobileNetV2 trial.

From the same batch, one update moves a moving statistic by ``(1 - momentum)(x - s)``: the port's
moving mean moved 1/3 as far as TF1's at every element at step 1. The note named "Keras and
tf.compat.v1.layers default 0.99", which neither run had; it now gives the factor and the momenta it
fits. Expectations are checked with numpy on the logged values.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf1_session
from keras_recipes import fit_recorded
from shim_readback import logged_value, tensors_by_step

from tb_parity_plugin import compare, summary_v1

STEPS, BATCH, FILTERS, CLASSES, LR = 3, 16, 8, 4, 0.05
RNG = np.random.default_rng(5)
X = RNG.standard_normal((STEPS * BATCH, 8, 8, 3)).astype(np.float32)
Y = RNG.integers(0, CLASSES, STEPS * BATCH)
KERNEL = (RNG.standard_normal((3, 3, 3, FILTERS)) * 0.3).astype(np.float32)
HEAD = (RNG.standard_normal((FILTERS, CLASSES)) * 0.3).astype(np.float32)


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        images = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3])
        labels = tf.compat.v1.placeholder(tf.int64, [None])
        net = tf.compat.v1.layers.conv2d(
            images, FILTERS, 3, padding="same", use_bias=False, kernel_initializer=tf.constant_initializer(KERNEL)
        )
        net = tf.nn.relu6(tf.compat.v1.layers.batch_normalization(net, momentum=0.997, training=True))
        logits = tf.compat.v1.layers.dense(
            tf.reduce_mean(net, [1, 2]), CLASSES, kernel_initializer=tf.constant_initializer(HEAD)
        )
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.MomentumOptimizer(LR, 0.9)
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train_op, (images, labels), (X, Y), STEPS, BATCH)


def _keras(run_dir: str) -> None:
    model = tf.keras.Sequential(
        [
            tf.keras.Input((8, 8, 3)),
            tf.keras.layers.Conv2D(FILTERS, 3, padding="same", use_bias=False),
            tf.keras.layers.BatchNormalization(epsilon=1e-3, momentum=0.999),  # keras.applications' momentum
            tf.keras.layers.ReLU(6.0),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(CLASSES),
        ]
    )
    model.layers[0].kernel.assign(KERNEL)
    model.layers[-1].kernel.assign(HEAD)
    fit_recorded(
        run_dir,
        model,
        None,
        X,
        Y,
        BATCH,
        tf.keras.optimizers.SGD(LR, momentum=0.9),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def test_another_batch_norm_momentum_is_told_by_the_factor_its_statistics_moved(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"))
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    batch_mean = np.mean(np.asarray(tf.nn.conv2d(X[:BATCH], KERNEL, 1, "SAME")), axis=(0, 1, 2))
    for logged, momentum in ((tf1, 0.997), (tf2, 0.999)):  # numpy: (1 - momentum) x the batch mean
        np.testing.assert_allclose(
            logged_value(logged, 1, "state", "moving_mean"), (1 - momentum) * batch_mean, rtol=1e-4, atol=1e-8
        )

    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind) == (1, "state") and "moving_mean" in first.tensor, first
    note = first.note or ""
    assert "moved it 0.3333 times as far as 'tf1' at every element" in note, note
    assert "0.997 against 0.999" in note, note
