"""Logging a Keras ``model.fit`` with the TF2 recorder, without rewriting the training loop.

:func:`instrument` replaces the model's ``train_step`` with one that records, per step, as
the TF1 ``Session`` loop does: lr, every variable as read at the step's start (weights,
``state`` such as batch-norm moving statistics, optimizer ``slot``s), chosen layers'
outputs, the loss and the gradients, numbered by ``optimizer.iterations`` before the update
(0, 1, 2, ... like the TF1 ``global_step`` read before its increment).
:func:`instrument_layer` makes a layer record its output inside a recorded step and do
nothing else anywhere else (``predict``, ``evaluate``, ``save``).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any, Optional, Sequence

import tensorflow as tf

from tb_parity_plugin.shim import slots as slot_lib
from tb_parity_plugin.shim.recorder import zero_masked as padding_zeroed

#: Strategies whose ``fit`` runs the whole step on one replica: recorded as on one device.
_ONE_DEVICE_STRATEGIES = ("_DefaultDistributionStrategy", "DefaultDistributionStrategy", "OneDeviceStrategy")
#: Strategies whose ``fit`` splits each step between replicas, recorded across them (:func:`instrument`).
_MIRRORED_STRATEGIES = ("MirroredStrategy", "MirroredStrategyV1")


def splitting_replica_context() -> Any:
    """The replica context when inside ``strategy.run`` of a strategy that splits the step between
    replicas, else None.

    ``OneDeviceStrategy`` never does: its one replica holds the whole step, so recording there is
    recording on one device, and Keras ``fit`` under it runs ``train_step`` there (a new user's port
    crashed at its first step). A ``MirroredStrategy`` splits even on one device: code recording
    there would stop working on the next machine's second GPU."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    if isinstance(tf.distribute.get_strategy(), tf.distribute.OneDeviceStrategy):
        return None
    return tf.distribute.get_replica_context()


#: Per replica thread (``MirroredStrategy`` runs each replica's ``train_step`` on its own thread
#: while ``fit`` traces it): the instrumented layers' outputs of this replica, (name, tensor), which
#: :func:`instrument` hands to the cross-replica context to record (a replica cannot record).
_REPLICA_OUTPUTS = threading.local()


def instrument_layer(recorder: Any, layer: Any, name: Optional[str] = None, zero_masked: bool = False) -> Any:
    """Make ``layer`` record its output as ``activation/<name>`` (default: the layer's name)
    whenever it runs inside ``with recorder.step(...)``; outside, it only runs.

    ``zero_masked``: record the positions Keras's mask of the output marks as padding
    (``Embedding(mask_zero=True)``, ``Masking``) as 0, as ``rec.activation(name, t, mask=...)``
    does, so only the real positions are compared (an output without a mask is recorded whole).

    The layer's class is swapped for a same-named subclass whose ``call`` records: Keras and
    SavedModel tracing look ``call`` up on the class, with its signature (``training=``).
    """
    if getattr(layer, "_tb_parity_recorder", None) is not None:
        raise ValueError(f"tb_parity: layer {layer.name!r} is already instrumented")
    _check_called(layer)
    base = type(layer)

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = base.call(self, *args, **kwargs)
        rec = self._tb_parity_recorder
        if rec.recording:
            flat = tf.nest.flatten(out)
            masks = _output_masks(self, args, kwargs, out) if self._tb_parity_zero_masked else [None] * len(flat)
            captured = getattr(_REPLICA_OUTPUTS, "outputs", None)
            if captured is not None:
                taken = {n for n, _ in captured}.__contains__
            else:
                taken = lambda n: rec.recorded("activation", n)  # noqa: E731
            called = _call_name(self._tb_parity_name, len(flat), taken)
            for i, (t, mask) in enumerate(zip(flat, masks)):
                name = called if len(flat) == 1 else f"{called}/{i}"
                if captured is not None:  # a replica's share of a step instrument records across replicas
                    captured.append((name, t if mask is None else padding_zeroed(t, mask)))
                else:
                    rec.activation(name, t, mask=mask)
        return out

    call.__signature__ = inspect.signature(base.call)  # type: ignore[attr-defined]
    attrs = {"call": call, "__module__": base.__module__, "__qualname__": base.__qualname__}
    layer._tb_parity_recorder = recorder
    layer._tb_parity_name = name or layer.name
    layer._tb_parity_zero_masked = zero_masked
    layer.__class__ = type(base.__name__, (base,), attrs)
    return layer


