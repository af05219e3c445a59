"""A noam schedule guarded against step 0 in the port, where TF1 evaluates it at step 0 itself.

tensor2tensor-style TF1 code reads ``d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)`` from
``global_step``: at step 0, ``min(inf, 0)`` is 0. A port's ``LearningRateSchedule`` that guards the
division with ``tf.maximum(step, 1)`` takes step 1's lr at step 0 and agrees at every later step. A
trial's Transformer port so written was told one phase of its schedule ran a step ahead, "as a warm-up
counted from 1 against 0 ((step + 1) / warmup_steps) before a decay": its warm-up reads the step itself.
Expected values: the schedule in numpy.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

D, WARMUP, STEPS = 8, 4, 4
X = np.random.default_rng(0).standard_normal((STEPS * 2, 3)).astype(np.float32)
Y = np.eye(2, dtype=np.float32)[np.arange(STEPS * 2) % 2]
KERNEL = np.random.default_rng(1).standard_normal((3, 2)).astype(np.float32)


def noam(step: np.ndarray) -> np.ndarray:
    s = np.asarray(step, np.float64)
    with np.errstate(divide="ignore"):
        return D**-0.5 * np.minimum(s**-0.5, s * WARMUP**-1.5)


def train_tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 2])
        logits = tf.compat.v1.layers.dense(x, 2, name="dense", kernel_initializer=tf.constant_initializer(KERNEL))
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        step = tf.cast(gs, tf.float32)
        lr = rec.lr(D**-0.5 * tf.minimum(step**-0.5, step * WARMUP**-1.5))
        opt = tf.compat.v1.train.AdamOptimizer(lr, beta2=0.98, epsilon=1e-9)
        train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        train(rec, train_op, [x, y], [X, Y], STEPS, 2)


class Noam(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, guarded: bool) -> None:
        self.guarded = guarded

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        if self.guarded:  # "avoid the division by zero at step 0"
            step = tf.maximum(step, 1.0)
        return D**-0.5 * tf.minimum(tf.math.rsqrt(step), step * WARMUP**-1.5)


def train_port(run_dir: str, guarded: bool) -> None:
    dense = tf.keras.layers.Dense(2, name="dense")
    model = tf.keras.Sequential([tf.keras.Input((3,)), dense])
    dense.set_weights([KERNEL, np.zeros(2, np.float32)])
    schedule = Noam(guarded)
    opt = tf.keras.optimizers.Adam(schedule, beta_2=0.98, epsilon=1e-9)
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(schedule(opt.iterations))
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(y, model(x)))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for s in range(STEPS):
        step(tf.constant(X[2 * s : 2 * s + 2]), tf.constant(Y[2 * s : 2 * s + 2]))
    rec.close()


def test_a_noam_schedule_guarded_at_step_0_is_told_so_not_a_shifted_warmup(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_port(str(tmp_path / "faithful"), guarded=False)
    train_port(str(tmp_path / "guarded"), guarded=True)
    steps = np.arange(STEPS)
    for run, expected in (("tf1", noam(steps)), ("faithful", noam(steps)), ("guarded", noam(np.maximum(steps, 1)))):
        recorded = tensors_by_step(str(tmp_path / run))
        lrs = [float(recorded[s][("lr", "lr")][2]) for s in range(STEPS)]
        np.testing.assert_allclose(lrs, expected, rtol=1e-6)
    # numpy: the guarded port's lr is step 1's at step 0 (TF1's is 0 there) and TF1's at every later step
    assert noam(0) == 0 and noam(np.maximum(steps, 1))[0] == noam(1) > 0

    assert compare(str(tmp_path), baseline="tf1", candidate="faithful").agree
    d = compare(str(tmp_path), baseline="tf1", candidate="guarded").first_divergence
    assert d is not None and (d.step, d.kind) == (0, "lr"), d
    note = d.note or ""
    assert "differ at step 0 alone and agree from step 1 on" in note, note
    assert "the candidate's value at step 0 is the one both have at step 1" in note, note
    assert "tf.maximum(step, 1)" in note and "warm-up counted from 1" not in note, note
