"""What a refresh may keep of a comparison's pairs when newer snapshots of the runs arrive.

A pair's verdicts over its first ``done`` compared steps stay true only while the compared steps
up to there are the same and both sides still hold the very same statistics there, and the very
same full values and runtime dimensions where the pair compares those (a later file may rewrite a
step: last write wins, and the same elements in another order keep every statistic). The checks
on statistics are made once per layout block, not once per tensor: a layout's tensors share their
steps array and their block, so a refresh of 200 tensors costs a few array comparisons plus a
dictionary lookup per pair.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from tb_parity_plugin.engine import batch
from tb_parity_plugin.engine.pair import Pair, step_rows, take_rows
from tb_parity_plugin.logdir.rundata import same_rows
from tb_parity_plugin.records import metadata


class Reuse:
    """The checks of one refresh, memoised by the identity of the arrays they read (every array
    is alive while the refresh runs, so an identity cannot be reused by another one)."""

    def __init__(self, steps: np.ndarray, in_place: bool) -> None:
        """``steps``: the new compared steps; ``in_place``: the steps only grew at the end and the
        alignment is unchanged, so pairs may be kept and grown rather than rebuilt."""
        self.steps = steps
        self.in_place = in_place and batch.ENABLED
        self._rows: dict[int, np.ndarray] = {}
        self._prefix: dict[tuple[int, int, int], bool] = {}
        self._unchanged: dict[tuple[int, int, int, int], bool] = {}
        self._layouts: dict[tuple[int, ...], Optional[tuple[bool, np.ndarray, np.ndarray]]] = {}

    def rows_of(self, series: Any) -> np.ndarray:
        """Row of each compared step in ``series`` (-1 where absent), shared by its layout."""
        key = id(series.steps)
        if key not in self._rows:
            self._rows[key] = step_rows(self.steps, series.steps)
        return self._rows[key]

    def same_prefix(self, a: np.ndarray, b: np.ndarray, n: int) -> bool:
        key = (id(a), id(b), n)
        if key not in self._prefix:
            self._prefix[key] = len(b) >= n and np.array_equal(a[:n], b[:n])
        return self._prefix[key]

    def rows_unchanged(self, old: Any, new: Any, idx: np.ndarray, keep: int) -> bool:
        """Every statistic (not one: a rewrite can keep the L2 norm, e.g. signs flipped) of the
        rows ``idx[:keep]`` compared before is the same in the new snapshot (last write wins)."""
        # Whole blocks only when the tensor sits in the same column of blocks of one width: a run
        # read anew (a file gone or replaced) may hold it in another layout, where equal blocks
        # say nothing of its own statistics (and blocks of other widths cannot be compared).
        if _whole_blocks(old, new):
            return self._same_at(old.block, new.block, idx, keep)
        return self._same_at(old.stats, new.stats, idx, keep)

    def compared_rows_unchanged(self, old: Pair, base: Any, cand: Any, done: int) -> bool:
        """What the pair compared beyond the statistics is the same in the new snapshots' rows
        ``[:done]``: the full values when it compares them, the runtime dimensions when it compares
        those. A rewrite may keep every statistic while changing both (the elements reversed, a
        shape transposed)."""
        sides = ((old.base, base, old.ib), (old.cand, cand, old.ic))
        fields = (("values",) if old.use_values else ()) + (("dims",) if old.dynamic else ())
        for field in fields:
            for o_series, n_series, idx in sides:
                o, n = getattr(o_series, field, None), getattr(n_series, field, None)
                if o is None or n is None:
                    if o is not n:
                        return False
                elif not self._same_at(o, n, idx, done):
                    return False
        return True

    def _same_at(self, old: np.ndarray, new: np.ndarray, idx: np.ndarray, keep: int) -> bool:
        """``old`` and ``new`` hold the same rows ``idx[:keep]`` (-1: none): known without reading
        them when they are the same memory or the reader's copy of it, else compared."""
        key = (id(old), id(new), id(idx), keep)
        if key not in self._unchanged:
            rows = idx[:keep][idx[:keep] >= 0]
            self._unchanged[key] = (
                not len(rows) or same_rows(old, new) or (old.shape[1:] == new.shape[1:] and _equal_rows(old, new, rows))
            )
        return self._unchanged[key]

    def _side_kept(self, old: Any, new: Any, old_rows: np.ndarray, new_rows: np.ndarray, done: int) -> bool:
        """One side of a pair: same kind, same compared rows and the same statistics up to ``done``."""
        return (
            _same_kind(old, new)
            and self.same_prefix(old_rows, new_rows, done)
            and self.rows_unchanged(old, new, old_rows, done)
        )

    def keep(self, old: Pair, base: Any, cand: Any) -> bool:
        """Grow ``old`` in place onto the new series if its verdicts stay valid (the common
        refresh: the same pair, more steps at the end); False, untouched, if it must be rebuilt."""
        if not self.in_place or old.partial:  # compared step by step on values: rebuilt (_same_kind)
            return False
        ob, oc, done = old.base, old.cand, old.done
        obb, bb, ocb, cb = ob.block, base.block, oc.block, cand.block
        layout: Optional[tuple[bool, np.ndarray, np.ndarray]] = None
        if (
            obb is not None
            and bb is not None
            and ocb is not None
            and cb is not None
            and ob.column == base.column
            and oc.column == cand.column
        ):
            # Both sides one column, the same as before, of layout blocks: when the blocks have one
            # width the rows checks read only the blocks and the steps, so they are answered once for
            # all the pairs of two layouts (None: blocks of other widths, checked per tensor).
            key = (id(obb), id(bb), id(ocb), id(cb), id(old.ib), id(old.ic), id(base.steps), id(cand.steps), done)
            if key in self._layouts:
                layout = self._layouts[key]
            else:
                layout = self._layouts[key] = self._layout_kept(old, base, cand)
        if layout is not None:
            rows_kept, rb, rc = layout
            kept = rows_kept and _same_kind(ob, base) and _same_kind(oc, cand)
        else:  # one tensor's own rows (several layouts, another column, or blocks of other widths)
            rb, rc = self.rows_of(base), self.rows_of(cand)
            kept = self._side_kept(ob, base, old.ib, rb, done) and self._side_kept(oc, cand, old.ic, rc, done)
        if kept and (old.use_values or old.dynamic):  # else the pair compares nothing but statistics
            kept = self.compared_rows_unchanged(old, base, cand, done)
        if kept:
            old.grow(base, cand, rb, rc)
        return kept

    def keep_group(self, group: list[Pair], base_tensors: dict[Any, Any], cand_tensors: dict[Any, Any]) -> bool:
        """:meth:`keep` for every pair of a batch group (``batch.groups``: statistics only, one pair
        of layout blocks, shared rows) at once: True, each grown, when each would be kept; False,
        none touched, otherwise (then each pair is asked on its own). The rows and statistics are
        checked once for the group; per pair only the identity of its new blocks and steps, its
        column and its kind (a refresh of 200 pairs spent 0.45 ms in per-pair calls of ``keep``)."""
        if not self.in_place:
            return False
        news = [(base_tensors.get(p.match.base), cand_tensors.get(p.match.cand)) for p in group]
        b0, c0 = news[0]
        if b0 is None or c0 is None or b0.block is None or c0.block is None:
            return False
        bb, cb, sb, sc = b0.block, c0.block, b0.steps, c0.steps
        for p, (b, c) in zip(group, news):
            if (
                b is None
                or c is None
                or b.block is not bb
                or c.block is not cb
                or b.steps is not sb
                or c.steps is not sc
                or p.base.column != b.column
                or p.cand.column != c.column
                or p.partial
                or not _same_kind(p.base, b)
                or not _same_kind(p.cand, c)
            ):
                return False
        # A group's pairs share their old blocks and rows (``batch.groups``); only ``done`` may differ.
        first = {p.done: p for p in reversed(group)}
        layouts = {}
        for done, p in first.items():
            key = (id(p.base.block), id(bb), id(p.cand.block), id(cb), id(p.ib), id(p.ic), id(sb), id(sc), done)
            if key not in self._layouts:
                self._layouts[key] = self._layout_kept(p, b0, c0)
            layout = self._layouts[key]
            if layout is None or not layout[0]:
                return False
            layouts[done] = layout
        for p, (b, c) in zip(group, news):
            _, rb, rc = layouts[p.done]
            p.grow(b, c, rb, rc)
        return True

    def _layout_kept(self, old: Pair, base: Any, cand: Any) -> Optional[tuple[bool, np.ndarray, np.ndarray]]:
        """For every pair of the same two old and two new layout blocks (``keep``'s memo key): whether
        the compared rows and their statistics are unchanged, and the new rows; None when a side's
        blocks changed width (then each tensor's own statistics are checked)."""
        ob, oc, done = old.base, old.cand, old.done
        if ob.block.shape[1:] != base.block.shape[1:] or oc.block.shape[1:] != cand.block.shape[1:]:
            return None
        rb, rc = self.rows_of(base), self.rows_of(cand)
        return (
            self.same_prefix(old.ib, rb, done)
            and self.same_prefix(old.ic, rc, done)
            and self.rows_unchanged(ob, base, old.ib, done)
            and self.rows_unchanged(oc, cand, old.ic, done),
            rb,
            rc,
        )

    def copy_verdicts(self, old: Pair, new: Pair) -> None:
        """Copy ``old``'s verdicts into the rebuilt ``new`` if the rows they came from are unchanged."""
        keep = old.done
        if not (
            old.feeder is None  # its verdicts allowed for its gradient's rows: Pair.link_feeder
            and not old.partial
            and not new.partial
            and old.use_values == new.use_values
            and old.static_reason == new.static_reason
            and old.dynamic == new.dynamic
            and self.same_prefix(old.ib, new.ib, keep)
            and self.same_prefix(old.ic, new.ic, keep)
            and self.rows_unchanged(old.base, new.base, old.ib, keep)
            and self.rows_unchanged(old.cand, new.cand, old.ic, keep)
            and self.compared_rows_unchanged(old, new.base, new.cand, keep)
        ):
            return
        new.reason[:keep] = old.reason[:keep]
        new.done = keep
        new.first_bad = old.first_bad
        rkeep = min(old.ratio_done, keep)
        new.ratio[:rkeep] = old.ratio[:rkeep]
        new.ratio_done = rkeep