def _check_called(layer: Any) -> None:
    """Raises for a layer whose ``call`` never runs when its model does: a model's ``InputLayer``. A
    helper's ``instrument(layers=["num", "ctx", ...])`` on a two-input fit port, to tell inputs fed
    crosswise from another function, recorded nothing for the inputs and said nothing."""
    if _is_input_layer(layer):
        raise ValueError(
            f"tb_parity: {layer.name!r} is an InputLayer, which a model never calls, so its output would never "
            "be recorded: record the input in your own step (rec.activation(name, x[name])), or, under fit, pass "
            "it through a layer you instrument (tf.keras.layers.Identity(name=...)(inp))"
        )


def _is_input_layer(layer: Any) -> bool:
    return type(layer).__name__ == "InputLayer"


def _call_name(name: str, outputs: int, taken: Any) -> str:
    """The name a layer's output is recorded under at this call in the step: ``name`` at its first
    call, ``<name>/call_<k>`` at its (k+1)-th. One layer applied to several inputs (a siamese tower,
    a shared encoder, a tied embedding) runs more than once per step; its second output was refused
    as "logged twice in one step; give each a distinct name", which ``instrument`` gives the user no
    way to do, and ``fit`` crashed at its first step. ``taken``: whether a name (the first output's,
    ``<name>/0``, for a layer of several outputs) is already recorded in the step."""
    base, k = name, 0
    while taken(base if outputs == 1 else f"{base}/0"):
        k += 1
        base = f"{name}/call_{k}"
    return base


def _output_masks(layer: Any, args: tuple, kwargs: dict, out: Any) -> list:
    """The mask Keras attaches to each of ``layer``'s outputs after ``call``, as ``Layer.__call__``
    does (``_set_mask_metadata``), None where there is none or its rank is above the output's.

    Not ``compute_mask`` for every output: Keras leaves a layer that does not support masking without
    one (a ``Conv1D`` after ``Embedding(mask_zero=True)``, whose ``compute_mask`` raises when asked);
    keeps a mask ``call`` set on an output (``Masking``, a nested model, ``MultiHeadAttention``'s scores
    ``[batch, 1, query, key]`` from its softmax) unless ``compute_mask`` gives that output one; and
    gives ``compute_mask``'s masks to the outputs in order, not its first to all (the query mask laid
    on the scores' ``[batch, heads]`` zeroed real queries).
    """
    flat = tf.nest.flatten(out)
    if not getattr(layer, "supports_masking", False):
        return [None] * len(flat)
    masks = [getattr(t, "_keras_mask", None) for t in flat]
    if not getattr(layer, "_compute_output_and_mask_jointly", False) and any(m is None for m in masks):
        inputs = args[0] if args else next(iter(kwargs.values()), None)
        if "mask" in kwargs:  # passed to ``call``: the mask Keras gives ``compute_mask`` too
            previous = kwargs["mask"]
        else:
            previous = tf.nest.map_structure(lambda t: getattr(t, "_keras_mask", None), inputs)
        # an Embedding(mask_zero=True) makes its mask from its input, so compute_mask even without one
        computed = layer.compute_mask(inputs, previous)
        if computed is not None:
            for i, m in enumerate(tf.nest.flatten(computed)[: len(flat)]):
                masks[i] = m
    return [
        m
        if m is not None and m.shape.rank is not None and t.shape.rank is not None and m.shape.rank <= t.shape.rank
        else None
        for t, m in zip(flat, masks)
    ]


def check_supported(model: Any) -> None:
    """Raise ``ValueError`` for what a recorded ``fit`` cannot do, naming the setting."""
    strategy = getattr(model, "distribute_strategy", None)
    supported = _ONE_DEVICE_STRATEGIES + _MIRRORED_STRATEGIES
    if strategy is not None and type(strategy).__name__ not in supported:
        raise ValueError(
            f"tb_parity: fit under {type(strategy).__name__} is not supported (MirroredStrategy and one "
            "device are): record around strategy.run in a custom loop (README: 'Distributed training')"
        )
    if getattr(model, "_jit_compile", False) is True:
        raise ValueError(
            "tb_parity: fit with jit_compile=True is not supported: XLA cannot write summaries (Keras 3's default "
            "jit_compile='auto' turns it on when a GPU is visible): compile(..., jit_compile=False)"
        )
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise ValueError("tb_parity: compile the model before instrumenting it")
    if "LossScale" in type(optimizer).__name__:
        raise ValueError(
            "tb_parity: a LossScaleOptimizer is not supported (compile adds one under the 'mixed_float16' "
            "policy): gradients would be logged scaled; see the README's 'Mixed precision'"
        )
    own = _own_train_step(model)
    if own is not None:
        raise ValueError(
            f"tb_parity: {own} overrides train_step; instrument would replace it with Keras's default step "
            "and record another program than yours (a new user's gradient clipping vanished: a false DIVERGE, "
            "and a false AGREE against an original without it). Record your own step instead: wrap its body "
            "in `with recorder.step(self.optimizer.iterations, variables=self, optimizer=self.optimizer):` "
            "and record lr, loss and gradients there (docs/shim.md, TF2)"
        )


