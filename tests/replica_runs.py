"""Write a one-device TF1 baseline and TF2 ports under MirroredStrategy on two logical CPUs.

Run as a script (``python tests/replica_runs.py LOGDIR VARIANT``): the logical devices must be
configured before TensorFlow touches a device, so each run gets a fresh process.

The model is a softmax regression trained with SGD on a global batch of 8, written the way the
TF guides write it. Variants of the TF2 port:
- ``faithful``: ``tf.nn.compute_average_loss`` over the global batch (grads summed by the
  optimizer's all-reduce equal the one-device gradient);
- ``local_mean``: the classic porting bug, a per-replica ``reduce_mean`` (the all-reduced
  gradient is twice the one-device one; the loss, combined as a mean, still agrees);
- ``unsynced``: a non-trainable running mean of the logits (recorded by both sides, like a
  batch-norm moving mean) is updated by each replica on its own (``ON_READ`` sync) instead of
  all-reduced (``ON_WRITE``): its single copy (the replicas' mean) still equals the one-device
  value, but the replicas' copies differ, the unsynchronised batch-norm statistic;
- ``unsynced_var``: the same for a running variance that starts at 1 with momentum 0.99 (a
  batch-norm moving variance), the running mean synchronised: its replicas are about 1% apart,
  out of the warm-up's tolerance (rtol 1e-7) and within the 5% after it;
- ``momentum``: faithful, with Keras SGD's momentum against TF1's ``MomentumOptimizer``
  (``tf1_momentum``), the slots recorded: a mirrored momentum slot was recorded as Keras keeps
  it (``-lr x accumulator``), not in lr units as on one device (a new user's false DIVERGE).
- ``local_batch``: each replica's loss divided by its own batch, ``compute_average_loss(...,
  global_batch_size=BATCH // 2)``, recorded with ``reduction="sum"``: the loss and the all-reduced
  gradient twice the one-device ones;
- ``mean_recorded``: faithful training (``compute_average_loss`` over the global batch), but each
  replica's ``reduce_mean`` recorded with ``reduction="sum"``: the recorded loss twice the one-device
  one, the gradient the one-device one;
- ``interleaved``: faithful, but each global batch dealt to the replicas row by row (replica 0 rows
  0, 2, 4, 6; replica 1 rows 1, 3, 5, 7), as a dataset sharded by element deals it: the same
  training, its logits (the replicas' parts concatenated) in another row order;
- ``unbuilt_momentum``: ``momentum`` with the optimizer left unbuilt, as the TF guide's custom loop
  leaves it: the recorder's ``rec.slots`` builds the slots around ``strategy.run``, where no strategy
  is current; they were plain variables, which each replica updated in turn (the momentum 1.9 times
  TF1's after one step, the replicas' weights apart).

``fit``, ``fit_momentum`` and ``fit_sum`` train the port with Keras ``fit`` instead (:func:`tf2_fit`).

``fit_two_outputs`` trains with ``fit`` a model whose instrumented layer returns two outputs
(``2 x`` and ``x + 1``, recorded as ``two/0`` and ``two/1``: :func:`tf2_fit_two_outputs`).

``local_results`` is ``faithful`` that also records the loss as
``experimental_local_results(loss)`` (refused: the message goes to ``refused.txt``) and a metric per
head as a list on one device (recorded). ``bn_synced`` and ``bn_unsynced`` write a Keras ``BatchNormalization(synchronized=...)`` run over
small inputs (:data:`BN_SCALE`), its moving statistics recorded with each replica's copy.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STEPS, BATCH, FEATURES, CLASSES, LR, MOMENTUM = 4, 8, 4, 3, 0.1, 0.9


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((STEPS * BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, STEPS * BATCH).astype(np.int64)
    w0 = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    return x, y, w0


def numpy_reference(momentum: float = 0.0) -> dict[str, list[np.ndarray]]:
    """One device, in float64: the weights before each step, the gradients and losses; with
    ``momentum``, TF1's accumulator of the kernel before each step too (``accum``)."""
    x, y, w0 = data()
    w, b = w0.astype(np.float64), np.zeros(CLASSES)
    acc_w, acc_b = np.zeros_like(w), np.zeros(CLASSES)
    out: dict[str, list[np.ndarray]] = {"kernel": [], "bias": [], "grad_kernel": [], "loss": [], "accum": []}
    for step in range(STEPS):
        xb, yb = x[step * BATCH : (step + 1) * BATCH].astype(np.float64), y[step * BATCH : (step + 1) * BATCH]
        logits = xb @ w + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        out["loss"].append(np.array(-np.log(p[np.arange(BATCH), yb]).mean()))
        d = p.copy()
        d[np.arange(BATCH), yb] -= 1
        d /= BATCH
        gw, gb = xb.T @ d, d.sum(0)
        out["kernel"].append(w.copy())
        out["bias"].append(b.copy())
        out["grad_kernel"].append(gw)
        out["accum"].append(acc_w.copy())
        acc_w, acc_b = momentum * acc_w + gw, momentum * acc_b + gb
        w, b = w - LR * acc_w, b - LR * acc_b
    return out


