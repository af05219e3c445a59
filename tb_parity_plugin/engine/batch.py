"""Pairs of one layout settled together: one array operation for many tensors.

Why: a run logs its tensors of one step as one statistics block (``[steps, tensors, 14]``),
and in an agreeing run nearly every pair's statistics are identical. Settling each pair on
its own costs a handful of numpy calls per pair, so a refresh of 100 new steps over 200
tensors was Python overhead, not arithmetic. Here the pairs whose two sides each come from
one block (``TensorSeries.block``) and share their step rows are compared as one array; a pair
whose statistics are identical over the new rows gets exactly what :meth:`Pair.verdicts` and
:meth:`Pair.ratios` give such rows (OK where both logged, MISSING/ABSENT elsewhere, ratio 0).
Every other pair is left to its own, unchanged, per-pair path.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tb_parity_plugin.engine.matrix import ABSENT, MISSING, OK
from tb_parity_plugin.engine.pair import Pair, take_rows
from tb_parity_plugin.engine.verdict_table import VerdictTable
from tb_parity_plugin.records import metadata

_NAN = metadata.STAT_INDEX["nan"]
#: Off: the engine as it was before layouts were settled together — every pair on its own path,
#: rebuilt on each refresh, its rows checked and scanned for NaN/Inf one tensor at a time.
#: Benchmarks print both side by side; nothing else turns it off.
ENABLED = True


def groups(pairs: Sequence[Pair]) -> list[list[Pair]]:
    """Pairs that can be settled together: statistics only, static shape and dtype agreeing,
    no runtime dimension to compare, each side one layout block, and the same step rows."""
    found: dict[tuple[int, int, int, int], list[Pair]] = {}
    for p in pairs if ENABLED else ():
        b, c = p.base, p.cand
        if getattr(b, "block", None) is None or getattr(c, "block", None) is None:
            continue
        if p.use_values or p.static_reason != OK or p.dynamic:
            continue
        found.setdefault((id(b.block), id(c.block), id(p.ib), id(p.ic)), []).append(p)
    return [g for g in found.values() if len(g) > 1]


def _identical(group: list[Pair], k0: int, k1: int, equal_nan: bool) -> tuple[np.ndarray, np.ndarray]:
    """(bool per pair: statistics identical at every compared step of ``[k0, k1)`` logged by
    both, with no NaN unless ``equal_nan``; bool per step: both logged)."""
    p0 = group[0]
    ib, ic = p0.ib[k0:k1], p0.ic[k0:k1]
    both = (ib >= 0) & (ic >= 0)
    if not both.any():
        return np.ones(len(group), dtype=bool), both
    blk_b, blk_c = take_rows(p0.base.block, ib[both]), take_rows(p0.cand.block, ic[both])
    cols_b = np.fromiter((p.base.column for p in group), np.intp, len(group))
    cols_c = np.fromiter((p.cand.column for p in group), np.intp, len(group))
    if np.array_equal(cols_b, cols_c) and blk_b.shape[1] == blk_c.shape[1]:  # same layout order: no gather
        same = (blk_b == blk_c).all(axis=0).all(axis=1)[cols_b]  # axis 0 first: 3x faster than (0, 2)
    else:
        same = (blk_b[:, cols_b] == blk_c[:, cols_c]).all(axis=0).all(axis=1)
    if not equal_nan:  # assert_allclose(equal_nan=False): a NaN is a divergence even against NaN
        same &= ~(blk_b[:, cols_b, _NAN] > 0).any(axis=0)
    return same, both


def settle(group: list[Pair], k1: int, equal_nan: bool, table: VerdictTable) -> None:
    """Verdicts of compared steps up to ``k1`` for the pairs of ``group`` whose statistics are
    identical there, and their error ratios where those had reached the same step; the rest are
    left as they were (to their own path). ``table``: where the pairs' verdicts are held, written
    as one array operation rather than one per pair (pair by pair for pairs it does not hold)."""
    k0 = group[0].done
    todo = [p for p in group if p.done == k0]
    if k0 >= k1 or len(todo) < 2:
        return
    same, both = _identical(todo, k0, k1, equal_nan)
    ib, ic = todo[0].ib[k0:k1], todo[0].ic[k0:k1]
    codes = np.where(both, OK, np.where((ib >= 0) != (ic >= 0), MISSING, ABSENT)).astype(np.uint8)
    ratio = np.where(both, 0.0, np.nan).astype(np.float32)
    missing = np.flatnonzero(codes == MISSING)
    first_bad = k0 + int(missing[0]) if len(missing) else -1
    settled = todo if same.all() else [p for p, s in zip(todo, same.tolist()) if s]  # usually all
    with_ratios = [p for p in settled if p.ratio_done == k0]
    cols = table.columns(settled)
    rcols = cols if len(with_ratios) == len(settled) else table.columns(with_ratios)  # a subset of it
    if cols is not None and rcols is not None:
        table.reason[k0:k1, cols] = codes[:, None]
        table.ratio[k0:k1, rcols] = ratio[:, None]
    else:
        for p in settled:
            p.reason[k0:k1] = codes
        for p in with_ratios:
            p.ratio[k0:k1] = ratio
    for p in settled:
        if p.first_bad < 0:
            p.first_bad = first_bad
        p.done = k1
    for p in with_ratios:
        p.ratio_done = k1
