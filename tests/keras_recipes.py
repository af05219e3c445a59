"""The Keras side of :func:`tf1_recipes.dense_regression`, shared by the tests of optimizer ports."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf


def dense_regression_port(
    run_dir: str,
    kernel: Any,
    xs: Any,
    ys: Any,
    opt: Any,
    watch: Callable[[Any], dict[str, Any]] = lambda opt: {},
    prepare: Optional[Callable[[Any, Any], None]] = None,
    after: bool = False,
) -> dict[str, list[np.ndarray]]:
    """One ``Dense`` (named ``dense``, its kernel ``kernel``) trained by ``opt`` on the mean squared
    error, one batch of ``xs``/``ys`` per step in a ``tf.function`` loop recorded with
    ``summary_v2`` (variables and slots). ``prepare(opt, model)`` builds the optimizer's slots and
    sets their start (a mean square at 1, as TF1's); returns each of ``watch(opt)``'s slots as it is
    before each step (``after``: after it)."""
    from tb_parity_plugin import summary_v2

    model = tf.keras.Sequential(
        [
            tf.keras.Input((xs.shape[-1],)),
            tf.keras.layers.Dense(ys.shape[-1], kernel_initializer=tf.constant_initializer(kernel), name="dense"),
        ]
    )
    if prepare is None:
        opt.build(model.trainable_variables)
    else:
        prepare(opt, model)
    slots = watch(opt)
    seen: dict[str, list[np.ndarray]] = {r: [] for r in slots}
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                loss = rec.loss(tf.reduce_mean(tf.square(model(x) - y)))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for s in range(len(xs)):
        if not after:
            for r, v in slots.items():
                seen[r].append(v.numpy())
        step(tf.constant(xs[s]), tf.constant(ys[s]))
        if after:
            for r, v in slots.items():
                seen[r].append(v.numpy())
    rec.close()
    return seen


def fit_recorded(
    run_dir: str, model: Any, layers: Optional[list[str]], xs: Any, ys: Any, batch: int, opt: Any, loss: Any = None
) -> None:
    """``model`` compiled with ``opt`` on ``loss`` (the mean squared error by default), instrumented onto a
    recorder at ``run_dir`` (its ``layers``' outputs; None: instrument's default), and fit for one epoch
    over ``xs``/``ys`` in order (``batch`` rows a step)."""
    from tb_parity_plugin import summary_v2

    model.compile(opt, tf.keras.losses.MeanSquaredError() if loss is None else loss)
    rec = summary_v2.Recorder(run_dir)
    if layers is None:
        summary_v2.instrument(model, rec)
    else:
        summary_v2.instrument(model, rec, layers=layers)
    model.fit(xs, ys, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    rec.close()


class BertAdam(tf.keras.optimizers.Optimizer):
    """BERT's ``AdamWeightDecayOptimizer`` as a Keras optimizer (slots ``m`` and ``v``; no bias
    correction; decoupled weight decay on variables whose name matches none of ``exclude``), the
    faithful port of the rule; ``coupled=True`` adds the decay to the gradient (L2) instead."""

    def __init__(
        self,
        learning_rate: float,
        weight_decay: float,
        exclude: Any,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-6,
        coupled: bool = False,
        name: str = "BertAdam",
    ) -> None:
        super().__init__(name=name)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.decay_rate, self.exclude, self.coupled = (
            weight_decay,
            list(exclude),
            coupled,
        )  # not weight_decay: the base class would decay too
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon

    def build(self, var_list: list[Any]) -> None:
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._m = [self.add_variable_from_reference(v, "m") for v in var_list]
        self._v = [self.add_variable_from_reference(v, "v") for v in var_list]

    def update_step(self, gradient: tf.Tensor, variable: tf.Variable) -> None:
        import re

        i = self._index_dict[self._var_key(variable)]
        m, v = self._m[i], self._v[i]
        decay = not any(re.search(r, variable.name) for r in self.exclude)
        if self.coupled and decay:
            gradient = gradient + self.decay_rate * variable
        next_m = self.beta_1 * m + (1.0 - self.beta_1) * gradient
        next_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(gradient)
        update = next_m / (tf.sqrt(next_v) + self.epsilon)
        if decay and not self.coupled:
            update += self.decay_rate * variable
        variable.assign_sub(tf.cast(self.learning_rate, variable.dtype) * update)
        m.assign(next_m)
        v.assign(next_v)
