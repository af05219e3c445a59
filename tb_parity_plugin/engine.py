"""The comparison engine: per tensor and step verdicts, the first divergence, the report.

Works on the reader's :class:`~tb_parity_plugin.reader.RunData` snapshots (numpy only,
no TensorFlow). A :class:`Comparison` keeps per-tensor, per-step verdicts over the
steps both runs logged; :meth:`Comparison.update` with newer snapshots keeps what is
still valid, so a refresh after appended steps only computes the new steps.

Speed comes from never looping in Python per (step, tensor): each tensor is checked
over a chunk of steps at once (statistics as ``[steps, 14]`` arrays, values as
``[steps, size]``), chunks are scanned in step order and the scan stops at the first
chunk holding a divergence, and equal rows skip the tolerance arithmetic.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np

from tb_parity_plugin import allclose, align, metadata
from tb_parity_plugin.matrix import ABSENT, DTYPE, MISSING, NONFINITE, OK, REASONS, SHAPE, VALUE, ParityMatrix
from tb_parity_plugin.tolerance import Tolerance, ToleranceOverride, TolerancePolicy

__all__ = [
    "Comparison",
    "Divergence",
    "ParityMatrix",
    "ParityReport",
    "TensorDetail",
    "ToleranceOverride",
    "TolerancePolicy",
    "compare_runs",
]

_IDX = metadata.STAT_INDEX
_NONFINITE_COLS = [_IDX[f] for f in metadata.NONFINITE_FIELDS]
_MOMENT_COLS = [_IDX[f] for f in metadata.MOMENT_FIELDS]
_CHECK_COLS = [_IDX["dtype"], _IDX["rank"], _IDX["size"]] + _NONFINITE_COLS
_FIGURES = ("max_abs_diff", "max_rel_diff", "cosine", "mismatch_fraction", "error_ratio")
#: Bytes of data one scan chunk touches: big enough to amortise per-call overhead,
#: small enough that a divergence early in the run is found without reading the rest.
_CHUNK_BYTES = 256 << 20
_MIN_CHUNK_STEPS = 16


def _json_float(value: Any) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return value if np.isfinite(value) else None


def _rows(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``array[index]``, as a view when ``index`` is a contiguous ascending run."""
    if len(index) and index[-1] - index[0] == len(index) - 1:
        return array[index[0] : index[-1] + 1]
    return array[index]


def _same_memory(old: np.ndarray, new: np.ndarray) -> bool:
    """True if ``new`` starts with the very rows of ``old`` (same buffer, same layout).

    Reader snapshots never change after they are taken, so when an appending reload
    hands out views of the same buffer, the old rows are unchanged without reading them.
    """
    if old is new:
        return True
    ia, ib = old.__array_interface__, new.__array_interface__
    return ia["data"][0] == ib["data"][0] and old.strides == new.strides and old.dtype == new.dtype and len(new) >= len(old)


def _positions(steps: np.ndarray, series_steps: np.ndarray) -> np.ndarray:
    """Row of each of ``steps`` in ``series_steps`` (both sorted), -1 where absent."""
    pos = np.searchsorted(series_steps, steps)
    clipped = np.minimum(pos, max(len(series_steps) - 1, 0))
    found = (pos < len(series_steps)) & (series_steps[clipped] == steps) if len(series_steps) else np.zeros(len(steps), bool)
    return np.where(found, pos, -1).astype(np.int64)


def _moment_figures(cm: np.ndarray, bm: np.ndarray, tol: Tolerance, rtol: float) -> dict:
    """Figures from the moments (min, max, mean, std, l2) when values are not at hand."""
    with np.errstate(all="ignore"):
        ok = np.isclose(cm, bm, rtol=rtol, atol=tol.atol, equal_nan=True)
        both = np.isfinite(cm) & np.isfinite(bm)
        diff = np.abs(cm - bm)[both]
        absb = np.abs(bm)[both]
        out = dict.fromkeys(_FIGURES)
        out["mismatch_fraction"] = float(1.0 - ok.mean())
        if diff.size:
            out["max_abs_diff"] = _json_float(diff.max())
            out["max_rel_diff"] = _json_float(np.where(diff == 0, 0.0, diff / absb).max())
            out["error_ratio"] = _json_float(np.where(diff == 0, 0.0, diff / (tol.atol + rtol * absb)).max())
    return out


