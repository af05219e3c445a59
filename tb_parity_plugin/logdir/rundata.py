"""What the reader hands out: consistent, immutable snapshots of a run's series.

Plain value classes (like ``tensorboard.data.provider``'s) so the engine and the front
ends depend on them, never on how the files were read.
"""

from __future__ import annotations

import dataclasses
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
