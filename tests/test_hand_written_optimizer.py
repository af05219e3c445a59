"""A ``tf.Module`` port with a hand-written momentum update, against TF1's ``MomentumOptimizer``.

The migration guide's non-Keras ports keep their weights and the optimizer's slots as plain
``tf.Variable``s, loaded from the TF1 checkpoint, and write the update by hand. A new user's port
folded the lr into its slot (``m = momentum*m + lr*g; var -= m``) where TF1 keeps the accumulator
(``m = momentum*m + g; var -= lr*m``): the two train alike until the lr changes, and the slot is
TF1's times the lr from the first update. The slot's note blamed clipping or dampening for that
factor, 0.1, which was the recorded lr. A momentum kept as Adam's first moment
(``m = momentum*m + (1 - momentum)*g``) is the same factor when the lr is 1 - momentum, and is not
told so: its weights move otherwise from the first update.

A port that passed its own optimizer module to ``rec.step(..., optimizer=opt)`` had none of its
slots recorded, silently (they were looked for under Keras's ``m/<variable>`` spelling), and the
structure report asked it for ``optimizer=opt``.

A faithful RMSProp port without momentum was a structure DIVERGE on TF1's momentum slot
``RMSProp_1``, which TF1 makes even with momentum=0, with no word of the ``--allow-unmatched`` the
README gives for it.

Each expectation is checked against a numpy replay of TF1's rule first.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(11)
STEPS, BATCH, MOMENTUM = 6, 8, 0.9
DECAY = 0.9  # the moving average's, in train_tf1(averaged=True) and AveragedMomentum
LR0, DECAY_STEPS = 0.1, 3  # staircase: 0.1 at steps 0-2, 0.05 at 3-5
X = RNG.normal(size=(STEPS * BATCH, 4)).astype(np.float32)
Y = RNG.normal(size=(STEPS * BATCH, 2)).astype(np.float32)
K0 = (RNG.normal(size=(4, 2)) * 0.5).astype(np.float32)


def lr_at(step: int) -> float:
    return LR0 * 0.5 ** (step // DECAY_STEPS)


def numpy_tf1() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """TF1's momentum on a bias-free linear layer (MSE), in float64: the kernel and the
    accumulator before each step."""
    w, acc, ws, accs = K0.astype(np.float64), np.zeros((4, 2)), [], []
    for step in range(STEPS):
        xb, yb = X[step * BATCH : (step + 1) * BATCH], Y[step * BATCH : (step + 1) * BATCH]
        g = 2 * xb.T @ (xb @ w - yb) / yb.size
        ws.append(w.copy())
        accs.append(acc.copy())
        acc = MOMENTUM * acc + g
        w = w - lr_at(step) * acc
    return ws, accs


def train_tf1(
    run_dir: str,
    optimizer: Callable[[tf.Tensor], Any] = lambda lr: tf.compat.v1.train.MomentumOptimizer(lr, MOMENTUM),
    averaged: bool = False,
) -> None:
    """The TF1 original on the dense layer under its staircase schedule; ``optimizer`` of the lr
    (Momentum unless given); ``averaged``: an ``ExponentialMovingAverage`` (decay ``DECAY``) of the
    weights after each update."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        y = tf.compat.v1.placeholder(tf.float32, [None, 2])
        with tf.compat.v1.variable_scope("dense"):
            kernel = tf.compat.v1.get_variable("kernel", initializer=K0)
        out = rec.activation("dense", tf.matmul(x, kernel))
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        lr = rec.lr(tf.compat.v1.train.exponential_decay(LR0, gs, DECAY_STEPS, 0.5, staircase=True))
        opt = optimizer(lr)
        train_op = rec.minimize(opt, loss, global_step=gs)
        if averaged:
            with tf.control_dependencies([train_op]):
                train_op = tf.compat.v1.train.ExponentialMovingAverage(DECAY).apply(tf.compat.v1.trainable_variables())
        rec.variables(optimizer=opt)
        train(rec, train_op, [x, y], [X, Y], STEPS, BATCH)