@dataclasses.dataclass
class _Pair:
    """One aligned tensor pair and its cached verdicts over the compared steps."""

    match: align.Match
    base: Any  # TensorSeries
    cand: Any
    tol: Tolerance
    ib: np.ndarray  # row in base series per compared step, -1 if absent
    ic: np.ndarray
    reason: np.ndarray  # uint8, valid for [:done]
    ratio: np.ndarray  # float32, valid for [:ratio_done]
    done: int = 0
    ratio_done: int = 0
    first_bad: int = -1  # first compared-step index with a divergence among [:done], -1 none

    @property
    def static_reason(self) -> int:
        if tuple(self.base.shape) != tuple(self.cand.shape):
            return SHAPE
        if self.base.dtype != self.cand.dtype:
            return DTYPE
        return OK

    @property
    def use_values(self) -> bool:
        """Compare full values: both runs kept them, same dtype and shape."""
        return (
            self.base.values is not None
            and self.cand.values is not None
            and self.static_reason == OK
            and self.base.values.shape[1:] == self.cand.values.shape[1:]
        )

    def row_bytes(self) -> int:
        if self.use_values:
            return self.base.values[0:1].nbytes + self.cand.values[0:1].nbytes
        return 2 * metadata.N_STATS * 8

    def rtols(self, k0: int, k1: int) -> np.ndarray:
        k = np.arange(k0, k1)
        return np.where(k < self.tol.warmup_steps, 0.0, self.tol.rtol)

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
        sb, sc = _rows(self.base.stats, rb), _rows(self.cand.stats, rc)
        static = self.static_reason
        if (
            static == OK
            and not (sb[:, _CHECK_COLS] != sc[:, _CHECK_COLS]).any()
            and (equal_nan or not sb[:, _IDX["nan"]].any())
        ):  # the common case: only the values (or moments) can differ
            out[both] = self._value_verdicts(rb, rc, ks, sb, sc, equal_nan)
            return out
        r = np.full(len(both), static, dtype=np.uint8)
        r[(sb[:, _IDX["dtype"]] != sc[:, _IDX["dtype"]]) & (r < DTYPE)] = DTYPE
        r[(sb[:, _IDX["rank"]] != sc[:, _IDX["rank"]]) | (sb[:, _IDX["size"]] != sc[:, _IDX["size"]])] = SHAPE
        nonfinite = (sb[:, _NONFINITE_COLS] != sc[:, _NONFINITE_COLS]).any(axis=1)
        if not equal_nan:  # assert_allclose(equal_nan=False): any NaN fails, even NaN vs NaN
            nonfinite |= sb[:, _IDX["nan"]] > 0
        r[nonfinite & (r < NONFINITE)] = NONFINITE
        todo = np.flatnonzero(r == OK)
        if len(todo):
            r[todo] = self._value_verdicts(rb[todo], rc[todo], ks[todo], sb[todo], sc[todo], equal_nan)
        out[both] = r
        return out

    def _value_verdicts(
        self, rb: np.ndarray, rc: np.ndarray, ks: np.ndarray, sb: np.ndarray, sc: np.ndarray, equal_nan: bool
    ) -> np.ndarray:
        """VALUE/NONFINITE/OK for rows whose shape, dtype and NaN/Inf counts agree."""
        r = np.zeros(len(rb), dtype=np.uint8)
        n_warm = int(np.searchsorted(ks, self.tol.warmup_steps))  # ks ascending
        for sel, rtol in ((slice(0, n_warm), 0.0), (slice(n_warm, len(ks)), self.tol.rtol)):
            if sel.start == sel.stop:
                continue
            if self.use_values:
                cv, bv = _rows(self.cand.values, rc[sel]), _rows(self.base.values, rb[sel])
                ok = allclose.rows_allclose(cv, bv, rtol, self.tol.atol, equal_nan)
                for i in np.flatnonzero(~ok):  # rare: classify the failing row
                    c, b = cv[i], bv[i]
                    fail = ~allclose.isclose(c, b, rtol, self.tol.atol, equal_nan)
                    finite = np.isfinite(c) & np.isfinite(b) if c.dtype.kind == "f" else True
                    r[sel.start + i] = NONFINITE if np.any(fail & ~finite) else VALUE
            else:
                ok = np.isclose(
                    sc[sel][:, _MOMENT_COLS], sb[sel][:, _MOMENT_COLS], rtol=rtol, atol=self.tol.atol, equal_nan=True
                ).all(axis=1)
                r[sel][~ok] = VALUE
        return r

    def ratios(self, k0: int, k1: int) -> np.ndarray:
        """float32 error ratios for compared steps ``[k0, k1)`` (the heat map's colour)."""
        ib, ic, both, ks = self._both(k0, k1)
        out = np.full(k1 - k0, np.nan, dtype=np.float32)
        if not len(both):
            return out
        rb, rc = ib[both], ic[both]
        rtol = np.where(ks < self.tol.warmup_steps, 0.0, self.tol.rtol)
        if self.use_values:
            out[both] = allclose.rows_error_ratio(
                _rows(self.cand.values, rc), _rows(self.base.values, rb), rtol, self.tol.atol
            )
        else:
            cm = _rows(self.cand.stats, rc)[:, _MOMENT_COLS]
            bm = _rows(self.base.stats, rb)[:, _MOMENT_COLS]
            with np.errstate(all="ignore"):
                diff = np.abs(cm - bm)
                ratio = diff / (self.tol.atol + rtol[:, None] * np.abs(bm))
                ratio[diff == 0] = 0.0
                out[both] = np.fmax.reduce(ratio, axis=1)
        return out

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

    def figures(self, k: int, equal_nan: bool) -> dict:
        """Error figures at compared step ``k`` (values when compared by values)."""
        rb, rc = int(self.ib[k]), int(self.ic[k])
        if rb < 0 or rc < 0:
            return dict.fromkeys(_FIGURES)
        rtol = self.tol.rtol_at(k)
        if self.use_values:
            return allclose.figures(self.cand.values[rc], self.base.values[rb], rtol, self.tol.atol, equal_nan)
        return _moment_figures(self.cand.stats[rc, _MOMENT_COLS], self.base.stats[rb, _MOMENT_COLS], self.tol, rtol)


