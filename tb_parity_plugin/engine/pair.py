"""One aligned tensor pair and its verdicts over the compared steps.

Verdicts are computed over chunks of steps at once (statistics as ``[steps, 14]``
arrays, values as ``[steps, size]``), never per (step, tensor) in Python, and cached
per pair so a refresh only computes new steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tb_parity_plugin.engine import align, allclose
from tb_parity_plugin.engine.matrix import ABSENT, DTYPE, MISSING, NONFINITE, OK, SHAPE, VALUE
from tb_parity_plugin.engine.tolerance import Tolerance
from tb_parity_plugin.engine.verdicts import FIGURES, json_float
from tb_parity_plugin.records import metadata

_IDX = metadata.STAT_INDEX
NONFINITE_COLS = [_IDX[f] for f in metadata.NONFINITE_FIELDS]
_MOMENT_COLS = [_IDX[f] for f in metadata.MOMENT_FIELDS]
_CHECK_COLS = [_IDX["dtype"], _IDX["rank"], _IDX["size"]] + NONFINITE_COLS


def take_rows(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``array[index]``, as a view when ``index`` is a contiguous ascending run."""
    if len(index) and index[-1] - index[0] == len(index) - 1:
        return array[index[0] : index[-1] + 1]
    rows: np.ndarray = array[index]  # numpy types integer-array indexing as Any
    return rows


def same_memory(old: np.ndarray, new: np.ndarray) -> bool:
    """True if ``new`` starts with the very rows of ``old`` (same buffer, same layout).

    Reader snapshots never change after they are taken, so when an appending reload
    hands out views of the same buffer, the old rows are unchanged without reading them.
    """
    if old is new:
        return True
    ia, ib = old.__array_interface__, new.__array_interface__
    return (
        ia["data"][0] == ib["data"][0]
        and old.strides == new.strides
        and old.dtype == new.dtype
        and len(new) >= len(old)
    )


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


def moment_figures(cm: np.ndarray, bm: np.ndarray, tol: Tolerance, rtol: float) -> dict[str, Any]:
    """Figures from the moments (min, max, mean, std, l2) when values are not at hand."""
    with np.errstate(all="ignore"):
        ok = np.isclose(cm, bm, rtol=rtol, atol=tol.atol, equal_nan=True)
        both = np.isfinite(cm) & np.isfinite(bm)
        diff = np.abs(cm - bm)[both]
        absb = np.abs(bm)[both]
        out = dict.fromkeys(FIGURES)
        out["mismatch_fraction"] = float(1.0 - ok.mean())
        if diff.size:
            out["max_abs_diff"] = json_float(diff.max())
            out["max_rel_diff"] = json_float(np.where(diff == 0, 0.0, diff / absb).max())
            out["error_ratio"] = json_float(np.where(diff == 0, 0.0, diff / (tol.atol + rtol * absb)).max())
    return out


@dataclasses.dataclass
class Pair:
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
            return int(self.base.values[0:1].nbytes + self.cand.values[0:1].nbytes)
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
        sb, sc = take_rows(self.base.stats, rb), take_rows(self.cand.stats, rc)
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
        nonfinite = (sb[:, NONFINITE_COLS] != sc[:, NONFINITE_COLS]).any(axis=1)
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
                cv, bv = take_rows(self.cand.values, rc[sel]), take_rows(self.base.values, rb[sel])
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
                take_rows(self.cand.values, rc), take_rows(self.base.values, rb), rtol, self.tol.atol
            )
        else:
            cm = take_rows(self.cand.stats, rc)[:, _MOMENT_COLS]
            bm = take_rows(self.base.stats, rb)[:, _MOMENT_COLS]
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

    def figures(self, k: int, equal_nan: bool) -> dict[str, Any]:
        """Error figures at compared step ``k`` (values when compared by values)."""
        rb, rc = int(self.ib[k]), int(self.ic[k])
        if rb < 0 or rc < 0:
            return dict.fromkeys(FIGURES)
        rtol = self.tol.rtol_at(k)
        if self.use_values:
            return allclose.figures(self.cand.values[rc], self.base.values[rb], rtol, self.tol.atol, equal_nan)
        return moment_figures(self.cand.stats[rc, _MOMENT_COLS], self.base.stats[rb, _MOMENT_COLS], self.tol, rtol)
