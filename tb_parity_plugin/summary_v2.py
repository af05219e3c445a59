"""TF2 eager / ``tf.function`` logging shim (same vocabulary as ``summary_v1``).

Record a training step's tensors inside ``with recorder.step(step):``; on exit the
statistics are computed as ops of the same step and written with ``tf.summary``::

    rec = summary_v2.Recorder("logs/tf2")

    @tf.function
    def train_step(x, y):
        with rec.step(optimizer.iterations):
            rec.lr(lr_schedule(optimizer.iterations))
            with tf.GradientTape() as tape:
                logits = rec.activation("logits", model(x))
                loss = rec.loss(loss_fn(y, logits))
            grads = tape.gradient(loss, model.trainable_variables)
            rec.apply_gradients(optimizer, zip(grads, model.trainable_variables))

Why it stays cheap: the layout (names, shapes, offsets) is static, so it is built at
trace time and written once from outside the graph (``tf.init_scope``); each step
only runs the statistics ops and ``tf.summary.write`` of one ``[n, 14]`` float64
block (plus the full values of tensors under ``full_values_limit``). Nothing depends
on Python values of the step, so the function is traced once.

Under a distribution strategy (``MirroredStrategy``, ``MultiWorkerMirroredStrategy``), record
in the cross-replica context (inside ``with rec.step(...)``, around ``strategy.run``) the
per-replica values ``strategy.run`` returns, and the mirrored variables. Each replica's value
is kept as ``<name>@replica<k>``, and ``<name>`` holds what one device would have computed on
the global batch, so the run compares to a one-device TF1 baseline: gradients are summed (as
the optimizers' all-reduce does), activations concatenated along the batch (the order in which
``experimental_distribute_dataset`` splits a global batch), a variable is its single copy (each
replica's copy is kept too, so the engine can name a replica whose copy disagrees), and losses
and metrics combine as ``reduction=`` says (``"sum"`` for ``tf.nn.compute_average_loss`` over
the global batch, ``"mean"`` for a per-replica mean): there is no safe default for them.

Values as read at the start of the step: ``with rec.step(step, variables=model,
optimizer=opt)`` reads every variable of ``model`` (trainable ones as ``weight``, the
others, such as batch-norm moving statistics, as ``state``) and ``opt``'s slots (``slot``)
on entry, before the forward pass (Keras updates the moving statistics inside it) and the
update. Inside ``tf.function``, automatic control dependencies run those reads before any
later write (and resource variables copy on write). ``weight``/``grads_and_vars`` called
later return the entry read of a variable read there, or read it where they are called;
a variable whose write was already built in the traced step raises instead of logging
the updated value.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata

from tb_parity_plugin.records import metadata, writer
from tb_parity_plugin.shim import ordering, slots
from tb_parity_plugin.shim.fit import forward_pass, instrument, instrument_layer, splitting_replica_context
from tb_parity_plugin.shim.recorder import (
    DEFAULT_FULL_VALUES_LIMIT,
    BaseRecorder,
    Blocks,
    Entry,
    StepLayouts,
    build_blocks,
    densified,
)

#: How each kind's per-replica values combine into the one-device value; kinds missing here
#: (loss, metric) must say it with ``reduction=``.
REPLICA_REDUCTIONS = {"grad": "sum", "activation": "concat", "output": "concat"}


def combine_replicas(parts: list[tf.Tensor], reduction: Optional[str], what: str) -> tf.Tensor:
    """The one-device value of per-replica ``parts`` under ``reduction`` (sum, mean, concat)."""
    if reduction == "sum":
        return tf.add_n(parts)
    if reduction == "mean":
        return tf.add_n(parts) / tf.cast(len(parts), parts[0].dtype)
    if reduction == "concat":
        return tf.concat(parts, axis=0)
    raise ValueError(
        f"{what} is per-replica: say how the replicas combine into the one-device value, "
        f"reduction='sum' (a loss scaled by the global batch, tf.nn.compute_average_loss) or 'mean' "
        f"(a per-replica mean) or 'concat'; got {reduction!r}"
    )


__all__ = ["Recorder", "forward_pass", "instrument", "instrument_layer"]


#: Why recording inside a replica context cannot work, and what does: said wherever it is tried.
_PER_REPLICA = (
    "recorded inside a replica context: under a tf.distribute strategy such as MirroredStrategy, "
    "strategy.run (and Keras fit, which calls train_step through it) runs the step once per replica, "
    "each with its share of the batch; return what to record from the replica function and record it "
    "in the cross-replica context around strategy.run in a custom loop (README: 'Distributed training'); "
    "Keras's default train_step under fit with MirroredStrategy is recorded by instrument(model, rec)"
)
_REDUCTIONS = ("sum", "mean", "concat")


def _on_replicas(values: Sequence[Any]) -> bool:
    """Whether ``values`` are tensors on more than one device: the replicas' parts, as
    ``experimental_local_results`` returns them (a plain list sits on one device, or on none yet)."""
    devices = {getattr(v, "device", "") for v in values}
    return len(devices - {""}) > 1


def _always_record() -> Any:
    """The recorder writes every step it is given, whatever ``tf.summary.record_if`` the caller
    set for its own summaries: Keras's ``TensorBoard(update_freq=N)`` callback sets one for the
    whole of ``fit`` (record when the step is a multiple of N), which left an instrumented port
    with every N-th step only (a false AGREE on the steps between, a late lr found N-1 steps late)."""
    return tf.summary.record_if(True)


def _in_replicas() -> bool:
    """Inside ``strategy.run`` of a strategy that splits the step between replicas
    (:func:`~tb_parity_plugin.shim.fit.splitting_replica_context`)."""
    return splitting_replica_context() is not None


#: Why a step compiled by XLA cannot be recorded, and what does: said where it is tried.
_IN_XLA = (
    "tb_parity: recording inside a function compiled with XLA (tf.function(jit_compile=True), or a Keras "
    "model compiled with jit_compile=True, which Keras 3's default jit_compile='auto' picks on a GPU) is not "
    "supported: XLA cannot compute the recorder's statistics nor write summaries; record in a function "
    "without it (tf.function(jit_compile=False), model.compile(..., jit_compile=False))"
)


def _keras_policy() -> Optional[str]:
    """The Keras global dtype policy's name (``mixed_float16`` under mixed precision), for the engine to
    say a port computes in float16 (a new user's faithful mixed port was told at step 0 that a layer
    "computes another function of its input", with no word of float16); None when Keras is absent.
    A Keras 3 imported as ``keras`` beside ``TF_USE_LEGACY_KERAS=1`` (``tf.keras`` then is tf_keras) has
    its own policy: a port built with it under ``mixed_float16`` was recorded as ``float32``. A ``mixed_``
    policy of either is the run's."""
    names = []
    for keras in (tf.keras, sys.modules.get("keras")):
        try:
            names.append(str(keras.mixed_precision.global_policy().name))  # type: ignore[union-attr]
        except Exception:  # no Keras, or one without a global policy: the run says nothing of it
            continue
    return next((name for name in names if name.startswith("mixed_")), names[0] if names else None)