@dataclasses.dataclass
class Divergence:
    """One tensor diverging at one step, with its figures (finite floats or None)."""

    step: int
    tensor: str  # baseline name
    kind: str
    candidate_tensor: str
    order: int
    reason: str
    max_abs_diff: Optional[float] = None
    max_rel_diff: Optional[float] = None
    cosine: Optional[float] = None
    mismatch_fraction: Optional[float] = None
    error_ratio: Optional[float] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ParityReport:
    """What the CLI prints with ``--json`` (:meth:`to_dict`) and what the API returns."""

    baseline: str
    candidate: str
    steps_compared: int
    tensors_compared: int
    first_divergence: Optional[Divergence]
    divergences_at_first_step: list  # of Divergence, execution order
    first_nonfinite: dict  # run -> None | {step, tensor, kind}
    unmatched: dict  # run -> [tags]
    mapping: list  # of {baseline, candidate, kind, how}
    steps_only: dict  # run -> number of steps only that run logged
    policy: TolerancePolicy
    problems: list  # of {run, path, offset, message}
    warnings: list  # of str
    comparison: Optional["Comparison"] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def agree(self) -> bool:
        return self.first_divergence is None

    def to_dict(self) -> dict:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "agree": self.agree,
            "steps_compared": self.steps_compared,
            "tensors_compared": self.tensors_compared,
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "divergences_at_first_step": [d.to_dict() for d in self.divergences_at_first_step],
            "first_nonfinite": self.first_nonfinite,
            "unmatched": self.unmatched,
            "mapping": self.mapping,
            "steps_only": self.steps_only,
            "policy": self.policy.to_dict(),
            "problems": self.problems,
            "warnings": self.warnings,
        }

    def _repr_html_(self) -> str:
        """Notebook view of this report, no server needed (drawn by html_report.py)."""
        from tb_parity_plugin import html_report

        return html_report.report_fragment(self)

    def matrix(self, max_steps: Optional[int] = None) -> ParityMatrix:
        """The steps x tensors matrix of the comparison behind this report."""
        if self.comparison is None:
            raise ValueError("this report is not attached to a Comparison")
        return self.comparison.matrix(max_steps)

    def detail(self, tensor: str, step: Optional[int] = None) -> "TensorDetail":
        if self.comparison is None:
            raise ValueError("this report is not attached to a Comparison")
        return self.comparison.detail(tensor, step)