def _whole_blocks(old: Any, new: Any) -> bool:
    """Both series are one column, the same, of layout blocks of one width."""
    ob, nb = getattr(old, "block", None), getattr(new, "block", None)
    return bool(
        batch.ENABLED
        and ob is not None
        and nb is not None
        and old.column == new.column
        and ob.shape[1:] == nb.shape[1:]
    )


def _same_kind(old: Any, new: Any) -> bool:
    """Whether what a pair's static properties (shape, dtype, evidence) depend on is unchanged. A
    series with full values at some steps only is never the same: its pair compares those values
    row by row (``Pair.partial``), and is rebuilt (such tensors are few, their values small)."""
    if old.shape != new.shape or old.dtype != new.dtype or old.layout_change != new.layout_change:
        return False
    if getattr(old, "value_rows", None) is not None or getattr(new, "value_rows", None) is not None:
        return False
    ov, nv = old.values, new.values
    if ov is None or nv is None:
        return ov is nv
    return bool(ov.shape[1:] == nv.shape[1:])


def _equal_rows(old: np.ndarray, new: np.ndarray, rows: np.ndarray) -> bool:
    """``old[rows] == new[rows]``, NaN equal to NaN (checked only if the plain test fails)."""
    a, b = take_rows(old, rows), take_rows(new, rows)
    return bool((a == b).all() or np.array_equal(a, b, equal_nan=True))


def scale_unchanged(old: Any, base_tensors: dict[Any, Any], sample: Any) -> bool:
    """Whether an element sample's tensor (``Pair.scale``: None when it had none) still holds the
    rows it held, which a kept sample's verdicts read for their share of its largest element (a
    review: a rewritten step of the tensor left a sample's stale verdicts in place while a fresh
    comparison found another first step)."""
    new = base_tensors.get((sample.kind, metadata.sample_parent(sample.name)))
    if old is None or new is None:
        return old is None and new is None
    n = len(old.steps)
    if len(new.steps) < n or not np.array_equal(old.steps, new.steps[:n]):
        return False
    return (
        old is new
        or same_rows(old.stats, new.stats)
        or bool(np.array_equal(old.stats[:n], new.stats[:n], equal_nan=True))
    )
