"""Plugin name, record schema and summary metadata for tb-parity records.

One *logical record* is one tensor at one step. On disk, all records of one step
that share a *layout* travel in one TensorBoard event (a few summary values), so a
reader pays Python overhead per step, not per tensor (see docs/ARCHITECTURE.md):

* ``tb_parity/layout/<hash>``  -- string scalar: the layout JSON (written once).
* ``tb_parity/stats/<hash>``   -- float64 ``[n_tensors, len(STATS_FIELDS)]``: one row
  per tensor of the layout, in layout order.
* ``tb_parity/values/<hash>/<dtype>`` -- 1-D tensor of that dtype: the full values of
  every tensor of the layout whose ``values`` entry names that dtype, concatenated.

All three use ``data_class=DATA_CLASS_TENSOR`` and plugin ``tb_parity`` with a
versioned JSON ``content``. This module imports neither TensorFlow nor numpy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from tensorboard.compat.proto import summary_pb2

PLUGIN_NAME = "tb_parity"
TAG_PREFIX = "tb_parity/"
LAYOUT_PREFIX = TAG_PREFIX + "layout/"
STATS_PREFIX = TAG_PREFIX + "stats/"
VALUES_PREFIX = TAG_PREFIX + "values/"
#: String scalar JSON describing the run: {"version", "side": "tf1"|"tf2", "mode":
#: "graph"|"eager"|"function", "tensorflow": version}. Lets tools pick the TF1 run as
#: the default baseline.
RUN_INFO_TAG = TAG_PREFIX + "run_info"
#: lr and loss are also written as ordinary scalars under these tags.
SCALAR_TAGS = {"lr": TAG_PREFIX + "lr", "loss": TAG_PREFIX + "loss"}

#: Version of the on-disk record format; bump on incompatible change.
FORMAT_VERSION = 1

#: Columns of a stats row. The first nine mirror Debugger V2's FULL_HEALTH vector
#: (without tensor/device id); the moments are over the *finite* elements only
#: (NaN when there are none), so one NaN does not hide the rest of the tensor.
STATS_FIELDS = (
    "dtype",  # TF DataType enum value (1 = float32, 2 = float64, 19 = float16, 14 = bfloat16)
    "rank",
    "size",
    "neg_inf",
    "pos_inf",
    "nan",
    "neg_finite",
    "zero",
    "pos_finite",
    "min",
    "max",
    "mean",
    "std",
    "l2",
)
STAT_INDEX = {name: i for i, name in enumerate(STATS_FIELDS)}


def field_span(names: Sequence[str]) -> slice:
    """The columns of consecutive ``names`` as a slice: indexing with it is a view, not a copy."""
    cols = [STAT_INDEX[n] for n in names]
    if cols != list(range(cols[0], cols[0] + len(cols))):
        raise ValueError(f"{names} are not consecutive statistics")
    return slice(cols[0], cols[-1] + 1)


N_STATS = len(STATS_FIELDS)
NONFINITE_FIELDS = ("neg_inf", "pos_inf", "nan")
#: The FULL_HEALTH counts; every writer's add up to the ``size`` column (the reader checks it).
COUNT_FIELDS = (*NONFINITE_FIELDS, "neg_finite", "zero", "pos_finite")
MOMENT_FIELDS = ("min", "max", "mean", "std", "l2")
#: The record's promise on the moments' rounding: tensors of at most this many elements (and
#: float64 tensors) accumulate mean, std and L2 in float64; larger ones may accumulate in
#: float32 in any order. The engine's statistics bounds (engine/stat_bounds.py) rely on it.
STATS_F64_LIMIT = 1 << 16

#: Kinds and their phase in a training step. Execution order within a step sorts by
#: (phase, call sequence): the step's inputs first, then forward, loss, backward.
#: ``weight`` (trainable), ``state`` (non-trainable: batch-norm moving statistics, counters)
#: and ``slot`` (an optimizer's per-variable state: momentum, Adam's moments) are variables
#: as read at the start of the step, so they are inputs of the step.
KIND_PHASE = {
    "lr": 0,
    "hparam": 0,
    "input": 1,
    "weight": 1,
    "state": 1,
    "slot": 1,
    "activation": 2,
    "output": 2,
    "loss": 3,
    "metric": 3,
    "grad": 4,
    "optimizer": 5,
}
DEFAULT_PHASE = 6  # kinds not listed above sort last

#: What a series' ``layout_change`` says (after "was ") when only its leading dimension changed
#: between the run's layouts: a ``tf.function`` traced again for a partial last batch.
BATCH_SIZES = "traced for several batch sizes"


#: A per-replica copy of a tensor is recorded as ``<name>@replica<k>`` beside ``<name>``, which
#: holds what one device would have computed on the global batch (the reduction, or a
#: variable's single copy). One convention for the TF2 shim (writing) and the engine (splitting).
REPLICA_MARK = "@replica"


def replica_name(name: str, replica: int) -> str:
    return f"{name}{REPLICA_MARK}{replica}"


def split_replica(name: str) -> tuple[str, Optional[int]]:
    """``("dense/kernel:0", 1)`` for ``dense/kernel:0@replica1``; ``(name, None)`` for other names."""
    base, mark, k = name.rpartition(REPLICA_MARK)
    if mark and k.isdigit():
        return base, int(k)
    return name, None


#: A tensor too large for full values is recorded with a fixed sample of its elements beside it,
#: as ``<name>#sample`` (``SAMPLE_SIZE`` elements at :func:`sample_positions`): an element of it out
#: of tolerance proves a divergence that the statistics alone cannot (they bound differences by
#: the rounding of a sum over every element, which a small difference of a large tensor hides in).
#: One convention for the shims (writing) and the engine (pairing a sample with its tensor).
SAMPLE_MARK = "#sample"
SAMPLE_SIZE = 256
#: Where sample position ``j`` falls within its stratum ``[j, j + 1) * size / SAMPLE_SIZE``: the
#: fractional part of ``j`` times this (the golden ratio's), so the positions do not line up with a
#: row length the way evenly spaced ones would (a 1024 x 1024 kernel would show its first column only).
SAMPLE_JITTER = 0.6180339887498949


def sample_name(name: str) -> str:
    return f"{name}{SAMPLE_MARK}"


def is_sample(name: str) -> bool:
    return name.endswith(SAMPLE_MARK)


def sample_parent(name: str) -> Optional[str]:
    """The tensor whose sample ``name`` is (``dense/kernel:0`` for ``dense/kernel:0#sample``), else None."""
    return name[: -len(SAMPLE_MARK)] if is_sample(name) else None


def sample_positions(size: int, count: int = SAMPLE_SIZE) -> np.ndarray:
    """Flat element positions of the sample of a tensor of ``size`` elements (the shims compute the
    same with TensorFlow ops): one per stratum, ``floor((j + frac(j * SAMPLE_JITTER)) * size / count)``,
    at most ``size - 1`` (an empty tensor's sample is zeros)."""
    j = np.arange(count, dtype=np.float64)
    pos = np.floor((j + np.mod(j * SAMPLE_JITTER, 1.0)) * float(size) / count).astype(np.int64)
    return np.minimum(pos, max(size - 1, 0))


def kind_phase(kind: str) -> int:
    """Phase of ``kind`` in a step (lower runs earlier)."""
    return KIND_PHASE.get(kind, DEFAULT_PHASE)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor of a layout.

    Attributes:
      kind: record kind, e.g. ``"weight"``.
      name: the user's name, e.g. ``"dense/kernel:0"`` (may hold any text, even HTML).
      order: execution order within the step (0 first); unique within a layout.
      dtype: numpy-style dtype name, e.g. ``"float32"``.
      shape: the shape of the steps written with this layout: the static shape, ``None``
        for unknown dimensions, or, when a writer resolved unknown dimensions at run time
        (the TF1 shim does, per distinct runtime shape), the runtime shape.
      values: ``[dtype, offset, length]`` into ``tb_parity/values/<hash>/<dtype>``
        when full values are kept, else ``None`` (statistics only).
      static: the graph's static shape when ``shape`` was resolved at run time (information
        only: verdicts use the runtime shape), else ``None``.
      random: the types of the random ops a forward tensor is computed from (the shims'
        ``randomness``), else ``None``: its runs draw other numbers unless made equal.
    """

    kind: str
    name: str
    order: int
    dtype: str
    shape: tuple[Optional[int], ...]
    values: Optional[tuple[Any, ...]] = None  # (dtype, offset, length), as read from JSON
    static: Optional[tuple[Optional[int], ...]] = None
    random: Optional[tuple[str, ...]] = None

    @property
    def tag(self) -> str:
        """The logical tag ``<kind>/<name>``."""
        return f"{self.kind}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "order": self.order,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "values": list(self.values) if self.values is not None else None,
            **({"static": list(self.static)} if self.static is not None else {}),
            **({"random": list(self.random)} if self.random else {}),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TensorSpec:
        values = obj.get("values")
        return cls(
            kind=str(obj["kind"]),
            name=str(obj["name"]),
            order=int(obj["order"]),
            dtype=str(obj["dtype"]),
            shape=_shape(obj["shape"]),
            values=tuple(values) if values is not None else None,
            static=_shape(obj["static"]) if obj.get("static") is not None else None,
            random=tuple(str(r) for r in obj["random"]) if obj.get("random") else None,
        )


def _shape(dims: Sequence[Any]) -> tuple[Optional[int], ...]:
    return tuple(None if d is None else int(d) for d in dims)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The static description of what one step's stats/values blocks hold."""

    tensors: tuple[TensorSpec, ...]  # in row order of the stats block

    def to_json_bytes(self) -> bytes:
        body = {"version": FORMAT_VERSION, "tensors": [t.to_json() for t in self.tensors]}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")

    @property
    def hash(self) -> str:
        """Content hash naming the layout's tags (12 hex chars)."""
        return hashlib.sha1(self.to_json_bytes()).hexdigest()[:12]

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Layout:
        body = json.loads(data.decode("utf-8"))
        version = int(body.get("version", 0))
        if version > FORMAT_VERSION:
            raise ValueError(f"tb_parity layout version {version} is newer than this reader ({FORMAT_VERSION})")
        return cls(tensors=tuple(TensorSpec.from_json(t) for t in body["tensors"]))