@dataclasses.dataclass
class TensorDetail:
    """One tensor pair over time, for a detail view.

    ``steps``/``reason``/``error_ratio`` cover the compared steps; ``*_steps`` and
    ``*_stats`` are each run's own series (columns ``metadata.STATS_FIELDS``). With
    ``step`` given and full values on both sides: ``base_values``, ``cand_values`` and
    ``diff`` (cand - base, float64) at that step, shaped like the tensor, and its figures.
    """

    tensor: str
    candidate_tensor: str
    kind: str
    how: str
    atol: float
    rtol: float
    warmup_steps: int
    steps: np.ndarray
    reason: np.ndarray
    error_ratio: np.ndarray
    base_steps: np.ndarray
    base_stats: np.ndarray
    cand_steps: np.ndarray
    cand_stats: np.ndarray
    step: Optional[int] = None
    figures: Optional[dict] = None
    base_values: Optional[np.ndarray] = None
    cand_values: Optional[np.ndarray] = None
    diff: Optional[np.ndarray] = None

    def to_dict(self) -> dict:
        """JSON-safe: non-finite numbers become None."""

        def clean(a: Optional[np.ndarray]) -> Any:
            return None if a is None else _nested(np.asarray(a, dtype=np.float64))

        return {
            "tensor": self.tensor,
            "candidate_tensor": self.candidate_tensor,
            "kind": self.kind,
            "how": self.how,
            "tolerance": {"atol": self.atol, "rtol": self.rtol, "warmup_steps": self.warmup_steps},
            "steps": self.steps.tolist(),
            "reason": [REASONS[int(c)] for c in self.reason],
            "error_ratio": clean(self.error_ratio),
            "stats_fields": list(metadata.STATS_FIELDS),
            "base": {"steps": self.base_steps.tolist(), "stats": clean(self.base_stats)},
            "candidate": {"steps": self.cand_steps.tolist(), "stats": clean(self.cand_stats)},
            "step": self.step,
            "figures": self.figures,
            "base_values": clean(self.base_values),
            "cand_values": clean(self.cand_values),
            "diff": clean(self.diff),
        }


def _nested(a: np.ndarray) -> Any:
    """``a.tolist()`` with NaN/Inf replaced by None."""
    if a.ndim == 0:
        return _json_float(a)
    return [_nested(x) for x in a] if a.ndim > 1 else [_json_float(x) for x in a.tolist()]


