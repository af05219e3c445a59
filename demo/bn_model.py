"""One small model with batch norm, written the TF1 way and ported to TF2 (a custom loop, Keras
``fit`` and one forward pass per mode): dense(3->4) -> batch norm -> relu -> dense(4->3),
softmax cross-entropy. The demo's ``batch_norm`` and ``forward_pass`` pairs and the state, slot,
fit and forward-pass tests use it.

Both sides start from the same weights (copied, not seeded) and see the same batches, so
a faithful port agrees and each planted difference shows where it acts.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

import demo  # noqa: F401  (legacy Keras, before TensorFlow is imported)
from tb_parity_plugin import summary_v1, summary_v2

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((3, 4)).astype(np.float32)
W2 = RNG.standard_normal((4, 3)).astype(np.float32)
STEPS = 4
BATCH = 8
XS = RNG.standard_normal((STEPS, BATCH, 3)).astype(np.float32) * 2.0 + 1.0
YS = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, (STEPS, BATCH))]
LR = 0.1

#: optimizer name -> (TF1 constructor, tf_keras constructor, tf_keras legacy constructor)
OPTIMIZERS: dict[str, tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]] = {
    "sgd": (
        lambda: tf.compat.v1.train.GradientDescentOptimizer(LR),
        lambda: tf.keras.optimizers.SGD(LR),
        lambda: tf.keras.optimizers.legacy.SGD(LR),
    ),
    "momentum": (
        lambda: tf.compat.v1.train.MomentumOptimizer(LR, 0.9),
        lambda: tf.keras.optimizers.SGD(LR, momentum=0.9),
        lambda: tf.keras.optimizers.legacy.SGD(LR, momentum=0.9),
    ),
    "adam": (
        lambda: tf.compat.v1.train.AdamOptimizer(LR, epsilon=1e-7),
        lambda: tf.keras.optimizers.Adam(LR, epsilon=1e-7),
        lambda: tf.keras.optimizers.legacy.Adam(LR, epsilon=1e-7),
    ),
}


def train_tf1(
    run_dir: str,
    optimizer: str = "sgd",
    update_ops: bool = True,
    steps: int = STEPS,
    moving_means: Optional[list[np.ndarray]] = None,
    full_values_limit: int = summary_v1.DEFAULT_FULL_VALUES_LIMIT,
) -> None:
    """The TF1 original: the train op waits for ``UPDATE_OPS`` (unless ``update_ops`` is False,
    the classic TF1 bug), built by the user outside any recorder block; every variable and
    slot is recorded with ``rec.variables``. ``moving_means`` gets the moving mean read by the
    session before each step, apart from the recorder (a test's own reference).
    ``full_values_limit``: the recorder's (below 256: statistics only, as for a wide layer)."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir, full_values_limit)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, (BATCH, 3))
        y = tf.compat.v1.placeholder(tf.float32, (BATCH, 3))
        # no bias before batch norm: its gradient is rounding noise, which Adam would amplify
        h = tf.compat.v1.layers.dense(
            x, 4, use_bias=False, kernel_initializer=tf.constant_initializer(W1), name="dense"
        )
        h = tf.compat.v1.layers.batch_normalization(h, training=True, name="batch_normalization")
        h = rec.activation("bn", h)
        logits = tf.compat.v1.layers.dense(
            tf.nn.relu(h), 3, kernel_initializer=tf.constant_initializer(W2), name="dense_1"
        )
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        opt = OPTIMIZERS[optimizer][0]()
        grads_and_vars = opt.compute_gradients(loss)
        rec.grads(*zip(*grads_and_vars))
        deps = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS) if update_ops else []
        with tf.control_dependencies(deps):
            train_op = opt.apply_gradients(grads_and_vars, global_step=gs)
        rec.set_step(gs)
        rec.variables(optimizer=opt)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            (moving_mean,) = (v for v in tf.compat.v1.global_variables() if v.op.name.endswith("moving_mean"))
            for step in range(steps):
                if moving_means is not None:
                    moving_means.append(sess.run(moving_mean))
                _, parity = sess.run([train_op, rec.fetches], {x: XS[step], y: YS[step]})
                rec.write(parity)
        rec.close()


def keras_model(name: str = "port", scale: bool = True) -> tf.keras.Model:
    """The TF2 port's model, built, with the TF1 initial weights (``scale=False``: batch norm
    without its gamma, a variable the TF1 model has)."""
    model = tf.keras.Sequential(
        [
            tf.keras.Input((3,)),
            tf.keras.layers.Dense(4, use_bias=False, kernel_initializer=tf.constant_initializer(W1), name="dense"),
            tf.keras.layers.BatchNormalization(scale=scale, name="batch_normalization"),
            tf.keras.layers.ReLU(name="relu"),
            tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(W2), name="dense_1"),
        ],
        name=name,
    )
    return model


