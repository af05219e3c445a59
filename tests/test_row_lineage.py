"""Rows the reader copied when a column outgrew its memory are known unchanged (rundata.same_rows).

A refresh must not read back every old row when the reader merely moved them (the refresh would
cost what recomputing does), and must never take rows for unchanged that the reader did not copy.
"""

from __future__ import annotations

import gc

import numpy as np
from engine_helpers import write_run

from tb_parity_plugin.engine import Comparison, refresh
from tb_parity_plugin.logdir import run_state
from tb_parity_plugin.logdir.reader import LogdirReader
from tb_parity_plugin.logdir.rundata import same_rows


def _column(rows: int, width: int = 3) -> np.ndarray:
    """An array that owns its memory, as the reader's columns do."""
    column = np.empty((rows, width, 2))
    column[...] = np.arange(column.size).reshape(column.shape)
    return column


def test_rows_copied_by_a_growth_are_the_same_rows() -> None:
    old = _column(8)
    grown = run_state._grown(old, 6, 20)  # the reader's growth: the 6 rows in use copied
    assert same_rows(old[:6], grown[:9])
    assert same_rows(old[:6, 1], grown[:9, 1])  # one tensor's column of a layout block
    assert same_rows(old[:4, 2, None], grown[:4, 2, None])


def test_rows_not_copied_or_elsewhere_are_not_taken_for_the_same() -> None:
    old = _column(8)
    grown = run_state._grown(old, 6, 20)
    assert not same_rows(old[:7], grown[:9])  # row 6 was not copied
    assert not same_rows(old[2:5], grown[2:5])  # a view that does not start at the first row
    assert not same_rows(old[:6, 1], grown[:9, 2])  # another tensor's column
    assert not same_rows(old[:6], grown[:5])  # fewer rows now
    equal = old.copy()  # equal values, but nobody says they are these rows
    assert not same_rows(old[:6], equal[:6])
    assert not same_rows(old[:6], grown[:6].copy())


def test_a_chain_of_growths_holds_only_while_every_copy_holds_the_rows() -> None:
    first = _column(4)
    second = run_state._grown(first, 4, 8)
    third = run_state._grown(second, 8, 16)
    assert same_rows(first[:4], third[:10])
    short = run_state._grown(run_state._grown(first, 4, 8), 2, 16)  # the second copy kept 2 rows
    assert not same_rows(first[:4], short[:10])
    gone = run_state._grown(run_state._grown(first, 4, 8), 8, 16)  # the middle array is freed
    gc.collect()
    assert not same_rows(first[:4], gone[:10])  # the chain cannot be followed: read the rows


def test_a_refresh_after_the_reader_moved_a_column_reads_no_old_row(tmp_path, monkeypatch) -> None:
    """Runs growing from 10 to 200 steps move their columns several times: every refresh finds the
    old rows unchanged without comparing them, and still gives what a fresh comparison gives
    (the divergence planted at step 150, the NaN at step 170)."""
    logdir = str(tmp_path)

    def tensors(step: int, bad: bool = False) -> list:
        rng = np.random.default_rng(step)
        out = []
        for i in range(4):
            a = rng.standard_normal(16).astype(np.float32)
            if bad and i == 3 and step >= 150:
                a *= np.float32(1.5)
            if i == 1 and step == 170:
                a[0] = np.nan
            out.append(("weight", f"t{i}", a))
        return out

    write_run(logdir, "b", range(10), tensors, limit=0)
    write_run(logdir, "c", range(10), lambda s: tensors(s, bad=True), limit=0)
    reader = LogdirReader(logdir)
    reader.reload()
    cmp = Comparison(reader.run("b"), reader.run("c"))
    cmp.report(), cmp.matrix()
    compared = []
    real = refresh._equal_rows
    monkeypatch.setattr(refresh, "_equal_rows", lambda *a: compared.append(1) or real(*a))
    moved = 0
    for lo in range(10, 200, 10):
        before = reader.run("c").tensors[("weight", "t0")].block
        write_run(logdir, "b", range(lo, lo + 10), tensors, limit=0)
        write_run(logdir, "c", range(lo, lo + 10), lambda s: tensors(s, bad=True), limit=0)
        reader.reload()
        b, c = reader.run("b"), reader.run("c")
        moved += (
            before.__array_interface__["data"][0] != c.tensors[("weight", "t0")].block.__array_interface__["data"][0]
        )
        cmp.update(b, c)
        fresh = Comparison(b, c)
        assert cmp.report().to_dict() == fresh.report().to_dict()
        np.testing.assert_array_equal(cmp.matrix().reason, fresh.matrix().reason)
    assert moved >= 2 and not compared  # columns moved, and no old row was read back
    report = cmp.report()
    assert (report.first_divergence.step, report.first_divergence.tensor) == (150, "t3")
    assert report.first_nonfinite["b"] == {"step": 170, "tensor": "t1", "kind": "weight"}
    reader.close()
