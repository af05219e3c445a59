"""A TF1 multi-tower original (``cifar10_multi_gpu_train.py``'s pattern: a tower per device under
``tf.device``, variables shared with ``variable_scope(reuse=...)``, the batch split with ``tf.split``,
the towers' gradients averaged by hand, the first tower's ``UPDATE_OPS`` alone run) and its port
under ``MirroredStrategy`` (a custom loop, a plain Keras ``BatchNormalization``), on two CPUs. Run
as a script (``python tests/tower_runs.py RUN_DIR WHICH``, WHICH ``tf1``, ``tf1_all_updates``
(every tower's ``UPDATE_OPS`` run), ``tf2``, ``tf2_synced`` (the port's batch norm
``synchronized=True``, which normalizes the whole batch) ``tf2_inference`` (the port's loop calls
the model without ``training=True``: its batch norm runs in inference mode) or ``tf2_momentum`` (the
port's batch norm with keras.applications' momentum 0.999)): the logical
devices must be configured before TensorFlow touches a device, so each run gets a fresh process.

Both normalize each tower's (replica's) half of the batch with its own statistics, so they train
alike; TF1's moving statistics take the first tower's half only, the port's (the replicas' copies,
read as their mean) the whole batch. numpy: :func:`reference`.
"""

from __future__ import annotations

