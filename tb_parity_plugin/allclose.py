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

from typing import Optional

import numpy as np

#: Elements per block: temporaries stay in L2 cache.
BLOCK_ELEMENTS = 1 << 15


def _fast_ok(x: np.ndarray, y: np.ndarray, rtol: float, atol: float) -> bool:
    """True if the replayed formula is valid: same float dtype, sane tolerances."""
    return (
        x.dtype == y.dtype
        and x.dtype.kind == "f"
        and 0.0 <= atol < np.inf
        and 0.0 <= rtol < np.inf
    )


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


def rows_allclose(cand: np.ndarray, base: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> np.ndarray:
    """Per row of 2-D ``cand``/``base``: would ``assert_allclose(cand[i], base[i], ...)`` pass?

    Fast path first: a row whose elements all compare ``==`` passes (``==`` is False for
    NaN, so NaN rows always take the full rule); only the other rows get :func:`isclose`.
    Works on strided row views (the reader's values are column slices of a block).
    """
    n, size = cand.shape
    out = np.ones(n, dtype=bool)
    if size == 0 or n == 0:
        return out
    rows = max(1, BLOCK_ELEMENTS // size)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        c, b = cand[r0:r1], base[r0:r1]
        equal = np.equal(c, b).all(axis=1)
        if equal.all():
            continue
        todo = np.flatnonzero(~equal)
        out[r0 + todo] = isclose(c[todo], b[todo], rtol, atol, equal_nan).all(axis=1)
    return out


def _finite_or_none(value: float) -> Optional[float]:
    value = float(value)
    return value if np.isfinite(value) else None


def figures(
    cand: np.ndarray, base: np.ndarray, rtol: float, atol: float, equal_nan: bool, *, with_cosine: bool = True
) -> dict:
    """Error figures of one comparison (display only; the verdict is :func:`isclose`).

    Differences are taken over elements finite on both sides, in float64:
    ``max_abs_diff``, ``max_rel_diff`` (``|c-b|/|b|``), ``cosine`` similarity,
    ``mismatch_fraction`` (share of elements failing :func:`isclose`) and
    ``error_ratio`` (max ``|c-b| / (atol + rtol*|b|)``). Non-finite results become None.
    """
    c = np.asarray(cand).ravel()
    b = np.asarray(base).ravel()
    result: dict = {
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


def rows_error_ratio(cand: np.ndarray, base: np.ndarray, rtol: np.ndarray, atol: float) -> np.ndarray:
    """Per row: max over elements finite on both sides of ``|c-b| / (atol + rtol_row*|b|)``.

    float32 result for the heat map: 0 where equal, inf where a difference meets a zero
    tolerance, NaN for rows without a finite pair. ``rtol`` is one value per row.
    """
    n = cand.shape[0]
    out = np.full(n, np.nan, dtype=np.float32)
    if n == 0 or cand.ndim != 2 or cand.shape[1] == 0:
        return out
    rows = max(1, BLOCK_ELEMENTS // cand.shape[1])
    work = np.result_type(cand.dtype, base.dtype, np.float32)
    with np.errstate(all="ignore"):
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            c = cand[r0:r1].astype(work, copy=False)
            b = base[r0:r1].astype(work, copy=False)
            diff = np.abs(c - b)
            den = np.abs(b)
            den *= rtol[r0:r1, None].astype(work)
            den += atol
            ratio = diff / den
            ratio[diff == 0] = 0  # equal (0/0 when tolerance is 0)
            ratio[~np.isfinite(diff)] = np.nan  # not a finite pair: ignored by fmax
            out[r0:r1] = np.fmax.reduce(ratio, axis=1)
    return out
