"""Issue 9 section 2: statistics never cry wolf, and still see what they can.

Randomised pairs (sizes up to 1M, float32 and float64, values near zero and large), their
statistics computed by the shim's own TensorFlow path (``health_tf.stats_block``, float32
accumulation for large float32 tensors), compared by the engine with and without full values.
The expectation comes from ``numpy.testing.assert_allclose`` under the same policy, never from
the tool itself:

* a pair that passes assert_allclose must never diverge by statistics, even when every element
  sits at the very edge of its tolerance, all pushed the same way (the worst case for mean and
  L2);
* a pair with one element planted far out must diverge on full values, and by statistics
  whenever the planted error exceeds what the derived bound allows.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import pytest
import tensorflow as tf

from tb_parity_plugin.engine import compare_runs
from tb_parity_plugin.engine.stat_bounds import COMPARED, allowed
from tb_parity_plugin.engine.tolerance import TolerancePolicy
from tb_parity_plugin.logdir.rundata import RunData, TensorSeries
from tb_parity_plugin.records.metadata import STAT_INDEX
from tb_parity_plugin.shim import health_tf

ATOL, RTOL = 1e-5, 0.05
POLICY = TolerancePolicy(atol=ATOL, rtol=RTOL, warmup_steps=1)  # step 0: rtol 0; step 1: rtol 5%
SIZES = [1, 7, 4096, 70_000, 710_000, 1_000_000]
COLS = [STAT_INDEX[f] for f in COMPARED]
SCALES = {"near_zero": 1e-6, "unit": 1.0, "large": 1e4}


def _stats(array: np.ndarray) -> np.ndarray:
    return health_tf.stats_block([tf.constant(array)]).numpy()


def _runs(base_steps: list[np.ndarray], cand_steps: list[np.ndarray], keep_values: bool) -> tuple[RunData, RunData]:
    # a weight: held to atol alone (a layer's output adds a share of its peak, tolerance.py's
    # OUTPUT_ATOL_OF_MAX, which this file's numpy bounds leave out)
    def one(name: str, arrays: list[np.ndarray]) -> RunData:
        steps = np.arange(len(arrays), dtype=np.int64)
        stats = np.concatenate([_stats(a) for a in arrays])
        values = np.stack(arrays) if keep_values else None
        a0 = arrays[0]
        series = TensorSeries("weight", "t", 0, a0.dtype.name, a0.shape, steps, stats, values)
        return RunData(name, {("weight", "t"): series}, {}, {}, steps, [], 1)

    return one("b", base_steps), one("c", cand_steps)


def _edge_pair(rng: np.random.Generator, size: int, dtype: type, scale: float, rtol: float) -> tuple:
    """b random; c = b pushed to the edge of its tolerance, every element the same way."""
    b = (rng.standard_normal(size) * scale).astype(dtype)
    room = (ATOL + rtol * np.abs(b.astype(np.float64))) * 0.99
    c = (b.astype(np.float64) + room).astype(dtype)
    # rounding to dtype may overshoot by an ulp: pull such elements back inside
    over = np.abs(c.astype(np.float64) - b) > ATOL + rtol * np.abs(b.astype(np.float64))
    c[over] = b[over]
    np.testing.assert_allclose(c, b, rtol=rtol, atol=ATOL)  # the independent reference
    return b, c


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", list(SCALES))
def test_pairs_within_tolerance_never_diverge_by_statistics(dtype: type, scale: str) -> None:
    rng = np.random.default_rng(hash((dtype.__name__, scale)) % 2**32)
    for size in SIZES:
        pairs = [_edge_pair(rng, size, dtype, SCALES[scale], rtol) for rtol in (0.0, RTOL)]  # step 0, step 1
        base, cand = _runs([p[0] for p in pairs], [p[1] for p in pairs], keep_values=False)
        report = compare_runs(base, cand, POLICY)
        assert report.agree, (size, report.first_divergence)
        assert report.to_dict()["evidence"]["statistics"] == 1  # agreement "within statistics"
        with_values = compare_runs(*_runs([p[0] for p in pairs], [p[1] for p in pairs], True), POLICY)
        assert with_values.agree and with_values.to_dict()["evidence"]["values"] == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_element_planted_far_out_is_found(dtype: type) -> None:
    rng = np.random.default_rng(7)
    for size in SIZES:
        b = rng.standard_normal(size).astype(dtype)
        for planted in (1e-3, 1.0, 1e3):
            c = b.copy()
            i = int(rng.integers(size))
            c[i] = c[i] + dtype(planted)
            with pytest.raises(AssertionError):
                np.testing.assert_allclose(c, b, rtol=0.0, atol=ATOL)
            steps_b, steps_c = [b], [c]
            full = compare_runs(*_runs(steps_b, steps_c, True), POLICY)
            assert full.first_divergence is not None and full.first_divergence.evidence == "values"
            stats_only = compare_runs(*_runs(steps_b, steps_c, False), POLICY)
            # Min and max are recorded exactly, so a planted element outside b's range by more than atol
            # must be seen (numpy decides, not the tool); elsewhere the verdict follows the documented bound.
            outside = c.max() > b.max() + ATOL * 1.000001 or c.min() < b.min() - ATOL * 1.000001
            if outside:
                assert stats_only.first_divergence is not None and stats_only.first_divergence.evidence == "statistics"
            sb, sc = _stats(b), _stats(c)
            bound_sees_it = bool((np.abs(sc[:, COLS] - sb[:, COLS]) > allowed(sb, sc, ATOL, np.zeros(1))).any())
            assert (stats_only.first_divergence is not None) == bound_sees_it, (size, planted)
        assert planted == 1e3 and outside  # the largest planted error always leaves b's range


def test_proven_is_ratios_above_one_with_a_tolerance_per_row() -> None:
    """What engine/batch.py rests on when it bounds a layout's differing pairs as one array: the
    divergence ``proven`` decides (with its shortcuts) is exactly some ratio above 1, and a
    tolerance given per row bounds each row as that tolerance given alone would. Rows: pairs at
    the edge of the tolerance, pairs with one element planted out, equal pairs and NaN pairs."""
    from tb_parity_plugin.engine.stat_bounds import proven, ratios

    rng = np.random.default_rng(11)
    base, cand, atols, rtols = [], [], [], []
    for size in (1, 7, 4096, 70_000):
        for rtol in (0.0, RTOL):
            b, c = _edge_pair(rng, size, np.float32, 1.0, rtol)
            planted = c.copy()
            planted[int(rng.integers(size))] += np.float32(0.5)
            nan = b.copy()
            nan[0] = np.nan
            for x, y in ((b, c), (b, planted), (b, b), (nan, nan)):
                base.append(_stats(x)[0])
                cand.append(_stats(y)[0])
                atols.append(ATOL if len(atols) % 3 else 1e-3)
                rtols.append(rtol)
    sb, sc, at, rt = np.array(base), np.array(cand), np.array(atols), np.array(rtols)
    found = proven(sb, sc, at, rt)
    np.testing.assert_array_equal(found, (ratios(sb, sc, at, rt) > 1).any(axis=1))
    alone = [proven(sb[i : i + 1], sc[i : i + 1], float(at[i]), rt[i : i + 1])[0] for i in range(len(sb))]
    np.testing.assert_array_equal(found, alone)
    assert found.any() and not found.all()  # planted rows proven, edge and equal rows not