class _FirstNonfinite:
    """One run's earliest (step, tensor in execution order) holding NaN/Inf, from the counts.

    Remembers per tensor the stats array it scanned and the first hit. A refresh whose
    stats start with the very same memory (an appending reload) scans only the new rows;
    anything else, such as a step rewritten later (last write wins), is rescanned whole.
    """

    def __init__(self) -> None:
        self._seen: dict = {}  # key -> (stats array scanned, first NaN/Inf step or None)

    def find(self, run: Any) -> Optional[dict]:
        best: Optional[tuple] = None
        for key, series in run.tensors.items():
            stats = series.stats
            old, hit = self._seen.get(key, (None, None))
            if old is not None and _same_memory(old, stats):
                start = len(old) if hit is None else len(stats)  # an earlier hit cannot move
            else:
                start, hit = 0, None
            rows = np.flatnonzero(stats[start:, _NONFINITE_COLS].any(axis=1))
            if len(rows):
                hit = int(series.steps[start + rows[0]])
            self._seen[key] = (stats, hit)
            if hit is not None:
                rank = (hit, align.execution_key(series))
                if best is None or rank < best[0]:
                    best = (rank, series)
        if best is None:
            return None
        return {"step": best[0][0], "tensor": best[1].name, "kind": best[1].kind}