def tf1(logdir: str, momentum: float = 0.0) -> None:
    import tensorflow as tf

    from tb_parity_plugin import summary_v1

    x, y, w0 = data()
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(logdir)
        xs = tf.compat.v1.placeholder(tf.float32, [BATCH, FEATURES])
        ys = tf.compat.v1.placeholder(tf.int64, [BATCH])
        gs = tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.variable_scope("dense"):
            w = tf.compat.v1.get_variable("kernel", initializer=w0)
            b = tf.compat.v1.get_variable("bias", initializer=np.zeros(CLASSES, np.float32))
            running = tf.compat.v1.get_variable(
                "running_mean", initializer=np.zeros(CLASSES, np.float32), trainable=False
            )
            running_var = tf.compat.v1.get_variable(
                "running_var", initializer=np.ones(CLASSES, np.float32), trainable=False
            )
        rec.lr(tf.constant(LR))
        logits = rec.activation("logits", tf.matmul(xs, w) + b)
        loss = rec.loss(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ys, logits=logits)))
        read = rec.weight(running, name="running_mean:0")
        read_var = rec.weight(running_var, name="running_var:0")
        with tf.control_dependencies([read, read_var]):  # the updates run after the recorder's reads
            update = tf.group(
                running.assign(0.5 * running + 0.5 * tf.reduce_mean(logits, axis=0)),
                running_var.assign(0.99 * running_var + 0.01 * tf.reduce_mean(tf.square(logits), axis=0)),
            )
        opt = (
            tf.compat.v1.train.MomentumOptimizer(LR, momentum)
            if momentum
            else tf.compat.v1.train.GradientDescentOptimizer(LR)
        )
        train = tf.group(rec.minimize(opt, loss, global_step=gs), update)
        if momentum:
            rec.slots(opt, [w, b])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(STEPS):
                feed = {xs: x[step * BATCH : (step + 1) * BATCH], ys: y[step * BATCH : (step + 1) * BATCH]}
                _, parity = sess.run([train, rec.fetches], feed)
                rec.write(parity)
        rec.close()


def _running(name: str, initial: Any, synced: bool) -> Any:
    """A non-trainable running statistic, all-reduced on write (``synced``) or kept per replica."""
    import tensorflow as tf

    sync = tf.VariableSynchronization.ON_WRITE if synced else tf.VariableSynchronization.ON_READ
    return tf.Variable(
        initial, trainable=False, name=name, synchronization=sync, aggregation=tf.VariableAggregation.MEAN
    )


def tf2(logdir: str, variant: str) -> None:
    import tensorflow as tf

    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tb_parity_plugin import summary_v2

    x, y, w0 = data()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(CLASSES, kernel_initializer=tf.constant_initializer(w0), input_shape=(FEATURES,))]
        )
        optimizer = tf.keras.optimizers.SGD(LR, momentum=MOMENTUM if variant.endswith("momentum") else 0.0)
        if variant != "unbuilt_momentum":
            optimizer.build(model.trainable_variables)  # its slots, mirrored, made in the strategy's scope
        running = _running("running_mean", tf.zeros(CLASSES), synced=variant != "unsynced")
        running_var = _running("running_var", tf.ones(CLASSES), synced=variant != "unsynced_var")
    rec = summary_v2.Recorder(logdir)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    dist = strategy.experimental_distribute_dataset(dataset)

    def step_fn(xb: tf.Tensor, yb: tf.Tensor) -> tuple:
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            per_example = tf.keras.losses.sparse_categorical_crossentropy(yb, logits, from_logits=True)
            if variant == "local_mean":
                loss = tf.reduce_mean(per_example)
            elif variant == "local_batch":
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH // 2)
            else:
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if variant == "mean_recorded":  # trained on the global batch's mean, recorded as each replica's
            loss = tf.reduce_mean(per_example)
        running.assign(0.5 * running + 0.5 * tf.reduce_mean(logits, axis=0))  # unsynced: each replica its own
        running_var.assign(0.99 * running_var + 0.01 * tf.reduce_mean(tf.square(logits), axis=0))
        return loss, grads, logits

    def deal(xb: Any, yb: Any) -> tuple:
        """``interleaved``: the global batch dealt to the replicas row by row; else as it came."""
        if variant != "interleaved":
            return xb, yb
        whole = [tf.concat(strategy.experimental_local_results(t), 0) for t in (xb, yb)]
        return tuple(
            strategy.experimental_distribute_values_from_function(
                lambda ctx, t=t: t[ctx.replica_id_in_sync_group :: strategy.num_replicas_in_sync]
            )
            for t in whole
        )

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> None:
        xb, yb = deal(xb, yb)
        with rec.step(optimizer.iterations):
            rec.lr(tf.constant(LR))
            rec.weights(model.trainable_variables)
            if variant.endswith("momentum"):
                rec.slots(optimizer, model.trainable_variables)  # unbuilt_momentum: built here
            rec.weight(running, name="running_mean:0")
            rec.weight(running_var, name="running_var:0")
            loss, grads, logits = strategy.run(step_fn, args=(xb, yb))
            rec.activation("logits", logits)
            rec.loss(loss, reduction="mean" if variant == "local_mean" else "sum")
            rec.grads(grads, model.trainable_variables)
            if variant == "local_results":
                try:  # the replicas' parts, as a list: refused, not stacked into a vector
                    rec.loss(strategy.experimental_local_results(loss), name="local")
                except TypeError as exc:
                    refused.append(str(exc))
                rec.metric("heads", [tf.constant(0.25), tf.constant(0.5)])  # one device: one value per head

    refused: list[str] = []
    for xb, yb in dist:
        train_step(xb, yb)
    rec.close()
    if variant == "local_results":
        with open(os.path.join(logdir, "refused.txt"), "w") as f:
            f.write("\n".join(refused))


