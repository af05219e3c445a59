"""Our verdict must never disagree with numpy.testing.assert_allclose (hypothesis).

Covers the element-wise rule (allclose.isclose / rows_allclose) and the engine's
per-step verdict on full values, which also uses the FULL_HEALTH counts.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import run, series
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tb_parity_plugin.engine import Comparison, allclose
from tb_parity_plugin.engine.matrix import OK
from tb_parity_plugin.engine.tolerance import TolerancePolicy

DTYPES = [np.float16, np.float32, np.float64]
TOLS = st.one_of(
    st.sampled_from([0.0, 1e-8, 1e-5, 1e-3, 0.05, 0.5, 1.0]),
    st.floats(min_value=0.0, max_value=2.0, allow_nan=False, allow_infinity=False),
)
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0]


def numpy_passes(cand: np.ndarray, base: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> bool:
    try:
        np.testing.assert_allclose(cand, base, rtol=rtol, atol=atol, equal_nan=equal_nan)
    except AssertionError:
        return False
    return True


@st.composite
def array_pairs(draw: st.DrawFn) -> tuple:
    """(cand, base, rtol, atol, equal_nan): base random, cand near the tolerance boundary."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    rtol, atol, equal_nan = draw(TOLS), draw(TOLS), draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = 10.0 ** draw(st.integers(-6, 4))
    with np.errstate(all="ignore"):
        base = (rng.standard_normal(shape) * scale).astype(dtype)
        b64 = base.astype(np.float64)
        # steps of about one tolerance width: many elements land right at the boundary
        k = rng.choice([0.0, 0.5, 0.999, 1.0, 1.001, 2.0, -1.0], size=shape)
        cand = (b64 + k * (atol + rtol * np.abs(b64)) * draw(st.sampled_from([1.0, 1 - 1e-7, 1 + 1e-7]))).astype(dtype)
        if draw(st.booleans()):
            cand = base.copy()
    for arr in (base, cand):  # NaN/Inf/zero placements, sometimes at the same positions
        if arr.size and draw(st.booleans()):
            idx = rng.integers(0, arr.size, size=draw(st.integers(1, 3)))
            arr.reshape(-1)[idx] = draw(st.sampled_from(SPECIAL))
            if draw(st.booleans()):
                (cand if arr is base else base).reshape(-1)[idx] = arr.reshape(-1)[idx]
    return cand, base, rtol, atol, equal_nan


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(array_pairs())
def test_elementwise_rule_matches_numpy(case: tuple) -> None:
    cand, base, rtol, atol, equal_nan = case
    ours = allclose.isclose(cand, base, rtol, atol, equal_nan)
    np.testing.assert_array_equal(ours, np.isclose(cand, base, rtol=rtol, atol=atol, equal_nan=equal_nan))
    assert bool(np.all(ours)) == numpy_passes(cand, base, rtol, atol, equal_nan)
    if cand.ndim == 2:
        rows = allclose.rows_allclose(cand, base, rtol, atol, equal_nan)
        expected = [numpy_passes(c, b, rtol, atol, equal_nan) for c, b in zip(cand, base)]
        assert rows.tolist() == expected
        # one atol per row (optimizer slots): each row as numpy judges it with its own atol alone
        per_row = np.array([atol * (i % 3) for i in range(len(cand))], dtype=np.float64)
        rows = allclose.rows_allclose(cand, base, rtol, per_row, equal_nan)
        assert rows.tolist() == [numpy_passes(c, b, rtol, float(a), equal_nan) for c, b, a in zip(cand, base, per_row)]
        got = allclose.rows_error_ratio(cand, base, np.full(len(cand), rtol), np.full(len(cand), atol))
        want = allclose.rows_error_ratio(cand, base, np.full(len(cand), rtol), atol)
        # the same ratios, but where a float atol's path makes 0/0 of equal elements (an atol that
        # underflows the dtype, equal infinities at zero tolerance): NaN there, 0 per row
        degenerate = np.isnan(want) & (got == 0)
        np.testing.assert_array_equal(got[~degenerate], want[~degenerate])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(array_pairs(), min_size=1, max_size=12), st.integers(0, 4))
def test_engine_step_verdicts_match_numpy(cases: list, warmup: int) -> None:
    """Per step, the engine's verdict (counts + values) equals assert_allclose's."""
    dtype, shape = cases[0][0].dtype, cases[0][0].shape
    cases = [c for c in cases if c[0].dtype == dtype and c[0].shape == shape]
    _, _, rtol, atol, equal_nan = cases[0]
    bases = [c[1] for c in cases]
    cands = [c[0] for c in cases]
    policy = TolerancePolicy(atol=atol, rtol=rtol, warmup_steps=warmup, equal_nan=equal_nan)
    comparison = Comparison(run("b", [series("weight", "w", bases)]), run("c", [series("weight", "w", cands)]), policy)
    reasons = comparison.matrix().reason[:, 0]
    for k, (c, b) in enumerate(zip(cands, bases)):
        expected = numpy_passes(c, b, 1e-7 if k < warmup else rtol, atol, equal_nan)  # warm-up: numpy's default rtol
        assert (reasons[k] == OK) == expected, (k, c, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_allclose_on_strided_views(dtype: type) -> None:
    """The reader hands column slices of a values block; the fast path must cope."""
    rng = np.random.default_rng(1)
    block = rng.standard_normal((300, 50)).astype(dtype)
    other = block.copy()
    other[7, 12] += 1
    other[200, 30] = np.nan
    view_b, view_c = block[:, 10:40], other[:, 10:40]
    rows = allclose.rows_allclose(view_c, view_b, 0.05, 1e-5, False)
    expected = [numpy_passes(c, b, 0.05, 1e-5, False) for c, b in zip(view_c, view_b)]
    assert rows.tolist() == expected
    assert not rows[7] and not rows[200] and rows.sum() == 298