def _last_op() -> tuple:
    """The current graph and the id of its last op (ops are numbered in creation order; -1: none)."""
    graph = tf.compat.v1.get_default_graph()
    ops = graph.get_operations()
    return graph, (ops[-1]._id if ops else -1)


def _in_xla() -> bool:
    """Inside a function that XLA compiles: ``tf.function(jit_compile=True)`` (Keras 3 ``fit`` builds its
    step so under ``jit_compile``). The recorder's ops failed there with XLA's "Detected unsupported
    operations ... SegmentSum", naming no setting: a new user's Keras 3 ``train_step`` override."""
    from tensorflow.python.ops import control_flow_util  # pylint: disable=g-direct-tensorflow-import

    return tf.inside_function() and control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


class Recorder(BaseRecorder):
    """Collects one training step's tensors and writes them as ``tf.summary`` events.

    Args:
      logdir: the run directory (one per run, e.g. ``logs/tf2``).
      full_values_limit: tensors with at most this many elements keep full values;
        larger ones keep statistics only.
    """

    def __init__(self, logdir: str, full_values_limit: int = DEFAULT_FULL_VALUES_LIMIT) -> None:
        super().__init__(full_values_limit)
        self.logdir = logdir
        with tf.init_scope():
            self._writer = tf.summary.create_file_writer(logdir)
        self._step: Optional[tf.Tensor] = None
        self._written_once: set[str] = set()
        self._replicas = 1  # the most per-replica copies seen in a step (run_info's "replicas")
        #: ``fit``'s ``steps_per_execution`` when above 1 (set by ``instrument``; run_info's): Keras then
        #: calls batch callbacks once per execution, and a value one sets per batch holds that long
        self.steps_per_execution: Optional[int] = None
        self._py_writer: Optional[writer.BlockWriter] = None  # steps with runtime-resolved layouts
        self._layouts = StepLayouts(full_values_limit)
        self._step_opened: Optional[tuple] = None  # (graph, id of its last op) when the open step began

    # -- BaseRecorder hooks -------------------------------------------------------
    def _check_open(self) -> None:
        if self._step is None:
            raise RuntimeError("record tensors inside `with recorder.step(step):`")

    def _snapshot(self, var: Any, tag: str) -> tf.Tensor:
        if tf.inside_function() and isinstance(var, tf.Variable) and hasattr(var, "handle"):
            # Stateful ops of a tf.function run in program order: a write built before this
            # read runs before it, and the value logged would be the updated one.
            # Only writes built since this step opened: a step opened after another phase's update in
            # the same function (a GAN's generator step after the discriminator's) records the values
            # that phase left, as TF1's second `sess.run` does (such a port was refused here).
            graph, opened = self._step_opened or (None, -1)
            current = tf.compat.v1.get_default_graph()
            written = [op for op in ordering.writers(var, calls=False) if current is not graph or op._id > opened]
            if written:
                raise ValueError(
                    f"tb_parity: {tag} is recorded after {written[0].name!r} wrote it in this step; "
                    "record it at the step's start: `with rec.step(step, variables=model, optimizer=opt)`"
                )
        value = var.read_value() if hasattr(var, "read_value") else tf.convert_to_tensor(var)
        return tf.identity(value)

    @property
    def recording(self) -> bool:
        """Whether a step is open (instrumented layers record only then)."""
        return self._step is not None

    # -- distribution strategies ---------------------------------------------------
    def _variable(self, kind: str, var: Any, name: Optional[str] = None, lr: Optional[tf.Tensor] = None) -> tf.Tensor:
        """A mirrored variable keeps each replica's copy beside its single copy (see :meth:`tensor`)."""
        if isinstance(var, tf.distribute.DistributedValues):
            # a Keras SGD momentum slot is mirrored too: it is recorded in lr units like any other (a
            # new user's faithful MirroredStrategy port had its raw -lr x accumulator compared with
            # TF1's accumulator: a false DIVERGE at step 1, cosine -1)
            return self._distributed(kind, name or self._name_of(var), var, None, lr)
        inner = getattr(var, "value", None)  # a Keras 3 variable holds its tf.Variable as `value`
        if isinstance(inner, tf.distribute.DistributedValues) and not isinstance(var, tf.Variable):
            # recorded as the replica 0 copy alone, a Keras 3 BatchNormalization's moving statistics kept
            # per replica (synchronized=False) were said to be "every variable's copies agree"
            return self._distributed(kind, name or self._name_of(var), inner, None, lr)
        return super()._variable(kind, var, name, lr)

    def tensor(self, kind: str, name: str, value: Any, reduction: Optional[str] = None) -> tf.Tensor:
        """Record ``value``; a per-replica value (or mirrored variable) also keeps each replica's copy."""
        return self._distributed(kind, name, value, reduction)

    def _distributed(
        self, kind: str, name: str, value: Any, reduction: Optional[str], lr: Optional[tf.Tensor] = None
    ) -> tf.Tensor:
        """:meth:`tensor`; ``lr``: a mirrored slot's copies recorded in lr units (``slots.in_lr_units``)."""
        if _in_replicas():  # inside strategy.run
            # checked first: a plain tensor recorded in step_fn came once per replica and was
            # refused as "logged twice in one step", which the user had not done
            raise RuntimeError(f"{kind}/{name!r}: {_PER_REPLICA}")
        if not isinstance(value, tf.distribute.DistributedValues):
            # One value is what every reduction of one replica gives: the distributed template's
            # rec.loss(loss, reduction="sum") runs unchanged under OneDeviceStrategy, whose
            # strategy.run returns plain tensors (it raised there, leaving the run empty)
            if reduction is not None and reduction not in _REDUCTIONS:
                raise ValueError(f"{kind}/{name!r}: reduction= is one of {', '.join(_REDUCTIONS)}; got {reduction!r}")
            if isinstance(value, (list, tuple)) and (reduction is not None or _on_replicas(value)):
                # experimental_local_results(loss) is one value per replica: stacked as one tensor,
                # a scalar loss became a vector of the replicas' parts, compared element by element
                # (with reduction= or without: a review's rec.loss(local_results) was stacked); a
                # list on one device (a metric per head) is recorded stacked, as summary_v1 does
                raise TypeError(
                    f"{kind}/{name!r}: takes strategy.run's result itself (a PerReplica value, with reduction=), "
                    f"or one tensor; got a {type(value).__name__} of {len(value)}, as from "
                    "experimental_local_results: pass the PerReplica value so each replica is recorded and reduced"
                )
            return super().tensor(kind, name, value)
        components = value.values  # one per replica, in replica order (as experimental_local_results)
        if isinstance(value, tf.Variable):
            parts = [tf.identity(v.read_value()) for v in components]
            single = tf.identity(value.read_value())
            if lr is not None:
                parts, single = [slots.in_lr_units(p, lr) for p in parts], slots.in_lr_units(single, lr)
        else:
            # each replica's ragged or sparse part recorded dense, as on one device; concatenated before that,
            # so the batch's rows are padded to its longest row, as one device pads them (a ragged fit port's
            # instrumented Embedding under MirroredStrategy failed its first step with "Failed to convert
            # elements of tf.RaggedTensor", and each replica pads to its own longest row)
            parts = [tf.convert_to_tensor(densified(v)) for v in components]
            how = reduction or REPLICA_REDUCTIONS.get(kind)
            if how == "concat" and isinstance(components[0], tf.RaggedTensor):
                single = densified(tf.concat(list(components), axis=0))
            elif how == "concat" and isinstance(components[0], tf.SparseTensor):
                single = densified(tf.sparse.concat(0, list(components), expand_nonconcat_dims=True))
            else:
                single = combine_replicas(parts, how, f"{kind}/{name!r}")
        self._replicas = max(self._replicas, len(parts))
        logged = super().tensor(kind, name, single)
        for k, part in enumerate(parts):
            super().tensor(kind, metadata.replica_name(name, k), part)
        return logged

    def loss(self, value: Any, name: str = "loss", reduction: Optional[str] = None) -> tf.Tensor:
        """The step's loss; a per-replica loss needs ``reduction="sum"`` or ``"mean"`` (see the module doc)."""
        return self.tensor("loss", name, value, reduction)

    def metric(self, name: str, value: Any, reduction: Optional[str] = None) -> tf.Tensor:
        return self.tensor("metric", name, value, reduction)

    # -- steps --------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, step: Any, variables: Any = None, optimizer: Any = None, when: Any = None) -> Iterator[Recorder]:
        """Records everything inside as step ``step`` (int, tensor or variable such as
        ``optimizer.iterations``, read on entry) and writes it on exit.

        ``variables`` (a Keras model or layer, a ``tf.Module`` or a list) are read on entry,
        before the forward pass updates batch-norm statistics and before the optimizer
        updates anything: trainable ones as ``weight``, the others as ``state``; with
        ``optimizer`` (one, or a list of them), their slots too (built now if Keras has not built them yet).
        ``when``: a boolean tensor; the step is written only where it is true (``instrument`` writes a
        Keras 3 optimizer's update micro-batch only, under ``gradient_accumulation_steps``).
        """
        if _in_replicas():
            raise RuntimeError(_PER_REPLICA)
        if _in_xla():
            raise ValueError(_IN_XLA)
        if self._step is not None:
            raise RuntimeError("recorder.step() does not nest")
        self._step_opened = _last_op() if tf.inside_function() else None
        self._step = tf.cast(tf.convert_to_tensor(step), tf.int64)
        self._take_entries()
        ok = False
        try:
            if variables is not None:
                self.variables(variables, optimizer)
            elif optimizer is not None:
                raise ValueError("step(optimizer=...) needs variables= (whose slots to record)")
            yield self
            self._restate_lr_units()
            ok = True
        finally:
            step_t, self._step = self._step, None
            entries = self._take_entries()
        if ok and entries:
            self._write(step_t, entries, when)

    def _restate_lr_units(self) -> None:
        """A Keras SGD momentum slot is recorded as ``-m / lr`` with the lr read when the step opens
        (:attr:`slots.Slot.lr_units`). A custom loop that computes its lr by hand and assigns it inside
        the step (``opt.learning_rate.assign(lr_fn(opt.iterations))`` after ``with rec.step(...)``) has
        the update apply the assigned lr, so the slot was divided by the step before's: a helper's
        Nesterov port under a piecewise schedule had its slot agree with TF1's at the lr change and was
        told of clipping or a weight decay a step later. Inside a ``tf.function``, when the lr variable
        is written in this step before the slot's update and not after it, the slot is divided by the
        lr read now (after that write, as the update read it); written both before and after, which lr
        the update applied is not known from the step, and that raises."""
        graph, opened = self._step_opened or (None, -1)
        if not self._lr_slots or not tf.inside_function() or tf.compat.v1.get_default_graph() is not graph:
            return
        restated: dict[int, tf.Tensor] = {}
        for read, lr_var, dtype in self._lr_slots:
            lr_writes = [op._id for op in ordering.writers(lr_var, calls=False) if op._id > opened]
            updates = [op._id for op in ordering.writers(read.var) if op._id > opened]
            if not lr_writes or not updates or min(lr_writes) > min(updates):
                continue  # the lr read at the step's start is the one the update applies
            if max(lr_writes) > min(updates):
                raise ValueError(
                    f"tb_parity: {read.tag} is a Keras SGD momentum recorded in lr units, and the optimizer's "
                    f"learning rate {lr_var.name!r} is assigned in this step both before and after its update: "
                    "assign it once, before `with rec.step(...)`"
                )
            with self._own_ops():
                restated[id(read.logged)] = slots.in_lr_units(read.read, tf.cast(lr_var.read_value(), dtype))
        if restated:
            self._entries = [
                Entry(e.kind, e.name, restated[id(e.tensor)], e.random) if id(e.tensor) in restated else e
                for e in self._entries
            ]

    def apply_gradients(self, optimizer: Any, grads_and_vars: Iterable[tuple], name: Optional[str] = None) -> Any:
        """Records each gradient and weight (read now), then ``optimizer.apply_gradients``."""
        pairs = self.grads_and_vars(grads_and_vars)
        kwargs = {"name": name} if name else {}
        return optimizer.apply_gradients(pairs, **kwargs)

    def minimize(self, optimizer: Any, loss: tf.Tensor, var_list: list, tape: tf.GradientTape) -> Any:
        """``tape.gradient`` then :meth:`apply_gradients`."""
        grads = tape.gradient(loss, var_list)
        return self.apply_gradients(optimizer, zip(grads, var_list))

    # -- writing ------------------------------------------------------------------
    def _write_once(self, key: str, tag: str, payload: bytes, block: str, layout_hash: str) -> None:
        """Writes a static string record once per recorder, eagerly even while tracing."""
        if key in self._written_once:
            return
        with tf.init_scope(), self._writer.as_default(), _always_record():
            tf.summary.write(
                tag,
                tf.constant(payload),
                step=0,
                metadata=metadata.create_summary_metadata(block, layout_hash),
            )
        self._written_once.add(key)

    def _write(self, step: tf.Tensor, entries: list[Entry], when: Any = None) -> None:
        mode = "function" if tf.inside_function() else "eager"
        info = {
            "version": metadata.FORMAT_VERSION,
            "side": "tf2",
            "mode": mode,
            "tensorflow": tf.__version__,
            "replicas": self._replicas,
            "keras_policy": _keras_policy(),
        }
        if self.steps_per_execution:
            info["steps_per_execution"] = self.steps_per_execution
        self._write_once("run_info", metadata.RUN_INFO_TAG, json.dumps(info, sort_keys=True).encode(), "run_info", "")
        blocks = build_blocks(entries, self.full_values_limit, dynamic_values=True)
        if blocks.shapes:  # shapes unknown to the graph: the layout is resolved per step, in Python
            self._write_resolved(step, blocks, when)
            return
        h = blocks.layout.hash
        self._write_once("layout/" + h, metadata.layout_tag(h), blocks.layout.to_json_bytes(), "layout", h)
        record = _always_record() if when is None else tf.summary.record_if(tf.cast(when, tf.bool))
        with self._writer.as_default(), record:
            tf.summary.write(
                metadata.stats_tag(h), blocks.stats, step=step, metadata=metadata.create_summary_metadata("stats", h)
            )
            for dtype, values in sorted(blocks.values.items()):
                tf.summary.write(
                    metadata.values_tag(h, dtype),
                    values,
                    step=step,
                    metadata=metadata.create_summary_metadata("values", h),
                )
            for kind, value in blocks.scalars.items():
                tf.summary.write(
                    metadata.SCALAR_TAGS[kind],
                    value,
                    step=step,
                    metadata=scalar_metadata.create_summary_metadata(display_name=kind, description=""),
                )

    def _write_resolved(self, step: tf.Tensor, blocks: Blocks, when: Any = None) -> None:
        """Write a step whose layout depends on runtime shapes (``tf.function`` with ``None``
        dimensions in its ``input_signature``): the blocks go to a Python writer, which fills
        the runtime shapes into the layout as the TF1 shim does, so such tensors keep full values."""
        dtypes, rows = sorted(blocks.values), sorted(blocks.shapes)
        scalar_kinds = sorted(blocks.scalars)

        def write(when_np: Any, step_np: Any, stats: Any, *rest: Any) -> np.int64:
            if not bool(when_np):
                return np.int64(0)
            values = dict(zip(dtypes, rest[: len(dtypes)]))
            shapes = dict(zip(rows, rest[len(dtypes) : len(dtypes) + len(rows)]))
            scalars = {k: float(v) for k, v in zip(scalar_kinds, rest[len(dtypes) + len(rows) :])}
            if self._py_writer is None:
                self._py_writer = writer.BlockWriter(
                    self.logdir, side="tf2", mode="function", tensorflow=tf.__version__
                )
            self._py_writer.write_step(int(step_np), self._layouts.of(blocks, shapes), stats, values, scalars)
            return np.int64(0)

        inputs = [
            tf.constant(True) if when is None else tf.cast(when, tf.bool),
            step,
            blocks.stats,
            *(blocks.values[d] for d in dtypes),
            *(blocks.shapes[i] for i in rows),
        ]
        tf.numpy_function(write, inputs + [blocks.scalars[k] for k in scalar_kinds], tf.int64, stateful=True)

    def flush(self) -> None:
        if self._py_writer is not None:
            self._py_writer.flush()
        with tf.init_scope():
            self._writer.flush()

    def close(self) -> None:
        if self._py_writer is not None:
            self._py_writer.close()
        with tf.init_scope():
            self._writer.close()
