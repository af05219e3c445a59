"""Keras defaults that change a CNN's shapes: ``Conv2D``'s ``padding="valid"`` where TF1 wrote
``padding="SAME"``, and ``MaxPool2D``'s strides, which default to the pool size where TF1's
``max_pool`` had ``strides=2``. The dense kernel after the flatten is then of another input width, and
as a weight (an input of the step) it is the first divergence in execution order: a layer ported
faithfully. A new user's port was told "shape [24, 16] vs [6, 16]" with no word of the conv or the
pool whose output shrank. Written the way users write it (a ``None`` batch, ``tf.nn.max_pool2d``,
``fit`` with ``instrument``); the expected shapes come from the convolution's arithmetic, not from
the tool."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

SIDE, FILTERS, CLASSES, BATCH, STEPS, LR, POOL = 8, 2, 3, 8, 2, 0.1, 3
RNG = np.random.default_rng(45)
X = RNG.standard_normal((BATCH * STEPS, SIDE, SIDE, 1)).astype(np.float32)
Y = np.eye(CLASSES, dtype=np.float32)[RNG.integers(0, CLASSES, BATCH * STEPS)]
CONV = RNG.standard_normal((3, 3, 1, FILTERS)).astype(np.float32) * 0.3
DENSE = RNG.standard_normal(((SIDE // 2) ** 2 * FILTERS, CLASSES)).astype(np.float32) * 0.1


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, SIDE, SIDE, 1])
        y = tf.compat.v1.placeholder(tf.float32, [None, CLASSES])
        h = rec.activation(
            "conv",
            tf.compat.v1.layers.conv2d(
                x, FILTERS, 3, padding="same", name="conv", kernel_initializer=tf.constant_initializer(CONV)
            ),
        )
        h = rec.activation("pool", tf.nn.max_pool2d(h, ksize=POOL, strides=2, padding="SAME"))
        flat = tf.reshape(h, [-1, (SIDE // 2) ** 2 * FILTERS])
        logits = tf.compat.v1.layers.dense(
            flat, CLASSES, name="logits", kernel_initializer=tf.constant_initializer(DENSE)
        )
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        train(rec, train_op, [x, y], [X, Y], STEPS, BATCH)


def _fit(run_dir: str, conv_padding: str, pool_strides) -> None:
    tf.keras.backend.clear_session()
    model = tf.keras.Sequential(
        [
            tf.keras.Input((SIDE, SIDE, 1)),
            tf.keras.layers.Conv2D(FILTERS, 3, padding=conv_padding, name="conv"),
            tf.keras.layers.MaxPool2D(POOL, strides=pool_strides, padding="same", name="pool"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(CLASSES, name="logits"),
        ]
    )
    # TF1's initial weights copied in; the resized dense kernel takes the rows that fit
    model.get_layer("conv").kernel.assign(CONV)
    dense = model.get_layer("logits").kernel
    dense.assign(DENSE[: dense.shape[0]])
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.CategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["conv", "pool"])
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def _first(tmp_path, conv_padding: str, pool_strides):
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), conv_padding, pool_strides)
    return compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence


def test_a_pool_left_at_keras_default_strides_is_named_from_the_dense_kernel(tmp_path) -> None:
    first = _first(tmp_path, "same", None)
    side = math.ceil(SIDE / POOL)  # strides = the pool size, 'same': ceil(8 / 3) = 3, where TF1 had ceil(8 / 2) = 4
    width = (SIDE // 2) ** 2 * FILTERS, side * side * FILTERS
    assert (first.step, first.kind, first.tensor, first.reason) == (0, "weight", "logits/kernel:0", "shape"), first
    assert f"shape [{width[0]}, {CLASSES}] in baseline vs [{width[1]}, {CLASSES}]" in first.note, first.note
    assert f"only its input axis differs ({width[0]} against {width[1]})" in first.note, first.note
    pool = f"activation/pool ([{BATCH}, {SIDE // 2}, {SIDE // 2}, {FILTERS}] in baseline vs [{BATCH}, {side}, {side}, {FILTERS}]"
    assert pool in first.note, first.note


def test_a_conv_left_at_keras_default_padding_is_named_from_the_dense_kernel(tmp_path) -> None:
    first = _first(tmp_path, "valid", 2)
    side = SIDE - 3 + 1  # 'valid' loses kernel - 1; the pool of strides 2, 'same', then ceil(6 / 2) = 3
    assert (first.step, first.tensor, first.reason) == (0, "logits/kernel:0", "shape"), first
    conv = f"activation/conv ([{BATCH}, {SIDE}, {SIDE}, {FILTERS}] in baseline vs [{BATCH}, {side}, {side}, {FILTERS}]"
    assert conv in first.note, first.note
    assert f"({(SIDE // 2) ** 2 * FILTERS} against {math.ceil(side / 2) ** 2 * FILTERS})" in first.note, first.note
