"""The TF1 original: graph, ``tf.compat.v1.layers.dense``, Session loop, ``global_step``."""

from __future__ import annotations

import warnings

import tensorflow as tf

from demo.common import LAYER_NAMES, UNITS, PairConfig, batch, data, initial_weights
from tb_parity_plugin import summary_v1


def train(run_dir: str, cfg: PairConfig) -> None:
    """Trains ``cfg.steps`` steps, logging lr, weights, layer outputs, loss and grads."""
    x_np, y_np = data(cfg)
    # The original is TF1 code on purpose; its deprecation notices are noise here.
    warnings.filterwarnings("ignore", message=r"`tf.layers.dense` is deprecated")
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        batch_dim = None if cfg.last_batch is not None else x_np.shape[1]  # shape-agnostic code: [None, n]
        x = tf.compat.v1.placeholder(tf.float32, (batch_dim, *x_np.shape[2:]), name="x")
        y = tf.compat.v1.placeholder(tf.float32, (batch_dim, *y_np.shape[2:]), name="y")
        h = x
        for units, name, (kernel, bias) in zip(UNITS, LAYER_NAMES, initial_weights()):
            h = tf.compat.v1.layers.dense(
                h,
                units,
                kernel_initializer=tf.constant_initializer(kernel),
                bias_initializer=tf.constant_initializer(bias),
                name=name,
            )
            rec.activation(name, h)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, h))
        lr = rec.lr(
            tf.compat.v1.train.polynomial_decay(cfg.learning_rate, global_step, cfg.decay_steps, cfg.end_learning_rate)
        )
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(lr)
        train_op = rec.minimize(optimizer, loss, global_step=global_step)
        fetches = rec.fetches  # before the session runs anything: it orders every update after the reads
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(cfg.steps):
                xb, yb = batch(cfg, x_np, y_np, step)
                _, parity = sess.run([train_op, fetches], {x: xb, y: yb})
                rec.write(parity)
        rec.close()
