"""When do two tensors' statistics *prove* that some element breaks the tolerance?

Tensors larger than ``full_values_limit`` are recorded as statistics only. A difference in
a statistic is a divergence only when no pair of tensors whose elements all satisfy the
element-wise policy ``|c_i - b_i| <= atol + rtol*|b_i|`` could show it, after allowing for
the rounding of the recorded statistics themselves. Otherwise the pair "agrees within
statistics", which is weaker evidence than an element-wise agreement and is reported as such.

Derivation (n finite elements, equal NaN/Inf counts, ``d = c - b``, ``a_i = atol + rtol|b_i|``,
``M = max|b|``, ``R = ||b|| / sqrt(n)`` the RMS; see docs/engine.md):

* max, min: ``max c <= max b + atol + rtol*M`` and symmetrically, so the extremes move by
  at most ``atol + rtol*M``.
* mean: ``|mean c - mean b| = |sum d| / n <= sum a / n = atol + rtol*mean|b| <= atol + rtol*R``.
* std (population): ``|std c - std b| <= ||d - mean d|| / sqrt(n) <= ||d|| / sqrt(n)
  <= ||a|| / sqrt(n) <= atol + rtol*R`` (triangle inequality twice).
* L2 norm: ``| ||c|| - ||b|| | <= ||d|| <= ||a|| <= atol*sqrt(n) + rtol*||b||``.

Rounding of the recorded statistics (``records/metadata.py``: tensors up to
``STATS_F64_LIMIT`` elements, and float64 tensors, accumulate in float64; larger ones may
accumulate in float32, in any order): a sum of n terms in unit roundoff u is off by at most
``gamma_n * sum|x|`` with ``gamma_n = n*u / (1 - n*u)``, and ``sum|x| <= sqrt(n)*||x||``.
So the mean is off by at most ``gamma*R``, the L2 norm by ``gamma*||x||`` (a square root
halves the relative error; we keep the whole), and the variance, ``E[x^2] - mean^2`` or two
passes, by ``3*gamma*R^2``, hence the std by ``min(sqrt(e), e / std)``. Min and max are exact.
"""

from __future__ import annotations

import numpy as np

from tb_parity_plugin.records import dtypes, metadata

_IDX = metadata.STAT_INDEX
#: The statistics compared, in this order (columns of the arrays below).
COMPARED = ("min", "max", "mean", "std", "l2")
_COLS = metadata.field_span(COMPARED)
_U32, _U64 = 2.0**-24, 2.0**-53
_F64 = dtypes.TF_DTYPE_ENUM["float64"]


def _per_row(x: float | np.ndarray, rows: int) -> np.ndarray:
    """A tolerance given once or per row, as one float64 per row (a layout's pairs are bounded
    together as one array of rows, each with its own tensor's tolerance: engine/batch.py)."""
    return np.broadcast_to(np.asarray(x, dtype=np.float64), (rows,))


