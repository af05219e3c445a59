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

import engine_helpers
import numpy as np
import pytest
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import summary_v1, summary_v2
from tb_parity_plugin.api import compare
from tb_parity_plugin.engine import Comparison
from tb_parity_plugin.logdir.rundata import RunData
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


def _adam_phases(root: str, run: str, d_beta_1: float, d_weight: float = 1.0) -> None:
    """Both phases with Adam; the discriminator has a one-unit output and its bias, shape [1].
    ``d_weight`` scales the discriminator's loss (0: its phase gets gradients of 0)."""
    disc = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    gen = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(3, use_bias=False)])
    disc.set_weights([K_D, np.zeros(1, np.float32)])
    gen.set_weights([K_G])
    d_opt = tf.keras.optimizers.Adam(LR, beta_1=d_beta_1)
    g_opt = tf.keras.optimizers.Adam(LR, beta_1=0.5)
    rec_d = summary_v2.Recorder(f"{root}/d/{run}")
    rec_g = summary_v2.Recorder(f"{root}/g/{run}")

    @tf.function
    def train_step(x: tf.Tensor) -> None:
        for rec, opt, model, sign in ((rec_d, d_opt, disc, d_weight), (rec_g, g_opt, gen, -1.0)):
            with rec.step(opt.iterations):
                rec.variables(disc, d_opt)
                rec.variables(gen, g_opt)
                with tf.GradientTape() as tape:
                    loss = rec.loss(sign * tf.reduce_mean(disc(gen(x) if sign < 0 else x)), "loss")
                rec.minimize(opt, loss, model.trainable_variables, tape)

    for x in X:
        train_step(tf.constant(x))
    rec_d.close()
    rec_g.close()


def test_a_slot_updated_by_the_phase_before_is_not_said_to_start_otherwise(tmp_path) -> None:
    """The discriminator's beta_1 0.9 for 0.5: in the generator's logdir its first moments differ at
    step 0, after the discriminator's first update (the bias's: 1 - beta_1 times its gradient, 1, so
    0.5 against 0.1). Its one element was told "starts at 0.5 in the baseline and 0.1 in the
    candidate: the optimizers initialise this slot differently"; the slot starts at 0 in both."""
    _adam_phases(str(tmp_path), "tf1", 0.5)
    _adam_phases(str(tmp_path), "tf2", 0.9)
    logged = {run: tensors_by_step(str(tmp_path / "g" / run))[0] for run in ("tf1", "tf2")}
    m_bias = {
        run: [v[2] for k, v in t.items() if k[0] == "slot" and k[1].startswith("m/") and v[2].size == 1]
        for run, t in logged.items()
    }
    # numpy: d_loss = mean(x @ kd + b): the bias's gradient is 1, so its first moment is 1 - beta_1
    np.testing.assert_allclose(m_bias["tf1"], [[0.5]], rtol=1e-6)
    np.testing.assert_allclose(m_bias["tf2"], [[0.1]], rtol=1e-6)
    report = compare(str(tmp_path / "g"), "tf1", "tf2")
    assert not report.agree and report.first_divergence.step == 0
    assert report.first_divergence.kind == "slot"
    notes = " ".join(d.note or "" for d in report.divergences_at_first_step)
    assert "initialise this slot differently" not in notes


def test_a_slot_the_phase_before_left_at_0_in_one_run_is_not_said_to_be_a_new_optimizer(tmp_path) -> None:
    """The candidate's discriminator loss weighted by 0 (a port whose loss gives no gradient: Keras's
    from_logits=False on logits clips them, with no gradient outside [1e-7, 1 - 1e-7]): its phase
    leaves the discriminator's moments at 0, where the baseline's hold its first update. In the
    generator's logdir, step 0, the bias's moment was told "the candidate starts a new optimizer here
    and the baseline carries one over"; both start their optimizers at step 0, and the update that
    differs is the phase's before it."""
    _adam_phases(str(tmp_path), "tf1", 0.5)
    _adam_phases(str(tmp_path), "tf2", 0.5, d_weight=0.0)
    logged = {run: tensors_by_step(str(tmp_path / "g" / run))[0] for run in ("tf1", "tf2")}
    m_bias = {
        run: [v[2] for k, v in t.items() if k[0] == "slot" and k[1].startswith("m/") and v[2].size == 1]
        for run, t in logged.items()
    }
    # numpy: the bias's gradient is 1 in the baseline, so its first moment is 1 - beta_1; 0 times it in the candidate
    np.testing.assert_allclose(m_bias["tf1"], [[0.5]], rtol=1e-6)
    np.testing.assert_array_equal(m_bias["tf2"], [[0.0]])
    report = compare(str(tmp_path / "g"), "tf1", "tf2")
    assert not report.agree and report.first_divergence.step == 0
    slots = [d for d in report.divergences_at_first_step if d.kind == "slot"]
    assert len(slots) == 4  # m and v of the discriminator's kernel and bias
    for d in slots:
        assert "starts a new optimizer here" not in d.note, d.note
        assert "a phase before this one in the same iteration" in d.note, d.note


