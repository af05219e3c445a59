"""What the TF1 and TF2 shims share: the recording vocabulary and the step blocks.

A recorder collects ``(kind, name, tensor)`` entries in call order; :func:`build_blocks`
turns them into the on-disk layout plus the graph ops computing the stats block and
the per-dtype values blocks (docs/ARCHITECTURE.md). ``summary_v1`` and ``summary_v2``
subclass :class:`BaseRecorder` and only add how snapshots are taken and how blocks are
written.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np
import tensorflow as tf

from tb_parity_plugin.records import metadata, writer
from tb_parity_plugin.shim import health_tf, partitions, randomness, slots
from tb_parity_plugin.shim.slots import Slot
from tb_parity_plugin.shim.variables import frozen_variables, is_variable, model_variables, variable_name

__all__ = ["BaseRecorder", "Blocks", "Entry", "build_blocks", "variable_name"]

DEFAULT_FULL_VALUES_LIMIT = writer.DEFAULT_FULL_VALUES_LIMIT


@dataclasses.dataclass(frozen=True)
class Entry:
    """One recorded tensor of a step."""

    kind: str
    name: str
    tensor: tf.Tensor
    #: The types of the random ops a forward tensor is computed from (:mod:`randomness`).
    random: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Blocks:
    """A step's layout (static) and the tensors to fetch or write for it."""

    layout: metadata.Layout
    stats: tf.Tensor  # float64 [n, N_STATS]
    values: dict  # dtype name -> 1-D tensor
    scalars: dict  # "lr"/"loss" -> scalar tensor
    #: Row index -> runtime shape (int64 vector) of each tensor of unknown static shape, and the
    #: indices among them whose values the values blocks hold when their runtime size is within
    #: the limit (``dynamic_values=True``): a writer resolves the layout per step from them.
    shapes: dict = dataclasses.field(default_factory=dict)
    dynamic: tuple = ()


def _values_dtype(dtype: tf.DType) -> bool:
    """Whether full values of this dtype go into a values block.

    bfloat16 is kept as statistics only: readers without TensorFlow cannot decode it.
    """
    return tf.as_dtype(dtype) in (tf.float16, tf.float32, tf.float64) or tf.as_dtype(dtype).is_integer


def _static_shape(t: tf.Tensor) -> tuple:
    """Static shape with ``None`` for unknown dims (``(None,)`` when even the rank is unknown)."""
    return tuple(t.shape.as_list()) if t.shape.rank is not None else (None,)


#: Kinds recorded without an element sample: a slot's tolerance scales with its largest element
#: (``Tolerance.atol_of_max``), which a sample does not hold, and weights expose a wrong slot.
UNSAMPLED_KINDS = frozenset({"slot"})


_COMPOSITE = (tf.RaggedTensor, tf.SparseTensor)


def densified(value: Any) -> Any:
    """``value`` as the dense tensor a padded batch records: a ``tf.RaggedTensor`` (an ``Embedding``'s
    output on ragged ids) padded with 0 to its longest row, a ``tf.SparseTensor`` with 0 where it holds
    nothing (its duplicate indices summed); padded positions are 0 as ``activation(..., mask=)`` and
    ``instrument(zero_masked=True)`` record them, so a ragged port pairs with a padded original or port
    element by element. Anything
    else as it is. (``tf.convert_to_tensor`` refuses both: a ragged ``fit`` port's instrumented
    ``Embedding`` failed its first step with "Failed to convert elements of tf.RaggedTensor".)"""
    if isinstance(value, tf.RaggedTensor):
        return value.to_tensor()
    if isinstance(value, tf.SparseTensor):
        # scattered, not tf.sparse.to_dense: that refuses indices out of order (a graph's adjacency built
        # from its edge list, which sparse_dense_matmul reads as it is, failed the step it was recorded in)
        # and duplicates, which the ops reading it sum, as the scatter does
        return tf.scatter_nd(value.indices, value.values, value.dense_shape)
    return value


def _components(value: Any) -> tf.Tensor:
    """The dense tensor of a ragged or sparse ``value`` that the ops after it read."""
    return value.flat_values if isinstance(value, tf.RaggedTensor) else value.values


