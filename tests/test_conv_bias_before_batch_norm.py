"""A 2018-style TF1 CNN (``placeholder([None, 8, 8, 3])``, ``conv2d`` with its default bias,
``batch_normalization`` updated through ``UPDATE_OPS``, ``MomentumOptimizer``) against its Keras
port trained with ``fit`` and Keras defaults, from a new user's trial.

The conv's bias sits right before batch normalization, so its gradient is float32 rounding noise
(0 in exact math) summed over 16 x 8 x 8 positions: about 1e-8, apart by about as much between the
two frameworks. Momentum's slot at step 1 is that gradient, so the two slots differed by the
gradient's difference, which the gradient's own tolerance had passed; the slot rule's bound on it
(1e-8 + 1e-4 |g|) did not: a DIVERGE of ratio 1.005 on every seed of the faithful port. A slot's
allowance now counts a gradient's differences in full up to 1024 ulps of its layer's largest
gradient element (``tolerance.SLOT_NOISE_OF_MAX``; 4 ulps when this test was written). Expectations are checked with numpy on the logged values.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf1_session
from keras_recipes import fit_recorded
from shim_readback import logged_value, tensors_by_step

from tb_parity_plugin import compare, summary_v1
from tb_parity_plugin.engine import tolerance

STEPS, BATCH, FILTERS, CLASSES, LR = 4, 16, 8, 4, 0.1
RNG = np.random.default_rng(42)
X = RNG.standard_normal((STEPS * BATCH, 8, 8, 3)).astype(np.float32)
Y = RNG.integers(0, CLASSES, STEPS * BATCH)
KERNEL = (RNG.standard_normal((3, 3, 3, FILTERS)) * 0.2).astype(np.float32)
BIAS = (RNG.standard_normal(FILTERS) * 0.1).astype(np.float32)
HEAD = (RNG.standard_normal((8 * 8 * FILTERS, CLASSES)) * 0.05).astype(np.float32)


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        images = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3])
        labels = tf.compat.v1.placeholder(tf.int64, [None])
        net = tf.compat.v1.layers.conv2d(
            images,
            FILTERS,
            3,
            padding="same",
            kernel_initializer=tf.constant_initializer(KERNEL),
            bias_initializer=tf.constant_initializer(BIAS),
            name="conv2d",
        )
        net = tf.nn.relu(tf.compat.v1.layers.batch_normalization(net, training=True, name="batch_normalization"))
        logits = tf.compat.v1.layers.dense(
            tf.compat.v1.layers.flatten(net), CLASSES, kernel_initializer=tf.constant_initializer(HEAD), name="dense"
        )
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.MomentumOptimizer(LR, 0.9)
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train_op, (images, labels), (X, Y), STEPS, BATCH)


def _keras(run_dir: str, momentum: float = 0.9) -> None:
    model = tf.keras.Sequential(
        [
            tf.keras.Input((8, 8, 3)),
            tf.keras.layers.Conv2D(FILTERS, 3, padding="same", name="conv2d"),
            tf.keras.layers.BatchNormalization(name="batch_normalization"),
            tf.keras.layers.ReLU(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(CLASSES, name="dense"),
        ]
    )
    model.get_layer("conv2d").set_weights([KERNEL, BIAS])
    model.get_layer("dense").kernel.assign(HEAD)
    fit_recorded(
        run_dir,
        model,
        None,
        X,
        Y,
        BATCH,
        tf.keras.optimizers.SGD(LR, momentum=momentum),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def test_a_faithful_port_with_a_conv_bias_before_batch_norm_agrees(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"))
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    for s in range(STEPS):  # numpy: every weight and gradient within the migration guide's tolerance
        for kind in ("weight", "grad"):
            for needle in ("conv2d/kernel", "conv2d/bias", "dense/kernel"):
                np.testing.assert_allclose(
                    logged_value(tf2, s, kind, needle), logged_value(tf1, s, kind, needle), rtol=1e-6, atol=1e-5
                )
    g_b, g_c = logged_value(tf1, 0, "grad", "conv2d/bias"), logged_value(tf2, 0, "grad", "conv2d/bias")
    scale = max(np.abs(logged_value(tf1, 0, "grad", n)).max() for n in ("conv2d/kernel", "conv2d/bias"))  # its layer's
    assert np.abs(g_b).max() < 1e-6 * scale  # the bias gradient is rounding noise
    # numpy: the step-1 slot is that gradient on each side, apart by the gradient's difference...
    m_b, m_c = logged_value(tf1, 1, "slot", "conv2d/bias"), logged_value(tf2, 1, "slot", "conv2d/bias")
    np.testing.assert_allclose(m_b, g_b, rtol=1e-6)
    np.testing.assert_allclose(m_c - m_b, g_c - g_b, atol=1e-12)
    # ...which is within 4 ulps of the largest gradient element of its layer at the step
    assert np.abs(g_c - g_b).max() <= tolerance.GRAD_NOISE_OF_MAX * scale
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.tolerance_text)


def test_another_momentum_in_the_port_is_still_found_where_the_weights_part(tmp_path) -> None:
    """Momentum 0.95 against 0.9: the step-1 slots are both the step-0 gradient; the first update
    that reads the momentum (step 1's) moves the weights apart at step 2."""
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"), momentum=0.95)
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    kernel = [
        np.abs(logged_value(tf2, s, "weight", "conv2d/kernel") - logged_value(tf1, s, "weight", "conv2d/kernel"))
        for s in range(3)
    ]
    assert kernel[1].max() < 1e-5 < kernel[2].max()  # numpy: apart past atol first at step 2
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (2, "weight", "conv2d/kernel:0"), first
