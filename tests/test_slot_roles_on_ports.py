"""Slots and moving averages paired by what they hold, on ports written the way users write them.

* TF1's ``RMSPropOptimizer(centered=True)`` names its slots by creation order: rms
  ``<v>/RMSProp``, mg ``<v>/RMSProp_1``, momentum ``<v>/RMSProp_2``. Read as the momentum,
  ``RMSProp_1`` was compared with Keras's momentum: a new user's faithful port diverged at step 1.
* Two same-shaped layers created in another order by the port, one of them under an
  ``ExponentialMovingAverage`` the other lacks: the first-values repair gave up (the EMA had no
  namesake under the other layer) and left the weights paired crosswise, silently: a false
  DIVERGE at step 0 with cosine 0.11.

Each expectation is checked on values fetched from both frameworks directly (not from the tool).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from keras_recipes import dense_regression_port
from shim_readback import tensors_by_step
from tf1_recipes import dense_regression

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(0)
STEPS = 5
X = RNG.normal(size=(STEPS, 8, 4)).astype(np.float32)
Y1 = RNG.normal(size=(STEPS, 8, 1)).astype(np.float32)
Y4 = RNG.normal(size=(STEPS, 8, 4)).astype(np.float32)
K = RNG.normal(size=(4, 1)).astype(np.float32) * 0.5
INIT = {n: RNG.normal(size=(4, 4)).astype(np.float32) * 0.5 for n in ("enc", "dec")}
ROLES = ("rms", "mg", "momentum")  # TF1's slot names, in creation order


def _regression_tf1(run_dir: str, make_opt: Any, watch: Any) -> list[dict[str, np.ndarray]]:
    """A TF1 dense regression trained by ``make_opt(global_step, rec)``; returns, before each step,
    what ``watch(opt, kernel)`` names, fetched from the session."""
    return dense_regression(run_dir, K, X, Y1, make_opt, lambda opt, variables: watch(opt, variables[0]))


def _rmsprop_tf1(run_dir: str, name: str = "RMSProp") -> dict[str, list[np.ndarray]]:
    """TF1 centered RMSProp with momentum (``name``: the optimizer's); returns each slot by role,
    read before each step."""

    def watch(opt: Any, kernel: Any) -> dict[str, Any]:
        slots = {r: opt.get_slot(kernel, r) for r in ROLES}
        assert [slots[r].name for r in ROLES] == [
            f"dense/kernel/{name}:0",
            f"dense/kernel/{name}_1:0",
            f"dense/kernel/{name}_2:0",
        ]
        return slots

    seen = _regression_tf1(
        run_dir,
        lambda gs, rec: tf.compat.v1.train.RMSPropOptimizer(
            0.01, decay=0.9, momentum=0.5, epsilon=1e-10, centered=True, name=name
        ),
        watch,
    )
    return {r: [step[r] for step in seen] for r in ROLES}


def _rmsprop_port(run_dir: str) -> dict[str, list[np.ndarray]]:
    """The Keras port: RMSprop(centered=True) with TF1's mean square starting at 1 (README)."""

    def prepare(opt: Any, model: Any) -> None:
        opt.build(model.trainable_variables)
        for v in opt._velocities:
            v.assign(tf.ones_like(v))

    def watch(opt: Any) -> dict[str, Any]:
        return {"rms": opt._velocities[0], "mg": opt._average_gradients[0], "momentum": opt._momentums[0]}

    opt = tf.keras.optimizers.RMSprop(0.01, rho=0.9, momentum=0.5, epsilon=1e-10, centered=True)
    return dense_regression_port(run_dir, K, X, Y1, opt, watch, prepare)


def test_a_faithful_centered_rmsprop_port_pairs_each_slot_by_what_it_holds(tmp_path) -> None:
    tf1, port = _rmsprop_tf1(str(tmp_path / "tf1")), _rmsprop_port(str(tmp_path / "tf2"))
    for role in ROLES:  # the frameworks' own slots agree role by role...
        np.testing.assert_allclose(port[role], tf1[role], rtol=1e-5, atol=1e-7)
    # ...and the mean gradient is not the momentum: pairing them by position is a divergence
    assert not np.allclose(tf1["mg"][1], port["momentum"][1], rtol=0.05, atol=1e-5)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    slots = {m["baseline"]: m["candidate"] for m in report.to_dict()["mapping"] if m["kind"] == "slot"}
    assert slots["dense/kernel/RMSProp_1:0"] == "average_gradient/dense/kernel", slots
    assert slots["dense/kernel/RMSProp_2:0"] == "momentum/dense/kernel", slots
    assert slots["dense/kernel/RMSProp:0"] == "velocity/dense/kernel", slots


def test_a_named_tf1_rmsprop_records_its_slots_as_its_class_names_them(tmp_path) -> None:
    """``RMSPropOptimizer(..., name="MyOpt")`` names the slots ``MyOpt``, ``MyOpt_1``, ``MyOpt_2``: a
    new user's were paired with Keras's by position (the momentum with the mean square), a false
    DIVERGE at step 0. Recorded under the class's spelling, they pair by role."""
    tf1, port = _rmsprop_tf1(str(tmp_path / "tf1"), name="MyOpt"), _rmsprop_port(str(tmp_path / "tf2"))
    for role in ROLES:  # numpy: the frameworks' own slots agree role by role
        np.testing.assert_allclose(port[role], tf1[role], rtol=1e-5, atol=1e-7)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    slots = {m["baseline"]: m["candidate"] for m in report.to_dict()["mapping"] if m["kind"] == "slot"}
    assert slots == {
        "dense/kernel/RMSProp:0": "velocity/dense/kernel",
        "dense/kernel/RMSProp_1:0": "average_gradient/dense/kernel",
        "dense/kernel/RMSProp_2:0": "momentum/dense/kernel",
        "dense/bias/RMSProp:0": "velocity/dense/bias",
        "dense/bias/RMSProp_1:0": "average_gradient/dense/bias",
        "dense/bias/RMSProp_2:0": "momentum/dense/bias",
    }, slots


def _swapped_tf1(run_dir: str) -> list[np.ndarray]:
    """TF1: enc -> dec, both [4, 4]; momentum; an EMA of enc's variables only. Returns enc's kernel
    before each step."""
    seen = []
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        y = tf.compat.v1.placeholder(tf.float32, [None, 4])
        init = tf.constant_initializer
        h = tf.compat.v1.layers.dense(x, 4, tf.nn.relu, kernel_initializer=init(INIT["enc"]), name="enc")
        p = tf.compat.v1.layers.dense(h, 4, kernel_initializer=init(INIT["dec"]), name="dec")
        loss = rec.loss(tf.reduce_mean(tf.square(p - y)))
        opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        train = rec.minimize(opt, loss, global_step=gs)
        enc_vars = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, scope="enc")
        with tf.control_dependencies([train]):
            train = tf.compat.v1.train.ExponentialMovingAverage(0.99).apply(enc_vars)
        rec.variables(optimizer=opt)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                seen.append(sess.run(enc_vars[0]))
                rec.write(sess.run([train, fetches], {x: X[s], y: Y4[s]})[1])
        rec.close()
    return seen


