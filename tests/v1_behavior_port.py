"""A TF1 training script as users run it under ``disable_v2_behavior()``: legacy ref variables,
v1 control flow, ``placeholder([None, 8])`` inputs, batch normalization with a ``training``
placeholder updated through ``UPDATE_OPS``, momentum. Its initial weights and batches come from
the ``.npz`` the test writes (``w1, b1, w2, b2, xs, ys``), so the Keras ``fit`` port in
``test_v1_behavior_port.py`` can start from the same. Run in its own process: the switch is
process-wide. Usage: ``v1_behavior_port.py RUN_DIR DATA.npz``."""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

from tb_parity_plugin import summary_v1

tf.compat.v1.disable_v2_behavior()
out, data = sys.argv[1], np.load(sys.argv[2])
init = tf.compat.v1.constant_initializer
rec = summary_v1.Recorder(out)
gs = tf.compat.v1.train.get_or_create_global_step()
x = tf.compat.v1.placeholder(tf.float32, [None, 8])
y = tf.compat.v1.placeholder(tf.float32, [None, 1])
training = tf.compat.v1.placeholder(tf.bool, [])
h = tf.compat.v1.layers.dense(
    x, 16, tf.nn.relu, kernel_initializer=init(data["w1"]), bias_initializer=init(data["b1"]), name="dense"
)
h = tf.compat.v1.layers.batch_normalization(h, training=training, name="batch_normalization")
pred = tf.compat.v1.layers.dense(
    h, 1, kernel_initializer=init(data["w2"]), bias_initializer=init(data["b2"]), name="dense_1"
)
loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, pred))
rec.lr(tf.constant(float(data["lr"])))
opt = tf.compat.v1.train.MomentumOptimizer(float(data["lr"]), 0.9)
with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
    train_op = rec.minimize(opt, loss, global_step=gs)
rec.variables(optimizer=opt)
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    for i in range(len(data["xs"])):
        _, parity = sess.run([train_op, rec.fetches], {x: data["xs"][i], y: data["ys"][i], training: True})
        rec.write(parity)
rec.close()
