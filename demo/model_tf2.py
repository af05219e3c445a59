"""The TF2 port: Keras Model subclass, GradientTape in a ``tf.function``, Keras SGD.

``bug`` plants one of the realistic porting mistakes the demo shows (``no_bias``: the last
layer built with ``use_bias=False``, a variable the original has and the port lacks).
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from demo.common import LAYER_NAMES, UNITS, PairConfig, batch, data, initial_weights
from tb_parity_plugin import summary_v2

BUGS = (None, "lr_offbyone", "log_softmax", "no_bias")


class SimpleModel(tf.keras.Model):
    """input 3 -> dense 2 -> dense 2 -> dense 3; variables get the ``simple_model/`` prefix."""

    def __init__(self, last_bias: bool = True) -> None:
        super().__init__(name="simple_model")
        self.dense_layers = [
            tf.keras.layers.Dense(
                units,
                kernel_initializer=tf.constant_initializer(kernel),
                bias_initializer=tf.constant_initializer(bias),
                use_bias=last_bias or i < len(UNITS) - 1,
                name=name,
            )
            for i, (units, name, (kernel, bias)) in enumerate(zip(UNITS, LAYER_NAMES, initial_weights()))
        ]

    def call(self, inputs: tf.Tensor, recorder: Optional[summary_v2.Recorder] = None) -> tf.Tensor:
        h = inputs
        for layer in self.dense_layers:
            h = layer(h)
            if recorder is not None:
                recorder.activation(layer.name, h)
        return h


class ShiftedSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):
    """The planted bug: counts steps from 1 (``optimizer.iterations + 1``), TF1 from 0."""

    def __init__(self, schedule: tf.keras.optimizers.schedules.LearningRateSchedule, shift: int) -> None:
        self.schedule, self.shift = schedule, shift

    def __call__(self, step):
        return self.schedule(step + self.shift)

    def get_config(self) -> dict:
        return {"shift": self.shift}


def hand_written_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """The planted bug: ``log(softmax)`` is -inf once a probability underflows to 0."""
    return tf.reduce_mean(-tf.reduce_sum(labels * tf.math.log(tf.nn.softmax(logits)), axis=1))


def train(run_dir: str, cfg: PairConfig, bug: Optional[str] = None) -> None:
    """Trains ``cfg.steps`` steps, logging the same tensors as the TF1 side."""
    if bug not in BUGS:
        raise ValueError(f"bug must be one of {BUGS}, got {bug!r}")
    x_np, y_np = data(cfg)
    model = SimpleModel(last_bias=bug != "no_bias")
    model(x_np[0])  # builds the variables under the model's name scope
    schedule = ShiftedSchedule(
        tf.keras.optimizers.schedules.PolynomialDecay(cfg.learning_rate, cfg.decay_steps, cfg.end_learning_rate),
        shift=1 if bug == "lr_offbyone" else 0,
    )
    optimizer = tf.keras.optimizers.SGD(schedule)
    optimizer.build(model.trainable_variables)
    if bug == "log_softmax":
        loss_fn = hand_written_cross_entropy
    else:
        loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)

    signature = None
    if cfg.last_batch is not None:  # shape-agnostic: one trace for every batch size
        signature = [
            tf.TensorSpec([None, *x_np.shape[2:]], tf.float32),
            tf.TensorSpec([None, *y_np.shape[2:]], tf.float32),
        ]

    @tf.function(input_signature=signature)
    def train_step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(optimizer.iterations):
            rec.lr(schedule(optimizer.iterations))
            with tf.GradientTape() as tape:
                logits = model(x, recorder=rec)
                loss = rec.loss(loss_fn(y, logits))
            rec.minimize(optimizer, loss, model.trainable_variables, tape)

    for step in range(cfg.steps):
        xb, yb = batch(cfg, x_np, y_np, step)
        train_step(tf.constant(xb), tf.constant(yb))
    rec.close()