class _Port(tf.keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.dec = tf.keras.layers.Dense(4)  # created first: Keras names it dense, enc dense_1
        self.enc = tf.keras.layers.Dense(4, activation="relu")

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return self.dec(self.enc(x))


def _swapped_port(run_dir: str, decay: float = 0.99) -> tuple[list[np.ndarray], str]:
    """The port; returns enc's kernel before each step and enc's Keras name (``dense_1`` in a fresh
    process: Keras numbers layers per process)."""
    model = _Port()
    model(X[0])
    model.enc.set_weights([INIT["enc"], np.zeros(4, np.float32)])
    model.dec.set_weights([INIT["dec"], np.zeros(4, np.float32)])
    opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    ema = tf.train.ExponentialMovingAverage(decay)
    ema.apply(model.enc.trainable_variables)
    shadows = [ema.average(v) for v in model.enc.trainable_variables]
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=[model, shadows], optimizer=opt):
            with tf.GradientTape() as tape:
                loss = rec.loss(tf.reduce_mean(tf.square(model(x) - y)))
            rec.minimize(opt, loss, model.trainable_variables, tape)
            ema.apply(model.enc.trainable_variables)

    seen = []
    for s in range(STEPS):
        seen.append(model.enc.kernel.numpy())
        step(tf.constant(X[s]), tf.constant(Y4[s]))
    rec.close()
    return seen, model.enc.name