#: Where Keras's default ``train_step`` is defined (tf_keras / Keras 2, Keras 3 on TensorFlow). Any
#: other definition, Keras's own models' too (SharpnessAwareMinimization, WideDeepModel), is a step
#: that ``instrument``'s default step would replace.
_DEFAULT_TRAIN_STEPS = frozenset(
    {
        ("tf_keras.src.engine.training", "Model"),
        ("keras.src.engine.training", "Model"),
        ("keras.engine.training", "Model"),
        ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer"),
    }
)


def _own_train_step(model: Any) -> Optional[str]:
    """Who overrides Keras's default ``train_step`` (``module.Class``, or the instance), None if no one."""
    step = vars(model).get("train_step")
    if step is not None and not getattr(step, "_tb_parity", False):
        return f"this {type(model).__name__} instance (train_step assigned on it)"
    for cls in type(model).__mro__:
        if "train_step" in vars(cls):
            if (cls.__module__, cls.__qualname__) in _DEFAULT_TRAIN_STEPS:
                return None
            return f"{cls.__module__}.{cls.__qualname__}"
    return None


def _track_loss(model: Any, total: Any, x: Any) -> None:
    """Feed Keras 3's loss tracker as its own ``train_step`` does: ``compute_loss`` leaves it alone,
    and the ``loss`` that ``fit`` reports (its History, the logs that ``ReduceLROnPlateau``,
    ``EarlyStopping`` or ``ModelCheckpoint`` monitor) is that tracker's mean. Left out, an
    instrumented Keras 3 ``fit`` reported a loss of 0.0 every epoch, so a callback monitoring it
    trained otherwise than the user's program. tf_keras's ``compute_loss`` tracks its loss itself
    (no ``_loss_tracker``). Under a strategy each replica's loss is scaled by the number of
    replicas; the tracker takes it unscaled, with the replica's batch size as its weight."""
    tracker = getattr(model, "_loss_tracker", None)
    if tracker is None:
        return
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    value = total * tf.cast(replicas, total.dtype) if replicas > 1 else total
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    tracker.update_state(value, sample_weight=tf.shape(first)[0])


class _StepNumbering:
    """Step numbers that go on across ``compile`` calls. A model compiled again with a new
    optimizer (fine-tuning in two phases) counts its ``iterations`` from 0 again: a new user's second
    phase wrote over the first's steps in the same run (the last write won) and was compared with
    the TF1 run's first steps, whose ``global_step`` went on counting. A fresh optimizer's steps
    (its count at 0) are numbered on from the last one's; one whose count is already past 0 (restored
    from a checkpoint) keeps its own, as a TF1 run restored to that ``global_step`` would."""

    def __init__(self) -> None:
        self._optimizer: Any = None
        self._offset = 0

    def step(self, optimizer: Any) -> Any:
        """The step of ``optimizer``'s next update (read while ``fit`` traces its step function)."""
        if self._optimizer is not None and optimizer is not self._optimizer:
            with tf.init_scope():  # eager values: the earlier fit has ended
                fresh = int(optimizer.iterations.numpy()) == 0
                self._offset = self._offset + int(self._optimizer.iterations.numpy()) if fresh else 0
        self._optimizer = optimizer
        return optimizer.iterations + self._offset if self._offset else optimizer.iterations


def _steps_per_execution(model: Any) -> Optional[int]:
    """``model.compile(steps_per_execution=n)``'s n when above 1 (a variable in tf_keras, an int in
    Keras 3), read while ``fit`` traces its step; None otherwise."""
    n = getattr(model, "_steps_per_execution", None)  # not `or`: a variable has no truth value in a graph
    if n is None:
        n = getattr(model, "steps_per_execution", None)
    if isinstance(n, tf.Variable):
        with tf.init_scope():
            n = n.numpy()
    try:
        value = int(n) if n is not None else 1
    except (TypeError, ValueError):
        return None
    return value if value > 1 else None


