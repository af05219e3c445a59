"""One aligned tensor pair and its verdicts over the compared steps.

Verdicts are computed over chunks of steps at once (statistics as ``[steps, 14]``
arrays, values as ``[steps, size]``), never per (step, tensor) in Python, and cached
per pair so a refresh only computes new steps.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator, Optional

import numpy as np

from tb_parity_plugin.engine import align, allclose, stat_bounds
from tb_parity_plugin.engine.matrix import ABSENT, DTYPE, MISSING, NONFINITE, OK, SHAPE, VALUE
from tb_parity_plugin.engine.tolerance import SLOT_NOISE_OF_MAX, StepClock, Tolerance
from tb_parity_plugin.engine.verdicts import FIGURES, json_float
from tb_parity_plugin.records import metadata

_IDX = metadata.STAT_INDEX
NONFINITE_COLS = metadata.field_span(metadata.NONFINITE_FIELDS)
CHECK_COLS = metadata.field_span(("dtype", "rank", "size", *metadata.NONFINITE_FIELDS))


def take_rows(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``array[index]``, as a view when ``index`` is a contiguous ascending run."""
    if len(index) and index[-1] - index[0] == len(index) - 1:
        return array[index[0] : index[-1] + 1]
    rows: np.ndarray = array[index]  # numpy types integer-array indexing as Any
    return rows


class GradientScale:
    """The largest finite |element| of one layer's gradients in the baseline, per compared step (from
    each gradient's statistics: statistics-only gradients count): the scale of the sums that made
    them, whose float32 rounding a slot of that layer's allowance admits (:data:`SLOT_NOISE_OF_MAX`).
    Per layer, not the model's: a review's gradient 2x off at 4e-7 passed beside another layer's
    gradient of 1. One per layer and update of a comparison; computed for new steps only, from
    ``previous`` (the last update's) while every gradient pair is the same, kept one (its rows
    unchanged up to ``done``)."""

    def __init__(self, grads: list[Pair], previous: Optional[GradientScale] = None) -> None:
        self._grads = grads
        self._upto = np.zeros(0)
        if previous is not None and len(previous._grads) == len(grads):
            if all(a is b for a, b in zip(previous._grads, grads)):
                settled = min((g.done for g in grads), default=0)
                self._upto = previous._upto[:settled]

    def upto(self, k1: int) -> np.ndarray:
        """The scale at compared steps ``[0, k1)`` (fewer when fewer steps are compared)."""
        if not self._grads:
            return np.zeros(k1)
        k1 = min(k1, min(len(g.ib) for g in self._grads))
        k0 = len(self._upto)
        if k0 < k1:
            out = np.zeros(k1 - k0)
            for g in self._grads:
                ib = g.ib[k0:k1]
                rows = np.flatnonzero(ib >= 0)
                if len(rows):
                    st = take_rows(g.base.stats, ib[rows])
                    with np.errstate(invalid="ignore"):
                        peak = np.fmax(np.abs(st[:, _IDX["min"]]), np.abs(st[:, _IDX["max"]]))
                    out[rows] = np.maximum(out[rows], np.where(np.isfinite(peak), peak, 0.0))
            self._upto = np.concatenate([self._upto, out])
        return self._upto[:k1]


def _row(atol: float | np.ndarray, i: int) -> float:
    """Row ``i``'s atol from :meth:`Tolerance.atols` (one float for every row, or one per row)."""
    return float(atol if np.ndim(atol) == 0 else np.asarray(atol)[i])


def step_rows(steps: np.ndarray, series_steps: np.ndarray) -> np.ndarray:
    """Row of each of ``steps`` in ``series_steps`` (both sorted), -1 where absent."""
    pos = np.searchsorted(series_steps, steps)
    clipped = np.minimum(pos, max(len(series_steps) - 1, 0))
    found = (
        (pos < len(series_steps)) & (series_steps[clipped] == steps)
        if len(series_steps)
        else np.zeros(len(steps), bool)
    )
    return np.where(found, pos, -1).astype(np.int64)


def statistics_figures(base: np.ndarray, cand: np.ndarray, atol: float, rtol: float) -> dict[str, Any]:
    """Figures of one step compared by statistics: only what the statistics can say.

    ``error_ratio`` is the largest ``|stat_c - stat_b| / allowed`` (above 1 proves that some
    element is out of tolerance); element-wise figures (max differences, cosine, mismatch share)
    do not exist without full values and stay None. ``note`` names the statistic.
    """
    out: dict[str, Any] = dict.fromkeys(FIGURES)
    out["evidence"] = "statistics"
    ratio = stat_bounds.ratios(base, cand, atol, np.array([rtol]))[0]
    if not np.all(np.isnan(ratio)):
        worst = int(np.nanargmax(ratio))
        out["error_ratio"] = json_float(ratio[worst])
        name = stat_bounds.COMPARED[worst]
        b, c = base[0, _IDX[name]], cand[0, _IDX[name]]
        limit = stat_bounds.allowed(base, cand, atol, np.array([rtol]))[0, worst]
        verdict = "proves an element out of tolerance" if ratio[worst] > 1 else "is within what the tolerance allows"
        out["note"] = (
            f"statistics only: {name} {_g(b)} vs {_g(c)} differs by {_g(abs(c - b))}, "
            f"at most {_g(limit)} if every element were within tolerance; this {verdict}"
        )
    return out


