"""Element-wise closeness exactly as ``numpy.testing.assert_allclose`` decides it, but fast.

``assert_allclose(actual, desired, rtol, atol, equal_nan)`` passes iff every element
satisfies ``numpy.isclose(actual, desired, rtol, atol, equal_nan)`` (its NaN/Inf
"same position" checks are the same element-wise rule). ``isclose`` computes
``|x - y| <= atol + rtol*|y|`` in the arrays' dtype (float32 stays float32) and treats
non-finite ``y`` specially. :func:`isclose` below replays the same ufuncs in the same
dtype, so the verdict is bit-for-bit the same; it just skips work that cannot change
the result (all-finite blocks, rtol == 0) and works on cache-sized blocks of rows.
The differential test (tests/test_allclose_differential.py) holds it to that.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

#: Elements per block: temporaries stay in L2 cache.
BLOCK_ELEMENTS = 1 << 16


def _fast_ok(x: np.ndarray, y: np.ndarray, rtol: float, atol: float) -> bool:
    """True if the replayed formula is valid: same float dtype, sane tolerances."""
    return x.dtype == y.dtype and x.dtype.kind == "f" and 0.0 <= atol < np.inf and 0.0 <= rtol < np.inf


def isclose(x: np.ndarray, y: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> np.ndarray:
    """``numpy.isclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan)``, bit-identical.

    ``x`` is the candidate (numpy's ``actual``), ``y`` the baseline (``desired``).
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if not _fast_ok(x, y, rtol, atol) or x.shape != y.shape or x.ndim == 0:
        return np.asarray(np.isclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan))
    with np.errstate(all="ignore"):
        diff = np.subtract(x, y)
        np.abs(diff, out=diff)
        ok: np.ndarray
        if rtol == 0.0:
            # atol + 0*|y| == dtype(atol) for finite y; non-finite y is handled below.
            ok = np.less_equal(diff, y.dtype.type(atol))
        else:
            tol = np.abs(y)
            np.multiply(tol, rtol, out=tol)
            np.add(tol, atol, out=tol)
            ok = np.less_equal(diff, tol)
        finite_y = np.isfinite(y)
        if not finite_y.all():
            # Only where y is non-finite can `& isfinite(y) | (x == y)` change the result:
            # for finite y, x == y implies |x - y| = 0 <= tol.
            ok &= finite_y
            ok |= np.equal(x, y)
            if equal_nan:
                ok |= np.isnan(x) & np.isnan(y)
    return ok


