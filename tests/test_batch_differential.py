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

from tb_parity_plugin.engine import Comparison, TolerancePolicy, batch
from tb_parity_plugin.engine.comparison_cache import ComparisonCache
from tb_parity_plugin.logdir.reader import LogdirReader
from tb_parity_plugin.records.writer import BlockWriter

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
