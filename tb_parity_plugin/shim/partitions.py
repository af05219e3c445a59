"""A TF1 partitioned variable's parts, recorded as the one tensor they make up.

Why: TF1 code shards a large embedding with a partitioner (``get_variable("item_emb", [20000, 64],
partitioner=fixed_size_partitioner(4))``): its parts ``item_emb/part_0:0`` ... are ``[5000, 64]``
each, with their own gradients and slots, against the port's one ``Embedding`` ``[20000, 64]``.
Recorded part by part, nothing in the port pairs with them: a new user's recommender port got 28
structure lines and no comparison of its tables. Recorded whole, they pair like any variable. A TF2
``ShardedVariable``'s shards (``ParameterServerStrategy``'s ``variable_partitioner``) are recorded
whole the same way (:func:`shard_of`), so either side's part count pairs with the other's.

Rows are laid out as the model reads them. ``tf.compat.v1.nn.embedding_lookup``'s default
``partition_strategy="mod"`` keeps row ``r`` in part ``r % n`` at row ``r // n``, so the table the
model looks up interleaves the parts; ``"div"``, and every other use of the variable
(``tf.convert_to_tensor``, a checkpoint's saved value), puts the parts one after the other. The
strategy is read from the lookup's ops in the graph (the ``DynamicPartition`` of its ids assigns
parts by ``ids % n``, a ``FloorMod``, under ``"mod"``, and by a ``Maximum`` under ``"div"``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Optional

import tensorflow as tf

#: A part's component in a recorded name: ``item_emb/part_0:0``, ``item_emb/part_0/Adam:0``.
_PART = re.compile(r"/part_\d+(?=[/:]|$)")


@dataclasses.dataclass(frozen=True)
class Part:
    """Where one part sits in its variable: along ``axis``, from ``offset``, of ``size`` rows."""

    whole: str  # the partitioned variable's name (``item_emb``)
    axis: int
    offset: int
    size: int
    full: tuple[int, ...]  # the whole variable's shape


def part_of(var: Any) -> Optional[Part]:
    """The part ``var`` is of a partitioned variable (its slots are parts too), or of a TF2
    ``ShardedVariable`` (:func:`shard_of`), or None."""
    info = getattr(var, "_save_slice_info", None)
    if info is None:
        return shard_of(var)
    try:
        full = tuple(int(d) for d in info.full_shape)
        offset = [int(d) for d in info.var_offset]
        shape = [int(d) for d in info.var_shape]
    except (TypeError, ValueError):
        return None
    if not (len(full) == len(offset) == len(shape)) or not full:
        return None
    axes = [i for i, (f, s) in enumerate(zip(full, shape)) if f != s]
    if len(axes) > 1:
        return None  # sliced along several axes: no partitioner of TF1's does that
    axis = axes[0] if axes else 0
    return Part(str(info.full_name), axis, offset[axis], shape[axis], full)


def shard_of(var: Any) -> Optional[Part]:
    """The part ``var`` is of a TF2 ``ShardedVariable``, or None.

    ``ParameterServerStrategy(..., variable_partitioner=FixedShardsPartitioner(n))`` (or
    ``MinSizePartitioner``) makes each variable it shards a ``ShardedVariable`` whose shards
    ``item_embedding/embeddings/part_0:0`` ... are what a Keras model's ``trainable_variables``
    lists, each with its own gradient and optimizer slots (a tf_keras ``Optimizer``'s
    ``m/item_embedding/embeddings/part_0:0`` are shards of a ``ShardedVariable`` of their own). A
    shard has no ``_save_slice_info`` (``ShardedVariable`` refuses one): it knows its container by
    ``_sharded_container``, whose shards lie one after the other along axis 0, as TF2's
    ``tf.nn.embedding_lookup`` (and so Keras ``Embedding``) reads them ("div"; a
    ``tf.compat.v1.nn.embedding_lookup`` in a ``tf.function`` reads them as "mod": :func:`interleaved`
    finds it as for TF1's parts). Its whole is named as
    the shard is, without ``/part_k``: PSS gives the container itself no name of its own
    (``ShardedVariable``)."""
    ref = getattr(var, "_sharded_container", None)
    container = ref() if callable(ref) else None
    parts = shards(container)
    if container is None or not parts:
        return None
    offset = 0
    for shard in parts:
        if shard is var:
            whole = whole_name(str(getattr(var, "name", "")))
            if whole is None:
                return None
            full = tuple(int(d) for d in container.shape)
            return Part(whole[:-2] if whole.endswith(":0") else whole, 0, offset, int(var.shape[0]), full)
        offset += int(shard.shape[0])
    return None


def shards(var: Any) -> list[Any]:
    """The shards of a TF2 ``ShardedVariable`` (``ParameterServerStrategy``'s ``variable_partitioner``), in
    row order; ``[]`` for anything else."""
    found = getattr(var, "_variables", None) if type(var).__name__ == "ShardedVariable" else None
    return list(found) if found else []


def whole_name(name: str) -> Optional[str]:
    """A part's recorded name as its whole variable's (``item_emb/part_2/Adam:0`` -> ``item_emb/Adam:0``).

    The last ``/part_<k>`` is the partitioner's: a scope of the user's named ``part_0`` above the
    variable (``tower/part_0/item_emb/part_2:0``) stays in the name.
    """
    found = list(_PART.finditer(name))
    if not found:
        return None
    last = found[-1]
    return name[: last.start()] + name[last.end() :]


def interleaves(whole: str, mod: dict[str, bool]) -> bool:
    """Whether the partitioned variable ``whole`` (a variable, or a slot of one: ``item_emb/Adam``) is
    laid out interleaved, by :func:`interleaved`'s answer for it or else for the nearest variable it
    is a slot of (a variable ``emb/x`` read in order is not ``emb``'s slot)."""
    name = whole
    while name:
        if name in mod:
            return mod[name]
        name = name.rpartition("/")[0]
    return False


def interleaved(variables: Iterable[Any]) -> dict[str, bool]:
    """Per partitioned variable (by name) read by a gather: whether every gather reads it as ``"mod"``."""
    strategies: dict[str, set[str]] = {}
    for var in variables:
        part = part_of(var)
        if part is None:
            continue
        for op in _readers(var):
            if op.type not in ("ResourceGather", "GatherV2", "Gather"):
                continue
            strategies.setdefault(part.whole, set()).add(_strategy(op))
    return {whole: found == {"mod"} for whole, found in strategies.items()}


def _strategy(gather: tf.Operation) -> str:
    """How a gather of a part reads it: ``"mod"`` when its ids are an ``embedding_lookup``'s
    ``DynamicPartition`` of ``ids % n`` (``FloorMod``), else ``"div"`` (``"div"`` partitions by a
    ``Maximum``; a gather of its own reads rows in order). Found from the ops, not their names: a
    lookup given a ``name=`` (``embedding_lookup(emb, ids, name="item_lookup")``) has no
    ``embedding_lookup`` scope, and was read as ``"div"``."""
    ids = gather.inputs[1].op
    if ids.type != "DynamicPartition":
        return "div"
    assign = ids.inputs[1].op
    while assign.type in ("Cast", "Identity"):
        assign = assign.inputs[0].op
    return "mod" if assign.type == "FloorMod" else "div"


def _readers(var: Any) -> list[tf.Operation]:
    """The ops that read ``var``'s value: the consumers of its handle (a resource variable) or of its
    buffer (a reference variable, what ``tf.compat.v1.disable_v2_behavior()`` makes), past the
    ``Identity`` and ``ReadVariableOp`` that pass it on; a variable made outside the function being
    traced (a ``ShardedVariable``'s shard) is read through the placeholder that captures its handle."""
    op = getattr(var, "op", None)
    if op is None:
        op = _captured(var)
    todo: list[tf.Operation] = [op] if op is not None else []
    seen: set[str] = set()
    found: list[tf.Operation] = []
    while todo:
        for out in todo.pop().outputs:
            for reader in out.consumers():
                if reader.name in seen:
                    continue
                seen.add(reader.name)
                (todo if reader.type in ("Identity", "ReadVariableOp") else found).append(reader)
    return found


def _captured(var: Any) -> Optional[tf.Operation]:
    """The op of the placeholder by which the function being traced captures ``var``'s handle, or None.

    A TF2 ``tf.compat.v1.nn.embedding_lookup`` of a ``ShardedVariable`` keeps TF1's default ``"mod"``
    inside a ``tf.function`` (row ``r`` from shard ``r % n``), where the shards are eager variables
    that have no op: their lookup was unseen, and the whole recorded as if read in order."""
    handle = getattr(var, "handle", None)
    graph = tf.compat.v1.get_default_graph()
    if handle is None or not hasattr(graph, "captures"):
        return None
    for external, internal in graph.captures:
        if external is handle:
            return internal.op
    return None


def whole(parts: list[tuple[Part, tf.Tensor]], interleave: bool) -> Optional[tf.Tensor]:
    """The whole variable from all its parts' values, or None unless they cover it exactly."""
    parts = sorted(parts, key=lambda p: p[0].offset)
    first = parts[0][0]
    # Not ``Part.whole``: TF names a slot's whole by cutting the primary's name off the slot's, which
    # an optimizer created inside the variables' scope (slots ``tower/tower/emb/part_0/Adam``) turns
    # into one name per part. The caller groups the parts by their recorded names.
    if any(p.axis != first.axis or p.full != first.full for p, _ in parts):
        return None
    offsets = [p.offset for p, _ in parts]
    if offsets[0] != 0 or any(a.offset + a.size != b.offset for (a, _), (b, _) in zip(parts, parts[1:])):
        return None
    if parts[-1][0].offset + parts[-1][0].size != first.full[first.axis]:
        return None
    values = [t for _, t in parts]
    if len(values) == 1:
        return tf.identity(values[0])
    if not interleave or first.axis != 0:
        return tf.concat(values, axis=first.axis)
    n = len(values)
    rows = first.full[0]
    if any(p.size != len(range(k, rows, n)) for k, (p, _) in enumerate(parts)):
        return None  # not the sizes "mod" gives: the parts hold other rows
    return tf.dynamic_stitch([tf.range(k, rows, n) for k in range(n)], values)