X4 = np.random.default_rng(11).normal(size=(4, 4, 3)).astype(np.float32)


def _discriminator_phase_logged(root: str, run: str, shared: bool) -> None:
    """The discriminator's phase recorded, numbered by the generator's Adam's ``iterations``, then the
    generator's update; ``shared``: one Adam for both (built for both, as Keras's "optimizer cannot
    recognize variable" says), so its ``iterations`` counts two per iteration."""
    disc = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    gen = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(3, use_bias=False)])
    disc.set_weights([K_D, np.zeros(1, np.float32)])
    gen.set_weights([K_G])
    d_opt = tf.keras.optimizers.Adam(LR, beta_1=0.5)
    g_opt = d_opt if shared else tf.keras.optimizers.Adam(LR, beta_1=0.5)
    if shared:
        d_opt.build(disc.trainable_variables + gen.trainable_variables)
    rec = summary_v2.Recorder(f"{root}/d/{run}")

    @tf.function
    def train_step(x: tf.Tensor) -> None:
        with rec.step(g_opt.iterations):
            rec.variables([disc, gen])
            with tf.GradientTape() as tape:
                d_loss = rec.loss(tf.reduce_mean(disc(x)), "d_loss")
            rec.minimize(d_opt, d_loss, disc.trainable_variables, tape)
        with tf.GradientTape() as tape:
            g_loss = -tf.reduce_mean(disc(gen(x)))
        g_opt.apply_gradients(zip(tape.gradient(g_loss, gen.trainable_variables), gen.trainable_variables))

    for x in X4:
        train_step(tf.constant(x))
    rec.close()


def test_a_port_counting_two_updates_per_step_is_warned_that_its_steps_pair_other_iterations(tmp_path) -> None:
    """One Adam shared by both networks, its ``iterations`` numbering the steps: the port logs its
    discriminator phases at 0, 2, 4, 6 where the original logs 0, 1, 2, 3, and its step 2 holds
    iteration 1 (numpy). The steps both logged, 0 and 2, were compared with no word that they pair
    other iterations: DIVERGE at step 2, told of the slots' rule and clipping."""
    _discriminator_phase_logged(str(tmp_path), "tf1", shared=False)
    _discriminator_phase_logged(str(tmp_path), "tf2", shared=True)
    logged = {run: tensors_by_step(str(tmp_path / "d" / run)) for run in ("tf1", "tf2")}
    assert sorted(logged["tf1"]) == [0, 1, 2, 3] and sorted(logged["tf2"]) == [0, 2, 4, 6]
    # numpy: Adam's first step moves each element by lr * g / (|g| + epsilon); d kd = mean(x, 0), d b = 1
    g = X4[0].astype(np.float64).mean(0)[:, None]
    kd1 = K_D - LR * g / (np.abs(g) + 1e-7)
    kernels = {
        run: [v[2] for k, v in t[s].items() if k[0] == "weight" and v[2].shape == (3, 1)]
        for run, t, s in (("tf1", logged["tf1"], 1), ("tf2", logged["tf2"], 2))
    }
    for run in ("tf1", "tf2"):
        np.testing.assert_allclose(kernels[run], [kd1], rtol=1e-5)
    report = compare(str(tmp_path / "d"), "tf1", "tf2")
    warned = [w for w in report.warnings if "counts 2 per iteration" in w]
    assert len(warned) == 1, report.warnings
    assert "'tf2' logged 4 steps, 0 to 6, every 2nd, where 'tf1' logged as many at every step, 0 to 3" in warned[0]


