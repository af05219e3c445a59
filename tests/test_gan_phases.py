"""A GAN's two phases in one ``tf.function``, one recorder each (the README's "Alternating updates").

TF1 runs ``sess.run(d_train)`` then ``sess.run(g_train)``: the generator's phase sees the
discriminator's weights after its update. The port records ``with rec_d.step(it)`` around the
discriminator's update and ``with rec_g.step(it)`` around the generator's, in one ``tf.function``.
The generator's recorder refused to read the discriminator's weights ("recorded after
'Adam/AssignSubVariableOp' wrote it in this step; record it at the step's start"), though it read
them at its own step's start: a write built before that step opened was counted as one of the step.
Expectations are numpy's.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import summary_v2
from tb_parity_plugin.shim.variables import variable_name

LR = 0.1
RNG = np.random.default_rng(7)
X = RNG.normal(size=(2, 4, 3)).astype(np.float32)
K_D = RNG.normal(size=(3, 1)).astype(np.float32)
K_G = RNG.normal(size=(3, 3)).astype(np.float32)


def _models() -> tuple[tf.keras.Sequential, tf.keras.Sequential]:
    disc = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1, use_bias=False)])
    gen = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(3, use_bias=False)])
    disc.set_weights([K_D])
    gen.set_weights([K_G])
    return disc, gen


def test_the_second_phase_records_the_weights_the_first_phase_left(tmp_path) -> None:
    disc, gen = _models()
    d_opt, g_opt = tf.keras.optimizers.SGD(LR), tf.keras.optimizers.SGD(LR)
    rec_d = summary_v2.Recorder(str(tmp_path / "d" / "tf2"))
    rec_g = summary_v2.Recorder(str(tmp_path / "g" / "tf2"))

    @tf.function
    def train_step(x: tf.Tensor) -> None:
        with rec_d.step(d_opt.iterations):
            rec_d.variables([disc, gen])
            with tf.GradientTape() as tape:
                d_loss = rec_d.loss(tf.reduce_mean(disc(x)), "d_loss")
            rec_d.minimize(d_opt, d_loss, disc.trainable_variables, tape)
        with rec_g.step(g_opt.iterations):  # after the discriminator's update, as TF1's second run
            rec_g.variables([disc, gen])
            with tf.GradientTape() as tape:
                g_loss = rec_g.loss(-tf.reduce_mean(disc(gen(x))), "g_loss")
            rec_g.minimize(g_opt, g_loss, gen.trainable_variables, tape)

    for x in X:
        train_step(tf.constant(x))
    rec_d.close()
    rec_g.close()

    # numpy: d_loss = mean(x @ kd) -> d kd = mean(x, 0); g_loss = -mean(x @ kg @ kd) -> d kg = -mean(x, 0)^T kd^T
    kd, kg, d_rows, g_rows = K_D.astype(np.float64), K_G.astype(np.float64), [], []
    for x in X.astype(np.float64):
        d_rows.append((kd.copy(), kg.copy()))
        kd = kd - LR * x.mean(0)[:, None]
        g_rows.append((kd.copy(), kg.copy()))
        kg = kg + LR * x.mean(0)[:, None] @ kd.T
    logged = {ph: tensors_by_step(str(tmp_path / ph / "tf2")) for ph in ("d", "g")}
    names = variable_name(disc.trainable_variables[0]), variable_name(gen.trainable_variables[0])
    for ph, rows in (("d", d_rows), ("g", g_rows)):
        assert sorted(logged[ph]) == [0, 1]
        for step, expected in enumerate(rows):
            for name, want in zip(names, expected):
                np.testing.assert_allclose(logged[ph][step][("weight", name)][2], want, rtol=1e-5, atol=1e-6)


def test_a_write_inside_the_step_is_still_refused(tmp_path) -> None:
    """The discriminator updated inside the generator's step, then read: still the updated value."""
    disc, _ = _models()
    d_opt = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(str(tmp_path / "late"))

    @tf.function
    def train_step(x: tf.Tensor) -> None:
        with rec.step(d_opt.iterations):
            with tf.GradientTape() as tape:
                d_loss = tf.reduce_mean(disc(x))
            d_opt.apply_gradients(zip(tape.gradient(d_loss, disc.trainable_variables), disc.trainable_variables))
            rec.variables(disc)

    with pytest.raises(ValueError, match="recorded after .* wrote it"):
        train_step(tf.constant(X[0]))
