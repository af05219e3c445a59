"""What the reader hands out: consistent, immutable snapshots of a run's series.

Plain value classes (like ``tensorboard.data.provider``'s) so the engine and the front
ends depend on them, never on how the files were read.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class ReadProblem:
    """A record that could not be used: ``path`` relative to the logdir, byte ``offset``."""

    path: str
    offset: int
    message: str


@dataclasses.dataclass
class TensorSeries:
    """One logical tensor of one run, every step it was logged at.

    ``stats`` and ``values`` are read-only views into the run's stacked blocks.
    ``values`` is ``None`` unless full values exist at every step in ``steps``; a tensor whose
    size changed between steps (a partial last batch) has rows as wide as its largest step,
    zero-padded past each step's own size (the ``size`` statistic).
    ``shape`` is the static shape (``None`` for dimensions unknown to the graph); ``dims``
    holds the runtime shape of each step (``-1`` where neither the record nor the size says).
    """

    kind: str
    name: str
    order: int
    dtype: str
    shape: tuple[Optional[int], ...]
    steps: np.ndarray
    stats: np.ndarray
    values: Optional[np.ndarray]
    dims: Optional[np.ndarray] = None  # int64 [steps, rank]; None when the rank is unknown or changed
    #: Set when the tensor's dtype or static shape differs between the run's layouts.
    layout_change: Optional[str] = None
    #: The statistics of every tensor of the one layout this series comes from, ``[steps, tensors,
    #: N_STATS]``, with ``stats == block[:, column]``; None when several layouts made it. Lets the
    #: engine settle a layout's tensors in one array operation instead of one call per tensor.
    block: Optional[np.ndarray] = dataclasses.field(default=None, repr=False, compare=False)
    column: int = -1
    #: Full values at some steps only, when ``values`` is None: a size that crosses
    #: ``full_values_limit`` between steps (a partial last batch of a ``[None, n]`` tensor) keeps
    #: them at its small steps. ``partial_values[j]`` is row ``value_rows[j]`` (ascending indices
    #: into ``steps``), zero-padded like ``values``. Only the engine's pairs read them, so nothing
    #: that takes ``values`` for every step sees rows that do not exist.
    partial_values: Optional[np.ndarray] = dataclasses.field(default=None, repr=False, compare=False)
    value_rows: Optional[np.ndarray] = dataclasses.field(default=None, repr=False, compare=False)
    #: The types of the random ops the tensor is computed from in this run (a forward tensor of a
    #: graph: ``TensorSpec.random``), else ``()``.
    random: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def runtime_shapes(self) -> list[tuple[int, ...]]:
        """The shape each step ran with (``-1`` for a dimension nothing recorded)."""
        if self.dims is None:
            return [tuple(None for _ in self.shape)] * len(self.steps)  # type: ignore[misc]
        return [tuple(int(d) for d in row) for row in self.dims]


@dataclasses.dataclass
class RunData:
    """A consistent snapshot of one run; later reloads never change it."""

    name: str
    tensors: dict[tuple[str, str], TensorSeries]  # (kind, name) ->
    scalars: dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (steps, values)
    info: dict[str, Any]
    steps: np.ndarray  # sorted and unique: every step some tensor was logged at
    problems: list[ReadProblem]
    generation: int
    #: Facts the engine derives from this snapshot alone (e.g. its first NaN/Inf), kept with it
    #: so that comparing it again under another tolerance does not recompute them.
    derived: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    #: What the reader set aside that is not damage, in words: a file that restarts the run
    #: supersedes the later steps of the files before it (``run_state.Timeline``).
    notices: list[str] = dataclasses.field(default_factory=list)
    #: The first step of each of the run's event files that starts at or before a step an earlier one
    #: reached: where the run was resumed from a checkpoint, and an input pipeline no checkpoint holds
    #: starts again.
    resumed_at: tuple[int, ...] = ()


#: Memory the reader grew out of older memory (a column that outgrew its capacity, whose rows in use
#: it copied): id(new owner array) -> (weak ref to it, weak ref to the older owner, rows copied).
_GROWN: dict[int, tuple[weakref.ref[np.ndarray], weakref.ref[np.ndarray], int]] = {}


def note_grown(new: np.ndarray, old: np.ndarray, rows: int) -> None:
    """The reader copied ``old[:rows]`` into ``new[:rows]``; noted only when both arrays own their
    memory (what :func:`same_rows` walks back)."""
    if new.base is not None or old.base is not None:
        return
    key = id(new)
    _GROWN[key] = (weakref.ref(new), weakref.ref(old), rows)
    weakref.finalize(new, _GROWN.pop, key, None)


def same_rows(old: np.ndarray, new: np.ndarray) -> bool:
    """True if ``new`` starts with the very rows of ``old`` without reading them: the same memory
    with the same layout, or memory the reader grew out of ``old``'s by copying those rows.

    Snapshots never change after they are taken (rows handed out are never written again), so an
    appending reload's views show the old rows unchanged; when a column outgrew its memory the
    reader copied them (:func:`note_grown`), which a refresh would otherwise have to read back
    whole, costing what recomputing costs.
    """
    if old is new:
        return True
    if old.dtype != new.dtype or old.strides != new.strides or len(new) < len(old):
        return False
    if _address(old) == _address(new):
        return True
    o_own, n_own = _owner(old), _owner(new)
    offset = _address(old) - _address(o_own)
    if (
        o_own.ndim == 0
        or old.ndim == 0
        or offset != _address(new) - _address(n_own)
        or not 0 <= offset < o_own.strides[0]  # the view starts in the owner's first row
        or old.strides[0] != o_own.strides[0]  # and maps its rows one to one
        or o_own.strides != n_own.strides
        or o_own.shape[1:] != n_own.shape[1:]
    ):
        return False
    owner = n_own
    while owner is not o_own:  # walk back the copies, each of which must hold old's rows
        entry = _GROWN.get(id(owner))
        if entry is None or entry[0]() is not owner:
            return False
        older = entry[1]()
        if older is None or entry[2] < len(old) or older.strides != owner.strides:
            return False
        owner = older
    return True


def _owner(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _address(array: np.ndarray) -> int:
    address: int = array.__array_interface__["data"][0]
    return address