def _tutorial_phases(
    root: str, run: str, stale: bool = False, inference: bool = False, g_lr: float = LR, by_d: bool = False
) -> None:
    """The TF2 DCGAN tutorial's shape, two phases recorded: ``stale`` takes the generator's loss from
    the forward pass run under both tapes before the discriminator's update (TF1's second sess.run
    computes it again); ``inference`` calls the generator, which has a batch norm, without
    ``training=True`` in its own phase; ``by_d`` numbers the generator's phase by the discriminator's
    ``iterations``, read after the discriminator's update."""
    disc = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    gen = tf.keras.Sequential(
        [tf.keras.Input((3,)), tf.keras.layers.Dense(3, use_bias=False), tf.keras.layers.BatchNormalization()]
    )
    disc.set_weights([K_D, np.zeros(1, np.float32)])
    gen.layers[0].set_weights([K_G])
    d_opt, g_opt = tf.keras.optimizers.Adam(LR, beta_1=0.5), tf.keras.optimizers.Adam(g_lr, beta_1=0.5)
    rec_d = summary_v2.Recorder(f"{root}/d/{run}")
    rec_g = summary_v2.Recorder(f"{root}/g/{run}")

    @tf.function
    def train_step(x: tf.Tensor) -> None:
        with rec_d.step(g_opt.iterations):
            rec_d.variables(disc, d_opt)
            rec_d.variables(gen, g_opt)
            with tf.GradientTape() as d_tape, tf.GradientTape() as g_tape:
                fake = gen(x, training=True)
                fake_out = disc(fake, training=True)
                real_out = disc(x, training=True)
                d_loss = rec_d.loss(
                    tf.reduce_mean(tf.nn.softplus(-real_out)) + tf.reduce_mean(tf.nn.softplus(fake_out)), "d_loss"
                )
                stale_g_loss = tf.reduce_mean(tf.nn.softplus(-fake_out))
            rec_d.minimize(d_opt, d_loss, disc.trainable_variables, d_tape)
        with rec_g.step(d_opt.iterations if by_d else g_opt.iterations):
            rec_g.variables(disc, d_opt)
            rec_g.variables(gen, g_opt)
            if stale:
                rec_g.activation("fake", fake)
                g_loss = rec_g.loss(stale_g_loss, "g_loss")
                grads = g_tape.gradient(g_loss, gen.trainable_variables)
            else:
                with tf.GradientTape() as tape:
                    fake = rec_g.activation("fake", gen(x) if inference else gen(x, training=True))
                    g_loss = rec_g.loss(tf.reduce_mean(tf.nn.softplus(-disc(fake, training=True))), "g_loss")
                grads = tape.gradient(g_loss, gen.trainable_variables)
            rec_g.apply_gradients(g_opt, zip(grads, gen.trainable_variables))

    for x in X4:
        train_step(tf.constant(x))
    rec_d.close()
    rec_g.close()


def _numpy_first_generator_losses() -> tuple[float, float, np.ndarray]:
    """numpy, iteration 0: the generator's loss (softplus(-logits), sigmoid cross-entropy against 1) on
    the discriminator before and after its first Adam update, and the generator's output in training
    mode (batch statistics; Keras BatchNormalization: gamma 1, beta 0, epsilon 1e-3)."""
    x = X4[0].astype(np.float64)
    h = x @ K_G
    fake = (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-3)

    def sigmoid(t: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-t))

    kd, b = K_D.astype(np.float64), 0.0
    real_l, fake_l = x @ kd + b, fake @ kd + b
    # d_loss = mean(softplus(-real_l)) + mean(softplus(fake_l))
    g_kd = (x * -sigmoid(-real_l)).mean(0)[:, None] + (fake * sigmoid(fake_l)).mean(0)[:, None]
    g_b = float(-sigmoid(-real_l).mean() + sigmoid(fake_l).mean())
    # Keras Adam's first step: lr sqrt(1 - beta_2) g / (sqrt(1 - beta_2) |g| + epsilon)
    c = np.sqrt(1 - 0.999)
    kd1, b1 = kd - LR * c * g_kd / (c * np.abs(g_kd) + 1e-7), b - LR * c * g_b / (c * abs(g_b) + 1e-7)

    def g_loss(k: np.ndarray, bias: float) -> float:
        return float(np.log1p(np.exp(-(fake @ k + bias))).mean())

    return g_loss(kd, b), g_loss(kd1, b1), fake


