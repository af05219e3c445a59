"""A port's optimizer written as a subclass of Keras ``SGD`` with TF1's momentum rule.

The README says no Keras ``SGD(momentum=...)`` matches ``MomentumOptimizer`` under a schedule, so a
port needs TF1's rule: a new user wrote it into an ``SGD`` subclass's ``update_step`` (the slot is
TF1's accumulator ``a = momentum*a + g``), trained with ``fit`` under ``PiecewiseConstantDecay``. The
shim divided that slot by ``-lr`` as if Keras's own rule kept it: a false DIVERGE at step 1,
cosine -1, with a note about clipping and weight decay. A subclass that overrides the update rule
now has its slot recorded as held; Keras's own rule is still recorded in lr units.

Each expectation is checked against a numpy replay of TF1's Nesterov momentum first.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(5)
STEPS, BATCH, MOMENTUM = 6, 8, 0.9
BOUNDARIES, LRS = [2, 4], [0.1, 0.05, 0.02]
X = RNG.normal(size=(STEPS * BATCH, 4)).astype(np.float32)
Y = RNG.normal(size=(STEPS * BATCH, 1)).astype(np.float32)
K0 = RNG.normal(size=(4, 1)).astype(np.float32) * 0.5


def numpy_accumulators() -> list[np.ndarray]:
    """TF1's Nesterov momentum on the kernel of a bias-free linear regression (MSE), in float64:
    its accumulator before each step."""
    w, acc, out = K0.astype(np.float64), np.zeros((4, 1)), []
    for step in range(STEPS):
        lr = LRS[int(np.searchsorted(BOUNDARIES, step, side="left"))]
        xb, yb = X[step * BATCH : (step + 1) * BATCH], Y[step * BATCH : (step + 1) * BATCH]
        g = 2 * xb.T @ (xb @ w - yb) / BATCH
        out.append(acc.copy())
        acc = MOMENTUM * acc + g
        w = w - lr * (g + MOMENTUM * acc)
    return out


def train_tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        out = tf.compat.v1.layers.dense(
            x, 1, use_bias=False, kernel_initializer=tf.constant_initializer(K0), name="dense"
        )
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, rec.activation("dense", out)))
        lr = rec.lr(tf.compat.v1.train.piecewise_constant(gs, BOUNDARIES, LRS))
        opt = tf.compat.v1.train.MomentumOptimizer(lr, MOMENTUM, use_nesterov=True)
        train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(STEPS):
                feed = {x: X[step * BATCH : (step + 1) * BATCH], y: Y[step * BATCH : (step + 1) * BATCH]}
                rec.write(sess.run([train_op, rec.fetches], feed)[1])
        rec.close()


class TF1StyleSGD(tf.keras.optimizers.SGD):
    """TF1's ``MomentumOptimizer(use_nesterov=True)`` rule, written as a user writes it."""

    def update_step(self, gradient, variable):  # type: ignore[no-untyped-def]
        lr = tf.cast(self.learning_rate, variable.dtype)
        m = self.momentums[self._index_dict[self._var_key(variable)]]
        m.assign(self.momentum * m + gradient)
        variable.assign_sub(lr * (gradient + self.momentum * m))


class RenamedSGD(tf.keras.optimizers.SGD):
    """Keras's own rule under another class name."""


class CountingSGD(tf.keras.optimizers.SGD):
    """Keras's own rule, called from an override that adds to it."""

    def update_step(self, gradient, variable):  # type: ignore[no-untyped-def]
        return super().update_step(gradient, variable)


def train_port(run_dir: str, optimizer: tf.keras.optimizers.Optimizer, steps: int = STEPS) -> None:
    model = tf.keras.Sequential(
        [
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(1, use_bias=False, kernel_initializer=tf.constant_initializer(K0), name="dense"),
        ]
    )
    model.compile(optimizer, "mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["dense"])
    model.fit(X[: steps * BATCH], Y[: steps * BATCH], batch_size=BATCH, shuffle=False, epochs=1, verbose=0)
    rec.close()


def schedule() -> tf.keras.optimizers.schedules.LearningRateSchedule:
    return tf.keras.optimizers.schedules.PiecewiseConstantDecay(BOUNDARIES, LRS)


def test_a_subclass_with_tf1s_rule_agrees_and_records_its_slot_as_held(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_port(str(tmp_path / "tf2"), TF1StyleSGD(schedule(), momentum=MOMENTUM, nesterov=True))
    want = numpy_accumulators()
    tf1, port = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    for step in range(STEPS):
        np.testing.assert_allclose(
            tf1[step][("slot", "dense/kernel/Momentum:0")][2].ravel(), want[step].ravel(), rtol=1e-5, atol=1e-7
        )
        (slot,) = (v for (kind, _), v in port[step].items() if kind == "slot")
        np.testing.assert_allclose(
            np.ravel(slot[2]), want[step].ravel(), rtol=1e-5, atol=1e-7
        )  # TF1's accumulator, as held
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence


@pytest.mark.parametrize("optimizer", ["keras", "renamed", "calls_super"])
def test_keras_own_rule_is_still_recorded_in_lr_units(tmp_path, optimizer: str) -> None:
    """Keras SGD (and a subclass that keeps its rule) under the schedule: its slot in lr units is
    TF1's accumulator up to the first lr change, and the real difference after it is still found
    at step 3, the first step the old velocity is scaled by another lr (numpy: lr(2)/lr(3) = 2.5
    on the velocity of step 2's accumulator)."""
    make = {"keras": tf.keras.optimizers.SGD, "renamed": RenamedSGD, "calls_super": CountingSGD}[optimizer]
    train_tf1(str(tmp_path / "tf1"))
    train_port(str(tmp_path / "tf2"), make(schedule(), momentum=MOMENTUM, nesterov=True))
    want = numpy_accumulators()
    port = tensors_by_step(str(tmp_path / "tf2"))
    for step in range(3):
        (slot,) = (v for (kind, _), v in port[step].items() if kind == "slot")
        np.testing.assert_allclose(np.ravel(slot[2]), want[step].ravel(), rtol=1e-5, atol=1e-7)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind) == (3, "slot"), first


def test_a_slot_held_as_keras_velocity_against_tf1s_accumulator_says_so() -> None:
    """A slot recorded as Keras SGD holds it (``-lr x accumulator``, a subclass the shim cannot read)
    against TF1's accumulator: cosine -1, blamed on clipping or a weight decay. The note names the
    factor as -lr and which run holds which units, either way round."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    acc = numpy_accumulators()
    grads = [np.ones(4, np.float32) * (s + 1) for s in range(3)]
    tf1_acc = [a.ravel().astype(np.float32) for a in acc[:3]]  # 0 before the first update
    velocity = [(-0.1 * a).astype(np.float32) for a in tf1_acc]

    def side(name: str, slot: list) -> object:
        return run(
            name,
            [
                series("lr", "lr", [np.float32(0.1)] * 3),
                series("grad", "dense/kernel:0", grads, order=1),
                series("slot", "dense/kernel/Momentum:0", slot, order=2),
            ],
        )

    for base, cand, held in ((tf1_acc, velocity, "candidate"), (velocity, tf1_acc, "baseline")):
        found = Comparison(side("tf1", base), side("tf2", cand)).report().first_divergence
        assert found is not None and (found.step, found.kind) == (1, "slot"), found
        assert f"the {held} holds this slot as Keras SGD's velocity (-lr x accumulator)" in (found.note or ""), found
