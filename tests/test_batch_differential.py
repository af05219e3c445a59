"""A layout's pairs settled together (engine/batch.py) against the per-pair path, on real event
files read by ``LogdirReader`` (the series carry the reader's layout blocks, ``TensorSeries.block``),
and against what numpy says of the arrays written: refreshes and the statistics bounds."""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any, Iterator

import numpy as np
import pytest
from engine_helpers import write_run

from tb_parity_plugin.engine import Comparison, TolerancePolicy, batch, stat_bounds
from tb_parity_plugin.engine.comparison_cache import ComparisonCache
from tb_parity_plugin.engine.matrix import OK
from tb_parity_plugin.logdir.reader import LogdirReader
from tb_parity_plugin.records import health, metadata
from tb_parity_plugin.records.writer import BlockWriter, build_layout

# -- the two engines ------------------------------------------------------------------------


@contextlib.contextmanager
def per_pair() -> Iterator[None]:
    """The engine before batching: every pair settled on its own (groups are made in update())."""
    was = batch.ENABLED
    batch.ENABLED = False
    try:
        yield
    finally:
        batch.ENABLED = was


def unbatched(base: Any, cand: Any, policy: TolerancePolicy, mapping: tuple[str, ...] = ()) -> Comparison:
    with per_pair():
        cmp = Comparison(base, cand, policy, mapping)
    assert not cmp._groups
    return cmp


def assert_same(batched: Comparison, plain: Comparison) -> None:
    """Report, matrix cells, error ratios and first divergence of the two engines are equal."""
    assert batched.report().to_dict() == plain.report().to_dict()
    mb, mp = batched.matrix(), plain.matrix()
    assert mb.tensors == mp.tensors
    np.testing.assert_array_equal(mb.reason, mp.reason)
    np.testing.assert_array_equal(mb.error_ratio, mp.error_ratio)  # NaN where NaN
    assert mb.first_divergence == mp.first_divergence
    bb, bp = batched.matrix(max_steps=3), plain.matrix(max_steps=3)
    np.testing.assert_array_equal(bb.reason, bp.reason)
    np.testing.assert_array_equal(bb.error_ratio, bp.error_ratio)


# -- cases ---------------------------------------------------------------------------------


def _xy(names: tuple[str, ...], values: tuple[float, ...]) -> Any:
    return lambda s: [("weight", n, np.full(8, v + s, np.float32)) for n, v in zip(names, values)]


@pytest.mark.parametrize("rerun", ["columns swapped", "one more tensor"])
def test_a_run_written_anew_in_another_layout_is_compared_again(tmp_path, rerun: str) -> None:
    """The candidate is run again into a fresh directory (its old file is gone, the reader reads it
    anew) and logs its tensors in another layout. The refresh may keep an old verdict only if that
    tensor's own statistics are unchanged: comparing the layout blocks whole compared other tensors'
    columns (``x`` now sits where ``y`` was, and holds what ``y`` held: the blocks are byte-identical,
    so AGREE was kept for a candidate whose ``x`` now differs from the baseline's from step 0), or
    raised ValueError when the new layout is wider. Through the dashboard's cache too."""
    logdir = str(tmp_path)
    write_run(logdir, "b", range(6), _xy(("x", "y"), (1.0, 5.0)), limit=0)
    write_run(logdir, "c", range(6), _xy(("x", "y"), (1.0, 5.0)), limit=0)
    reader = LogdirReader(logdir)
    reader.reload()
    policy = TolerancePolicy()
    cache = ComparisonCache()
    b, c = reader.run("b"), reader.run("c")
    cmp = Comparison(b, c, policy)
    assert cmp.report().first_divergence is None
    assert cache.use("pair", b, c, policy, (), lambda e: e.report).first_divergence is None
    shutil.rmtree(os.path.join(logdir, "c"))
    if rerun == "columns swapped":  # x now holds what y held, and y what x held
        write_run(logdir, "c", range(6), _xy(("y", "x"), (1.0, 5.0)), limit=0)
    else:  # x holds the baseline's y; a third tensor joins the layout
        write_run(logdir, "c", range(6), _xy(("x", "y", "z"), (5.0, 5.0, 0.0)), limit=0)
    reader.reload()
    b2, c2 = reader.run("b"), reader.run("c")
    assert c2.tensors[("weight", "x")].block is not None
    cmp.update(b2, c2)
    first = cmp.report().first_step_divergence
    assert (first.step, first.tensor, first.reason) == (0, "x", "value")  # 1 + s vs 5 + s: numpy says so
    assert_same(cmp, unbatched(b2, c2, policy))
    report = cache.use("pair", b2, c2, policy, (), lambda e: e.report)
    assert cache.updated == 1 and report.first_step_divergence.tensor == "x"
    reader.close()