def with_samples(entries: Sequence[Entry], full_values_limit: int) -> Sequence[Entry]:
    """``entries`` with, after each tensor that may be too large for full values (more than
    ``full_values_limit`` elements, or a size the graph does not know), a fixed sample of its
    elements (``<name>#sample``, :func:`health_tf.sample`): values of a few elements, compared
    element by element, where the tensor itself is compared by statistics. None below a
    ``full_values_limit`` of ``SAMPLE_SIZE``: a sample could not keep its values either."""
    if full_values_limit < metadata.SAMPLE_SIZE:  # statistics only, as asked
        return entries
    out = []
    for e in entries:
        out.append(e)
        size = e.tensor.shape.num_elements()
        if (
            (size is None or size > full_values_limit)
            and e.kind not in UNSAMPLED_KINDS
            and metadata.REPLICA_MARK not in e.name
            and _values_dtype(e.tensor.dtype)
        ):
            out.append(Entry(e.kind, metadata.sample_name(e.name), health_tf.sample(e.tensor), e.random))
    return out


def build_blocks(entries: Sequence[Entry], full_values_limit: int, dynamic_values: bool = False) -> Blocks:
    """Layout and block ops for ``entries`` with their samples (:func:`with_samples`; layout row i
    = entry i of those).

    With ``dynamic_values``, a tensor of unknown static size goes into its dtype's values block
    at run time when its runtime size is within ``full_values_limit`` (else it adds nothing),
    and ``shapes`` gives every such tensor's runtime shape, so the writer can resolve the layout
    of each step (``writer.resolve_layout``): a ``[None, n]`` placeholder keeps full values.
    """
    entries = with_samples(entries, full_values_limit)
    specs = [(e.kind, e.name, health_tf.dtype_name(e.tensor.dtype), _static_shape(e.tensor)) for e in entries]
    layout = writer.build_layout(specs, full_values_limit)
    # Offsets are per dtype, so dropping a whole dtype's values leaves the others valid.
    layout = metadata.Layout(
        tensors=tuple(
            dataclasses.replace(
                spec,
                values=spec.values if _values_dtype(e.tensor.dtype) else None,
                random=e.random or None,
            )
            for spec, e in zip(layout.tensors, entries)
        )
    )

    stats = health_tf.stats_block([e.tensor for e in entries])
    parts: dict[str, list] = {}
    shapes, dynamic = {}, []
    for i, (spec, e) in enumerate(zip(layout.tensors, entries)):
        if spec.values is not None:
            parts.setdefault(spec.values[0], []).append(tf.reshape(e.tensor, [-1]))
        elif None in spec.shape and dynamic_values:
            shapes[i] = tf.shape(e.tensor, out_type=tf.int64)
            if _values_dtype(e.tensor.dtype):
                dynamic.append(i)
                flat = tf.reshape(e.tensor, [-1])
                keep = tf.size(flat, out_type=tf.int64) <= full_values_limit
                parts.setdefault(spec.dtype, []).append(flat[: tf.where(keep, tf.size(flat), 0)])
    values = {dtype: tf.concat(ts, 0) if len(ts) > 1 else ts[0] for dtype, ts in parts.items()}
    scalars = {}
    for e in entries:
        if e.kind in metadata.SCALAR_TAGS and e.kind not in scalars and e.tensor.shape.num_elements() == 1:
            scalars[e.kind] = tf.reshape(tf.cast(e.tensor, tf.float32), [])
    return Blocks(layout=layout, stats=stats, values=values, scalars=scalars, shapes=shapes, dynamic=tuple(dynamic))


class StepLayouts:
    """The layout of each step of one recorder: runtime shapes filled in, one per distinct set."""

    def __init__(self, full_values_limit: int) -> None:
        self.full_values_limit = full_values_limit
        self._resolved: dict[tuple, metadata.Layout] = {}

    def of(self, blocks: Blocks, shapes: Any) -> metadata.Layout:
        """``shapes``: row index -> runtime shape fetched for ``blocks.shapes`` (numpy)."""
        if not shapes:
            return blocks.layout
        key = (blocks.layout.hash, tuple((i, tuple(int(d) for d in np.asarray(v))) for i, v in sorted(shapes.items())))
        layout = self._resolved.get(key)
        if layout is None:
            layout = self._resolved[key] = writer.resolve_layout(
                blocks.layout, dict(key[1]), self.full_values_limit, blocks.dynamic
            )
        return layout