def test_a_generator_loss_taken_before_the_discriminator_update_is_told_so(tmp_path) -> None:
    """The candidate's generator loss from the tutorial's one forward pass (the discriminator before
    its update), where TF1's second sess.run computes it after: in the generator's logdir the loss
    diverges at step 0 while every weight recorded there agrees, and was told only that the loss is
    computed differently (its labels, from_logits, ...). Both runs' discriminator moments hold an update
    at step 0: this phase follows another's, which the note now says."""
    _tutorial_phases(str(tmp_path), "tf1")
    _tutorial_phases(str(tmp_path), "tf2", stale=True)
    stale, fresh, _ = _numpy_first_generator_losses()
    logged = {run: tensors_by_step(str(tmp_path / "g" / run))[0] for run in ("tf1", "tf2")}
    np.testing.assert_allclose(float(logged["tf1"][("loss", "g_loss")][2]), fresh, rtol=1e-4)
    np.testing.assert_allclose(float(logged["tf2"][("loss", "g_loss")][2]), stale, rtol=1e-4)
    assert abs(stale - fresh) > 1e-2
    first = compare(str(tmp_path / "g"), "tf1", "tf2").first_divergence
    assert (first.step, first.kind) == (0, "loss"), first
    assert "this logdir records a phase that follows another's update" in first.note, first.note
    assert "a loss computed from a forward pass run before that update" in first.note, first.note


def test_a_generator_called_in_inference_mode_is_told_of_the_training_flag(tmp_path) -> None:
    """The candidate's generator called without training=True in its own phase: Keras normalizes with
    the moving statistics, so its output diverges at step 0, the first output recorded there. It was
    told of activations, scales, epsilon, padding and data formats, not of a training flag."""
    _tutorial_phases(str(tmp_path), "tf1")
    _tutorial_phases(str(tmp_path), "tf2", inference=True)
    _, _, training = _numpy_first_generator_losses()
    logged = {run: tensors_by_step(str(tmp_path / "g" / run))[0] for run in ("tf1", "tf2")}
    np.testing.assert_allclose(logged["tf1"][("activation", "fake")][2], training, rtol=1e-4, atol=1e-5)
    # numpy: inference normalizes by the moving statistics, moved once by the discriminator's phase
    x = X4[0].astype(np.float64)
    h = x @ K_G
    mean, var = 0.01 * h.mean(0), 0.99 + 0.01 * h.var(0)
    np.testing.assert_allclose(logged["tf2"][("activation", "fake")][2], (h - mean) / np.sqrt(var + 1e-3), rtol=1e-4)
    first = compare(str(tmp_path / "g"), "tf1", "tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "fake"), first
    assert "a training flag: a layer that normalizes by its batch or drops units in training run in inference" in (
        first.note
    )


def test_a_generator_weight_in_the_discriminator_logdir_points_to_where_its_gradient_is(tmp_path) -> None:
    """The candidate's generator at twice the lr: the discriminator's logdir first sees it at step 1,
    on the generator's kernel, whose gradient only the generator's logdir records. That divergence had
    no note (a trial's faithful GAN: its generator's bias before batch norm, whose rounding noise the
    generator's logdir named); it now says its gradient is recorded elsewhere, its slots here."""
    _tutorial_phases(str(tmp_path), "tf1")
    _tutorial_phases(str(tmp_path), "tf2", g_lr=2 * LR)
    logged = {run: tensors_by_step(str(tmp_path / "d" / run))[1] for run in ("tf1", "tf2")}
    kernels = {
        run: [v[2] for k, v in t.items() if k[0] == "weight" and v[2].shape == (3, 3)] for run, t in logged.items()
    }
    # numpy: Adam's first step is lr times g / (|g| + epsilon'), so twice the lr moves the kernel twice as far
    np.testing.assert_allclose(kernels["tf2"][0] - K_G, 2 * (kernels["tf1"][0] - K_G), rtol=1e-4, atol=1e-6)
    assert np.abs(kernels["tf1"][0] - K_G).max() > 0.05
    first = compare(str(tmp_path / "d"), "tf1", "tf2").first_divergence
    assert (first.step, first.kind) == (1, "weight") and first.tensor.endswith("kernel:0"), first
    assert "neither run recorded its gradient here, though both record its optimizer's slots" in first.note, first
    # in the generator's logdir, where its gradient is, the note is on its update (the discriminator's
    # weights, which the generator's other output moved in the discriminator's phase, point back)
    report = compare(str(tmp_path / "g"), "tf1", "tf2")
    kernel = next(d for d in report.divergences_at_first_step if d.tensor == first.tensor)
    assert kernel.step == 1 and "neither run recorded its gradient here" not in kernel.note, kernel.note


def test_a_phase_numbered_by_the_counter_of_the_phase_before_is_told_its_steps_are_one_later(tmp_path) -> None:
    """A faithful port that numbers its generator's phase by the discriminator's ``iterations``, which
    that phase's update has already moved: its generator logdir holds steps 1-4 where TF1's holds 0-3,
    each one iteration later (numpy: its step 1 holds the initial generator kernel, TF1's step 0 too).
    The steps both logged compared other iterations: DIVERGE at step 1 with no note."""
    _tutorial_phases(str(tmp_path), "tf1")
    _tutorial_phases(str(tmp_path), "tf2", by_d=True)
    logged = {run: tensors_by_step(str(tmp_path / "g" / run)) for run in ("tf1", "tf2")}
    assert sorted(logged["tf1"]) == [0, 1, 2, 3] and sorted(logged["tf2"]) == [1, 2, 3, 4]
    for run, step in (("tf1", 0), ("tf2", 1)):
        kernel = [v[2] for k, v in logged[run][step].items() if k[0] == "weight" and v[2].shape == (3, 3)]
        np.testing.assert_array_equal(kernel, [K_G])
    first = compare(str(tmp_path / "g"), "tf1", "tf2").first_divergence
    assert (first.step, first.kind) == (1, "weight"), first
    assert "every weight 'tf2' recorded at this step is the one 'tf1' recorded at step 0" in first.note, first.note
    assert "'tf2' numbers its steps 1 later" in first.note, first.note


def test_a_slot_whose_name_names_no_variable_does_not_break_the_note_on_a_weight_without_gradient() -> None:
    """The note on a weight whose gradient neither run recorded looked up each slot's variable, and a slot
    whose name names none (``velocity``, recorded by hand) made it index None: the report raised TypeError.
    Synthetic series: the weight moves by 0.1 in the baseline and 0.2 in the candidate at step 1 (numpy)."""
    w0 = np.array([1.0, 2.0], np.float32)
    other = np.array([0.5, 0.5], np.float32)

    def side(name: str, lr: float) -> RunData:
        return engine_helpers.run(
            name,
            [
                engine_helpers.series("weight", "dense/kernel:0", [w0, w0 - lr], order=1),
                engine_helpers.series("weight", "other/kernel:0", [other, other], order=2),
                engine_helpers.series("grad", "other/kernel:0", [other * 0, other * 0], order=3),
                engine_helpers.series("slot", "dense/kernel/m", [w0 * 0, w0 * 0 + 0.1], order=4),
                engine_helpers.series("slot", "velocity", [w0 * 0, w0 * 0], order=5),
            ],
        )

    first = Comparison(side("b", 0.1), side("c", 0.2)).report().first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "weight", "dense/kernel:0"), first
    assert "neither run recorded its gradient here" in (first.note or ""), first.note