def instrument(
    model: Any,
    recorder: Any,
    layers: Sequence[Any] = (),
    gradients: bool = True,
    slots: bool = True,
    zero_masked: bool = False,
) -> Any:
    """Make ``model.fit`` record every training step on ``recorder`` (a ``summary_v2.Recorder``).

    Args:
      model: a compiled Keras model (tf_keras, or Keras 3 on the TensorFlow backend).
      recorder: where to record.
      layers: layers whose outputs to record (see :func:`instrument_layer`), or their names
        (``model.get_layer(name)``).
      gradients: record each trainable variable's gradient.
      slots: record the optimizer's slots (none for plain SGD).
      zero_masked: record the positions a layer output's Keras mask marks as padding as 0 (see
        :func:`instrument_layer`); the TF1 side records them likewise with
        ``rec.activation(name, t, mask=...)``.

    ``steps_per_execution > 1`` works: Keras runs that many ``train_step``s inside one
    ``tf.function``, and each writes its own step. Under ``MirroredStrategy`` the step is recorded
    across the replicas (``mirrored_step``). Raises ``ValueError`` for a distribution strategy other
    than ``OneDeviceStrategy`` and ``MirroredStrategy``, ``jit_compile=True``, a loss-scale optimizer or
    a model class with its own ``train_step`` (see :func:`check_supported`), and, when ``fit`` starts,
    for a model that computes no loss (and for Keras 3's ``gradient_accumulation_steps`` under
    ``MirroredStrategy``).
    """
    check_supported(model)
    # a name is the model's layer of that name (a new user's layers=["dense"] failed with
    # "type object 'str' has no attribute 'call'"); get_layer names the ones it lacks
    chosen = [model.get_layer(layer) if isinstance(layer, str) else layer for layer in layers]
    if {id(layer) for layer in getattr(model, "layers", ())} <= {id(layer) for layer in chosen}:
        # every layer of the model (layers=model.layers, which holds a functional model's InputLayers): the
        # inputs were not asked for by name, and the model's other layers are recorded as before
        chosen = [layer for layer in chosen if not _is_input_layer(layer)]
    for layer in chosen:  # before any is instrumented: a refused one leaves the others as they were
        _check_called(layer)
    for layer in chosen:
        if getattr(layer, "_tb_parity_recorder", None) is not None:
            # instrumented by an earlier call (the first compile's: a second phase is instrumented again, as
            # the first needed it after compile): it records onto this recorder, under its name (wrapped
            # again, it raised "already instrumented" and a two-phase fine-tuning port stopped there)
            layer._tb_parity_recorder = recorder
            layer._tb_parity_zero_masked = zero_masked
        else:
            instrument_layer(recorder, layer, zero_masked=zero_masked)

    # instrumenting again onto the same recorder (after a second compile, as the first needed it)
    # keeps the numbering: a new one started the second phase at its optimizer's 0 again, over the
    # first phase's steps (a faithful two-phase port diverged at step 0 on its lr)
    previous = getattr(vars(model).get("train_step"), "_tb_parity_numbering", None)
    numbering = previous[1] if previous is not None and previous[0] is recorder else _StepNumbering()

    def train_step(data: Any) -> Any:
        check_supported(model)
        recorder.steps_per_execution = _steps_per_execution(model)
        replica = splitting_replica_context()
        if replica is not None:
            return mirrored_step(replica, data)
        x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
        opt = model.optimizer
        variables = model.trainable_variables
        # Keras 3's gradient_accumulation_steps=n: each call is one micro-batch, `iterations` counts updates
        # (the same step n times) and the update applies the mean of the n micro-batches' gradients. Only
        # the update's micro-batch is written, with that mean (what TF1's accumulation applies and records,
        # README "Gradient accumulation"): every step was written n times, the last micro-batch's own
        # gradient compared with the applied one, a faithful port's false DIVERGE at step 0.
        n = slot_lib.accumulation_steps(opt)
        when = None
        if n:
            slot_lib.build_slots(opt, variables)
            when = tf.equal((tf.convert_to_tensor(opt._iterations) + 1) % n, 0)
        with recorder.step(numbering.step(opt), variables=model, optimizer=opt if slots else None, when=when):
            lr = slot_lib.current_lr(opt)
            if lr is not None:
                recorder.lr(lr)
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                total = model.compute_loss(x, y, y_pred, sample_weight)
                if total is None:  # raised while fit traces the step, before anything is recorded
                    raise ValueError(
                        "tb_parity: the model computes no loss (compile(loss=...) or add_loss); "
                        "instrument records the loss fit minimises"
                    )
                loss = recorder.loss(total)
                _track_loss(model, total, x)
            grads = tape.gradient(loss, variables)
            if gradients:
                recorded = grads
                if n:
                    accumulated = [opt._accumulated_gradients[opt._get_variable_index(v)] for v in variables]
                    recorded = [  # None: a variable the loss does not reach (Keras skips it too)
                        None if g is None else (tf.convert_to_tensor(g) + tf.convert_to_tensor(a)) / n
                        for g, a in zip(grads, accumulated)
                    ]
                recorder.grads(recorded, variables)
            opt.apply_gradients(zip(grads, variables))
        return model.compute_metrics(x, y, y_pred, sample_weight)

    def mirrored_step(replica: Any, data: Any) -> Any:
        """Keras's default step on one replica of a ``MirroredStrategy``, recorded across the replicas.

        A replica cannot record (each would write its own share of the step), so the step is opened
        and closed in the cross-replica context by two ``merge_call``s, as a custom loop records around
        ``strategy.run`` (README "Distributed training"): the first reads every variable before the
        forward pass updates batch-norm statistics, the second records the replicas' layer outputs
        (concatenated along the batch), their losses (summed: Keras scales each replica's loss by the
        number of replicas) and gradients (summed, as the optimizer's all-reduce sums them), before the
        optimizer applies them. Until then ``fit`` under ``MirroredStrategy`` was refused and had to be
        rewritten as a custom loop, another program than the user's."""
        x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
        opt = model.optimizer
        variables = model.trainable_variables
        if slot_lib.accumulation_steps(opt):
            raise ValueError(
                "tb_parity: gradient_accumulation_steps under MirroredStrategy is not supported: record one "
                "device, or a custom loop around strategy.run"
            )
        stack = contextlib.ExitStack()

        def open_step(strategy: Any) -> None:
            stack.enter_context(recorder.step(numbering.step(opt), variables=model, optimizer=opt if slots else None))
            lr = slot_lib.current_lr(opt)
            if lr is not None:
                recorder.lr(lr)

        # merge_call runs the first replica's open_step (and close_step) once for all: that replica's
        # stack holds the step, the others' stay empty
        replica.merge_call(open_step)
        outputs: list[tuple[str, Any]] = []
        _REPLICA_OUTPUTS.outputs = outputs
        try:
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                total = model.compute_loss(x, y, y_pred, sample_weight)
                if total is not None:
                    _track_loss(model, total, x)
            if total is None:
                raise ValueError(
                    "tb_parity: the model computes no loss (compile(loss=...) or add_loss); instrument records "
                    "the loss fit minimises"
                )
            grads = tape.gradient(total, variables)
        except BaseException as exc:  # the open step is dropped, unwritten: the recorder can record again
            stack.__exit__(type(exc), exc, exc.__traceback__)
            raise
        finally:
            _REPLICA_OUTPUTS.outputs = None
        # the names stay out of merge_call's arguments, which it regroups per replica: a multi-output
        # layer's names ("two/0"), built on each replica, became a PerReplica of strings and the
        # recorder raised "name must be a non-empty string" (every replica names its outputs alike)
        names = [name for name, _ in outputs]

        def close_step(strategy: Any, values: list, total: Any, grads: list) -> None:
            with stack:
                for name, value in zip(names, values):
                    recorder.activation(name, value)
                recorder.loss(total, reduction="sum")
                if gradients:
                    recorder.grads(grads, variables)

        replica.merge_call(close_step, args=([value for _, value in outputs], total, grads))
        opt.apply_gradients(zip(grads, variables))
        return model.compute_metrics(x, y, y_pred, sample_weight)

    train_step._tb_parity = True  # type: ignore[attr-defined]  # ours: instrumenting again is allowed
    train_step._tb_parity_numbering = (recorder, numbering)  # type: ignore[attr-defined]
    model.train_step = train_step
    model.train_function = None  # a cached function would keep the old step
    return model


def forward_pass(
    recorder: Any,
    model: Any,
    inputs: Any,
    step: int = 0,
    modes: Sequence[str] = ("inference", "training"),
    output_name: str = "output",
) -> dict[str, Any]:
    """Record one forward pass per mode as step ``step``, no optimizer: the model's output as
    ``output/<mode>/<output_name>`` and each instrumented layer's as ``activation/<mode>/<layer>``.

    The migration guides' first check: same inputs and weights on both sides, outputs
    compared in inference mode and in training mode. Returns the outputs by mode. A
    training-mode pass runs the model as training does (batch norm updates its statistics).
    """
    outputs = {}
    with recorder.step(step):
        for mode in modes:
            with recorder.mode(mode):
                outputs[mode] = model(inputs, training=mode == "training")
                for i, t in enumerate(flat := tf.nest.flatten(outputs[mode])):
                    recorder.output(output_name if len(flat) == 1 else f"{output_name}/{i}", t)
    return outputs
