"""Builders for engine tests: RunData from numpy arrays, and logdirs via BlockWriter."""

from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from tb_parity_plugin.engine import Comparison
from tb_parity_plugin.engine.verdicts import ParityReport
from tb_parity_plugin.logdir.reader import LogdirReader, RunData, TensorSeries
from tb_parity_plugin.records import health, metadata
from tb_parity_plugin.records.writer import BlockWriter


def series(
    kind: str,
    name: str,
    arrays: Sequence[np.ndarray],
    steps: Optional[Sequence[int]] = None,
    order: int = 0,
    keep_values: bool = True,
) -> TensorSeries:
    """A TensorSeries over ``steps`` (default 0..n-1) with stats from ``health_numpy``."""
    arrays = [np.asarray(a) for a in arrays]
    steps = np.arange(len(arrays), dtype=np.int64) if steps is None else np.asarray(steps, dtype=np.int64)
    first = arrays[0] if arrays else np.zeros(0, np.float32)
    stats = np.stack([health.health_numpy(a) for a in arrays]) if arrays else np.zeros((0, metadata.N_STATS))
    values = np.stack([a.reshape(-1) for a in arrays]) if keep_values and arrays else None
    return TensorSeries(kind, name, order, first.dtype.name, tuple(first.shape), steps, stats, values)


def run(name: str, tensors: Sequence[TensorSeries], side: str = "") -> RunData:
    all_steps = [t.steps for t in tensors]
    steps = np.unique(np.concatenate(all_steps)) if all_steps else np.zeros(0, np.int64)
    return RunData(
        name=name,
        tensors={(t.kind, t.name): t for t in tensors},
        scalars={},
        info={"side": side} if side else {},
        steps=steps,
        problems=[],
        generation=1,
    )


def write_run(logdir: str, run_name: str, steps: Sequence[int], tensors_at, side: str = "", limit: int = 4096) -> str:
    """Write a run with BlockWriter; ``tensors_at(step)`` -> [(kind, name, array), ...]."""
    writer = BlockWriter(os.path.join(logdir, run_name), side=side)
    for step in steps:
        writer.write_arrays(step, tensors_at(step), full_values_limit=limit)
    writer.close()
    return writer.path


class Watch:
    """One comparison of a logdir's two runs, refreshed each time it is called (after each phase of
    a training that is still writing), as the dashboard refreshes: each refresh must say what a
    fresh comparison of the same snapshots says (asserted); the reports are kept in order."""

    def __init__(self, logdir: str, baseline: str = "tf1", candidate: str = "tf2") -> None:
        self.reader = LogdirReader(logdir)
        self.runs = (baseline, candidate)
        self.comparison: Optional[Comparison] = None
        self.reports: list[ParityReport] = []

    def __call__(self) -> None:
        self.reader.reload()
        b, c = (self.reader.run(name) for name in self.runs)
        if self.comparison is None:
            self.comparison = Comparison(b, c)
        else:
            self.comparison.update(b, c)
        report = self.comparison.report()
        self.comparison.matrix()
        assert report.to_dict() == Comparison(b, c).report().to_dict()
        self.reports.append(report)

    def close(self) -> None:
        self.reader.close()