def test_same_shaped_layers_in_another_order_with_an_ema_of_one_are_paired_by_their_values(tmp_path) -> None:
    tf1, (port, enc) = _swapped_tf1(str(tmp_path / "tf1")), _swapped_port(str(tmp_path / "tf2"))
    np.testing.assert_allclose(port, tf1, rtol=1e-5, atol=1e-6)  # enc trains the same on both sides
    assert not np.allclose(INIT["enc"], INIT["dec"], atol=1e-3)  # paired crosswise, they differ at step 0
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    pairs = {(m["kind"], m["baseline"]): m["candidate"] for m in report.to_dict()["mapping"]}
    for kind, name in (
        ("weight", "enc/kernel:0"),
        ("grad", "enc/kernel:0"),
        ("state", "enc/kernel/ExponentialMovingAverage:0"),
        ("slot", "enc/kernel/Momentum:0"),
    ):
        assert f"port/{enc}/kernel" in pairs[(kind, name)], (kind, name, pairs)
    assert any(w.startswith("paired enc/* with ") and f"/{enc}/*" in w for w in report.warnings), report.warnings


def test_a_wrong_ema_decay_on_the_swapped_layer_is_found_on_its_average_at_step_1(tmp_path) -> None:
    _swapped_tf1(str(tmp_path / "tf1"))
    _swapped_port(str(tmp_path / "tf2"), decay=0.9)
    # numpy: the shadow after step 0 is decay * w0 + (1 - decay) * w1, 0.09 (w1 - w0) apart
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None
    assert (first.step, first.kind, first.tensor) == (1, "state", "enc/kernel/ExponentialMovingAverage:0"), first


def _momentum_tf1(run_dir: str) -> list[np.ndarray]:
    """TF1 MomentumOptimizer under a staircase schedule halving the lr at step 2; returns the
    kernel's weights read before each step."""

    def make_opt(gs: Any, rec: Any) -> Any:
        return tf.compat.v1.train.MomentumOptimizer(
            rec.lr(tf.compat.v1.train.exponential_decay(0.05, gs, 2, 0.5, staircase=True)), 0.9
        )

    return [step["kernel"] for step in _regression_tf1(run_dir, make_opt, lambda opt, kernel: {"kernel": kernel})]