def layout_tag(layout_hash: str) -> str:
    return LAYOUT_PREFIX + layout_hash


def stats_tag(layout_hash: str) -> str:
    return STATS_PREFIX + layout_hash


def values_tag(layout_hash: str, dtype: str) -> str:
    return f"{VALUES_PREFIX}{layout_hash}/{dtype}"


def create_summary_metadata(block: str, layout_hash: str) -> summary_pb2.SummaryMetadata:
    """Metadata for one of our tags. ``block`` is ``layout``, ``stats`` or ``values``."""
    content = json.dumps(
        {"version": FORMAT_VERSION, "block": block, "layout": layout_hash},
        sort_keys=True,
        separators=(",", ":"),
    ).encode("utf-8")
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=content),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def parse_plugin_content(content: bytes) -> dict[str, Any]:
    """Parse our ``plugin_data.content``; raises ValueError on garbage or a newer version."""
    try:
        body = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"bad tb_parity metadata content: {exc}") from None
    if not isinstance(body, dict) or int(body.get("version", 0)) > FORMAT_VERSION:
        raise ValueError(f"unsupported tb_parity metadata content: {content[:80]!r}")
    return body


def order_specs(entries: Sequence[tuple[str, str]]) -> list[int]:
    """Execution order for ``(kind, name)`` entries given in call sequence.

    Sorts stably by kind phase, so weights logged after the backward pass still
    count as step inputs.
    """
    ranked = sorted(range(len(entries)), key=lambda i: (kind_phase(entries[i][0]), i))
    order = [0] * len(entries)
    for position, index in enumerate(ranked):
        order[index] = position
    return order
