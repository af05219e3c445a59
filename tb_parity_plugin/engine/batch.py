"""Pairs of one layout settled together: one array operation for many tensors.

Why: a run logs its tensors of one step as one statistics block (``[steps, tensors, 14]``).
In an agreeing run nearly every pair's statistics are identical; after a divergence nearly
every pair's differ. Settling each pair on its own costs a handful of numpy calls per pair, so
a refresh of 100 new steps over 200 tensors was Python overhead, not arithmetic. Here the pairs
whose two sides each come from one block (``TensorSeries.block``) and share their step rows are
compared as one array, and get exactly what :meth:`Pair.verdicts` and :meth:`Pair.ratios` give:
- identical statistics over the new rows: OK where both logged, MISSING/ABSENT elsewhere, ratio 0;
- statistics that differ, with the same shape, dtype and NaN/Inf counts at every row (no NaN
  unless ``equal_nan``): the bounds of engine/stat_bounds.py over all their rows at once.
Every other pair is left to its own, unchanged, per-pair path."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from tb_parity_plugin.engine import stat_bounds
from tb_parity_plugin.engine.matrix import ABSENT, MISSING, OK, VALUE
from tb_parity_plugin.engine.pair import CHECK_COLS, Pair, take_rows
from tb_parity_plugin.engine.verdict_table import VerdictTable
from tb_parity_plugin.records import metadata

_NAN = metadata.STAT_INDEX["nan"]
#: Statistics rows bounded per array operation: one refresh of 100 steps x 150 tensors is one
#: operation, a whole run of 2000 steps is sliced so the temporaries stay in the cache.
_BOUNDED_ROWS = 1 << 14
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
        if p.use_values or p.static_reason != OK or p.dynamic or p.partial or p.feeder is not None or p.reshaped:
            continue
        if p.tol.atol_of_peak:  # its atol reads earlier rows (Pair._peaks)
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


def settle(group: list[Pair], k1: int, equal_nan: bool, table: VerdictTable, ratios: bool = False) -> None:
    """Verdicts of compared steps up to ``k1`` for the pairs of ``group`` that can be settled as
    one array: those whose statistics are identical there, and those whose statistics differ only
    where the bounds of engine/stat_bounds.py decide (same shape, dtype and NaN/Inf counts at every
    row, no NaN unless ``equal_nan``); the rest are left as they were (to their own path). Also
    the ratios of the identical pairs (0) whose ratios had reached the same step. ``table``: where
    the pairs' verdicts are held, written as one array operation rather than one per pair (pair by
    pair for pairs it does not hold). ``ratios``: also the ratios of the differing pairs whose ratios
    had reached the same step (the matrix needs them): the bounds are then computed once, for both."""
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
    if same.all():  # the usual agreeing run
        settled, differ = todo, []
    else:
        flags = same.tolist()
        settled = [p for p, s in zip(todo, flags) if s]
        differ = [p for p, s in zip(todo, flags) if not s]
    with_ratios = [p for p in settled if p.ratio_done == k0]
    cols = table.columns(settled)
    _write(table, settled, "reason", k0, k1, np.broadcast_to(codes[:, None], (k1 - k0, len(settled))), cols)
    rcols = cols if len(with_ratios) == len(settled) else table.columns(with_ratios)  # a subset of it
    _write(table, with_ratios, "ratio", k0, k1, np.broadcast_to(ratio[:, None], (k1 - k0, len(with_ratios))), rcols)
    for p in settled:
        if p.first_bad < 0:
            p.first_bad = first_bad
        p.done = k1
    for p in with_ratios:
        p.ratio_done = k1
    if differ and both.any():
        _settle_bounded(differ, k0, k1, both, codes, equal_nan, table, ratios)


def _settle_bounded(
    pairs: list[Pair],
    k0: int,
    k1: int,
    both: np.ndarray,
    codes: np.ndarray,
    equal_nan: bool,
    table: VerdictTable,
    ratios: bool = False,
) -> None:
    """The pairs of one group whose statistics differ somewhere in ``[k0, k1)``, bounded as one
    array of ``rows x pairs`` statistics rows (each with its own tensor's tolerance): what
    :meth:`Pair.verdicts` gives them one tensor at a time when the counts agree at every row.
    Why: after a divergence nearly every tensor differs, and 150 tensors on their own path cost
    150 times a handful of numpy calls on a refresh of 100 rows. With ``ratios``, when every such
    pair's ratios reached ``k0`` too, their largest ratios are computed instead of the proof, and
    the proof read from them (``proven`` is exactly some ratio above 1): one bound, not two."""
    rows = np.flatnonzero(both)
    blk_b, blk_c, cols_b, cols_c = _blocks(pairs, k0, rows)
    easy = ~(blk_b[:, cols_b, CHECK_COLS] != blk_c[:, cols_c, CHECK_COLS]).any(axis=(0, 2))
    if not equal_nan:  # assert_allclose(equal_nan=False): a NaN is a divergence even against NaN
        easy &= ~(blk_b[:, cols_b, _NAN] > 0).any(axis=0)
    if not easy.any():
        return
    pick = np.flatnonzero(easy)
    pairs, cols_b, cols_c = [pairs[j] for j in pick.tolist()], cols_b[pick], cols_c[pick]
    rtol, atol = _tolerances(pairs, k0 + rows, blk_b, cols_b)
    reason = np.repeat(codes[:, None], len(pairs), axis=1)
    if ratios and all(p.ratio_done == k0 for p in pairs):
        largest = _by_slices(_largest_ratio, blk_b, blk_c, cols_b, cols_c, atol, rtol)
        reason[rows] = np.where(largest > 1, VALUE, OK)
        ratio = np.full((k1 - k0, len(pairs)), np.nan, dtype=np.float32)
        ratio[rows] = largest
        _write(table, pairs, "ratio", k0, k1, ratio)
        for p in pairs:
            p.ratio_done = k1
    else:  # proven divergences only: the ratios are left to settle_ratios (the scan does not need them)
        reason[rows] = np.where(_by_slices(stat_bounds.proven, blk_b, blk_c, cols_b, cols_c, atol, rtol), VALUE, OK)
    bad = (reason != OK) & (reason != ABSENT)
    first = np.where(bad.any(axis=0), k0 + bad.argmax(axis=0), -1).tolist()
    _write(table, pairs, "reason", k0, k1, reason)
    for p, f in zip(pairs, first):
        if p.first_bad < 0:
            p.first_bad = f
        p.done = k1


def settle_ratios(group: list[Pair], k1: int, table: VerdictTable) -> None:
    """Error ratios of compared steps up to ``k1`` for the pairs of ``group`` whose ratios reached
    the same step, as one array (:meth:`Pair.ratios`: the bounds' largest ratio where both logged,
    NaN elsewhere; row by row, whatever the verdicts). Only the matrix and the details need them,
    so the scan for the first divergence does not pay for them."""
    r0 = min(p.ratio_done for p in group)
    pairs = [p for p in group if p.ratio_done == r0]
    if r0 >= k1 or len(pairs) < 2:
        return
    ib, ic = pairs[0].ib[r0:k1], pairs[0].ic[r0:k1]
    rows = np.flatnonzero((ib >= 0) & (ic >= 0))
    ratio = np.full((k1 - r0, len(pairs)), np.nan, dtype=np.float32)
    if len(rows):
        blk_b, blk_c, cols_b, cols_c = _blocks(pairs, r0, rows)
        rtol, atol = _tolerances(pairs, r0 + rows, blk_b, cols_b)
        ratio[rows] = _by_slices(_largest_ratio, blk_b, blk_c, cols_b, cols_c, atol, rtol)
    _write(table, pairs, "ratio", r0, k1, ratio)
    for p in pairs:
        p.ratio_done = k1


def _write(
    table: VerdictTable,
    pairs: list[Pair],
    field: str,
    k0: int,
    k1: int,
    values: np.ndarray,
    cols: Optional[np.ndarray] = None,
) -> None:
    """Rows ``[k0, k1)`` of the pairs' ``reason`` or ``ratio`` (``values``: ``[rows, pairs]``): one
    array operation when the table holds them (``cols``: their columns, if already looked up),
    else pair by pair."""
    if cols is None:
        cols = table.columns(pairs)
    if cols is not None:
        getattr(table, field)[k0:k1, cols] = values
    else:
        for j, p in enumerate(pairs):
            getattr(p, field)[k0:k1] = values[:, j]


def _blocks(pairs: list[Pair], k0: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Both sides' layout blocks at compared steps ``k0 + rows`` (``[rows, the layout's tensors,
    N_STATS]``: the pairs of a group share their blocks and step rows) and each pair's columns."""
    p0 = pairs[0]
    cols_b = np.fromiter((p.base.column for p in pairs), np.intp, len(pairs))
    cols_c = np.fromiter((p.cand.column for p in pairs), np.intp, len(pairs))
    blk_b = take_rows(p0.base.block, p0.ib[k0:][rows])
    blk_c = take_rows(p0.cand.block, p0.ic[k0:][rows])
    return blk_b, blk_c, cols_b, cols_c


def _largest_ratio(base: np.ndarray, cand: np.ndarray, atol: np.ndarray, rtol: np.ndarray) -> np.ndarray:
    """What :meth:`Pair.ratios` keeps of a statistics row: its largest ratio."""
    found: np.ndarray = stat_bounds.ratios(base, cand, atol, rtol).max(axis=1)
    return found


def _by_slices(
    bound: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray],
    blk_b: np.ndarray,
    blk_c: np.ndarray,
    cols_b: np.ndarray,
    cols_c: np.ndarray,
    atol: np.ndarray,
    rtol: np.ndarray,
) -> np.ndarray:
    """``bound`` (one value per statistics row) of the rows of ``blk_b``/``blk_c`` at the columns of
    each pair, ``[rows, pairs]``, in slices of pairs small enough for the cache: as one array of a
    whole run's rows the temporaries cost more than pair by pair."""
    rows, out = len(blk_b), []
    width = max(1, _BOUNDED_ROWS // rows)
    for j0 in range(0, len(cols_b), width):
        j1 = min(len(cols_b), j0 + width)
        found = bound(
            blk_b[:, cols_b[j0:j1]].reshape(-1, metadata.N_STATS),
            blk_c[:, cols_c[j0:j1]].reshape(-1, metadata.N_STATS),
            atol[:, j0:j1].ravel(),
            rtol[:, j0:j1].ravel(),
        )
        out.append(found.reshape(rows, j1 - j0))
    return np.concatenate(out, axis=1)


def _tolerances(
    pairs: list[Pair], ks: np.ndarray, blk_b: np.ndarray, cols_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(rtol, atol) per compared step ``ks`` and pair, ``[steps, pairs]``: the warm-up rule reads
    ``ks``' training steps (the pairs' shared clock), a slot's atol its baseline rows (``blk_b``'s
    columns ``cols_b``: Tolerance.atols)."""
    by_tol: dict[Any, np.ndarray] = {}
    since = pairs[0].clock.since(ks)
    rtol = np.stack([by_tol.setdefault(p.tol, p.tol.rtols(since)) for p in pairs], axis=1)
    atol = np.empty(rtol.shape, dtype=np.float64)
    atol[:] = [p.tol.atol for p in pairs]
    for j, p in enumerate(pairs):
        if p.tol.atol_of_max:
            atol[:, j] = p.scale_atols(ks, blk_b[:, cols_b[j]])
    return rtol, atol