def _momentum_port(run_dir: str, staircase: bool = True) -> list[np.ndarray]:
    """The Keras port as users write it: SGD with momentum and the same staircase schedule, fit."""
    model = tf.keras.Sequential(
        [tf.keras.Input((4,)), tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(K), name="dense")]
    )
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.5, staircase=staircase)
    model.compile(tf.keras.optimizers.SGD(schedule, momentum=0.9), "mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    weights = []
    for s in range(STEPS):
        weights.append(model.get_layer("dense").kernel.numpy())
        model.fit(X[s], Y1[s], batch_size=8, epochs=1, shuffle=False, verbose=0)
    rec.close()
    return weights


def test_keras_momentum_under_a_schedule_is_told_where_its_rule_parts_from_tf1s(tmp_path) -> None:
    """TF1 applies a new lr to the whole accumulator, Keras SGD only to the new gradient: the two part
    at the first lr change (step 2) and the weights differ from step 3 (numpy below). The slot, kept
    by Keras as -lr x accumulator and recorded divided by this step's lr, differs at step 2 by
    exactly lr(1)/lr(2) = 2, and the note now says why instead of leaving a bare factor of 2."""
    w_tf1 = _momentum_tf1(str(tmp_path / "tf1"))
    w_port = _momentum_port(str(tmp_path / "tf2"))
    for s in range(3):  # numpy: the same weights through step 2 (the update at 2 is the first to part)
        np.testing.assert_allclose(w_port[s], w_tf1[s], rtol=1e-6, atol=1e-7)
    assert np.abs(w_port[3] - w_tf1[3]).max() > 1e-4
    # numpy on the records (TensorBoard's loader, not the engine): the port's slot is TF1's times 2
    logged = [tensors_by_step(str(tmp_path / side))[2] for side in ("tf1", "tf2")]
    slots = [np.asarray(next(v[2] for (kind, _), v in at.items() if kind == "slot")) for at in logged]
    np.testing.assert_allclose(slots[1], 2 * slots[0], rtol=1e-5)
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (found.step, found.kind) == (2, "slot"), found
    assert "times lr/lr at step 1 / at step 2 = 2:" in found.note, found.note
    assert "their rules part" in found.note


def test_a_port_whose_schedule_forgot_staircase_has_its_slots_told_the_lr_not_clipping(tmp_path) -> None:
    """A new user's port with ``staircase=False``: the candidate's lr alone changed at step 1 (the
    first divergence, right), and every momentum slot diverging beside it got the clipping / weight
    decay note at a factor that was the candidate's own lr(0) / lr(1). Each slot holds what TF1's
    does in its own optimizer's units (numpy below): the note now names the lr."""
    w_tf1 = _momentum_tf1(str(tmp_path / "tf1"))
    w_port = _momentum_port(str(tmp_path / "tf2"), staircase=False)
    np.testing.assert_allclose(w_port[1], w_tf1[1], rtol=1e-6, atol=1e-7)  # numpy: step 0's lr is 0.05 on both
    logged = [tensors_by_step(str(tmp_path / side))[1] for side in ("tf1", "tf2")]
    slots = [np.asarray(next(v[2] for (kind, _), v in at.items() if kind == "slot")) for at in logged]
    factor = 1 / 0.5 ** (1 / 2)  # the candidate's lr(0) / lr(1) without the staircase
    np.testing.assert_allclose(slots[1], factor * slots[0], rtol=1e-5)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert (report.first_divergence.step, report.first_divergence.kind) == (1, "lr"), report.first_divergence
    slot = next(d for d in report.divergences_at_first_step if d.kind == "slot")
    assert f"times the candidate's lr/lr at step 0 / at step 1 = {factor:.4g}:" in slot.note, slot.note
    assert "its schedule is the difference" in slot.note and "clipping" not in slot.note, slot.note


def test_keras_momentum_under_an_lr_assigned_inside_the_step_is_recorded_in_that_lrs_units(tmp_path) -> None:
    """A custom loop that computes TF1's staircase lr by hand from ``optimizer.iterations`` and assigns
    it inside ``with rec.step(...)``, before the update. The slot, kept by Keras as -lr x accumulator,
    was divided by the lr read when the step opened, the step before's: at the lr change (step 2) it
    agreed with TF1's, and the weights parting at step 3 were told of clipping or a weight decay.
    numpy below: the update at step 2 applies lr 0.025 and the slot it starts from, over that lr, is
    twice TF1's accumulator, as the documented lr(1)/lr(2) says."""
    w_tf1 = _momentum_tf1(str(tmp_path / "tf1"))
    model = tf.keras.Sequential(
        [tf.keras.Input((4,)), tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(K), name="dense")]
    )
    opt = tf.keras.optimizers.SGD(0.05, momentum=0.9)
    opt.build(model.trainable_variables)
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            lr = 0.05 * tf.pow(0.5, tf.floor(tf.cast(opt.iterations, tf.float32) / 2.0))
            opt.learning_rate.assign(lr)
            rec.lr(lr)
            with tf.GradientTape() as tape:
                loss = rec.loss(tf.reduce_mean(tf.square(model(x) - y)))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    w_port, m_port = [], []
    for s in range(STEPS):
        w_port.append(model.get_layer("dense").kernel.numpy())
        m_port.append(opt.variables()[1].numpy())  # [iterations, the kernel's momentum, ...]
        step(tf.constant(X[s]), tf.constant(Y1[s]))
    rec.close()
    for s in range(3):  # numpy: the same weights through step 2 (the update at 2 is the first to part)
        np.testing.assert_allclose(w_port[s], w_tf1[s], rtol=1e-6, atol=1e-7)
    assert np.abs(w_port[3] - w_tf1[3]).max() > 1e-4
    tf1_slot = next(v[2] for (kind, _), v in tensors_by_step(str(tmp_path / "tf1"))[2].items() if kind == "slot")
    np.testing.assert_allclose(-m_port[2] / 0.025, 2 * np.asarray(tf1_slot), rtol=1e-5)
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (found.step, found.kind) == (2, "slot"), found
    assert "times lr/lr at step 1 / at step 2 = 2:" in found.note, found.note


class _WarmupFromZero(tf.keras.optimizers.schedules.LearningRateSchedule):
    """BERT's linear warm-up, ``peak * step / warmup_steps``: 0 at step 0."""

    def __call__(self, step: Any) -> Any:
        return 0.05 * tf.minimum(tf.cast(step, tf.float32) / 2.0, 1.0)

    def get_config(self) -> dict:
        return {}


