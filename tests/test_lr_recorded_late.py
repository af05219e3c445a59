"""An lr recorded one update late, where both runs apply the same lr, is named as a recording slip.

A new user's custom-loop port recorded ``rec.lr(optimizer.learning_rate)``: tf_keras's optimizer
holds a schedule's value of its last update there, so read in the step before ``apply_gradients``
it is the previous step's lr. The port trained as TF1 did (numpy SGD on the real schedule), but its
recorded lr was TF1's one step earlier: DIVERGE at the first decay, told only "its schedule runs 1
step(s) behind: a step count read after its increment ...", and the user searched a faithful
schedule for a bug. Every weight at the next step agreeing, where the recorded lr would have moved
them out of tolerance, proves the update applied the baseline's lr. A port whose schedule really
lags (its update applies the lagged lr) keeps the plain schedule note.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(11)
X = RNG.standard_normal((64, 3)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, 64)]
W = (RNG.standard_normal((3, 3)) * 0.5).astype(np.float32)
BATCH, STEPS, DECAY_STEPS = 8, 8, 3


def numpy_lr(step: int) -> float:
    return 0.5 * 0.5 ** (step // DECAY_STEPS)


def numpy_sgd(lr_of: Any) -> list[np.ndarray]:
    """The dense layer's kernel before each step under plain SGD at ``lr_of(step)`` (bias likewise)."""
    w, b, kernels = W.astype(np.float64), np.zeros(3), []
    for s in range(STEPS):
        x, y = X[s * BATCH : (s + 1) * BATCH].astype(np.float64), Y[s * BATCH : (s + 1) * BATCH]
        kernels.append(w.copy())
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        d = (p - y) / len(x)
        w, b = w - lr_of(s) * x.T @ d, b - lr_of(s) * d.sum(0)
    return kernels


def train_tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 3])
        lr = rec.lr(tf.compat.v1.train.exponential_decay(0.5, gs, DECAY_STEPS, 0.5, staircase=True))
        logits = tf.compat.v1.layers.dense(x, 3, kernel_initializer=tf.constant_initializer(W), name="dense")
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(lr), loss, global_step=gs)
        rec.variables()
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, BATCH)


class _Lagged(tf.keras.optimizers.schedules.LearningRateSchedule):
    """A schedule that reads the step count one behind: a real bug, applied by the update."""

    def __init__(self, schedule: Any) -> None:
        self.schedule = schedule

    def __call__(self, step: Any) -> Any:
        return self.schedule(tf.maximum(step - 1, 0))

    def get_config(self) -> dict:
        return {}


def train_tf2(run_dir: str, lagged: bool) -> list[np.ndarray]:
    """The port: a ``tf.function`` loop; ``lagged`` applies a lagging schedule and records it, else
    the right schedule is applied and ``optimizer.learning_rate`` recorded. Returns the kernels."""
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.5, DECAY_STEPS, 0.5, staircase=True)
    if lagged:
        schedule = _Lagged(schedule)
    dense = tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(W), name="dense")
    model = tf.keras.Sequential([tf.keras.Input((3,)), dense])
    optimizer = tf.keras.optimizers.SGD(schedule)
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)
    kernels = []

    @tf.function(input_signature=[tf.TensorSpec([None, 3]), tf.TensorSpec([None, 3])])
    def step(x: Any, y: Any) -> None:
        with rec.step(optimizer.iterations, variables=model, optimizer=optimizer):
            rec.lr(schedule(optimizer.iterations) if lagged else optimizer.learning_rate)
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(y, model(x, training=True)))
            rec.minimize(optimizer, loss, model.trainable_variables, tape)

    for s in range(STEPS):
        kernels.append(dense.kernel.numpy())
        step(X[s * BATCH : (s + 1) * BATCH], Y[s * BATCH : (s + 1) * BATCH])
    rec.close()
    return kernels


def test_an_lr_recorded_one_update_late_is_told_that_both_runs_applied_the_same_lr(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    faithful = train_tf2(str(tmp_path / "late"), lagged=False)
    # numpy: the port trains as TF1 does on the real schedule, and records the lr one step late
    np.testing.assert_allclose(np.stack(faithful), np.stack(numpy_sgd(numpy_lr)), atol=2e-6)
    recorded = tensors_by_step(str(tmp_path / "late"))
    late = [float(recorded[s][("lr", "lr")][2]) for s in sorted(recorded)]
    np.testing.assert_allclose(late[1:], [numpy_lr(s - 1) for s in range(1, STEPS)], rtol=1e-6)
    d = compare(str(tmp_path), baseline="tf1", candidate="late").first_divergence
    assert d is not None and (d.step, d.kind) == (DECAY_STEPS, "lr"), d
    assert f"every recorded weight agrees at step {DECAY_STEPS + 1}" in (d.note or ""), d.note
    assert "both runs applied the same lr at step 3" in d.note and "optimizer.learning_rate" in d.note


def test_a_schedule_that_really_lags_keeps_the_schedule_note(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    lagged = train_tf2(str(tmp_path / "lagged"), lagged=True)
    # numpy: the lagging port applies lr(s - 1), and its kernel parts from TF1's at step DECAY_STEPS + 1
    np.testing.assert_allclose(np.stack(lagged), np.stack(numpy_sgd(lambda s: numpy_lr(max(s - 1, 0)))), atol=2e-6)
    assert np.abs(numpy_sgd(numpy_lr)[DECAY_STEPS + 1] - lagged[DECAY_STEPS + 1]).max() > 1e-3
    d = compare(str(tmp_path), baseline="tf1", candidate="lagged").first_divergence
    assert d is not None and (d.step, d.kind) == (DECAY_STEPS, "lr"), d
    assert "runs 1 step(s) behind" in (d.note or "") and "applied the same lr" not in d.note, d.note