class Linear(tf.Module):
    def __init__(self) -> None:
        super().__init__(name="dense")
        with self.name_scope:
            self.kernel = tf.Variable(K0, name="kernel")


class HandMomentum(tf.Module):
    """TF1's rule, ``m = momentum*m + g; var -= lr*m``, with its slots named ``<variable>/momentum``
    (under the module's own name scope when ``scoped``), or ``accumulator_<k>`` when not ``named``."""

    def __init__(self, var_list: list, scoped: bool = False, named: bool = True) -> None:
        super().__init__(name="hand_momentum")
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        names = [v.name[:-2] + "/momentum" if named else f"accumulator_{k}" for k, v in enumerate(var_list)]
        with self.name_scope if scoped else contextlib.nullcontext():
            self.slots = [tf.Variable(tf.zeros_like(v), trainable=False, name=n) for v, n in zip(var_list, names)]

    def apply(self, grads: list, var_list: list, lr: tf.Tensor) -> None:
        for g, v, m in zip(grads, var_list, self.slots):
            m.assign(MOMENTUM * m + g)
            v.assign_sub(lr * m)
        self.iterations.assign_add(1)


class LrFoldedMomentum(HandMomentum):
    """``m = momentum*m + lr*g; var -= m``: a velocity in weight units."""

    def apply(self, grads: list, var_list: list, lr: tf.Tensor) -> None:
        for g, v, m in zip(grads, var_list, self.slots):
            m.assign(MOMENTUM * m + lr * g)
            v.assign_sub(m)
        self.iterations.assign_add(1)


class EmaMomentum(HandMomentum):
    """``m = momentum*m + (1 - momentum)*g; var -= lr*m``: Adam's first moment for a momentum. With
    lr 0.1 and momentum 0.9 its first slot is TF1's times 0.1 = lr as well, but it moves the weights
    otherwise from the first update."""

    def apply(self, grads: list, var_list: list, lr: tf.Tensor) -> None:
        for g, v, m in zip(grads, var_list, self.slots):
            m.assign(MOMENTUM * m + (1 - MOMENTUM) * g)
            v.assign_sub(lr * m)
        self.iterations.assign_add(1)


def train_port(run_dir: str, optimizer: type = LrFoldedMomentum, as_optimizer: bool = False, **kw: bool) -> None:
    """The port; its slots recorded one by one with ``rec.tensor``, or by ``rec.step(..., optimizer=opt)``."""
    model = Linear()
    variables = list(model.trainable_variables)
    opt = optimizer(variables, **kw)
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(LR0, DECAY_STEPS, 0.5, staircase=True)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt if as_optimizer else None):
            if not as_optimizer:
                for slot in opt.slots:
                    rec.tensor("slot", slot.name[:-2], slot)
            lr = rec.lr(schedule(opt.iterations))
            with tf.GradientTape() as tape:
                out = rec.activation("dense", tf.matmul(x, model.kernel))
                loss = rec.loss(tf.reduce_mean(tf.square(y - out)))
            grads = tape.gradient(loss, variables)
            rec.grads(grads, variables)
            opt.apply(grads, variables, lr)

    for s in range(STEPS):
        step(X[s * BATCH : (s + 1) * BATCH], Y[s * BATCH : (s + 1) * BATCH])
    rec.close()