def test_a_slot_carried_over_from_a_checkpoint_is_not_said_to_be_left_by_a_phase_before(tmp_path) -> None:
    """A fine-tuning port that restores its pretraining's checkpoint with the optimizer
    (``tf.train.Checkpoint(model=, optimizer=)``), its custom loop numbered from 0, where TF1 restores the
    weights alone and starts a fresh Adam: at step 0 the port's moments hold the pretraining's update and
    TF1's are 0. Both counters at 0, it was told of a GAN's discriminator phase and of a loss that clips,
    though this logdir records these variables' gradients: its own phase trains them, and the port
    carries an optimizer over. Expectations are numpy's (the pretraining step's gradient)."""
    rng = np.random.default_rng(3)
    w0, p, py = rng.normal(size=(3, 2)).astype(np.float32), X[0], np.eye(2, dtype=np.float32)[[0, 1, 1, 0]]
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, use_bias=False, name="dense")])
    model.set_weights([w0])
    pre_opt, loss_fn = tf.keras.optimizers.Adam(LR), tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        pre_loss = loss_fn(py, model(p))
    pre_opt.apply_gradients(zip(tape.gradient(pre_loss, model.trainable_variables), model.trainable_variables))
    path = tf.train.Checkpoint(model=model, optimizer=pre_opt).save(str(tmp_path / "pre" / "c"))
    w_pre = model.get_weights()[0]
    # numpy: the pretraining step's gradient of the mean softmax cross-entropy; Adam's first moment 0.1 x it
    logits = p.astype(np.float64) @ w0
    prob = np.exp(logits - logits.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    m_pre = 0.1 * p.T.astype(np.float64) @ ((prob - py) / len(p))

    opt = tf.keras.optimizers.Adam(LR)
    opt.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=opt).restore(path).assert_consumed()
    rec = summary_v2.Recorder(str(tmp_path / "ft" / "tf2"))
    for step, x in enumerate(X):
        with rec.step(step, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(py, model(x)))
            rec.apply_gradients(opt, zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    rec.close()
    with tf.Graph().as_default():
        rec1 = summary_v1.Recorder(str(tmp_path / "ft" / "tf1"))
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        out = tf.compat.v1.layers.dense(x, 2, use_bias=False, kernel_initializer=tf.constant_initializer(w_pre))
        opt1 = tf.compat.v1.train.AdamOptimizer(LR, epsilon=1e-7)
        train_op = rec1.minimize(opt1, rec1.loss(tf.compat.v1.losses.softmax_cross_entropy(py, out)), gs)
        rec1.variables(optimizer=opt1)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in X:
                rec1.write(sess.run([train_op, rec1.fetches], {x: batch})[1])
        rec1.close()
    m0 = {run: tensors_by_step(str(tmp_path / "ft" / run))[0] for run in ("tf1", "tf2")}
    np.testing.assert_allclose(m0["tf2"][("slot", "m/dense/kernel")][2], m_pre, atol=1e-6)
    assert not np.any(m0["tf1"][("slot", "dense/kernel/Adam:0")][2])
    report = compare(str(tmp_path / "ft"), "tf1", "tf2")
    assert not report.agree and report.first_divergence.step == 0
    slots = [d for d in report.divergences_at_first_step if d.kind == "slot"]
    assert len(slots) == 2  # m and v of the kernel
    for d in slots:
        assert "a phase before this one" not in d.note, d.note
        assert "the candidate carries one over" in d.note, d.note


Y2 = np.eye(2, dtype=np.float32)[[0, 1, 1, 0]]


def _resumed_adam(root: str, run: str, smoothing: float) -> None:
    """One phase only: a model pretrained one Adam step, restored with its optimizer from the checkpoint
    (``tf.train.Checkpoint(model=, optimizer=)``) and trained on, numbered from 0 by the loop's counter.
    ``smoothing``: the cross-entropy's label smoothing."""
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, use_bias=False, name="dense")])
    model.set_weights([K_G[:, :2]])
    pre_opt, loss_fn = tf.keras.optimizers.Adam(LR), tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        pre_loss = loss_fn(Y2, model(X[1]))
    pre_opt.apply_gradients(zip(tape.gradient(pre_loss, model.trainable_variables), model.trainable_variables))
    path = tf.train.Checkpoint(model=model, optimizer=pre_opt).save(f"{root}/ckpt/{run}/c")
    opt = tf.keras.optimizers.Adam(LR)
    opt.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=opt).restore(path).assert_consumed()
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=smoothing)
    rec = summary_v2.Recorder(f"{root}/ft/{run}")
    for step, x in enumerate(X):
        with rec.step(step, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(Y2, model(x)))
            rec.apply_gradients(opt, zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    rec.close()


def test_a_resumed_port_whose_loss_differs_is_not_told_of_a_phase_before(tmp_path) -> None:
    """Both runs resumed with their optimizer from a checkpoint and numbered from 0, so Adam's moments
    hold an update at step 0 in both; the candidate smooths its labels (0.1). The loss, diverging first
    with every weight agreeing, was told that this logdir records a phase following another's update in
    the iteration (a GAN's generator) and that its loss saw other weights than those recorded: the
    moments are this logdir's own, their gradients recorded here, and the loss saw the recorded weights.
    Expectations are numpy's."""
    _resumed_adam(str(tmp_path), "tf1", 0.0)
    _resumed_adam(str(tmp_path), "tf2", 0.1)
    logged = {run: tensors_by_step(str(tmp_path / "ft" / run))[0] for run in ("tf1", "tf2")}
    for run, smoothing in (("tf1", 0.0), ("tf2", 0.1)):
        assert np.any(logged[run][("slot", "m/dense/kernel")][2])  # an update at step 0: the pretraining's
        w = logged[run][("weight", "dense/kernel:0")][2].astype(np.float64)
        logits = X[0].astype(np.float64) @ w
        log_p = logits - logits.max(1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
        target = Y2 * (1 - smoothing) + smoothing / 2
        np.testing.assert_allclose(logged[run][("loss", "loss")][2], -(target * log_p).sum(1).mean(), rtol=1e-5)
    report = compare(str(tmp_path / "ft"), "tf1", "tf2")
    assert not report.agree and report.first_divergence.step == 0
    assert report.first_divergence.kind == "loss"
    note = report.first_divergence.note or ""
    assert "no output is recorded before it" in note, note
    assert "follows another's update" not in note, note
