"""An ``--allow-unmatched`` pattern broad enough to take in state both runs record. A new user's
custom ``train_step`` port declared ``state/*`` for a metric's variables; its batch norm's moving
statistics, named otherwise in each run (TF1's ``batch_normalization/moving_mean:0``, the port's
``bn/moving_mean:0``), were then never paired by shape, listed only as expected, and compared
nowhere, silently. The warning names them. The moving statistics are checked with numpy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, BATCH, MOMENTUM = 3, 8, 0.9
RNG = np.random.default_rng(26)
X = RNG.standard_normal((STEPS * BATCH, 4)).astype(np.float32)
Y = RNG.standard_normal((STEPS * BATCH, 2)).astype(np.float32)
W = (RNG.standard_normal((4, 2)) * 0.5).astype(np.float32)


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x, y = tf.compat.v1.placeholder(tf.float32, [None, 4]), tf.compat.v1.placeholder(tf.float32, [None, 2])
        h = tf.compat.v1.layers.dense(x, 2, use_bias=False, kernel_initializer=tf.constant_initializer(W))
        out = tf.compat.v1.layers.batch_normalization(h, momentum=MOMENTUM, training=True)
        loss = rec.loss(tf.reduce_mean(tf.square(out - y)))
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        rec.variables()
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, BATCH)


def _port(run_dir: str) -> None:
    model = tf.keras.Sequential(
        [
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(2, use_bias=False, kernel_initializer=tf.constant_initializer(W), name="dense"),
            tf.keras.layers.BatchNormalization(momentum=MOMENTUM, name="bn"),
        ]
    )
    opt = tf.keras.optimizers.SGD(0.1)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model):
            with tf.GradientTape() as tape:
                loss = rec.loss(tf.reduce_mean(tf.square(model(x, training=True) - y)))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for s in range(STEPS):
        step(tf.constant(X[s * BATCH : (s + 1) * BATCH]), tf.constant(Y[s * BATCH : (s + 1) * BATCH]))
    rec.close()


def test_state_a_broad_pattern_keeps_from_its_pair_is_named(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "tf2"))
    # numpy: the first update's moving mean, the same in both runs
    expected = (1 - MOMENTUM) * (X[:BATCH] @ W).mean(axis=0)
    for run, name in (("tf1", "batch_normalization/moving_mean:0"), ("tf2", "bn/moving_mean:0")):
        np.testing.assert_allclose(tensors_by_step(str(tmp_path / run))[1][("state", name)][2], expected, atol=1e-6)
    plain = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    paired = {(m["baseline"], m["candidate"]) for m in plain.to_dict()["mapping"]}
    assert ("batch_normalization/moving_mean:0", "bn/moving_mean:0") in paired, paired
    assert plain.agree, plain.first_divergence
    declared = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["state/*"])
    said = [w for w in declared.warnings if "--allow-unmatched pattern declares" in w]
    assert len(said) == 1, declared.warnings
    assert "state/batch_normalization/moving_mean:0 ~ state/bn/moving_mean:0" in said[0], said
    assert "moving_variance" in said[0], said