class Comparison:
    """Baseline vs candidate, with verdicts cached per tensor and step.

    ``report()`` finds the first divergence scanning forward only as far as needed;
    ``matrix()`` and ``detail()`` fill in the rest on demand. ``update()`` with newer
    snapshots of the same runs reuses every verdict whose inputs did not change.
    """

    def __init__(
        self, base: Any, cand: Any, policy: TolerancePolicy = TolerancePolicy(), mapping: Sequence[str] = ()
    ) -> None:
        self.policy = policy
        self.mapping = tuple(mapping)
        self._pairs: list[_Pair] = []
        self._alignment: Optional[align.Alignment] = None
        self._keys: Optional[tuple] = None
        self._nonfinite_scans: dict[str, _FirstNonfinite] = {}
        self.steps = np.zeros(0, dtype=np.int64)
        self.base = base
        self.cand = cand
        self.update(base, cand)

    # -- building and refreshing -------------------------------------------------
    def update(self, base: Any, cand: Any) -> None:
        """Switch to newer snapshots of the two runs, keeping still-valid verdicts.

        A pair's cached verdicts survive when the compared steps only grew at the end
        and both series still hold the same rows (same steps, same statistics) there.
        """
        keys = (tuple(sorted(base.tensors)), tuple(sorted(cand.tensors)))
        if keys != self._keys:
            self._alignment = align.align(list(base.tensors.values()), list(cand.tensors.values()), self.mapping)
            self._keys = keys
        old_steps = self.steps
        steps = np.intersect1d(base.steps, cand.steps).astype(np.int64)
        prefix = len(old_steps) <= len(steps) and np.array_equal(steps[: len(old_steps)], old_steps)
        old_pairs = {(p.match.base, p.match.cand): p for p in self._pairs}
        pairs = []
        positions: dict[int, np.ndarray] = {}  # tensors of one layout share their steps array

        def rows_of(series: Any) -> np.ndarray:
            if id(series.steps) not in positions:
                positions[id(series.steps)] = _positions(steps, series.steps)
            return positions[id(series.steps)]

        memo: dict[tuple, bool] = {}  # row-position arrays are shared by a layout's tensors

        def same_prefix(a: np.ndarray, b: np.ndarray, n: int) -> bool:
            key = (id(a), id(b), n)
            if key not in memo:
                memo[key] = len(b) >= n and np.array_equal(a[:n], b[:n])
            return memo[key]

        assert self._alignment is not None
        for match in self._alignment.matches:
            b, c = base.tensors[match.base], cand.tensors[match.cand]
            n = len(steps)
            pair = _Pair(
                match=match,
                base=b,
                cand=c,
                tol=self.policy.for_tag(f"{b.kind}/{b.name}"),
                ib=rows_of(b),
                ic=rows_of(c),
                reason=np.zeros(n, dtype=np.uint8),
                ratio=np.full(n, np.nan, dtype=np.float32),
            )
            old = old_pairs.get((match.base, match.cand))
            if prefix and old is not None:
                self._reuse(old, pair, same_prefix)
            pairs.append(pair)
        self._pairs = pairs
        self.steps = steps
        self.base, self.cand = base, cand
        self._nonfinite = {run.name: self._nonfinite_scans.setdefault(run.name, _FirstNonfinite()).find(run) for run in (base, cand)}

    @staticmethod
    def _reuse(old: _Pair, new: _Pair, same_prefix: Callable[[np.ndarray, np.ndarray, int], bool]) -> None:
        """Copy ``old``'s verdicts into ``new`` if the rows they were computed from are unchanged."""
        keep = old.done
        if not (
            old.use_values == new.use_values
            and old.static_reason == new.static_reason
            and same_prefix(old.ib, new.ib, keep)
            and same_prefix(old.ic, new.ic, keep)
        ):
            return
        for o, n, idx in ((old.base, new.base, old.ib[:keep]), (old.cand, new.cand, old.ic[:keep])):
            rows = idx[idx >= 0]
            if len(rows) and not _same_memory(o.stats, n.stats):
                # every statistic, not one: a rewrite can keep the L2 norm (e.g. signs flipped)
                a, b = _rows(o.stats, rows), _rows(n.stats, rows)
                if not ((a == b).all() or np.array_equal(a, b, equal_nan=True)):  # NaN-aware only if needed
                    return  # an already-compared step was rewritten (last write wins)
        new.reason[:keep] = old.reason[:keep]
        new.done = keep
        new.first_bad = old.first_bad
        rkeep = min(old.ratio_done, keep)
        new.ratio[:rkeep] = old.ratio[:rkeep]
        new.ratio_done = rkeep

    # -- the scan ----------------------------------------------------------------
    def _chunk_steps(self) -> int:
        per_step = sum(p.row_bytes() for p in self._pairs) or 1
        return max(_MIN_CHUNK_STEPS, _CHUNK_BYTES // per_step)

    def _scan_first(self) -> Optional[int]:
        """Index (into ``self.steps``) of the first divergent step, scanning lazily."""
        n = len(self.steps)
        chunk = self._chunk_steps()
        equal_nan = self.policy.equal_nan
        while True:
            done = min((p.done for p in self._pairs), default=n)
            bad = [p.first_bad for p in self._pairs if 0 <= p.first_bad]
            if bad and min(bad) < done:
                return min(bad)
            if done >= n:
                return None
            end = min(n, done + chunk)
            for p in self._pairs:
                p.ensure(end, equal_nan)

    def fill(self) -> None:
        """Compute every verdict and ratio (the matrix needs them all)."""
        n = len(self.steps)
        for p in self._pairs:
            p.ensure(n, self.policy.equal_nan)
            p.ensure_ratios(n)

    # -- results -----------------------------------------------------------------
    def _divergence(self, pair: _Pair, k: int) -> Divergence:
        b, c = pair.base, pair.cand
        return Divergence(
            step=int(self.steps[k]),
            tensor=b.name,
            kind=b.kind,
            candidate_tensor=c.name,
            order=int(b.order),
            reason=REASONS[int(pair.reason[k])],
            **pair.figures(k, self.policy.equal_nan),
        )

    def report(self) -> ParityReport:
        """The report; scans only as far as the first divergent step."""
        k = self._scan_first()
        at_first = [] if k is None else [self._divergence(p, k) for p in self._pairs if p.first_bad == k]
        alignment = self._alignment
        assert alignment is not None
        base, cand = self.base, self.cand
        problems = [
            {"run": run.name, "path": p.path, "offset": int(p.offset), "message": p.message}
            for run in (base, cand)
            for p in run.problems
        ]
        return ParityReport(
            baseline=base.name,
            candidate=cand.name,
            steps_compared=len(self.steps),
            tensors_compared=len(self._pairs),
            first_divergence=at_first[0] if at_first else None,
            divergences_at_first_step=at_first,
            first_nonfinite=dict(self._nonfinite),
            unmatched={
                base.name: [f"{k}/{n}" for k, n in alignment.unmatched_base],
                cand.name: [f"{k}/{n}" for k, n in alignment.unmatched_cand],
            },
            mapping=[
                {"baseline": m.base[1], "candidate": m.cand[1], "kind": m.base[0], "how": m.how}
                for m in alignment.matches
            ],
            steps_only={
                base.name: int(len(np.setdiff1d(base.steps, cand.steps))),
                cand.name: int(len(np.setdiff1d(cand.steps, base.steps))),
            },
            policy=self.policy,
            problems=problems,
            warnings=list(alignment.warnings),
            comparison=self,
        )

    def matrix(self, max_steps: Optional[int] = None) -> ParityMatrix:
        """Steps x tensors matrix (baseline execution order), bucketed to ``max_steps`` rows."""
        self.fill()
        n = len(self.steps)
        if self._pairs:
            reason = np.stack([p.reason for p in self._pairs], axis=1)
            ratio = np.stack([p.ratio for p in self._pairs], axis=1)
        else:
            reason = np.zeros((n, 0), dtype=np.uint8)
            ratio = np.zeros((n, 0), dtype=np.float32)
        first = None
        k = self._scan_first()
        if k is not None:
            col = next(i for i, p in enumerate(self._pairs) if p.first_bad == k)
            first = (k, col)
        m = ParityMatrix(
            step_start=self.steps.copy(),
            step_end=self.steps.copy(),
            tensors=[p.base.tag for p in self._pairs],
            candidate_tensors=[p.cand.tag for p in self._pairs],
            kinds=[p.base.kind for p in self._pairs],
            error_ratio=ratio,
            reason=reason,
            first_divergence=first,
        )
        return m.bucketed(max_steps) if max_steps else m

    def _pair(self, tensor: str) -> _Pair:
        """Tags before names: an activation *named* ``grad/w`` must not shadow the tag ``grad/w``."""
        for field in ("tag", "name"):
            for side in ("base", "cand"):
                for p in self._pairs:
                    if getattr(getattr(p, side), field) == tensor:
                        return p
        raise KeyError(f"no compared tensor {tensor!r}")

    def detail(self, tensor: str, step: Optional[int] = None) -> TensorDetail:
        """One pair's series (``tensor``: baseline or candidate tag or name), values at ``step``."""
        p = self._pair(tensor)
        n = len(self.steps)
        p.ensure(n, self.policy.equal_nan)
        p.ensure_ratios(n)
        d = TensorDetail(
            tensor=p.base.name,
            candidate_tensor=p.cand.name,
            kind=p.base.kind,
            how=p.match.how,
            atol=p.tol.atol,
            rtol=p.tol.rtol,
            warmup_steps=p.tol.warmup_steps,
            steps=self.steps,
            reason=p.reason,
            error_ratio=p.ratio,
            base_steps=p.base.steps,
            base_stats=p.base.stats,
            cand_steps=p.cand.steps,
            cand_stats=p.cand.stats,
        )
        if step is not None:
            hits = np.flatnonzero(self.steps == step)
            if not len(hits):
                raise KeyError(f"step {step} was not logged by both runs")
            k = int(hits[0])
            d.step, d.figures = int(step), p.figures(k, self.policy.equal_nan)
            rb, rc = int(p.ib[k]), int(p.ic[k])
            shape = tuple(p.base.shape) if None not in tuple(p.base.shape) else (-1,)
            if rb >= 0 and p.base.values is not None:
                d.base_values = np.asarray(p.base.values[rb]).reshape(shape)
            if rc >= 0 and p.cand.values is not None:
                d.cand_values = np.asarray(p.cand.values[rc]).reshape(tuple(p.cand.shape) if None not in tuple(p.cand.shape) else (-1,))
            if p.use_values and rb >= 0 and rc >= 0:
                d.diff = p.cand.values[rc].astype(np.float64) - p.base.values[rb].astype(np.float64)
                d.diff = d.diff.reshape(shape)
        return d


def compare_runs(
    base: Any, cand: Any, policy: TolerancePolicy = TolerancePolicy(), mapping: Sequence[str] = ()
) -> ParityReport:
    """Compare two runs (reader ``RunData``); ``mapping`` items are ``OLD=NEW`` or ``re:PAT=REPL``."""
    return Comparison(base, cand, policy, mapping).report()