def _element_verdict(c: np.ndarray, b: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> int:
    """OK, VALUE, or NONFINITE (some failing element is NaN/Inf on a side) for one step's elements."""
    fail = ~allclose.isclose(c, b, rtol, atol, equal_nan)
    if not fail.any():
        return OK
    finite = np.isfinite(c) & np.isfinite(b) if c.dtype.kind == "f" else True
    return NONFINITE if np.any(fail & ~finite) else VALUE


def _valued(series: Any) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(values array, its row per series row or -1) of a series with full values at every step
    (``values``) or at some steps only (``TensorSeries.partial_values``), None without any."""
    if series.values is not None:
        return series.values, np.arange(len(series.steps))
    rows = getattr(series, "value_rows", None)
    partial = getattr(series, "partial_values", None)
    if rows is None or partial is None:
        return None
    index = np.full(len(series.steps), -1, dtype=np.int64)
    index[rows] = np.arange(len(rows))
    return partial, index


def _g(x: float) -> str:
    return f"{x:.6g}"


@dataclasses.dataclass
class Pair:
    """One aligned tensor pair and its cached verdicts over the compared steps."""

    match: align.Match
    base: Any  # TensorSeries
    cand: Any
    tol: Tolerance
    ib: np.ndarray  # row in base series per compared step, -1 if absent
    ic: np.ndarray
    reason: np.ndarray  # uint8, valid for [:done] (may be longer than the compared steps: a table column)
    ratio: np.ndarray  # float32, valid for [:ratio_done]
    clock: StepClock  # the comparison's compared steps: the warm-up counts training steps
    done: int = 0
    ratio_done: int = 0
    first_bad: int = -1  # first compared-step index with a divergence among [:done], -1 none
    #: The last :meth:`finding` of a settled step, ``(k, equal_nan, finding)``: a refresh keeps a
    #: pair only while its rows ``[:done]`` are unchanged, and each refresh's report asks again for
    #: the same first divergence, whose statistics figures cost ~40 numpy calls on one row.
    _found: Optional[tuple[int, bool, dict[str, Any]]] = dataclasses.field(default=None, repr=False, compare=False)
    #: The pair of this slot's variable's gradient (``align.gradient_matches``; None for every
    #: other tensor), with the ``equal_nan`` its verdicts are settled with, the power of the
    #: gradient the slot holds (1, 2, or 0 when unknown) and whether it averages rather than sums
    #: it (``align.slot_rule``). A slot sums its
    #: gradients, so at each step its atol also allows what the gradient's differences add up to
    #: (:meth:`allowance`). Why: the bias of a dense layer before batch normalization has a gradient
    #: of float32 noise (~1e-9, within every tolerance), and its momentum sums that noise past the
    #: slot's floor of 1e-8: a faithful port was a DIVERGE at step 3 or 4 on that slot alone.
    feeder: Optional[Pair] = dataclasses.field(default=None, repr=False, compare=False)
    #: Its layer's gradient scale per step (:class:`GradientScale`), beside :attr:`feeder`: up to
    #: :data:`SLOT_NOISE_OF_MAX` of it, a gradient's difference is rounding and counts in full
    grad_scale: Optional[GradientScale] = dataclasses.field(default=None, repr=False, compare=False)
    feeder_equal_nan: bool = False
    feeder_moment: int = 0
    feeder_averages: bool = False
    #: A weight's last note on its update (``Comparison._moved_by_the_update``): (its gradient's
    #: pair, the compared step, (the note, what it adds for gradients below atol)), valid while
    #: both pairs are kept and the step settled
    update_note: Optional[tuple[Pair, int, tuple[Optional[str], Optional[str]]]] = dataclasses.field(
        default=None, repr=False, compare=False
    )
    #: For an element sample whose tolerance scales with the largest element (``atol_of_max``): its
    #: tensor's baseline series (``Comparison`` links it on every update), whose rows at the same
    #: steps set the share. A sample's own largest element is not its tensor's: a review's
    #: activation of peak 1000 agreed with full values and diverged by its sample.
    scale: Optional[Any] = dataclasses.field(default=None, repr=False, compare=False)
    #: :meth:`allowance` per compared step, computed for ``[:len]``, and the gradient scale it used
    _through: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0), repr=False, compare=False)
    _scale_seen: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0), repr=False, compare=False)

    @functools.cached_property
    def static_reason(self) -> int:
        """SHAPE or DTYPE when every step must differ; static dims unknown to a graph
        (``None``) match anything, since only the runtime shapes decide."""
        if not align.same_elements(tuple(self.base.shape), tuple(self.cand.shape)):
            return SHAPE
        changed = getattr(self.base, "layout_change", None) or getattr(self.cand, "layout_change", None)
        if self.base.dtype != self.cand.dtype and not changed:  # else judged per step (stats dtype column)
            return DTYPE
        return OK

    @functools.cached_property
    def reshaped(self) -> bool:
        """The two static shapes hold the same elements in row-major order (:func:`align.reshaped`):
        compared element for element, their ranks apart."""
        return align.reshaped(tuple(self.base.shape), tuple(self.cand.shape))

    @functools.cached_property
    def check_cols(self) -> slice | np.ndarray:
        """The statistics columns that must be equal before values decide (:data:`CHECK_COLS`),
        the rank left out of a reshaped pair."""
        if not self.reshaped:
            return CHECK_COLS
        cols = np.arange(metadata.N_STATS)[CHECK_COLS]
        kept: np.ndarray = cols[cols != _IDX["rank"]]
        return kept

    @functools.cached_property
    def use_values(self) -> bool:
        """Compare full values: both runs kept them, same dtype and shape."""
        return (
            self.base.values is not None
            and self.cand.values is not None
            and self.static_reason == OK
            and self.base.values.shape[1:] == self.cand.values.shape[1:]
        )

    @property
    def evidence(self) -> str:
        """How the pair's steps are compared, for the views: ``values`` (element-wise at every step),
        ``partial`` (element-wise at the steps both runs kept full values, by statistics at the
        others) or ``statistics`` (moments within their bounds only: weaker evidence, which a new
        user's heat map showed as plain green beside elements 42x out of tolerance)."""
        return "values" if self.use_values else "partial" if self.partial else "statistics"

    @functools.cached_property
    def partial(self) -> bool:
        """Full values at some compared steps of both runs, not at every one (a size crossing
        ``full_values_limit``: a partial last batch; one side may have them at every step), or at
        every step in rows of other widths (each run pads to its own widest step): those steps are
        compared element-wise, step by step, the others by statistics. Recorded values are never
        left unread for the weaker evidence."""
        return (
            not self.use_values
            and self.static_reason == OK
            and self._valued["base"] is not None
            and self._valued["cand"] is not None
        )

    @functools.cached_property
    def _valued(self) -> dict[str, Optional[tuple[np.ndarray, np.ndarray]]]:
        """Each side's partial full values and their row per series row (:func:`_valued`)."""
        return {"base": _valued(self.base), "cand": _valued(self.cand)}

    def _both_valued(self, rb: np.ndarray, rc: np.ndarray) -> np.ndarray:
        """Of series rows ``rb``/``rc`` (-1: absent), the positions where both runs kept full values."""
        vb, vc = self._valued["base"], self._valued["cand"]
        assert vb is not None and vc is not None
        ib, ic = vb[1][np.maximum(rb, 0)], vc[1][np.maximum(rc, 0)]
        return np.flatnonzero((rb >= 0) & (rc >= 0) & (ib >= 0) & (ic >= 0))

    def _valued_rows(self, rb: np.ndarray, rc: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(position, baseline values, candidate values) where both runs kept full values of one
        size: a run rewritten with a resized tensor has rows no element-wise measure applies to (the
        heat map's ratio raised a broadcast error there; its verdict is the shape's)."""
        for j in self._both_valued(rb, rc).tolist():
            b, c = self.row_values("base", int(rb[j])), self.row_values("cand", int(rc[j]))
            assert b is not None and c is not None
            if len(b) == len(c):
                yield j, b, c

    def row_values(self, side: str, row: int) -> Optional[np.ndarray]:
        """One series row's full values, padding cut (None where that step has none)."""
        series = self.base if side == "base" else self.cand
        valued = self._valued[side]
        if valued is None or valued[1][row] < 0:
            return None
        return np.asarray(valued[0][valued[1][row]])[: int(series.stats[row, _IDX["size"]])]

    def _partial_verdicts(
        self, r: np.ndarray, rb: np.ndarray, rc: np.ndarray, rtol: float, atol: float | np.ndarray, equal_nan: bool
    ) -> None:
        """Overwrite ``r`` (VALUE/OK from the statistics) with the element-wise verdict where both
        runs kept full values: what the statistics could not prove, the values may show."""
        for j, b, c in self._valued_rows(rb, rc):
            r[j] = _element_verdict(c, b, rtol, _row(atol, j), equal_nan)

    def valued_steps(self) -> tuple[int, int]:
        """(compared steps both runs kept full values at, compared steps both logged) of a
        :attr:`partial` pair: how much of it was compared element-wise."""
        both = int(np.count_nonzero((self.ib >= 0) & (self.ic >= 0)))
        return self.valued_before(len(self.ib)), both

    def valued_before(self, k: int) -> int:
        """How many compared steps before ``k`` both runs kept full values at (0 unless :attr:`partial`)."""
        return len(self._both_valued(self.ib[:k], self.ic[:k])) if self.partial else 0

    def by_statistics(self, n: int) -> np.ndarray:
        """bool ``[n]``: the compared steps before ``n`` both runs logged whose verdict rests on
        statistics alone (a :attr:`partial` pair's steps without full values on both sides too: a
        review found those drawn as proven agreements)."""
        out: np.ndarray = (self.ib[:n] >= 0) & (self.ic[:n] >= 0)
        if self.use_values:
            out[:] = False
        elif self.partial:
            out[self._both_valued(self.ib[:n], self.ic[:n])] = False
        return out

    def by_values_at(self, k: int) -> bool:
        """Compared step ``k`` is compared element-wise (full values on both sides there)."""
        rb, rc = int(self.ib[k]), int(self.ic[k])
        if rb < 0 or rc < 0:
            return False
        if self.use_values:
            return True
        return self.partial and len(self._both_valued(np.array([rb]), np.array([rc]))) == 1

    def row_bytes(self) -> int:
        if self.use_values:
            return int(self.base.values[0:1].nbytes + self.cand.values[0:1].nbytes)
        return 2 * metadata.N_STATS * 8

    def _both(self, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Compared-step offsets (within the chunk) where both logged, and their rows."""
        ib, ic = self.ib[k0:k1], self.ic[k0:k1]
        both = np.flatnonzero((ib >= 0) & (ic >= 0))
        return ib, ic, both, k0 + both

    def verdicts(self, k0: int, k1: int, equal_nan: bool) -> np.ndarray:
        """Reason codes for compared steps ``[k0, k1)``; see ``matrix`` for the codes."""
        ib, ic, both, ks = self._both(k0, k1)
        out = np.where((ib >= 0) != (ic >= 0), MISSING, ABSENT).astype(np.uint8)
        if not len(both):
            return out
        rb, rc = ib[both], ic[both]
        sb, sc = take_rows(self.base.stats, rb), take_rows(self.cand.stats, rc)
        static = self.static_reason
        if static == OK and self.dynamic:  # a runtime shape that differs is a shape divergence
            bad = self.dims_differ(rb, rc)
            if bad.any():
                static_rows = np.where(bad, SHAPE, OK).astype(np.uint8)
                r = self._slow_verdicts(rb, rc, ks, sb, sc, equal_nan, static_rows)
                out[both] = r
                return out
        if (  # statistics only and identical (the usual agreeing run): nothing can be proven, one pass
            static == OK
            and not self.use_values
            and not self.partial
            and np.array_equal(sb, sc)
            and (equal_nan or not sb[:, _IDX["nan"]].any())
        ):
            out[both] = OK
            return out
        if (
            static == OK
            and not (sb[:, self.check_cols] != sc[:, self.check_cols]).any()
            and (equal_nan or not sb[:, _IDX["nan"]].any())
        ):  # the common case: only the values (or moments) can differ
            out[both] = self._value_verdicts(rb, rc, ks, sb, sc, equal_nan)
            return out
        out[both] = self._slow_verdicts(rb, rc, ks, sb, sc, equal_nan, np.full(len(both), static, dtype=np.uint8))
        return out

    def _slow_verdicts(
        self,
        rb: np.ndarray,
        rc: np.ndarray,
        ks: np.ndarray,
        sb: np.ndarray,
        sc: np.ndarray,
        equal_nan: bool,
        r: np.ndarray,
    ) -> np.ndarray:
        """Reasons row by row, starting from ``r`` (the static or runtime-shape reason)."""
        r[(sb[:, _IDX["dtype"]] != sc[:, _IDX["dtype"]]) & (r < DTYPE)] = DTYPE
        rank_apart = np.zeros(len(r), dtype=bool) if self.reshaped else sb[:, _IDX["rank"]] != sc[:, _IDX["rank"]]
        r[rank_apart | (sb[:, _IDX["size"]] != sc[:, _IDX["size"]])] = SHAPE
        nonfinite = (sb[:, NONFINITE_COLS] != sc[:, NONFINITE_COLS]).any(axis=1)
        if not equal_nan:  # assert_allclose(equal_nan=False): any NaN fails, even NaN vs NaN
            nonfinite |= sb[:, _IDX["nan"]] > 0
        r[nonfinite & (r < NONFINITE)] = NONFINITE
        todo = np.flatnonzero(r == OK)
        if len(todo):
            r[todo] = self._value_verdicts(rb[todo], rc[todo], ks[todo], sb[todo], sc[todo], equal_nan)
        return r

    @functools.cached_property
    def dynamic(self) -> bool:
        """Some dimension is unknown to a graph: runtime shapes are compared step by step."""
        return None in tuple(self.base.shape) or None in tuple(self.cand.shape)

    def dims_differ(self, rb: np.ndarray, rc: np.ndarray) -> np.ndarray:
        """bool per row: both runtime shapes known there and different (rank and size are
        compared with the statistics; this catches the same size in another shape). A
        :attr:`reshaped` pair compares the leading dimensions the two shapes share (a batch): its
        other dimensions are known and regroup the same elements."""
        db, dc = self.base.dims, self.cand.dims
        if db is not None and dc is not None and self.reshaped:
            lead = align.reshaped_prefix(tuple(self.base.shape), tuple(self.cand.shape)) or 0
            db, dc = db[:, :lead], dc[:, :lead]
        if db is None or dc is None or db.shape[1] != dc.shape[1]:
            return np.zeros(len(rb), dtype=bool)
        b, c = db[rb], dc[rc]
        differ: np.ndarray = ((b != c) & (b >= 0) & (c >= 0)).any(axis=1)
        return differ

    def values_at(self, side: str, row: int) -> Optional[np.ndarray]:
        """One step's full values in the shape that step ran with (padding of a resized tensor cut)."""
        series = self.base if side == "base" else self.cand
        if series.values is None:
            flat = self.row_values(side, row)
            if flat is None:
                return None
        else:
            flat = np.asarray(series.values[row])[: int(series.stats[row, _IDX["size"]])]
        shape = self.runtime_shape(side, row)
        dims = [d for d in shape if d is not None]
        return flat.reshape(dims) if len(dims) == len(shape) and int(np.prod(dims)) == flat.size else flat

    def step_values(self, k: int) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """Compared step ``k``'s full values, (baseline, candidate), flat and cut to the step's size
        (a resized tensor's rows are zero-padded past it); None unless both runs kept them there
        at one size."""
        if not self.use_values:
            return None
        rb, rc = int(self.ib[k]), int(self.ic[k])
        if rb < 0 or rc < 0:
            return None
        n = int(self.base.stats[rb, _IDX["size"]])
        if int(self.cand.stats[rc, _IDX["size"]]) != n:
            return None
        return self.base.values[rb][:n], self.cand.values[rc][:n]

    def runtime_shape(self, side: str, row: int) -> list[Optional[int]]:
        """The runtime shape of one step of one side, ``None`` where unrecorded."""
        series = self.base if side == "base" else self.cand
        if series.dims is None:
            return list(series.shape)
        return [None if d < 0 else int(d) for d in series.dims[row]]

    def known_shape(self, side: str, row: int) -> Optional[tuple[int, ...]]:
        """:meth:`runtime_shape` when every dimension of it is recorded, else None."""
        shape = self.runtime_shape(side, row)
        return None if None in shape else tuple(int(d) for d in shape if d is not None)

    def link_feeder(
        self,
        feeder: Optional[Pair],
        equal_nan: bool,
        moment: int,
        averages: bool,
        scale: Optional[GradientScale] = None,
    ) -> None:
        """Set :attr:`feeder` and :attr:`grad_scale`. Verdicts settled with another one (or none),
        or with a gradient scale that has changed at their steps (a gradient rewritten), are
        forgotten: a rebuilt gradient pair means its rows changed, and with them what this slot
        was allowed."""
        rule = (equal_nan, moment, averages)
        seen = len(self._scale_seen)
        same_scale = (scale is None) == (self.grad_scale is None) and (
            scale is None or np.array_equal(scale.upto(seen), self._scale_seen)
        )
        self.grad_scale = scale
        if (
            feeder is self.feeder
            and rule == (self.feeder_equal_nan, self.feeder_moment, self.feeder_averages)
            and same_scale
        ):
            return
        if self.done or self.ratio_done:
            self.done = self.ratio_done = 0
            self.first_bad = -1
            self._found = None
        self.feeder, (self.feeder_equal_nan, self.feeder_moment, self.feeder_averages) = feeder, rule
        self._through = self._scale_seen = np.zeros(0)

    def allowance(self, k1: int) -> np.ndarray:
        """Per compared step ``[0, k1)``: the sum (a summing slot) or the largest (an averaging
        one), over the steps *before* it, of the largest difference of the feeder gradient's
        elements each step, at the steps where both runs kept its full values and it agrees
        within its own tolerance (0 without a feeder). A slot is read at the step's start, so
        step k's slot holds the gradients of steps 0..k-1 only: step 0's allowance is 0 and an
        initial value (RMSProp's 1 against 0) is still held to the slot rule alone.

        An element's difference counts only as far as this slot's own rule would call it
        agreement in the gradient (``atol + rtol |g_b|``, :meth:`_moved`): the gradient's atol
        (1e-5) passes a gradient of 1e-6 that is 2x off, and its slot, 2x off too, must not be
        excused by it (an independent review's false AGREE). Why the rest bounds a slot: a
        momentum (``m + g``, or ``- lr g`` with lr <= 1) moves by at most the gradient's
        difference a step, an accumulator (``+ g²``) by its square's, and a moving average
        (``b v + (1 - b) g²``) by at most the largest of them; the tightest bound each (a sum for
        Adam's ``v`` would pass a wrong beta2). A gradient that diverged excuses nothing. One
        compared by statistics only shows no element's difference, so it adds what its
        statistics bound of that capped difference (:meth:`_moved_by_statistics`): a faithful
        MirroredStrategy port's bias before batch norm, 5000 wide, has a gradient of float32 noise
        kept as statistics, and its momentum slot (5e-8 against 3.5e-8) was a DIVERGE at step 12
        that the same port 4000 wide, its gradient kept in full, did not have. Up to
        :data:`SLOT_NOISE_OF_MAX` of its layer's gradient scale (:attr:`grad_scale`), a difference is
        the gradient's rounding and counts in full: a bias before batch norm."""
        g = self.feeder
        if g is None:
            return np.zeros(k1)
        k0 = len(self._through)
        if k0 < k1:
            g.ensure(k1, self.feeder_equal_nan)
            ib, ic = g.ib[k0:k1], g.ic[k0:k1]
            rows = np.flatnonzero((np.asarray(g.reason[k0:k1]) == OK) & (ib >= 0) & (ic >= 0))
            scale = self.grad_scale.upto(k1) if self.grad_scale is not None else np.zeros(k1)
            noise = scale[k0:k1][rows] * SLOT_NOISE_OF_MAX
            step = np.zeros(k1 - k0)
            if not g.use_values:  # rows with values (a partial gradient's) are replaced below
                sb, sc = take_rows(g.base.stats, ib[rows]), take_rows(g.cand.stats, ic[rows])
                step[rows] = self._moved_by_statistics(sb, sc, noise)
            if g.use_values:
                b = take_rows(g.base.values, ib[rows]).astype(np.float64)
                c = take_rows(g.cand.values, ic[rows]).astype(np.float64)
                if b.size:
                    step[rows] = self._moved(b, c, noise)
            elif g.partial:
                for j, bv, cv in g._valued_rows(ib[rows], ic[rows]):
                    step[rows[j]] = self._moved(
                        bv[None].astype(np.float64), cv[None].astype(np.float64), noise[j : j + 1]
                    )[0]
            start = self._through[-1] if k0 else 0.0
            grown = np.maximum(start, np.maximum.accumulate(step)) if self.feeder_averages else start + np.cumsum(step)
            self._through = np.concatenate([self._through, grown])
            self._scale_seen = scale
        before: np.ndarray = np.concatenate([[0.0], self._through[: k1 - 1]]) if k1 else np.zeros(0)
        return before

    def _moved(self, b: np.ndarray, c: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Per row of gradient values (float64, ``[rows, size]``): what this slot may move by. Each
        element's ``|g_c - g_b|`` is capped at what this slot's rule allows (``atol + rtol |g_b|``)
        or the row's ``noise`` (the gradient's rounding at the step's scale), whichever is larger,
        and a second moment's change is that of ``g²`` for a gradient that close:
        ``d (2 |g_b| + d)``. An element whose difference is not finite (NaN against NaN under
        ``equal_nan``, inf against inf) adds nothing, and leaves the others' count."""
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.minimum(np.abs(c - b), np.maximum(self.tol.atol + self.tol.rtol * np.abs(b), noise[:, None]))
            parts = []
            if self.feeder_moment != 2:
                parts.append(d)
            if self.feeder_moment != 1:
                parts.append(d * (2 * np.abs(b) + d))
            out = np.zeros(len(b))
            for part in parts:
                out += np.where(np.isfinite(part), part, 0.0).max(axis=1, initial=0.0)
        return out

    def _moved_by_statistics(self, sb: np.ndarray, sc: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """:meth:`_moved` of a gradient compared by statistics only, from its rows of statistics
        (``[rows, N_STATS]``): no element's difference is known, so only the rounding term: the
        gap between one run's extreme and the other's opposite one, at most the row's ``noise``
        (the layer's gradient rounding), and nothing for a second moment. The slot rule's cap
        (``atol + rtol max |g|``) is not granted: from statistics it was granted whole at every
        step, and a review's wrong beta_2 on a 5000-wide ``v`` agreed."""
        lo, hi = _IDX["min"], _IDX["max"]
        if self.feeder_moment == 2:
            return np.zeros(len(sb))
        with np.errstate(invalid="ignore", over="ignore"):
            gap = np.maximum(sc[:, hi] - sb[:, lo], sb[:, hi] - sc[:, lo])
            d = np.minimum(gap, noise)
        return np.maximum(np.where(np.isfinite(d), d, 0.0), 0.0)

    def _atols(self, ks: np.ndarray, sb: np.ndarray) -> float | np.ndarray:
        """atol per compared step ``ks`` (ascending) with baseline statistics rows ``sb``: the
        tolerance's (:meth:`Tolerance.atols`) plus a slot's :meth:`allowance`."""
        atol = self.scale_atols(ks, sb)
        if self.tol.atol_of_peak and len(ks):
            atol = atol + self._peaks(self.ib[ks])
        if self.feeder is None or not len(ks):
            return atol
        found: np.ndarray = atol + self.allowance(int(ks[-1]) + 1)[ks]
        return found

    def scale_atols(self, ks: np.ndarray, sb: np.ndarray) -> float | np.ndarray:
        """:meth:`Tolerance.atols` at compared steps ``ks`` whose baseline rows are ``sb``, an
        element sample's from its tensor's rows at the same steps (:attr:`scale`; its own where the
        tensor has none): looked up for those steps only, so a refresh pays for its new rows."""
        if self.scale is None or not self.tol.atol_of_max:
            return self.tol.atols(sb)
        rows = step_rows(self.base.steps[self.ib[ks]], self.scale.steps)
        stats = np.array(np.asarray(sb, dtype=np.float64).reshape(-1, metadata.N_STATS))
        stats[rows >= 0] = self.scale.stats[rows[rows >= 0]]
        return self.tol.atols(stats)

    def _peaks(self, rows: np.ndarray) -> np.ndarray:
        """A hyper-parameter's :meth:`Tolerance.peak_atols` at baseline rows ``rows`` (ascending
        steps; one pass over the rows up to the last). A hyper-parameter of several elements gets
        the smallest of its elements' own (a review's ``[beta1, beta2, epsilon]`` had epsilon's
        1e-8 against 1e-7 passed by beta2's share); one compared by statistics only, none."""
        upto = int(rows.max()) + 1
        if self.base.values is None or self.base.values.shape[1] == 1:
            stats = self.base.stats[:upto]
            largest = np.maximum(np.abs(stats[:, _IDX["min"]]), np.abs(stats[:, _IDX["max"]]))
            if self.base.values is None and (stats[:, _IDX["size"]] > 1).any():
                largest = np.zeros(upto)
            found: np.ndarray = self.tol.peak_atols(largest)[rows]
            return found
        size = int(self.base.stats[:upto, _IDX["size"]].min())
        values = np.abs(np.asarray(self.base.values[:upto, :size], dtype=np.float64))
        values = np.where(np.isfinite(values), values, 0.0)
        each: np.ndarray = np.maximum.accumulate(values, axis=0).min(axis=1, initial=np.inf)
        shares: np.ndarray = self.tol.peak_atols(np.where(np.isfinite(each), each, 0.0))[rows]
        return shares

    def rtol_at(self, k: int) -> float:
        """The rtol compared step ``k`` was held to (the warm-up's until ``warmup_steps`` training
        steps after the first compared step)."""
        return self.tol.rtol_at(int(self.clock.since(k)))

    def atol_at(self, k: int) -> float:
        """The atol compared step ``k`` was held to (:meth:`_atols`): what a detail view draws per
        element must be what the verdict used, a slot's share of its largest element and its
        gradient's allowance included."""
        rb = int(self.ib[k])
        if rb < 0:
            return self.tol.atol
        return float(_row(self._atols(np.array([k]), self.base.stats[rb : rb + 1]), 0))

    def _value_verdicts(
        self, rb: np.ndarray, rc: np.ndarray, ks: np.ndarray, sb: np.ndarray, sc: np.ndarray, equal_nan: bool
    ) -> np.ndarray:
        """VALUE/NONFINITE/OK for rows whose shape, dtype and NaN/Inf counts agree."""
        r = np.zeros(len(rb), dtype=np.uint8)
        for sel, rtol in self.tol.phases(self.clock.since(ks)):  # ks ascending
            atol = self._atols(ks[sel], sb[sel])  # one float, or one per row (slots)
            if self.use_values:
                cv, bv = take_rows(self.cand.values, rc[sel]), take_rows(self.base.values, rb[sel])
                ok = allclose.rows_allclose(cv, bv, rtol, atol, equal_nan)
                for i in np.flatnonzero(~ok):  # rare: classify the failing row
                    r[sel.start + i] = _element_verdict(cv[i], bv[i], rtol, _row(atol, int(i)), equal_nan)
            else:  # statistics only: a divergence must be proven (engine/stat_bounds.py)
                r[sel][stat_bounds.proven(sb[sel], sc[sel], atol, np.full(len(sb[sel]), rtol))] = VALUE
                if self.partial:
                    self._partial_verdicts(r[sel], rb[sel], rc[sel], rtol, atol, equal_nan)
        return r

    def ratios(self, k0: int, k1: int) -> np.ndarray:
        """float32 error ratios for compared steps ``[k0, k1)`` (the heat map's colour)."""
        ib, ic, both, ks = self._both(k0, k1)
        out = np.full(k1 - k0, np.nan, dtype=np.float32)
        if not len(both):
            return out
        rb, rc = ib[both], ic[both]
        rtol = self.tol.rtols(self.clock.since(ks))
        sb = take_rows(self.base.stats, rb)
        atol = self._atols(ks, sb)
        if self.use_values:
            out[both] = allclose.rows_error_ratio(
                take_rows(self.cand.values, rc), take_rows(self.base.values, rb), rtol, atol
            )
        else:
            ratio = stat_bounds.ratios(sb, take_rows(self.cand.stats, rc), atol, rtol).max(axis=1)
            if self.partial:
                for j, b, c in self._valued_rows(rb, rc):
                    ratio[j] = allclose.rows_error_ratio(c[None], b[None], rtol[j : j + 1], _row(atol, j))[0]
            out[both] = ratio
        # elements of other shapes do not correspond: no ratio means anything there (a shape step's cell
        # carried one from the statistics, 2037, where the summary said n/a)
        known = ks < self.done
        out[both[known][self.reason[ks[known]] == SHAPE]] = np.nan
        return out

    def grow(self, base: Any, cand: Any, ib: np.ndarray, ic: np.ndarray) -> None:
        """Switch to newer snapshots of the same two series whose compared steps only grew at
        the end, keeping the verdicts of ``[:done]`` (the caller checked those rows unchanged).
        Ratios past ``done`` were computed from rows nobody checked: they are recomputed. The
        caller gives ``reason`` and ``ratio`` their new length (engine/verdict_table.py)."""
        self.base, self.cand, self.ib, self.ic = base, cand, ib, ic
        if self.ratio_done > self.done:
            self.ratio[self.done : self.ratio_done] = np.nan
            self.ratio_done = self.done

    def ensure(self, k1: int, equal_nan: bool) -> None:
        """Compute verdicts up to compared step ``k1`` (exclusive)."""
        if self.done >= k1:
            return
        chunk = self.verdicts(self.done, k1, equal_nan)
        self.reason[self.done : k1] = chunk
        if self.first_bad < 0:
            bad = np.flatnonzero((chunk != OK) & (chunk != ABSENT))
            if len(bad):
                self.first_bad = self.done + int(bad[0])
        self.done = k1

    def ensure_ratios(self, k1: int) -> None:
        if self.ratio_done < k1:
            self.ratio[self.ratio_done : k1] = self.ratios(self.ratio_done, k1)
            self.ratio_done = k1

    def finding(self, k: int, equal_nan: bool) -> dict[str, Any]:
        """Figures, ``evidence`` and ``note`` of this pair's verdict at compared step ``k``.

        ``evidence`` says what the verdict rests on: ``values`` (element-wise),
        ``statistics`` (proven from min/max/mean/std/L2, see stat_bounds), ``counts``
        (NaN/Inf counts), ``shape``, ``dtype`` or ``presence`` (logged by one run only).
        """
        if self._found is not None and self._found[:2] == (k, equal_nan) and k < self.done:
            return dict(self._found[2])
        out = self._finding(k, equal_nan)
        if k < self.done:
            self._found = (k, equal_nan, dict(out))
        return out

    def _finding(self, k: int, equal_nan: bool) -> dict[str, Any]:
        reason = int(self.reason[k]) if k < self.done else OK
        out = self.figures(k, equal_nan)
        out.setdefault("evidence", "values" if self.use_values else "statistics")
        rb, rc = int(self.ib[k]), int(self.ic[k])
        if reason == MISSING:
            out["evidence"] = "presence"
            out["note"] = f"logged by the {'baseline' if rb >= 0 else 'candidate'} only at this step"
        elif reason in (SHAPE, DTYPE):  # a shape step's figures are none already (:meth:`figures`)
            by_values = out.get("evidence") == "values"  # the figures' own evidence, before it is the reason's
            out["evidence"] = "shape" if reason == SHAPE else "dtype"
            b, c = self.base, self.cand
            shapes = (self.runtime_shape("base", rb), self.runtime_shape("cand", rc)) if rb >= 0 and rc >= 0 else None
            if reason == DTYPE:
                out["note"] = f"dtype {b.dtype} in baseline vs {c.dtype} in candidate"
                ratio = out.get("error_ratio")
                if ratio is not None and ratio <= 1:  # the figures are not the reason: say so
                    out["note"] += (
                        f"; the values agree within tolerance element-wise (error ratio {_g(ratio)}), but what ran "
                        "differs (README: Mixed precision)"
                        if by_values
                        else f"; its statistics show no difference past tolerance (error ratio {_g(ratio)}), which "
                        "proves nothing of its elements, and what ran differs (README: Mixed precision)"
                    )
            elif shapes is not None and shapes[0] != shapes[1] and None not in shapes[0] + shapes[1]:
                out["note"] = f"shape {shapes[0]} in baseline vs {shapes[1]} in candidate at this step"
            elif not align.same_elements(tuple(b.shape), tuple(c.shape)):
                out["note"] = f"static shape {list(b.shape)} in baseline vs {list(c.shape)} in candidate"
            else:
                sb, sc = self.base.stats[rb], self.cand.stats[rc]
                out["note"] = (
                    f"rank {int(sb[_IDX['rank']])}, size {int(sb[_IDX['size']])} in baseline vs "
                    f"rank {int(sc[_IDX['rank']])}, size {int(sc[_IDX['size']])} in candidate"
                )
        elif reason == NONFINITE and out.get("evidence") != "values":
            sb, sc = self.base.stats[rb], self.cand.stats[rc]
            counts = [(f, int(sb[_IDX[f]]), int(sc[_IDX[f]])) for f in metadata.NONFINITE_FIELDS]
            out["evidence"] = "counts"
            out["note"] = "NaN/Inf counts (baseline vs candidate): " + ", ".join(
                f"{f} {b} vs {c}" for f, b, c in counts
            )
            if all(b == c for _, b, c in counts):
                out["note"] += "; equal, but NaN never equals NaN unless equal_nan is set"
        return out

    def figures(self, k: int, equal_nan: bool) -> dict[str, Any]:
        """Error figures at compared step ``k`` (values when compared by values)."""
        rb, rc = int(self.ib[k]), int(self.ic[k])
        if rb < 0 or rc < 0:
            return dict.fromkeys(FIGURES)
        if k < self.done and self.reason[k] == SHAPE:  # elements of other shapes do not correspond
            return {**dict.fromkeys(FIGURES), "evidence": "shape"}
        rtol = self.rtol_at(k)
        atol = self.atol_at(k)
        if self.use_values:
            n = int(self.base.stats[rb, _IDX["size"]])  # rows of a resized tensor are zero-padded past it
            out = allclose.figures(self.cand.values[rc][:n], self.base.values[rb][:n], rtol, atol, equal_nan)
            return {**out, "evidence": "values"}
        if self.partial:
            b, c = self.row_values("base", rb), self.row_values("cand", rc)
            if b is not None and c is not None and b.shape == c.shape:
                return {**allclose.figures(c, b, rtol, atol, equal_nan), "evidence": "values"}
        if self.static_reason == DTYPE and self.base.values is not None and self.cand.values is not None:
            # another dtype (float16 against float32): the figures are still the elements' (a new
            # user's float16 activation was told its values agreed, from statistics, 288x apart)
            n = int(self.base.stats[rb, _IDX["size"]])
            if int(self.cand.stats[rc, _IDX["size"]]) == n:
                b64 = np.asarray(self.base.values[rb][:n], np.float64)
                c64 = np.asarray(self.cand.values[rc][:n], np.float64)
                return {**allclose.figures(c64, b64, rtol, atol, equal_nan), "evidence": "values"}
        return statistics_figures(self.base.stats[rb : rb + 1], self.cand.stats[rc : rc + 1], atol, rtol)