def train_tf2_loop(
    run_dir: str,
    optimizer: str = "sgd",
    legacy: bool = False,
    steps: int = STEPS,
    bn_training: bool = True,
    bn_scale: bool = True,
    eval_in_training_after: Optional[int] = None,
    moving_means: Optional[list[np.ndarray]] = None,
    full_values_limit: int = summary_v2.DEFAULT_FULL_VALUES_LIMIT,
) -> None:
    """The TF2 port as a custom ``tf.function`` loop, everything read on entering the step.
    ``eval_in_training_after``: after that step, an evaluation pass calls the layers with
    ``training=True`` (the slip that moves the moving statistics); ``moving_means`` gets the
    moving mean before each step, read from the layer apart from the recorder."""
    model = keras_model(scale=bn_scale)
    opt = OPTIMIZERS[optimizer][2 if legacy else 1]()
    rec = summary_v2.Recorder(run_dir, full_values_limit)
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    dense, bn, relu, dense_1 = model.layers

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                h = rec.activation("bn", bn(dense(x), training=bn_training))
                loss = rec.loss(loss_fn(y, dense_1(relu(h))))
            grads = tape.gradient(loss, model.trainable_variables)
            rec.grads(grads, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

    for step in range(steps):
        if moving_means is not None:
            moving_means.append(bn.moving_mean.numpy())
        train_step(tf.constant(XS[step]), tf.constant(YS[step]))
        if step == eval_in_training_after:
            bn(dense(tf.constant(XS[-1] * 0.5)), training=True)
    rec.close()


def numpy_bn_moving_mean(steps: int, momentum: float = 0.99, update: bool = True) -> list[np.ndarray]:
    """Independent reference for the moving mean as read at the start of each step, under
    plain SGD: the moving mean depends on the first layer's outputs, which depend on the
    first kernel, so only step 0's and 1's are computed (step 1 needs no gradient)."""
    mean = np.zeros(4, np.float64)
    out = [mean.copy()]
    for step in range(min(steps, 2) - 1):
        batch_mean = (XS[step].astype(np.float64) @ W1.astype(np.float64)).mean(axis=0)
        if update:
            mean = mean * momentum + batch_mean * (1 - momentum)
        out.append(mean.copy())
    return out


def train_tf2_fit(
    run_dir: str,
    steps_per_execution: int = 1,
    lr: Any = LR,
    optimizer: Optional[Any] = None,
    strategy: Optional[tf.distribute.Strategy] = None,
) -> tf.keras.Model:
    """The TF2 port trained with ``model.fit`` over a ``tf.data`` dataset, instrumented; built and
    compiled in ``strategy.scope()`` when a strategy is given."""
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = keras_model()
        model.compile(
            optimizer=optimizer or tf.keras.optimizers.SGD(lr),
            loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution,
        )
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument_layer(rec, model.get_layer("batch_normalization"), "bn")
    summary_v2.instrument(model, rec)
    # drop_remainder: a static batch size, so activations keep full values like the TF1 placeholders
    data = tf.data.Dataset.from_tensor_slices((XS.reshape(-1, 3), YS.reshape(-1, 3))).batch(
        XS.shape[1], drop_remainder=True
    )
    model.fit(data, epochs=1, verbose=0, shuffle=False)
    rec.close()
    return model


def forward_tf1(run_dir: str, dropout: bool = False) -> None:
    """One forward pass of the TF1 model per mode (shared variables), fetched in one ``sess.run``."""
    x_np = XS[0]
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        x = tf.constant(x_np)
        for mode in ("inference", "training"):
            training = mode == "training"
            with rec.mode(mode), tf.compat.v1.variable_scope("", reuse=tf.compat.v1.AUTO_REUSE):
                h = tf.compat.v1.layers.dense(
                    x, 4, use_bias=False, kernel_initializer=tf.constant_initializer(W1), name="dense"
                )
                h = rec.activation("bn", tf.compat.v1.layers.batch_normalization(h, training=training))
                h = tf.nn.relu(h)
                if dropout:
                    h = rec.activation("dropout", tf.compat.v1.layers.dropout(h, 0.5, training=training))
                out = tf.compat.v1.layers.dense(h, 3, kernel_initializer=tf.constant_initializer(W2), name="dense_1")
                rec.output("output", out)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            rec.write(sess.run(rec.fetches), step=0)
        rec.close()


def forward_tf2(
    run_dir: str,
    bn_training: Optional[bool] = None,
    dropout_training: Optional[bool] = None,
    modes: Sequence[str] = ("inference", "training"),
) -> None:
    """One forward pass of the Keras port per mode (``summary_v2.forward_pass``); ``bn_training``
    or ``dropout_training`` pin a layer's mode whatever the pass's (the classic porting slips)."""
    model = keras_model()
    layers = model.layers
    if dropout_training is not None:
        layers = [*layers[:3], tf.keras.layers.Dropout(0.5, name="dropout"), layers[3]]
    rec = summary_v2.Recorder(run_dir)
    bn = layers[1]
    summary_v2.instrument_layer(rec, bn, "bn")
    if dropout_training is not None:
        summary_v2.instrument_layer(rec, layers[3], "dropout")

    class Port(tf.keras.Model):
        def call(self, x: tf.Tensor, training: Optional[bool] = None) -> tf.Tensor:
            h = bn(layers[0](x), training=training if bn_training is None else bn_training)
            h = layers[2](h)
            if dropout_training is not None:
                h = layers[3](h, training=dropout_training)
            return layers[-1](h)

    summary_v2.forward_pass(rec, Port(), tf.constant(XS[0]), modes=modes)
    rec.close()
