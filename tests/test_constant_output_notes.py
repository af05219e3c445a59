"""Constant outputs are no evidence for the notes that match one output's values against another's.

The review of the day's notes: an output of one value throughout in one run (a dead or saturated
unit) was told its "inputs or branches were fed crosswise" because another output of its size holds
that value in the other run; and an output near 0 throughout in one run against one far below 0 in
the other was told a sigmoid is on in one run only (the sigmoid of -12 is within the tolerance of 0),
where a ReLU on one side makes the same. Written with the pure-numpy writer: the values are the test's own."""

from __future__ import annotations

import os

import numpy as np

from tb_parity_plugin import compare
from tb_parity_plugin.records.writer import BlockWriter

RNG = np.random.default_rng(26)
A = RNG.standard_normal((4, 3)).astype(np.float32)
W = RNG.standard_normal((3, 3)).astype(np.float32)  # a weight both runs hold alike: the notes' premise


def _write(root: str, outputs: dict[str, list[tuple[str, np.ndarray]]]) -> None:
    for side, tensors in outputs.items():
        writer = BlockWriter(os.path.join(root, side), side=side, mode="graph" if side == "tf1" else "function")
        for step in range(2):
            writer.write_arrays(step, [("weight", "dense/kernel", W)] + [("activation", n, v) for n, v in tensors])
        writer.close()


def test_a_constant_output_is_not_told_it_holds_another_constant_output(tmp_path) -> None:
    flat = np.full((4, 3), 0.5, np.float32)  # a saturated unit's output, one value throughout
    _write(str(tmp_path), {"tf1": [("a", A), ("b", flat)], "tf2": [("a", flat), ("b", flat)]})
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.tensor) == (0, "a"), first
    assert np.abs(A - 0.5).max() > 0.1  # numpy: the runs' a differ past any tolerance; b agrees, all 0.5
    assert "crosswise" not in (first.note or ""), first.note


def test_near_zeros_against_values_far_below_0_are_not_told_a_sigmoid(tmp_path) -> None:
    low = (-12.0 - np.abs(A)).astype(np.float32)
    assert (1 / (1 + np.exp(-low.astype(np.float64)))).max() < 1e-5  # numpy: its sigmoid is 0 to 1e-5
    _write(str(tmp_path), {"tf1": [("h", low)], "tf2": [("h", np.full((4, 3), 1e-6, np.float32))]})
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.tensor) == (0, "h"), first
    assert "sigmoid" not in (first.note or ""), first.note