def test_a_slot_holding_lr_times_tf1s_accumulator_is_told_so(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_port(str(tmp_path / "tf2"))
    weights, accs = numpy_tf1()
    port = tensors_by_step(str(tmp_path / "tf2"))
    for s in range(STEPS):
        kernel = port[s][("weight", "dense/kernel:0")][2]
        slot = port[s][("slot", "dense/kernel/momentum")][2]
        # the velocity is lr x TF1's accumulator while the lr has not changed (steps 0-3)...
        if s <= DECAY_STEPS:
            np.testing.assert_allclose(slot, LR0 * accs[s], rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(kernel, weights[s], rtol=1e-5, atol=1e-7)
    # ...and the weights part once an update's lr differs from the one before (step 3's): at step 4
    assert np.abs(port[4][("weight", "dense/kernel:0")][2] - weights[4]).max() > 1e-3

    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind) == (1, "slot"), first
    note = first.note or ""
    assert "times 0.1 = lr (0.1): the candidate holds this slot as a velocity in weight units" in note, note
    assert "dampening" not in note, note


def test_a_moving_average_momentum_is_not_told_it_holds_lr_units(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_port(str(tmp_path / "tf2"), EmaMomentum)
    weights, accs = numpy_tf1()
    port = tensors_by_step(str(tmp_path / "tf2"))
    # its first slot is TF1's times 1 - momentum = 0.1 = lr, and its weight has moved otherwise already
    assert abs(1 - MOMENTUM - LR0) < 1e-12
    np.testing.assert_allclose(port[1][("slot", "dense/kernel/momentum")][2], LR0 * accs[1], rtol=1e-5, atol=1e-7)
    assert np.abs(port[1][("weight", "dense/kernel:0")][2] - weights[1]).max() > 1e-3

    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (1, "weight"), first
    slot = next(d for d in report.divergences_at_first_step if d.kind == "slot")
    assert "velocity" not in (slot.note or ""), slot.note


@pytest.mark.parametrize("scoped", [False, True], ids=["unscoped", "scoped"])
def test_an_own_optimizer_given_to_step_has_its_slots_recorded(tmp_path, scoped: bool) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_port(str(tmp_path / "tf2"), HandMomentum, as_optimizer=True, scoped=scoped)
    weights, accs = numpy_tf1()
    port = tensors_by_step(str(tmp_path / "tf2"))
    for s in range(STEPS):
        np.testing.assert_allclose(port[s][("weight", "dense/kernel:0")][2], weights[s], rtol=1e-5, atol=1e-7)
        # recorded under the variable's name, whatever scope the module made it in
        np.testing.assert_allclose(port[s][("slot", "dense/kernel/momentum")][2], accs[s], rtol=1e-5, atol=1e-7)
    assert not any(kind == "state" for kind, _ in port[0]), sorted(port[0])
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree and report.tensors_compared == 6, (report.first_divergence, report.tensors_compared)


def test_an_own_optimizer_whose_slots_are_not_named_after_their_variables_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"rec.tensor\('slot', '<variable>/momentum', slot\)"):
        train_port(str(tmp_path / "tf2"), HandMomentum, as_optimizer=True, named=False)


class HandSGD(tf.Module):
    """Plain SGD written by hand: a step counter, no slot."""

    def __init__(self, var_list: list) -> None:
        super().__init__(name="hand_sgd")
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        self.slots: list = []

    def apply(self, grads: list, var_list: list, lr: tf.Tensor) -> None:
        for g, v in zip(grads, var_list):
            v.assign_sub(lr * g)
        self.iterations.assign_add(1)


def test_an_own_optimizer_without_slots_is_not_refused(tmp_path) -> None:
    """It holds no variable of a trained variable's shape (its counter alone): nothing to record, and
    nothing misnamed to refuse."""
    train_port(str(tmp_path / "tf2"), HandSGD, as_optimizer=True)
    port = tensors_by_step(str(tmp_path / "tf2"))
    assert len(port) == STEPS and not any(kind == "slot" for kind, _ in port[0]), sorted(port[0])


EPSILON = 1e-3


def numpy_tf1_rmsprop() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """TF1's RMSProp (decay 0.9, momentum 0; the mean square starts at 1, epsilon inside the square
    root) on the same layer, in float64: the kernel and the mean square before each step."""
    w, ms, ws, mss = K0.astype(np.float64), np.ones((4, 2)), [], []
    for step in range(STEPS):
        xb, yb = X[step * BATCH : (step + 1) * BATCH], Y[step * BATCH : (step + 1) * BATCH]
        g = 2 * xb.T @ (xb @ w - yb) / yb.size
        ws.append(w.copy())
        mss.append(ms.copy())
        ms = 0.9 * ms + 0.1 * g * g
        w = w - lr_at(step) * g / np.sqrt(ms + EPSILON)
    return ws, mss


class HandRMSProp(tf.Module):
    """TF1's RMSProp without momentum, its mean square named ``<variable>/rms``."""

    def __init__(self, var_list: list) -> None:
        super().__init__(name="hand_rmsprop")
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        self.slots = [tf.Variable(tf.ones_like(v), trainable=False, name=v.name[:-2] + "/rms") for v in var_list]

    def apply(self, grads: list, var_list: list, lr: tf.Tensor) -> None:
        for g, v, ms in zip(grads, var_list, self.slots):
            ms.assign(0.9 * ms + 0.1 * tf.square(g))
            v.assign_sub(lr * g / tf.sqrt(ms + EPSILON))
        self.iterations.assign_add(1)


def test_tf1s_unused_rmsprop_momentum_is_named_with_its_allow_unmatched(tmp_path) -> None:
    train_tf1(
        str(tmp_path / "tf1"),
        lambda lr: tf.compat.v1.train.RMSPropOptimizer(lr, decay=0.9, momentum=0.0, epsilon=EPSILON),
    )
    train_port(str(tmp_path / "tf2"), HandRMSProp, as_optimizer=True)
    weights, mean_squares = numpy_tf1_rmsprop()
    tf1, port = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    for s in range(STEPS):
        for run in (tf1, port):
            np.testing.assert_allclose(run[s][("weight", "dense/kernel:0")][2], weights[s], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(port[s][("slot", "dense/kernel/rms")][2], mean_squares[s], rtol=1e-5, atol=1e-7)
        if s:  # TF1's momentum slot, with momentum 0, holds the last update
            moved = weights[s - 1] - weights[s]
            np.testing.assert_allclose(tf1[s][("slot", "dense/kernel/RMSProp_1:0")][2], moved, rtol=1e-4, atol=1e-8)

    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and first.reason == "structure" and first.tensor == "dense/kernel/RMSProp_1:0", first
    assert "makes this momentum slot even with momentum=0" in (first.note or ""), first.note
    assert "--allow-unmatched '*RMSProp_1*'" in (first.note or ""), first.note
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*RMSProp_1*"])
    assert report.agree, report.first_divergence


class ParamSGD(HandSGD):
    """Plain SGD written by hand that holds the parameters it updates (``SGD(params)``, as in PyTorch)."""

    def __init__(self, var_list: list) -> None:
        super().__init__(var_list)
        self.params = list(var_list)


def test_an_own_optimizer_holding_its_parameters_records_them_as_weights(tmp_path) -> None:
    """The kernel it holds is the model's, of a trained variable's shape: it was taken for a misnamed
    slot, refused at the first step (and, as one of the optimizer's own variables, left unrecorded)."""
    train_port(str(tmp_path / "tf2"), ParamSGD, as_optimizer=True)
    w, want = K0.astype(np.float64), []
    for step in range(STEPS):
        xb, yb = X[step * BATCH : (step + 1) * BATCH], Y[step * BATCH : (step + 1) * BATCH]
        want.append(w.copy())
        w = w - lr_at(step) * 2 * xb.T @ (xb @ w - yb) / yb.size
    port = tensors_by_step(str(tmp_path / "tf2"))
    for s in range(STEPS):
        np.testing.assert_allclose(port[s][("weight", "dense/kernel:0")][2], want[s], rtol=1e-5, atol=1e-7)
    assert not any(kind == "slot" for kind, _ in port[0]), sorted(port[0])


class AveragedMomentum(HandMomentum):
    """TF1's rule, keeping an ``ExponentialMovingAverage`` of the weights it updates (its shadows
    ``dense/kernel/ExponentialMovingAverage``, of the kernel's shape)."""

    def __init__(self, var_list: list, **kw: bool) -> None:
        super().__init__(var_list, **kw)
        self.ema = tf.train.ExponentialMovingAverage(DECAY)
        self.ema.apply(var_list)
        self.shadows = [self.ema.average(v) for v in var_list]

    def apply(self, grads: list, var_list: list, lr: tf.Tensor) -> None:
        super().apply(grads, var_list, lr)
        self.ema.apply(var_list)


def test_an_own_optimizers_moving_average_is_state_as_tf1s(tmp_path) -> None:
    """TF1 records its shadow as ``state``; the port's, named so, was recorded as a slot: a
    structure DIVERGE on a faithful port."""
    train_tf1(str(tmp_path / "tf1"), averaged=True)
    train_port(str(tmp_path / "tf2"), AveragedMomentum, as_optimizer=True)
    weights, accs = numpy_tf1()
    average = [K0.astype(np.float64)]
    for s in range(1, STEPS):
        average.append(DECAY * average[-1] + (1 - DECAY) * weights[s])
    port = tensors_by_step(str(tmp_path / "tf2"))
    for s in range(STEPS):
        np.testing.assert_allclose(port[s][("weight", "dense/kernel:0")][2], weights[s], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(port[s][("slot", "dense/kernel/momentum")][2], accs[s], rtol=1e-5, atol=1e-7)
        shadow = port[s][("state", "dense/kernel/ExponentialMovingAverage")][2]
        np.testing.assert_allclose(shadow, average[s], rtol=1e-5, atol=1e-7)
    assert ("slot", "dense/kernel/ExponentialMovingAverage") not in port[0], sorted(port[0])
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree and report.tensors_compared == 7, (report.first_divergence, report.tensors_compared)


class ScaledLinear(tf.Module):
    """The layer with a learnable scalar output scale: a trained variable of the shape of a step counter."""

    def __init__(self) -> None:
        super().__init__(name="dense")
        with self.name_scope:
            self.kernel = tf.Variable(K0, name="kernel")
            self.scale = tf.Variable(1.0, name="scale")


class HandSGDWithRate(HandSGD):
    """Plain SGD keeping its learning rate as a float32 scalar variable (the scale's shape and dtype)."""

    def __init__(self, var_list: list) -> None:
        super().__init__(var_list)
        self.learning_rate = tf.Variable(LR0, trainable=False, name="learning_rate")


@pytest.mark.parametrize("optimizer", [HandSGD, HandSGDWithRate], ids=["int64 counter", "float32 rate"])
def test_an_own_sgd_whose_counter_has_a_scalar_weights_shape_is_not_refused(tmp_path, optimizer: type) -> None:
    """Its int64 step counter has the float32 scale's shape, (): it was refused as a misnamed slot; a
    float32 learning-rate variable has its dtype too, and was refused the same way."""
    model = ScaledLinear()
    variables = list(model.trainable_variables)
    opt = optimizer(variables)
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    for s in range(STEPS):
        xb, yb = X[s * BATCH : (s + 1) * BATCH], Y[s * BATCH : (s + 1) * BATCH]
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                loss = rec.loss(tf.reduce_mean(tf.square(model.scale * tf.matmul(xb, model.kernel) - yb)))
            grads = tape.gradient(loss, variables)
            rec.grads(grads, variables)
            opt.apply(grads, variables, tf.constant(LR0))
    rec.close()
    w, a, want = K0.astype(np.float64), 1.0, []
    for s in range(STEPS):
        xb, yb = X[s * BATCH : (s + 1) * BATCH].astype(np.float64), Y[s * BATCH : (s + 1) * BATCH]
        want.append((w.copy(), a))
        err = 2 * (a * xb @ w - yb) / yb.size
        w, a = w - LR0 * a * xb.T @ err, a - LR0 * float(np.sum(err * (xb @ w)))
    port = tensors_by_step(str(tmp_path / "tf2"))
    for s in range(STEPS):
        np.testing.assert_allclose(port[s][("weight", "dense/kernel:0")][2], want[s][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(port[s][("weight", "dense/scale:0")][2], want[s][1], rtol=1e-5, atol=1e-6)
    assert not any(kind == "slot" for kind, _ in port[0]), sorted(port[0])