#: Mode labels of a forward pass (:meth:`BaseRecorder.mode`).
MODES = ("inference", "training")


@dataclasses.dataclass(frozen=True)
class VariableRead:
    """A recorded variable and the read the step's writes of it must wait for."""

    var: Any
    read: tf.Tensor  # the snapshot (what writers are ordered after)
    logged: tf.Tensor  # what is logged (the read, or a slot in lr units)
    tag: str


def _same_value(a: Any, b: Any) -> bool:
    """Whether variables ``a`` and ``b`` hold one value now, read outside any function being traced (a
    model restored from a checkpoint of the other). In a TF1 graph, where values are read only by a
    session, a variable of another graph (one name is one variable in a graph) is taken for one."""
    with tf.init_scope():
        if not tf.executing_eagerly():
            return True
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            return False
        x, y = np.asarray(a.numpy()), np.asarray(b.numpy())
    return bool(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"))


class BaseRecorder:
    """The recording vocabulary common to TF1 and TF2.

    Every method records a tensor under ``kind`` and ``name`` (tag ``<kind>/<name>``)
    and returns the tensor it will log, so calls can wrap expressions. A ``(kind, name)``
    may be recorded once per step; a second time raises ``ValueError``. A variable is read
    once per step: recording it again (``weight`` after ``variables``) returns that read.
    """

    def __init__(self, full_values_limit: int = DEFAULT_FULL_VALUES_LIMIT) -> None:
        if full_values_limit < 0:
            raise ValueError(f"full_values_limit must be >= 0, got {full_values_limit}")
        self.full_values_limit = int(full_values_limit)
        self._entries: list[Entry] = []
        self._keys: set[tuple[str, str]] = set()
        #: ``.ref()`` of the step's tensors a later forward tensor's random ops are not looked for past
        #: (:mod:`randomness`): those recorded, and the value of an output recorded masked
        self._walk_stops: set[Any] = set()
        self._reads: dict[int, VariableRead] = {}
        #: the step's slots recorded in lr units (``slots.in_lr_units``) by an optimizer whose lr is a
        #: variable, with that variable and the dtype of its read: ``summary_v2`` divides them again when
        #: the step assigns the lr before its update (:meth:`summary_v2.Recorder._restate_lr_units`)
        self._lr_slots: list[tuple[VariableRead, Any, tf.DType]] = []
        #: recorded name -> (the partitioned variable's part it is, its variable): ``_whole_parts``
        self._parts: dict[str, tuple[partitions.Part, Any]] = {}
        self._prefix = ""
        #: id(variable) -> (variable, recorded name) and recorded name -> variable, across steps:
        #: :meth:`_name_of`
        self._names: dict[int, tuple[Any, str]] = {}
        self._named: dict[str, Any] = {}
        #: ids of the variables named since the step opened: only these hold their name against another
        self._named_now: set[int] = set()

    # -- hooks for the subclasses -------------------------------------------------
    def _check_open(self) -> None:
        """Raise if recording is not allowed now."""

    def _snapshot(self, var: Any, tag: str) -> tf.Tensor:
        """The value of a variable as read now (``tag`` names it in errors)."""
        raise NotImplementedError

    def _moment_candidates(self) -> list[Any]:
        """Variables where a BERT-style optimizer's moments may be (``slots.named_moments``) beyond
        those passed in: none here; TF1's global variables in ``summary_v1``."""
        return []

    def _own_ops(self) -> contextlib.AbstractContextManager[None]:
        """Context for the ops the recorder builds for itself (TF1 frees them of the user's
        ``control_dependencies``)."""
        return contextlib.nullcontext()

    # AutoGraph strips the docstring of a body that is only a docstring and fails on what is left:
    # a tf.function recording inside Python control flow (a loop over layers) printed "AutoGraph
    # could not transform ... _after_read ... Please report this to the TensorFlow team"
    @tf.autograph.experimental.do_not_convert  # type: ignore[untyped-decorator]  # TensorFlow has no stubs
    def _after_read(self, read: VariableRead) -> None:
        """Called once a variable's read is recorded (TF1 orders its writers after it)."""

    # -- the vocabulary -----------------------------------------------------------
    def tensor(self, kind: str, name: str, value: Any) -> tf.Tensor:
        """Record ``value`` under ``<kind>/<name>``; returns the logged tensor (a ``tf.RaggedTensor`` or
        ``tf.SparseTensor`` itself: it is recorded dense, :func:`densified`, and the model goes on with it)."""
        if is_variable(value):
            return self._variable(kind, value, name)
        logged = self._record(kind, name, value)
        return value if isinstance(value, _COMPOSITE) else logged

    def recorded(self, kind: str, name: str) -> bool:
        """Whether ``<kind>/<name>`` is already recorded in this step (under the current mode)."""
        return (kind, self._prefix + name) in self._keys

    def _record(self, kind: str, name: str, value: Any) -> tf.Tensor:
        self._check_open()
        if not isinstance(kind, str) or not kind or "/" in kind:
            raise ValueError(f"kind must be a non-empty string without '/', got {kind!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        name = self._prefix + name
        if (kind, name) in self._keys:
            raise ValueError(f"tensor {kind}/{name!r} is logged twice in one step; give each a distinct name")
        with self._own_ops():
            t = tf.convert_to_tensor(densified(value))
        health_tf.check_dtype(t.dtype, f"{kind}/{name!r}")
        random: tuple[str, ...] = ()
        if kind in randomness.FORWARD_KINDS:
            random = randomness.random_ops(t, self._walk_stops)
        self._walk_stops.add(t.ref())
        if isinstance(value, _COMPOSITE):  # what the model reads on from it
            self._walk_stops.add(_components(value).ref())
        self._keys.add((kind, name))
        self._entries.append(Entry(kind, name, t, random))
        return t

    def _variable(self, kind: str, var: Any, name: Optional[str] = None, lr: Optional[tf.Tensor] = None) -> tf.Tensor:
        """Record ``var`` as read now, once per step (a second call returns the first read)."""
        known = self._reads.get(id(var))
        if known is not None and known.var is var:
            if not known.tag.startswith(f"{kind}/"):  # returning it would log a slot as state, silently
                hint = (
                    ": with two optimizers, pass both at once (variables(..., optimizer=[opt_a, opt_b])), so that "
                    "each one's slots are recorded as slots"
                    if kind == "slot"
                    else ": record each variable under one kind per step"
                )
                raise ValueError(
                    f"tb_parity: {variable_name(var)!r} is recorded as {known.tag} already in this step, not as "
                    f"{kind}{hint}"
                )
            return known.logged
        self._check_open()
        name = name or self._name_of(var)
        read = self._snapshot(var, f"{kind}/{name}")
        with self._own_ops():
            value = slots.in_lr_units(read, lr) if lr is not None else read
        logged = self._record(kind, name, value)
        self._note_part(self._prefix + name, var)
        self._reads[id(var)] = entry = VariableRead(var, read, logged, f"{kind}/{self._prefix}{name}")
        self._after_read(entry)
        return logged

    def _name_of(self, var: Any) -> str:
        """The name ``var`` (its weight, gradient and slots) is recorded under: :func:`variable_name`, or,
        when another variable already holds that name, the name TF1's graph would give a second variable
        of it (``hidden/kernel_1:0``, ``_2`` ...). tf_keras names a variable after its layer alone, so two
        sub-models whose layers share a name (a siamese tower ported as two towers built by one function,
        a two-tower model) hold two ``hidden/kernel:0``: ``fit`` failed at its first step with
        "weight/'hidden/kernel:0' is logged twice in one step", which the user could not rename."""
        known = self._names.get(id(var))
        if known is not None and known[0] is var and self._named.get(known[1]) is var:
            self._named_now.add(id(var))
            return known[1]
        base = variable_name(var)
        stem, colon, port = base.rpartition(":")
        if not (colon and port.isdigit()):
            stem, colon, port = base, "", ""
        name, k = base, 0
        # a name is another's while that variable is recorded in this step, or holds another value: one of a
        # model recorded in steps before whose value this one holds (a model rebuilt or loaded from its
        # checkpoint to resume, instrumented on the same recorder) gives it up, as TF1's graph holds one
        # variable of it (it was weight/dense/kernel_1:0 from the resumed steps on, a faithful resumed port's
        # structure DIVERGE); one of another value is another tower trained in its own steps (two towers of
        # one name, each trained by its own function on one recorder, wrote one series in turn)
        holder = self._named.get(name)
        while (
            holder is not None and holder is not var and (id(holder) in self._named_now or not _same_value(holder, var))
        ):
            k += 1
            name = f"{stem}_{k}{colon}{port}"
            holder = self._named.get(name)
        if holder is not None and holder is not var:
            self._names.pop(id(holder), None)
        self._names[id(var)] = (var, name)
        self._named[name] = var
        self._named_now.add(id(var))
        return name

    def lr(self, value: Any, name: str = "lr") -> tf.Tensor:
        """The learning rate used by this step's update."""
        return self.tensor("lr", name, value)

    def hparam(self, name: str, value: Any) -> tf.Tensor:
        """A hyper-parameter of this step (momentum, weight decay, ...): compared strictly, like lr."""
        return self.tensor("hparam", name, value)

    def loss(self, value: Any, name: str = "loss") -> tf.Tensor:
        return self.tensor("loss", name, value)

    def metric(self, name: str, value: Any) -> tf.Tensor:
        return self.tensor("metric", name, value)

    def activation(self, name: str, value: Any, mask: Any = None) -> tf.Tensor:
        """A forward output, e.g. a layer's output.

        ``mask``: which positions are real (``True`` or 1) and which are padding, of the output's
        leading shape (``[batch, time]`` for ``[batch, time, features]``): padded positions are
        recorded as 0, so only the real ones are compared. A port that masks padding elsewhere
        (Keras ``MultiHeadAttention`` under ``Embedding(mask_zero=True)`` masks padded queries too)
        computes other values there that nothing downstream reads. Returns ``value`` unchanged.
        """
        if mask is None:
            return self.tensor("activation", name, value)
        with self._own_ops():
            t = tf.convert_to_tensor(densified(value))
            recorded = zero_masked(t, mask)
        self.tensor("activation", name, recorded)
        # the model reads ``t``, not what is recorded: walked past, its random ops (a dropout before it)
        # were listed for every later output too, and a real bug after it was told the draws differ
        self._walk_stops.add(t.ref())
        if isinstance(value, _COMPOSITE):
            self._walk_stops.add(_components(value).ref())
            return value
        return t

    def output(self, name: str, value: Any) -> tf.Tensor:
        """A model output (of a forward pass: see :meth:`mode`)."""
        return self.tensor("output", name, value)

    def weight(self, var: Any, name: Optional[str] = None) -> tf.Tensor:
        """A trainable variable's value as read at the start of the step."""
        return self._variable("weight", var, name)

    def weights(self, variables: Iterable[Any]) -> list:
        return [self.weight(v) for v in variables]

    def state(self, var: Any, name: Optional[str] = None) -> tf.Tensor:
        """A non-trainable variable (batch-norm moving statistics, a counter) as read at the step's start."""
        return self._variable("state", var, name)

    def states(self, variables: Iterable[Any]) -> list:
        return [self.state(v) for v in variables]

    def slots(self, optimizer: Any, variables: Iterable[Any], required: bool = True) -> list:
        """The optimizer's slots (momentum, Adam's moments) of each variable, as read at the step's start.

        Keras builds its slots lazily; they are built here. Raises ``ValueError`` naming the
        variable when ``required`` and the optimizer keeps no slot for it (plain SGD, or a TF1
        optimizer whose update is not built yet).
        """
        var_list = list(variables)
        return self._slots(optimizer, var_list, slots.named_moments(var_list, self._moment_candidates()), required)

    def _slots(
        self,
        optimizer: Any,
        var_list: list[Any],
        moments: dict[int, list[Slot]],
        required: bool,
        build: bool = True,
        model: Sequence[Any] = (),
    ) -> list:
        """:meth:`slots`, with each variable's BERT-style moments (``slots.named_moments``) among
        its slots: BERT's ``AdamWeightDecayOptimizer`` keeps them outside ``get_slot``. Without
        ``build``, only the slots the optimizer already keeps. ``model``: every variable recorded
        beside them, which a port's own optimizer may hold (``slots.keeps_unnamed_slots``)."""
        if build:
            slots.build_slots(optimizer, var_list)
        lr = None
        out = []
        for var in var_list:
            found = slots.slots_of(optimizer, var)
            held = {id(s.variable) for s in found}
            found += [m for m in moments.get(id(var), []) if id(m.variable) not in held]
            if not found and required:
                raise ValueError(
                    f"tb_parity: {type(optimizer).__name__} keeps no slot for {variable_name(var)!r} "
                    "(an optimizer without slots, such as plain SGD; or, in TF1, record slots after "
                    "building the update with minimize/apply_gradients)"
                )
            for slot in found:
                if slot.lr_units and lr is None:
                    lr = slots.current_lr(optimizer, slot.variable.dtype)
                name = slot.name
                own, renamed = variable_name(var).removesuffix(":0"), self._name_of(var).removesuffix(":0")
                if renamed != own and own in name:  # its variable's own name is another's (_name_of)
                    name = renamed.join(name.rsplit(own, 1))
                if ("slot", self._prefix + name) in self._keys:  # a second optimizer of the class on this variable:
                    name = variable_name(slot.variable)  # its own name (the class's spelling is the first's)
                out.append(self._variable("slot", slot.variable, name, lr if slot.lr_units else None))
                read = self._reads.get(id(slot.variable))
                lr_var = slots.lr_variable(optimizer) if slot.lr_units else None
                if lr_var is not None and read is not None and read.var is slot.variable:
                    self._lr_slots.append((read, lr_var, slot.variable.dtype))
                self._note_slot_part(self._prefix + name, slot.variable, var)
        if (
            not out
            and var_list
            and slots.own_optimizer(optimizer)
            and slots.keeps_unnamed_slots(optimizer, var_list, model)
        ):
            # an update of the user's own has its slots found by name only: none found was no slot recorded,
            # silently, and the structure report then asked for the optimizer=opt that had been given (one
            # holding no variable of a trained variable's shape, hand-written plain SGD, has none to record)
            raise ValueError(
                f"tb_parity: {type(optimizer).__name__} is no TF1 or Keras optimizer, and none of its variables is "
                f"a slot of {variable_name(var_list[0])!r} (...) named '<variable>/<slot>' (as TF1 names them: "
                "'dense/kernel/momentum'): name its slot variables so, or record each yourself, "
                "rec.tensor('slot', '<variable>/momentum', slot)"
            )
        return out

    def _note_slot_part(self, name: str, slot: Any, var: Any) -> None:
        """A slot of a ``ShardedVariable``'s shard is the part its shard is, and laid out as the shard's
        lookup reads it: a tf_keras legacy optimizer's slot (``.../part_0/m``) is a plain variable, and a
        tf_keras ``Optimizer``'s (``m/.../part_0``), a shard of a ``ShardedVariable`` of its own, is named
        so that its whole is no prefix of its variable's. A TF1 slot keeps its own part."""
        part = partitions.shard_of(var)
        if part is None and name not in self._parts:
            part = partitions.part_of(var)
        if part is not None and tuple(slot.shape) == tuple(var.shape):
            self._parts[name] = (part, var)

    def variables(self, variables: Any, optimizer: Any = None) -> list:
        """Every variable of ``variables`` (a model, layer, module or list) as read at the step's start:
        trainable ones as ``weight``, the others as ``state``; with ``optimizer`` (one, or a list: a
        GAN's two), also the slots each keeps for the trainable ones (an optimizer without slots
        records none), and the moving averages a Keras ``use_ema`` optimizer keeps, as ``state`` (as
        TF1's ``ExponentialMovingAverage`` shadows are: see ``slots.AVERAGE_ROLE``). The given
        optimizers' own variables (slots, counters, Adam's beta powers) are never recorded as ``state``.
        Nor are the moments BERT's ``AdamWeightDecayOptimizer`` (and the LAMB copies) keep as plain
        variables, ``<variable>/adam_m`` and ``/adam_v`` (``slots.named_moments``): they are that
        variable's slots, with or without ``optimizer``, so they pair with a Keras port's ``m`` and ``v``."""
        # a Keras 3 SeedGenerator's state (every Dropout, LSTM, GRU holds one, used or not) counts random
        # draws, as an optimizer's counter counts steps: TF1's random ops keep theirs inside the op, so
        # it paired with nothing, and a new user's faithful Keras 3 LSTM port was a structure DIVERGE
        var_list = [v for v in model_variables(variables) if not _seed_state(v)]
        optimizers = (
            [] if optimizer is None else list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
        )
        trainable = [v for v in var_list if getattr(v, "trainable", True)]
        # a variable of a layer frozen with trainable = False keeps its flag (it is recorded as a weight, as
        # TF1's variable left out of var_list is) but no optimizer updates it: its slots were built and
        # recorded, and a faithful fine-tuning port had slots its TF1 original has not
        frozen = frozen_variables(variables) if variables is not None else set()
        trained = [v for v in trainable if id(v) not in frozen]
        several = len(optimizers) > 1
        unbuilt = [type(opt).__name__ for opt in optimizers if several and slots.unbuilt(opt)]
        if unbuilt:
            # building each for every variable gave each the other's slots (a trial's GAN: 16 slot tags
            # where TF1 has 8, unused slots in the user's optimizers): which it updates, only it knows
            raise ValueError(
                f"tb_parity: with several optimizers, each records the slots of the variables it updates, which a "
                f"Keras optimizer knows once built, and {', '.join(unbuilt)} is not built yet: record each with its "
                "own variables, rec.variables(generator, g_opt) then rec.variables(discriminator, d_opt), or build "
                "each first (g_opt.build(generator.trainable_variables); a legacy optimizer: "
                "g_opt._create_all_weights(generator.trainable_variables))"
            )
        moments = slots.named_moments(trainable, [*var_list, *(self._moment_candidates() if optimizers else [])])
        # a port's own optimizer may hold the model's variables (a plain SGD given its parameters): they
        # stay the model's, weights and state, unless named as its slots or averages; as the optimizer's
        # own, the weights went unrecorded
        model_ids = {id(v) for v in var_list}
        owned = {
            id(opt_var)
            for opt in optimizers
            for named in [slots.own_named(opt, trainable) if slots.own_optimizer(opt) else None]
            for opt_var in _optimizer_variables(opt)
            if named is None or id(opt_var) not in model_ids or id(opt_var) in named
        }
        owned |= {id(m.variable) for found in moments.values() for m in found}
        out = [
            self._variable("weight" if getattr(v, "trainable", True) else "state", v)
            for v in var_list
            if id(v) not in owned
        ]
        if not optimizers:
            out += [self._variable("slot", m.variable, m.name) for v in trainable for m in moments.get(id(v), [])]
        for i, opt in enumerate(optimizers):  # the moments once (a second optimizer would re-read them)
            out += self._slots(
                opt, trained, moments if i == 0 else {}, required=False, build=not several, model=var_list
            )
            out += [self._variable("state", a.variable, a.name) for v in trained for a in slots.averages_of(opt, v)]
            out += [self._variable("state", a.variable, a.name) for v in trained for a in slots.accumulators_of(opt, v)]
        return out

    @contextlib.contextmanager
    def mode(self, label: str) -> Iterator[None]:
        """Names recorded inside get the prefix ``<label>/``: a forward pass's mode, ``inference``
        or ``training``, so one step can hold both passes and a report names the mode."""
        if label not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {label!r}")
        if self._prefix:
            raise RuntimeError("recorder.mode() does not nest")
        self._prefix = label + "/"
        try:
            yield
        finally:
            self._prefix = ""

    def grad(self, name: str, value: Any) -> Optional[tf.Tensor]:
        """A gradient; ``None`` gradients (unconnected variables) are skipped."""
        if value is None:
            return None
        if isinstance(value, tf.IndexedSlices):
            with self._own_ops():
                value = tf.convert_to_tensor(value)
        return self.tensor("grad", name, value)

    def grads(self, grads: Sequence[Any], variables: Sequence[Any]) -> list:
        """Gradients named after their variables."""
        grads, variables = list(grads), list(variables)
        if len(grads) != len(variables):
            raise ValueError(f"{len(grads)} gradients for {len(variables)} variables")
        return [self._variable_grad(g, v) for g, v in zip(grads, variables)]

    def grads_and_vars(self, grads_and_vars: Iterable[tuple]) -> list:
        """Each pair's gradient and the variable's value as read at the step's start."""
        pairs = list(grads_and_vars)
        for g, v in pairs:
            self._variable_grad(g, v)
            self.weight(v)
        return pairs

    def _variable_grad(self, grad: Any, var: Any) -> Optional[tf.Tensor]:
        """:meth:`grad` named after ``var``, which may be a part of a partitioned variable (TF1)."""
        logged = self.grad(self._name_of(var), grad)
        if logged is not None:
            self._note_part(self._prefix + self._name_of(var), var)
        return logged

    def _note_part(self, name: str, var: Any) -> None:
        """Remember that ``name`` is recorded from a part of a partitioned variable (TF1)."""
        part = partitions.part_of(var)
        if part is not None:
            self._parts[name] = (part, var)

    def _whole_parts(self, entries: list[Entry]) -> list[Entry]:
        """``entries`` with each kind's parts of one partitioned variable replaced by the whole
        variable, at its first part's place (:mod:`partitions`); parts that do not cover it all
        (some not recorded) stay as they are."""
        if not self._parts:
            return entries
        mod = partitions.interleaved(var for _, var in self._parts.values())
        wholes = [partitions.whole_name(e.name) if e.name in self._parts else None for e in entries]
        groups: dict[tuple[str, str], list[tuple[partitions.Part, Entry]]] = {}
        for e, whole in zip(entries, wholes):
            if whole is not None:
                groups.setdefault((e.kind, whole), []).append((self._parts[e.name][0], e))
        names = {(e.kind, e.name) for e in entries}
        decided: dict[tuple[str, str], Optional[tf.Tensor]] = {}
        out = []
        for e, whole in zip(entries, wholes):
            if whole is None:
                out.append(e)
                continue
            key = (e.kind, whole)
            if key in decided:  # the whole is at its first part's place; unmerged parts stay
                if decided[key] is None:
                    out.append(e)
                continue
            part = groups[key][0][0]
            interleave = partitions.interleaves(part.whole, mod)
            value = None
            if key not in names:  # a name the user recorded already keeps its parts
                with self._own_ops():
                    value = partitions.whole([(p, g.tensor) for p, g in groups[key]], interleave)
            decided[key] = value
            out.append(e if value is None else Entry(e.kind, whole, value))
        return out

    # -- internals ----------------------------------------------------------------
    def _take_entries(self) -> list[Entry]:
        entries, self._entries, self._keys, self._walk_stops = self._entries, [], set(), set()
        entries = self._whole_parts(entries)
        self._reads, self._parts, self._lr_slots, self._named_now = {}, {}, [], set()
        return entries


def _optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's own variables (slots, iterations, Adam's beta powers)."""
    found = getattr(optimizer, "variables", None)
    if callable(found):
        found = found()
    return list(found or [])


def _seed_state(var: Any) -> bool:
    """Whether ``var`` is a Keras 3 ``SeedGenerator``'s state (``seed_generator_state``, shape [2])."""
    return hasattr(var, "path") and getattr(var, "name", None) == "seed_generator_state"


def zero_masked(value: tf.Tensor, mask: Any) -> tf.Tensor:
    """``value`` with the positions ``mask`` marks as padding (False or 0) set to 0; ``mask`` holds
    ``value``'s leading dimensions (``[batch, time]`` for ``[batch, time, features]``)."""
    keep = tf.cast(mask, tf.bool)
    if keep.shape.rank is not None and value.shape.rank is not None:
        for _ in range(value.shape.rank - keep.shape.rank):
            keep = keep[..., None]
    return tf.where(keep, value, tf.zeros_like(value))
