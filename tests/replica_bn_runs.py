"""A TF1 one-device baseline and its Keras port under MirroredStrategy on two logical CPUs, with a
plain (unsynchronized) batch normalization named ``bn1`` after a dense layer, as a new user's U-Net
named its layers. Run as a script (``python tests/replica_bn_runs.py RUN_DIR WHICH LIMIT``; the
logical devices must be configured before TensorFlow touches a device, so each run gets a fresh
process). WHICH: ``tf1`` or ``tf2``; LIMIT: the recorder's ``full_values_limit`` (below the dense
output's 1024 elements, that output and the batch norm's are compared by statistics).

numpy: :func:`reference` gives the first step's batch-norm output on one device and per replica.
"""

from __future__ import annotations

import os
import sys

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STEPS, BATCH, FEATURES, UNITS, LR, EPSILON = 3, 16, 6, 64, 0.1, 1e-3


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((STEPS * BATCH, FEATURES)).astype(np.float32)
    x[: STEPS * BATCH : 2] += 2.0  # the two halves of each batch have other statistics
    y = rng.standard_normal((STEPS * BATCH, 1)).astype(np.float32)
    kernel = (rng.standard_normal((FEATURES, UNITS)) * 0.3).astype(np.float32)
    return x, y, kernel


def reference() -> tuple[np.ndarray, np.ndarray]:
    """float64, step 0: (batch norm over the global batch, batch norm over each replica's half)."""
    x, _, kernel = data()
    h = x[:BATCH].astype(np.float64) @ kernel.astype(np.float64)

    def norm(a: np.ndarray) -> np.ndarray:
        return (a - a.mean(0)) / np.sqrt(a.var(0) + EPSILON)

    return norm(h), np.concatenate([norm(h[: BATCH // 2]), norm(h[BATCH // 2 :])])


def tf1(run_dir: str, limit: int) -> None:
    import tensorflow as tf

    from tb_parity_plugin import summary_v1

    x, y, kernel = data()
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir, full_values_limit=limit)
        gs = tf.compat.v1.train.get_or_create_global_step()
        xs = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
        ys = tf.compat.v1.placeholder(tf.float32, [None, 1])
        h = rec.activation(
            "dense",
            tf.compat.v1.layers.dense(
                xs, UNITS, use_bias=False, kernel_initializer=tf.constant_initializer(kernel), name="dense"
            ),
        )
        bn = rec.activation("bn1", tf.compat.v1.layers.batch_normalization(h, training=True, name="bn1"))
        out = tf.compat.v1.layers.dense(tf.nn.relu(bn), 1, kernel_initializer=tf.constant_initializer(0.1), name="out")
        loss = rec.loss(tf.reduce_mean(tf.square(out - ys)))
        rec.lr(tf.constant(LR))
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        rec.variables()
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                rows = slice(s * BATCH, (s + 1) * BATCH)
                rec.write(sess.run([train, fetches], {xs: x[rows], ys: y[rows]})[1])
        rec.close()


def tf2(run_dir: str, limit: int) -> None:
    import tensorflow as tf

    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tb_parity_plugin import summary_v2

    x, y, kernel = data()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        inp = tf.keras.Input((FEATURES,))
        h = tf.keras.layers.Dense(UNITS, use_bias=False, name="dense")(inp)
        bn = tf.keras.layers.BatchNormalization(name="bn1")(h)
        out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(0.1), name="out")(
            tf.keras.layers.ReLU()(bn)
        )
        model = tf.keras.Model(inp, [h, bn, out])
        model.get_layer("dense").kernel.assign(kernel)
        optimizer = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir, full_values_limit=limit)
    dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))

    def step_fn(xb: tf.Tensor, yb: tf.Tensor) -> tuple:
        with tf.GradientTape() as tape:
            hb, bnb, outb = model(xb, training=True)
            loss = tf.nn.compute_average_loss(tf.reduce_mean(tf.square(outb - yb), axis=1), global_batch_size=BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, grads, hb, bnb

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> None:
        with rec.step(optimizer.iterations, variables=model):
            rec.lr(tf.constant(LR))
            loss, grads, hb, bnb = strategy.run(step_fn, args=(xb, yb))
            rec.activation("dense", hb)
            rec.activation("bn1", bnb)
            rec.loss(loss, reduction="sum")
            rec.grads(grads, model.trainable_variables)

    for xb, yb in dist:
        train_step(xb, yb)
    rec.close()


if __name__ == "__main__":
    target, which, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    (tf1 if which == "tf1" else tf2)(target, limit)