def _gamma(n: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``n*u / (1 - n*u)``, infinite once ``n*u >= 1/2`` (no useful bound left)."""
    nu = n * u
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(nu < 0.5, nu / (1.0 - nu), np.inf)


def rounding(stats: np.ndarray) -> np.ndarray:
    """Bound on the rounding error of each compared statistic, ``[rows, 5]``, for recorded rows."""
    n = _finite_count(stats)
    float64 = (stats[:, _IDX["dtype"]] == _F64) | (stats[:, _IDX["size"]] <= metadata.STATS_F64_LIMIT)
    g = _gamma(n, np.where(float64, _U64, _U32))
    l2 = np.abs(stats[:, _IDX["l2"]])
    with np.errstate(divide="ignore", invalid="ignore"):
        rms = np.where(n > 0, l2 / np.sqrt(np.maximum(n, 1.0)), 0.0)
        e_var = 3.0 * g * rms * rms
        std = np.abs(stats[:, _IDX["std"]])
        e_std = np.where(std > 0, np.minimum(np.sqrt(e_var), e_var / std), np.sqrt(e_var))
    zero = np.zeros_like(g)
    return np.stack([zero, zero, g * rms, e_std, g * l2], axis=1)


def _finite_count(stats: np.ndarray) -> np.ndarray:
    counts = stats[:, [_IDX["neg_finite"], _IDX["zero"], _IDX["pos_finite"]]].sum(axis=1)
    return np.asarray(counts, dtype=np.float64)


def _scaled(rtol: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``rtol * x``, 0 where rtol is 0: an overflowed statistic (inf) times no rtol allows
    nothing more, not NaN (which :func:`ratios` would read as a proven divergence)."""
    with np.errstate(invalid="ignore"):
        out: np.ndarray = np.where(rtol == 0, 0.0, rtol * x)
    return out


def _diff(base: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """``|cand - base|``, 0 where they are equal: a statistic that overflowed to inf on both
    sides is equal, not NaN apart."""
    with np.errstate(invalid="ignore"):
        out: np.ndarray = np.where(cand == base, 0.0, np.abs(cand - base))
    return out


def allowed(base: np.ndarray, cand: np.ndarray, atol: float | np.ndarray, rtol: np.ndarray) -> np.ndarray:
    """How far each statistic may move between two tensors within the policy, rounding included.

    ``base``/``cand``: stats rows ``[rows, N_STATS]`` with equal NaN/Inf counts; ``rtol``
    per row, ``atol`` once or per row. Returns ``[rows, 5]`` (columns :data:`COMPARED`).
    """
    rtol = np.asarray(rtol, dtype=np.float64).reshape(-1, 1)[:, 0]
    atol = _per_row(atol, len(base))
    err_b, err_c = rounding(base), rounding(cand)
    n = _finite_count(base)
    root_n = np.sqrt(np.maximum(n, 1.0))
    # The policy's bounds use the baseline's true statistics; the recorded ones may be low by their rounding.
    m = np.maximum(np.abs(base[:, _IDX["min"]]), np.abs(base[:, _IDX["max"]]))
    l2 = np.abs(base[:, _IDX["l2"]]) + err_b[:, 4]
    rms = l2 / root_n
    extreme = atol + _scaled(rtol, m)
    spread = atol + _scaled(rtol, rms)
    policy = np.stack([extreme, extreme, spread, spread, atol * root_n + _scaled(rtol, l2)], axis=1)
    out: np.ndarray = policy + err_b + err_c
    return out


def ratios(base: np.ndarray, cand: np.ndarray, atol: float | np.ndarray, rtol: np.ndarray) -> np.ndarray:
    """``|stat_c - stat_b| / allowed`` per statistic, ``[rows, 5]``; above 1 proves a divergence.

    0 where the statistics are equal (also NaN == NaN: no finite element on either side).
    """
    diff = _diff(base[:, _COLS], cand[:, _COLS])
    both_nan = np.isnan(cand[:, _COLS]) & np.isnan(base[:, _COLS])
    out = np.zeros(diff.shape)
    todo = np.flatnonzero(((diff != 0) & ~both_nan).any(axis=1))  # rows equal throughout stay 0, unbounded
    if len(todo):
        rt = np.broadcast_to(np.asarray(rtol, dtype=np.float64), (len(base),))[todo]
        d = diff[todo]
        with np.errstate(divide="ignore", invalid="ignore"):
            sub: np.ndarray = d / allowed(base[todo], cand[todo], _per_row(atol, len(base))[todo], rt)
        sub[(d == 0) | both_nan[todo]] = 0.0
        sub[np.isnan(sub)] = np.inf  # a statistic present on one side only (counts differ: caught earlier)
        out[todo] = sub
    return out


def proven(base: np.ndarray, cand: np.ndarray, atol: float | np.ndarray, rtol: np.ndarray) -> np.ndarray:
    """bool per row: the statistics prove a divergence (``ratios(...) > 1`` for some statistic).

    Most rows settle without the bounds: equal statistics prove nothing, and neither does a
    difference within the smallest allowance any row can have (``atol``, or ``atol*sqrt(n)`` for
    the L2 norm, rounding aside); only the rest pay for :func:`allowed`.
    """
    b, c = base[:, _COLS], cand[:, _COLS]
    if np.array_equal(b, c):  # the common case, NaN aside (NaN == NaN is settled below)
        return np.zeros(len(base), dtype=bool)
    diff = _diff(b, c)
    atol = _per_row(atol, len(base))
    with np.errstate(invalid="ignore"):
        floor = np.repeat(atol[:, None], diff.shape[1], axis=1)
        floor[:, 4] = atol * np.sqrt(np.maximum(_finite_count(base), 1.0))
        settled = ((diff <= floor) | (np.isnan(b) & np.isnan(c))).all(axis=1)
    out = np.zeros(len(base), dtype=bool)
    todo = np.flatnonzero(~settled)
    if len(todo):
        rt = np.broadcast_to(np.asarray(rtol, dtype=np.float64), (len(base),))[todo]
        out[todo] = (ratios(base[todo], cand[todo], atol[todo], rt) > 1).any(axis=1)
    return out