import os
import sys

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STEPS, BATCH, TOWERS, FEATURES, UNITS, CLASSES, LR, EPSILON = 2, 8, 2, 6, 8, 3, 0.1, 1e-3


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((STEPS * BATCH, FEATURES)).astype(np.float32)
    x[:, :3] += np.tile(np.repeat([2.0, -1.0], BATCH // 2), STEPS)[:, None]  # the halves differ
    y = rng.integers(0, CLASSES, STEPS * BATCH).astype(np.int32)
    hidden = (rng.standard_normal((FEATURES, UNITS)) * 0.4).astype(np.float32)
    logits = (rng.standard_normal((UNITS, CLASSES)) * 0.4).astype(np.float32)
    return x, y, hidden, logits


def reference() -> dict[str, np.ndarray]:
    """float64, step 0: the batch norm's input, each half normalized alone, the whole batch
    normalized at once, and the step-1 moving
    mean from the first half (TF1's first tower) and from the whole batch (momentum 0.99)."""
    x, _, hidden, _ = data()
    h = x[:BATCH].astype(np.float64) @ hidden.astype(np.float64)
    halves = [h[: BATCH // 2], h[BATCH // 2 :]]
    norm = np.concatenate([(a - a.mean(0)) / np.sqrt(a.var(0) + EPSILON) for a in halves])
    whole = (h - h.mean(0)) / np.sqrt(h.var(0) + EPSILON)
    return {
        "hidden": h,
        "bn": norm,
        "bn_whole": whole,
        "mean_first_tower": 0.01 * halves[0].mean(0),
        "mean_whole": 0.01 * h.mean(0),
        # every tower's update (from 0): one after the other, either way, or both from the same read
        "mean_all_towers": np.stack(
            [
                0.99 * 0.01 * halves[0].mean(0) + 0.01 * halves[1].mean(0),
                0.99 * 0.01 * halves[1].mean(0) + 0.01 * halves[0].mean(0),
                0.01 * (halves[0].mean(0) + halves[1].mean(0)),
            ]
        ),
    }


def tf1(run_dir: str, all_updates: bool = False) -> None:
    import tensorflow as tf

    from tb_parity_plugin import summary_v1

    x, y, hidden, logits_init = data()
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        xs = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
        ys = tf.compat.v1.placeholder(tf.int32, [None])
        opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
        tower_grads, losses, hs, bns, outs, update_ops = [], [], [], [], [], []
        for i, (xi, yi) in enumerate(zip(tf.split(xs, TOWERS), tf.split(ys, TOWERS))):
            with (
                tf.device(f"/cpu:{i}"),
                tf.compat.v1.name_scope(f"tower_{i}") as scope,
                tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=i > 0),
            ):
                h = tf.compat.v1.layers.dense(
                    xi, UNITS, use_bias=False, kernel_initializer=tf.constant_initializer(hidden), name="hidden"
                )
                bn = tf.compat.v1.layers.batch_normalization(h, training=True, name="bn")
                out = tf.compat.v1.layers.dense(
                    tf.nn.relu(bn), CLASSES, kernel_initializer=tf.constant_initializer(logits_init), name="logits"
                )
                losses.append(tf.compat.v1.losses.sparse_softmax_cross_entropy(yi, out))
                if i == 0:
                    update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, scope)
                tower_grads.append(opt.compute_gradients(losses[-1]))
                hs.append(h), bns.append(bn), outs.append(out)
        if all_updates:  # every tower's: each updates the moving statistics from its own half, unordered
            update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        rec.lr(tf.constant(LR))
        rec.activation("hidden", tf.concat(hs, 0))
        rec.activation("bn", tf.concat(bns, 0))
        rec.activation("logits", tf.concat(outs, 0))
        rec.loss(tf.reduce_mean(losses))
        averaged = [(tf.reduce_mean(tf.stack([g for g, _ in gv]), 0), gv[0][1]) for gv in zip(*tower_grads)]
        with tf.control_dependencies(update_ops):
            train = rec.apply_gradients(opt, averaged, global_step=gs)
        rec.variables()
        fetches = rec.fetches
        with tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(device_count={"CPU": TOWERS})) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                rows = slice(s * BATCH, (s + 1) * BATCH)
                rec.write(sess.run([train, fetches], {xs: x[rows], ys: y[rows]})[1])
        rec.close()


def tf2(run_dir: str, synchronized: bool = False, training: bool = True, momentum: float = 0.99) -> None:
    import tensorflow as tf

    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * TOWERS)
    from tb_parity_plugin import summary_v2

    x, y, hidden, logits_init = data()
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(TOWERS)])
    with strategy.scope():
        inp = tf.keras.Input((FEATURES,))
        h = tf.keras.layers.Dense(UNITS, use_bias=False, name="hidden")(inp)
        bn = tf.keras.layers.BatchNormalization(name="bn", synchronized=synchronized, momentum=momentum)(h)
        out = tf.keras.layers.Dense(CLASSES, name="logits")(tf.keras.layers.ReLU()(bn))
        model = tf.keras.Model(inp, [h, bn, out])
        model.get_layer("hidden").kernel.assign(hidden)
        model.get_layer("logits").kernel.assign(logits_init)
        optimizer = tf.keras.optimizers.SGD(LR)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    rec = summary_v2.Recorder(run_dir)
    dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))

    def step_fn(xb: tf.Tensor, yb: tf.Tensor) -> tuple:
        with tf.GradientTape() as tape:
            hb, bnb, outb = model(xb, training=True) if training else model(xb)
            loss = tf.nn.compute_average_loss(loss_fn(yb, outb), global_batch_size=BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, grads, hb, bnb, outb

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> None:
        with rec.step(optimizer.iterations, variables=model):
            rec.lr(tf.constant(LR))
            loss, grads, hb, bnb, outb = strategy.run(step_fn, args=(xb, yb))
            rec.activation("hidden", hb)
            rec.activation("bn", bnb)
            rec.activation("logits", outb)
            rec.loss(loss, reduction="sum")
            rec.grads(grads, model.trainable_variables)

    for xb, yb in dist:
        train_step(xb, yb)
    rec.close()


if __name__ == "__main__":
    if sys.argv[2].startswith("tf1"):
        tf1(sys.argv[1], all_updates=sys.argv[2] == "tf1_all_updates")
    else:
        tf2(
            sys.argv[1],
            synchronized=sys.argv[2] == "tf2_synced",
            training=sys.argv[2] != "tf2_inference",
            momentum=0.999 if sys.argv[2] == "tf2_momentum" else 0.99,
        )