def test_a_refresh_follows_a_changed_execution_order(tmp_path) -> None:
    """From step 3 on the runs log ``b`` before ``a`` (a new layout), and both diverge at step 3:
    the first divergence is ``b``, first in execution order there, as a fresh comparison says.
    The refresh re-aligned only when the set of tensor names changed, so it kept the order of
    the steps it had seen and named ``a``."""
    logdir = str(tmp_path)

    def at(bad: bool) -> Any:
        def tensors(s: int) -> list:
            a, b = np.full(4, 1.0 + s, np.float32), np.full(4, 2.0 + s, np.float32)
            if bad and s >= 3:
                a, b = a + 10, b + 10
            out = [("weight", "a", a), ("weight", "b", b)]
            return out if s < 3 else out[::-1]

        return tensors

    writers = {name: BlockWriter(os.path.join(logdir, name)) for name in "bc"}
    for name, bad in (("b", False), ("c", True)):
        for s in range(3):
            writers[name].write_arrays(s, at(bad)(s), full_values_limit=0)
        writers[name].flush()
    reader = LogdirReader(logdir)
    reader.reload()
    policy = TolerancePolicy()
    cmp = Comparison(reader.run("b"), reader.run("c"), policy)
    assert cmp.report().first_divergence is None
    for name, bad in (("b", False), ("c", True)):
        for s in range(3, 6):
            writers[name].write_arrays(s, at(bad)(s), full_values_limit=0)
        writers[name].close()
    reader.reload()
    b2, c2 = reader.run("b"), reader.run("c")
    cmp.update(b2, c2)
    first = cmp.report().first_step_divergence
    assert (first.step, first.tensor) == (3, "b")
    assert_same(cmp, unbatched(b2, c2, policy))
    reader.close()


def _huge(step: int, i: int) -> np.ndarray:
    """float64 elements near 1e200: the sum of squares overflows, so std and L2 are recorded as inf."""
    rng = np.random.default_rng([step, i])
    return (1 + rng.random(7)) * rng.choice([-1.0, 1.0], 7) * 1e200


def test_an_overflowed_moment_neither_colours_nor_proves(tmp_path) -> None:
    """std and L2 recorded as inf in both runs (the sum of squares overflowed) are equal
    statistics: they prove nothing and colour nothing. inf - inf is NaN, which the bounds read as
    "on one side only" and so as a proven divergence: identical tensors got error ratio inf (the
    heat map's colour of a proven divergence, on an OK cell) from the per-pair path and 0 when
    their layout was settled together, and a candidate within rtol of the baseline got VALUE."""
    logdir = str(tmp_path)
    with np.errstate(over="ignore"):
        write_run(logdir, "b", range(4), lambda s: [("weight", f"w{i}", _huge(s, i)) for i in range(3)], limit=0)
        write_run(
            logdir,
            "c",
            range(4),
            lambda s: [("weight", f"w{i}", _huge(s, i) * (1 + 1e-9 * (i == 2))) for i in range(3)],
            limit=0,
        )
    policy = TolerancePolicy(warmup_steps=0)  # rtol 5% from the first step
    for s in range(4):  # numpy: every element of w2 is within tolerance, w0 and w1 are identical
        np.testing.assert_allclose(_huge(s, 2) * (1 + 1e-9), _huge(s, 2), rtol=policy.rtol, atol=policy.atol)
    reader = LogdirReader(logdir)
    reader.reload()
    b, c = reader.run("b"), reader.run("c")
    assert np.isinf(b.tensors[("weight", "w0")].stats[:, metadata.STAT_INDEX["l2"]]).all()
    with np.errstate(over="ignore", invalid="ignore"):
        batched = Comparison(b, c, policy)
        assert batched._groups  # w0 and w1: identical statistics, settled together
        assert_same(batched, unbatched(b, c, policy))
        m = batched.matrix()
    assert (m.reason == OK).all()
    assert (m.error_ratio[:, [m.tensors.index("weight/w0"), m.tensors.index("weight/w1")]] == 0).all()
    assert not (m.error_ratio > 1).any()
    assert batched.report().first_divergence is None
    reader.close()


def test_an_overflowed_moment_during_warmup_proves_nothing(tmp_path) -> None:
    """The same elements in both runs, summed in another order (the candidate's mean is off by
    an ulp, as two frameworks' reductions may be), std and L2 overflowed to inf, during warm-up
    (rtol 0): the bounds multiplied rtol 0 by an infinite RMS (NaN) and called the mean's ulp a
    proven divergence. Nothing is proven there: the mean's rounding is unbounded."""
    mean = metadata.STAT_INDEX["mean"]
    for seed in range(100):  # the first tensor whose reversed sum rounds differently
        a = _huge(seed, 0)
        if a[::-1].sum() / a.size != a.sum() / a.size:
            break
    with np.errstate(over="ignore"):
        base_stats = health.health_numpy(a)
    cand_stats = base_stats.copy()
    cand_stats[mean] = a[::-1].sum() / a.size
    assert cand_stats[mean] != base_stats[mean] and np.isinf(base_stats[metadata.STAT_INDEX["l2"]])
    layout = build_layout([("weight", "w", "float64", a.shape), ("weight", "v", "float64", (3,))], 0)
    for run, stats in (("b", base_stats), ("c", cand_stats)):
        writer = BlockWriter(str(tmp_path / run))
        for s in range(3):
            writer.write_step(s, layout, np.stack([stats, health.health_numpy(np.arange(3.0))]))
        writer.close()
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    b, c = reader.run("b"), reader.run("c")
    policy = TolerancePolicy()  # warm-up: rtol 0 for the first 10 compared steps
    with np.errstate(over="ignore", invalid="ignore"):
        batched = Comparison(b, c, policy)
        assert_same(batched, unbatched(b, c, policy))
        m = batched.matrix()
    assert (m.reason == OK).all()  # numpy: the elements are the very same
    assert not (m.error_ratio > 1).any()
    assert not stat_bounds.proven(base_stats[None], cand_stats[None], policy.atol, np.zeros(1)).any()
    reader.close()
