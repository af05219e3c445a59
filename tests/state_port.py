"""A TF1 ``Session`` original and a TF2 eager port that records a state of its own (a structure
divergence, at no step) and ports a ``piecewise_constant`` boundary one step early (the lrs part at
step 2, numpy); the tests check the first step divergence is named after the structure one."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from tb_parity_plugin import summary_v1, summary_v2


def write(root: str, steps: int = 5) -> np.ndarray:
    """A TF1 ``Session`` original (``piecewise_constant`` boundaries [2]) and its TF2 eager port,
    which keeps a KL-annealing weight of its own (a ``state`` TF1 has not: a structure divergence)
    and ports the schedule's boundaries as [1]; returns both lrs per step, in numpy."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * 4, 3)).astype(np.float32)
    y = rng.standard_normal((steps * 4, 1)).astype(np.float32)
    init = tf.keras.initializers.Constant(rng.standard_normal((3, 1)).astype(np.float32))
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(os.path.join(root, "tf1"))
        xs, ys = tf.compat.v1.placeholder(tf.float32, [None, 3]), tf.compat.v1.placeholder(tf.float32, [None, 1])
        global_step = tf.compat.v1.train.get_or_create_global_step()
        out = rec.activation("dense", tf.compat.v1.layers.dense(xs, 1, kernel_initializer=init, name="dense"))
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(ys, out))
        lr = rec.lr(tf.compat.v1.train.piecewise_constant(global_step, [2], [0.1, 0.01]))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(lr), loss, global_step=global_step)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(steps):
                rec.write(sess.run([train_op, fetches], {xs: x[s * 4 : s * 4 + 4], ys: y[s * 4 : s * 4 + 4]})[1])
        rec.close()
    rec = summary_v2.Recorder(os.path.join(root, "tf2"))
    dense = tf.keras.layers.Dense(1, kernel_initializer=init, name="dense")
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay([1], [0.1, 0.01])
    opt = tf.keras.optimizers.SGD(schedule)
    beta = tf.Variable(0.0, trainable=False, name="kl_beta")
    for s in range(steps):
        with rec.step(opt.iterations):
            rec.lr(schedule(opt.iterations))
            rec.tensor("state", "kl_beta", beta)
            with tf.GradientTape() as tape:
                out = rec.activation("dense", dense(x[s * 4 : s * 4 + 4]))
                loss = rec.loss(tf.reduce_mean(tf.square(y[s * 4 : s * 4 + 4] - out)))
            rec.minimize(opt, loss, dense.trainable_variables, tape)
        beta.assign_add(0.25)
    rec.close()
    s = np.arange(steps)
    return np.stack([np.where(s <= 2, 0.1, 0.01), np.where(s <= 1, 0.1, 0.01)])