def tf2_fit(logdir: str, variant: str) -> None:
    """The port trained with Keras ``fit`` under MirroredStrategy, recorded by ``instrument``: the same
    model and batches as :func:`tf2`. ``fit``: SGD; ``fit_momentum``: SGD with momentum, its slots
    recorded; ``fit_sum``: the loss compiled with ``reduction="sum"``, which Keras does not scale by the
    global batch (the gradient is the batch's sum, 8 times the one-device mean's)."""
    import tensorflow as tf

    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tb_parity_plugin import summary_v2

    x, y, w0 = data()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        dense = tf.keras.layers.Dense(CLASSES, kernel_initializer=tf.constant_initializer(w0), name="dense")
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), dense])
        loss = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="sum" if variant == "fit_sum" else "auto"
        )
        model.compile(tf.keras.optimizers.SGD(LR, momentum=MOMENTUM if variant == "fit_momentum" else 0.0), loss)
    rec = summary_v2.Recorder(logdir)
    summary_v2.instrument_layer(rec, dense, "logits")
    summary_v2.instrument(model, rec)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def tf2_fit_two_outputs(logdir: str) -> None:
    """``fit`` under MirroredStrategy with an instrumented layer of two outputs, ``2 x`` and ``x + 1``."""
    import tensorflow as tf

    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tb_parity_plugin import summary_v2

    class Two(tf.keras.layers.Layer):
        def call(self, h: Any) -> Any:
            return 2.0 * h, h + 1.0

    x, y, w0 = data()
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        inputs = tf.keras.Input((FEATURES,))
        doubled, shifted = Two(name="two")(inputs)
        logits = tf.keras.layers.Dense(CLASSES, kernel_initializer=tf.constant_initializer(w0))(doubled + shifted)
        model = tf.keras.Model(inputs, logits)
        model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(logdir)
    summary_v2.instrument(model, rec, layers=["two"])
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


#: the batch-norm variants' input scale: small activations, whose per-replica moving means (about
#: 1e-6) are apart by far less than the training atol (1e-5), yet not in sync
BN_SCALE = 1e-4


def bn_data() -> np.ndarray:
    return (np.random.default_rng(3).standard_normal((STEPS * BATCH, FEATURES)) * BN_SCALE).astype(np.float32)


def tf2_batch_norm(logdir: str, synchronized: bool) -> None:
    """A Keras ``BatchNormalization(synchronized=...)`` over the input under MirroredStrategy, its
    moving statistics recorded (mirrored: the single copy and each replica's)."""
    import tensorflow as tf

    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tb_parity_plugin import summary_v2

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((FEATURES,)), tf.keras.layers.BatchNormalization(synchronized=synchronized)]
        )
    rec = summary_v2.Recorder(logdir)
    dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(bn_data()).batch(BATCH))

    @tf.function
    def train_step(step: tf.Tensor, xb: tf.Tensor) -> None:
        with rec.step(step):
            rec.states(model.non_trainable_variables)
            out = strategy.run(lambda x: model(x, training=True), args=(xb,))
            rec.activation("batch_normalization", out)

    for step, xb in enumerate(dist):
        train_step(tf.constant(step, tf.int64), xb)
    rec.close()


if __name__ == "__main__":
    target, which = sys.argv[1], sys.argv[2]
    if which.startswith("bn_"):
        tf2_batch_norm(target, synchronized=which == "bn_synced")
    elif which == "fit_two_outputs":
        tf2_fit_two_outputs(target)
    elif which.startswith("fit"):
        tf2_fit(target, which)
    elif which.startswith("tf1"):
        tf1(target, MOMENTUM if which == "tf1_momentum" else 0.0)
    else:
        tf2(target, which)