def test_keras_momentum_under_a_warmup_from_zero_is_told_where_its_rule_parts_from_tf1s(tmp_path) -> None:
    """A warm-up from lr 0 (BERT's): TF1's accumulator holds step 0's gradient, Keras SGD's velocity
    -lr x g holds 0, so the slot differs at step 1 and the weights from step 2 (numpy below). The
    momentum note required a positive lr before the change, so the port's zero slot got the note
    for clipping, a weight decay or the betas, none of which the port has."""

    def make_opt(gs: Any, rec: Any) -> Any:
        warm = 0.05 * tf.minimum(tf.cast(gs, tf.float32) / 2.0, 1.0)
        return tf.compat.v1.train.MomentumOptimizer(rec.lr(warm), 0.9)

    w_tf1 = [step["kernel"] for step in _regression_tf1(str(tmp_path / "tf1"), make_opt, lambda o, k: {"kernel": k})]
    model = tf.keras.Sequential(
        [tf.keras.Input((4,)), tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(K), name="dense")]
    )
    model.compile(tf.keras.optimizers.SGD(_WarmupFromZero(), momentum=0.9), "mse")
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    summary_v2.instrument(model, rec)
    w_port = []
    for s in range(STEPS):
        w_port.append(model.get_layer("dense").kernel.numpy())
        model.fit(X[s], Y1[s], batch_size=8, epochs=1, shuffle=False, verbose=0)
    rec.close()
    for s in range(2):  # numpy: the same weights through step 1 (the update at 1 is the first to part)
        np.testing.assert_allclose(w_port[s], w_tf1[s], rtol=1e-6, atol=1e-7)
    assert np.abs(w_port[2] - w_tf1[2]).max() > 1e-4
    logged = [tensors_by_step(str(tmp_path / side))[1] for side in ("tf1", "tf2")]
    slots = [np.asarray(next(v[2] for (kind, _), v in at.items() if kind == "slot")) for at in logged]
    assert np.all(slots[1] == 0) and np.abs(slots[0]).max() > 1e-3, slots
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (found.step, found.kind) == (1, "slot"), found
    assert "times lr/lr at step 0 / at step 1 = 0:" in found.note, found.note
    assert "from lr 0" in found.note and "clipping" not in found.note, found.note


def test_an_adam_slot_under_a_decaying_lr_is_not_told_momentum() -> None:
    """From a review: an Adam first moment 13% apart (another beta1) under an lr decaying 10% per
    step, its slot rule loosened by an override, was told Keras SGD's momentum rule (ratio 1.11)."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison
    from tb_parity_plugin.engine.tolerance import ToleranceOverride, TolerancePolicy

    lrs = [np.float32(0.1 * 0.9**s) for s in range(3)]
    m = [np.full(4, 0.01 * s, np.float32) for s in range(3)]
    for name, scale, noted in (("dense/kernel/Adam:0", 1 / 0.9, False), ("dense/kernel/Momentum:0", 1 / 0.9, True)):
        moved = [m[0], m[1] * np.float32(scale), m[2] * np.float32(scale)]
        base = run("tf1", [series("lr", "lr", lrs), series("slot", name, m, order=1)])
        cand = run("tf2", [series("lr", "lr", lrs), series("slot", name, moved, order=1)])
        policy = TolerancePolicy(overrides=(ToleranceOverride("slot/*", rtol=0.05),))
        found = Comparison(base, cand, policy).report().first_divergence
        assert found is not None and found.kind == "slot", found
        assert ("Keras SGD keeps momentum" in (found.note or "")) == noted, found.note


def test_two_named_tf1_optimizers_of_one_class_on_one_variable_keep_their_slots_apart(tmp_path) -> None:
    """A main and an auxiliary loss on a shared encoder, each with its own named Adam: both sets of
    slots would take the class's spelling (``Adam``, ``Adam_1``) and collide ("logged twice"); the
    second keeps its own names."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        h = tf.compat.v1.layers.dense(x, 2, name="enc")
        main, aux = (tf.compat.v1.train.AdamOptimizer(0.01, name=n) for n in ("main", "aux"))
        main.minimize(tf.reduce_mean(tf.square(h)))
        aux.minimize(tf.reduce_mean(h))
        rec.variables(optimizer=[main, aux])
        names = sorted(t.name for t in rec.layout.tensors if t.kind == "slot" and "kernel" in t.name)
    assert names == ["enc/kernel/Adam:0", "enc/kernel/Adam_1:0", "enc/kernel/aux:0", "enc/kernel/aux_1:0"], names
