"""Per run: the first step and tensor (in execution order) holding NaN or Inf.

Debugger V2's alert, from the recorded FULL_HEALTH counts, for one run on its own.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from tb_parity_plugin.engine import align, batch
from tb_parity_plugin.engine.pair import NONFINITE_COLS
from tb_parity_plugin.logdir.rundata import same_rows


class _Scanned(NamedTuple):
    """What was scanned of some stats (a layout block's ``[steps, tensors, N_STATS]``, or one
    tensor's as ``[steps, 1, N_STATS]``) and per column the first step holding NaN/Inf."""

    stats: np.ndarray
    hit: np.ndarray  # bool per column: some step holds NaN/Inf
    first_step: np.ndarray  # int64 per column, where ``hit``


class FirstNonfinite:
    """One run's earliest (step, tensor in execution order) holding NaN/Inf, from the counts.

    Remembers what it scanned: a layout block (all the tensors of one layout, scanned as one
    array: a run of 200 tensors is a few array operations, not 200), or a lone tensor's stats
    (a tensor merged from several layouts). A refresh whose arrays start with the very same
    memory (an appending reload: the reader never changes a row it handed out) scans only the
    new rows; anything else, such as a step rewritten later (last write wins, read into a
    fresh array), is rescanned whole.
    """

    def __init__(self) -> None:
        self._seen: dict[Any, _Scanned] = {}  # a layout's ("layout", first tensor's key, width), or one tensor's key

    def copy(self) -> FirstNonfinite:
        """A scanner that knows what this one knows (and goes on on its own)."""
        other = FirstNonfinite()
        other._seen = dict(self._seen)
        return other

    def find(self, run: Any) -> Optional[dict[str, Any]]:
        layouts: dict[int, tuple[np.ndarray, np.ndarray, Any]] = {}  # id(block) -> (block, steps, first key)
        lone: list[tuple[Any, Any]] = []
        enabled = batch.ENABLED
        for key, series in run.tensors.items():
            block = series.block if enabled else None
            if block is None:
                lone.append((key, series))
            elif id(block) not in layouts:
                layouts[id(block)] = (block, series.steps, key)
        before, seen = self._seen, {}
        hits: list[tuple[int, Any]] = []  # (step, series)
        hit_blocks: set[int] = set()
        for block, steps, first_key in layouts.values():
            # A layout is remembered by its first tensor and its width; whether what was scanned
            # may be kept is decided by the memory itself (``_scan``), never by this name.
            name = ("layout", first_key, block.shape[1])
            seen[name] = scanned = _scan(before.get(name), block, steps)
            if scanned.hit.any():  # rare: look at the members
                hit_blocks.add(id(block))
        if hit_blocks:
            for series in run.tensors.values():
                block = series.block if enabled else None
                if block is not None and id(block) in hit_blocks:
                    scanned = seen[("layout", layouts[id(block)][2], block.shape[1])]
                    if scanned.hit[series.column]:
                        hits.append((int(scanned.first_step[series.column]), series))
        for key, series in lone:
            seen[key] = scanned = _scan(before.get(key), series.stats[:, None], series.steps)
            if scanned.hit[0]:
                hits.append((int(scanned.first_step[0]), series))
        self._seen = seen
        if not hits:
            return None
        step, first = min(hits, key=lambda h: (h[0], align.execution_key(h[1])))
        return {"step": step, "tensor": first.name, "kind": first.kind}


def _scan(old: Optional[_Scanned], stats: np.ndarray, steps: np.ndarray) -> _Scanned:
    """Per column of ``stats`` (``[rows, columns, N_STATS]``, rows at ``steps``) the first step
    holding NaN/Inf, scanning only the rows past ``old``'s when they are ``old``'s very memory."""
    width = stats.shape[1]
    hit, first_step, start = np.zeros(width, dtype=bool), np.zeros(width, dtype=np.int64), 0
    if old is not None and len(old.hit) == width and same_rows(old.stats, stats):
        hit, first_step, start = old.hit.copy(), old.first_step.copy(), len(old.stats)
    if start < len(stats) and not hit.all():
        fresh = stats[start:]
        # One reduction over the rows as one 2-D array, then the count columns: 1.5x faster than
        # reducing the count columns' strided view, and 3x faster than axis=(0, 2).
        nonzero: np.ndarray = np.any(fresh.reshape(len(fresh), -1), axis=0)
        flagged = nonzero.reshape(width, -1)[:, NONFINITE_COLS].any(axis=1) & ~hit
        for col in np.flatnonzero(flagged).tolist():  # rare: only columns holding NaN/Inf
            first_step[col] = steps[start + int(np.flatnonzero(np.any(fresh[:, col, NONFINITE_COLS], axis=1))[0])]
            hit[col] = True
    return _Scanned(stats, hit, first_step)