def rows_allclose(
    cand: np.ndarray, base: np.ndarray, rtol: float, atol: float | np.ndarray, equal_nan: bool
) -> np.ndarray:
    """Per row of 2-D ``cand``/``base``: would ``assert_allclose(cand[i], base[i], ...)`` pass?

    Exact, but proves most rows with two passes: ``isclose``'s tolerance for element i is
    ``fl(atol + fl(rtol*|b_i|))``, which rounding keeps monotone in ``|b_i|``, so a row
    passes if ``max|c-b| <= atol`` or ``max|c-b| <= fl(atol + fl(rtol*min|b|))`` (computed
    with the same ufuncs in the same dtype). NaN/Inf make the max NaN/Inf, so such rows,
    and rows these bounds cannot settle, get the element-wise :func:`isclose`.
    Works on strided row views (the reader's values are column slices of a block).
    """
    n, size = cand.shape
    out = np.ones(n, dtype=bool)
    if size == 0 or n == 0:
        return out
    if np.ndim(atol):  # one atol per row (optimizer slots): numpy's isclose, each row with its own
        return np.asarray(_isclose_rows(cand, base, rtol, np.asarray(atol), equal_nan).all(axis=1))
    atol = float(atol)
    if not _fast_ok(cand, base, rtol, atol):
        close = np.asarray(np.isclose(cand, base, rtol=rtol, atol=atol, equal_nan=equal_nan))
        return np.asarray(close.all(axis=1))
    atol_t = base.dtype.type(atol)
    rows = max(1, BLOCK_ELEMENTS // size)
    buffer = np.empty((min(rows, n), size), dtype=base.dtype)
    try_equal = True  # identical runs are common: one compare pass settles a block
    with np.errstate(all="ignore"):
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            c, b = cand[r0:r1], base[r0:r1]
            if try_equal:
                if np.array_equal(c, b):
                    continue
                try_equal = False
            diff = np.subtract(c, b, out=buffer[: r1 - r0])
            np.abs(diff, out=diff)
            dmax = diff.max(axis=1)
            ok = dmax <= atol_t
            if ok.all():
                continue
            todo = np.flatnonzero(~ok)
            if rtol > 0.0:
                bound = np.abs(b[todo]).min(axis=1)
                np.multiply(bound, rtol, out=bound)
                np.add(bound, atol, out=bound)
                settled = (dmax[todo] <= bound) & np.isfinite(dmax[todo])  # finite max: no NaN/Inf in the row
                ok[todo[settled]] = True
                todo = todo[~settled]
            if len(todo):
                ok[todo] = isclose(c[todo], b[todo], rtol, atol, equal_nan).all(axis=1)
            out[r0:r1] = ok
    return out


def _isclose_rows(x: np.ndarray, y: np.ndarray, rtol: float, atol_rows: np.ndarray, equal_nan: bool) -> np.ndarray:
    """``numpy.isclose`` of 2-D rows, row ``i`` with ``atol_rows[i]``, computed in the arrays'
    float dtype as a float ``atol`` would be (float32 stays float32), so each row is what
    :func:`isclose` gives it alone."""
    dtype = y.dtype if y.dtype.kind == "f" else np.float64
    return np.asarray(np.isclose(x, y, rtol=rtol, atol=atol_rows.astype(dtype)[:, None], equal_nan=equal_nan))


def _finite_or_none(value: float) -> Optional[float]:
    value = float(value)
    return value if np.isfinite(value) else None


def figures(
    cand: np.ndarray, base: np.ndarray, rtol: float, atol: float, equal_nan: bool, *, with_cosine: bool = True
) -> dict[str, Any]:
    """Error figures of one comparison (display only; the verdict is :func:`isclose`).

    Differences are taken over elements finite on both sides, in float64:
    ``max_abs_diff``, ``max_rel_diff`` (``|c-b|/|b|``), ``cosine`` similarity,
    ``mismatch_fraction`` (share of elements failing :func:`isclose`) and
    ``error_ratio`` (max ``|c-b| / (atol + rtol*|b|)``). Non-finite results become None.
    """
    c = np.asarray(cand).ravel()
    b = np.asarray(base).ravel()
    result: dict[str, Any] = {
        "max_abs_diff": None,
        "max_rel_diff": None,
        "cosine": None,
        "mismatch_fraction": None,
        "error_ratio": None,
    }
    if c.size == 0 or c.shape != b.shape:
        return result
    result["mismatch_fraction"] = float(1.0 - isclose(c, b, rtol, atol, equal_nan).mean())
    c64 = c.astype(np.float64)
    b64 = b.astype(np.float64)
    both = np.isfinite(c64) & np.isfinite(b64)
    if not both.any():
        return result
    c64, b64 = c64[both], b64[both]
    diff = np.abs(c64 - b64)
    absb = np.abs(b64)
    with np.errstate(all="ignore"):
        rel = np.where(diff == 0, 0.0, diff / absb)
        ratio = np.where(diff == 0, 0.0, diff / (atol + rtol * absb))
        result["max_abs_diff"] = _finite_or_none(diff.max())
        result["max_rel_diff"] = _finite_or_none(rel.max())
        result["error_ratio"] = _finite_or_none(ratio.max())
        if with_cosine:
            nb, nc = np.sqrt(np.dot(b64, b64)), np.sqrt(np.dot(c64, c64))
            if nb > 0 and nc > 0:
                result["cosine"] = _finite_or_none(np.clip(np.dot(b64, c64) / (nb * nc), -1.0, 1.0))
            elif nb == 0 and nc == 0:
                result["cosine"] = 1.0
    return result


def rows_error_ratio(cand: np.ndarray, base: np.ndarray, rtol: np.ndarray, atol: float | np.ndarray) -> np.ndarray:
    """Per row: max over elements finite on both sides of ``|c-b| / (atol + rtol_row*|b|)``.

    float32 result for the heat map: 0 where equal, inf where a difference meets a zero
    tolerance, NaN for rows without a finite pair. ``rtol`` is one value per row, ``atol``
    one for all rows or one per row. Display only, so it is computed in float32 (float64 for
    float64 data).
    """
    n = cand.shape[0]
    out = np.full(n, np.nan, dtype=np.float32)
    if n == 0 or cand.ndim != 2 or cand.shape[1] == 0:
        return out
    size = cand.shape[1]
    work = np.float64 if np.float64 in (cand.dtype, base.dtype) else np.float32
    rows = max(1, BLOCK_ELEMENTS // size)
    diff_buf = np.empty((min(rows, n), size), dtype=work)
    den_buf = np.empty_like(diff_buf)
    with np.errstate(all="ignore"):
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            c, b = cand[r0:r1], base[r0:r1]
            diff = np.subtract(c, b, out=diff_buf[: r1 - r0], dtype=work)
            np.abs(diff, out=diff)
            r = rtol[r0:r1]
            per_row = np.ndim(atol) > 0  # one atol per row (optimizer slots)
            a = np.asarray(atol)[r0:r1, None].astype(work) if per_row else work(atol)
            zero = (np.asarray(atol)[r0:r1] == 0)[:, None] if per_row else atol == 0  # as given, not as cast
            no_atol = not per_row and atol == 0
            if not per_row and np.all(r == 0):
                ratio = diff if atol == 0 else np.divide(diff, a, out=diff)
            else:
                den = np.abs(b, out=den_buf[: r1 - r0], dtype=work)  # atol + rtol*|b|
                np.multiply(den, r[:, None].astype(work), out=den)
                np.add(den, a, out=den)
                if per_row:  # 0 where equal, inf past a zero tolerance
                    ratio = np.where(diff == 0, work(0), diff / den)
                else:
                    ratio = np.divide(diff, den, out=diff)
                if not np.all(r == 0):  # 0/0: equal zeros (and infinities) where atol is 0
                    ratio[np.isnan(ratio) & (np.abs(c) == np.abs(b)) & zero] = 0
            best = ratio.max(axis=1)
            bad = ~np.isfinite(best)
            if bad.any():  # NaN/Inf inputs: ignore pairs that are not both finite
                sub = ratio[bad]
                finite = np.isfinite(c[bad]) & np.isfinite(b[bad])
                sub[~finite] = np.nan
                best[bad] = np.fmax.reduce(sub, axis=1)
            if no_atol and np.all(r == 0):
                best = np.where(best > 0, np.inf, best)  # any difference at zero tolerance
            out[r0:r1] = best
    return out
