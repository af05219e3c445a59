"""A layer whose kernel has another input size in the port: a shape difference upstream, not another
parametrisation.

A new user's Keras 3 port of a TF1 CNN used ``padding="same"`` where TF1's ``conv2d`` defaults to
``valid``: the conv outputs are 8x8 against 6x6, so the dense kernel after the flatten is
``[128, 3]`` against ``[72, 3]``. The dense biases share their shape, so the layers were paired by
it and then unpaired as "another parametrisation (LSTMCell against Keras LSTM)", with the advice
``--allow-unmatched '*dense*'``, which silences the very layer the shapes part before. Here the
port's dense layer is named ``logits`` (Keras 3 prefixed it with the model's name), so it pairs by
shape, not by name. Written the way users write it: a ``None`` batch dimension, TF1's ``conv2d`` default padding, the port trained
with ``fit`` and recorded by ``instrument``; the expected sizes come from the convolution's
arithmetic, not from the tool.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

SIDE, KERNEL, FILTERS, CLASSES, BATCH, STEPS, LR = 8, 3, 2, 3, 8, 3, 0.1
RNG = np.random.default_rng(5)
X = RNG.standard_normal((BATCH * STEPS, SIDE, SIDE, 1)).astype(np.float32)
Y = np.eye(CLASSES, dtype=np.float32)[RNG.integers(0, CLASSES, BATCH * STEPS)]
CONV = RNG.standard_normal((KERNEL, KERNEL, 1, FILTERS)).astype(np.float32) * 0.3


def _flat(padding: str) -> int:
    """Elements the flatten hands the dense layer: stride 1, ``valid`` loses ``KERNEL - 1`` a side."""
    side = SIDE if padding == "same" else SIDE - KERNEL + 1
    return side * side * FILTERS


DENSE = RNG.standard_normal((_flat("valid"), CLASSES)).astype(np.float32) * 0.1


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, SIDE, SIDE, 1])
        y = tf.compat.v1.placeholder(tf.float32, [None, CLASSES])
        h = tf.compat.v1.layers.conv2d(x, FILTERS, KERNEL, kernel_initializer=tf.constant_initializer(CONV))
        h = tf.compat.v1.layers.flatten(tf.nn.relu(h))
        logits = tf.compat.v1.layers.dense(h, CLASSES, kernel_initializer=tf.constant_initializer(DENSE))
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        train(rec, train_op, [x, y], [X, Y], STEPS, BATCH)


def _fit(run_dir: str, padding: str) -> None:
    tf.keras.backend.clear_session()
    model = tf.keras.Sequential(
        [
            tf.keras.Input((SIDE, SIDE, 1)),
            tf.keras.layers.Conv2D(FILTERS, KERNEL, padding=padding, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(CLASSES, name="logits"),  # its own name: paired by shape, not by name
        ]
    )
    model.layers[0].kernel.assign(CONV)
    if padding == "valid":
        model.layers[2].kernel.assign(DENSE)
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.CategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def test_a_dense_kernel_resized_by_the_padding_is_not_called_another_parametrisation(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "same"), "same")
    report = compare(str(tmp_path), baseline="tf1", candidate="same", allow_unmatched=["lr/*"])
    assert not report.agree
    resized = [w for w in report.warnings if "the same variable of another size" in w]
    assert len(resized) == 1, report.warnings
    sizes = f"kernel is [{_flat('valid')}, {CLASSES}] in one run and [{_flat('same')}, {CLASSES}] in the other"
    assert sizes in resized[0], resized[0]
    assert not any("--allow-unmatched '*dense*'" in w for w in report.warnings), report.warnings


def test_the_faithful_port_agrees_without_the_warning(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "valid"), "valid")
    report = compare(str(tmp_path), baseline="tf1", candidate="valid", allow_unmatched=["lr/*"])
    assert report.agree, report.first_divergence
    assert not any("another size" in w or "parametrisation" in w for w in report.warnings), report.warnings
