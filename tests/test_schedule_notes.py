"""A hyper-parameter that diverges says when it is the baseline's schedule shifted or scaled.

A new user's warm-up off by one step showed ``lr 0.001 against 0`` at step 0 with
``max_rel_diff=n/a`` and no note; the port's value at every step was TF1's at the next. Expected
values here are the schedules written out in numpy.
"""

from __future__ import annotations

import numpy as np
from engine_helpers import run, series

from tb_parity_plugin.engine import Comparison

STEPS = np.arange(30)


def _warmup_then_decay(steps: np.ndarray, peak: float = 5e-3, warmup: int = 5) -> np.ndarray:
    """BERT's schedule: linear warm-up from 0, then linear decay to 0 at step 30."""
    s = steps.astype(np.float64)
    return np.where(s < warmup, peak * s / warmup, peak * (1 - (s - warmup) / (30 - warmup))).clip(0)


def _first(base_lr: np.ndarray, cand_lr: np.ndarray):  # type: ignore[no-untyped-def]
    lrs = [[np.float32(v) for v in values] for values in (base_lr, cand_lr)]
    found = Comparison(run("tf1", [series("lr", "lr", lrs[0])]), run("tf2", [series("lr", "lr", lrs[1])])).report()
    assert found.first_divergence is not None and found.first_divergence.kind == "lr"
    return found.first_divergence


def test_a_schedule_one_step_ahead_or_two_behind_is_named() -> None:
    ahead = _first(_warmup_then_decay(STEPS), _warmup_then_decay(STEPS + 1))
    assert ahead.step == 0 and "is the baseline's 1 step(s) later (at step 0: the baseline's at step 1)" in ahead.note
    assert "runs 1 step(s) ahead" in ahead.note
    behind = _first(_warmup_then_decay(STEPS), _warmup_then_decay(STEPS - 2))
    assert behind.step == 1 and "the baseline's 2 step(s) earlier" in behind.note, behind.note


def test_a_scaled_schedule_is_named_and_another_schedule_is_not_called_either() -> None:
    scaled = _first(_warmup_then_decay(STEPS), 2 * _warmup_then_decay(STEPS))
    assert scaled.step == 1 and "the baseline's times 2 at every step" in (scaled.note or ""), scaled.note
    other = _first(_warmup_then_decay(STEPS), _warmup_then_decay(STEPS, warmup=8))
    assert other.step == 1 and other.note is None, other.note


def test_a_warmup_alone_one_step_ahead_is_named() -> None:
    """BERT's warm-up ported as ``(step + 1) / warmup`` before a decay that reads the step itself:
    the port's lr is TF1's one step later during the warm-up only, equal after it, and a helper's
    Transformer port got no note (the shift did not hold at every later step)."""
    s = STEPS.astype(np.float64)
    decay = 5e-3 * (1 - s / 30)
    base = np.where(s < 8, 5e-3 * s / 8, decay)
    cand = np.where(s < 8, 5e-3 * (s + 1) / 8, decay)
    # numpy: the port's is the baseline's one step later at steps 0-6, equal from step 8 on
    assert np.allclose(cand[:7], base[1:8]) and np.allclose(cand[8:], base[8:]) and cand[7] != base[7]
    found = _first(base, cand)
    assert found.step == 0 and "from step 0 to step 6 (7 steps both runs logged)" in (found.note or ""), found.note
    assert "the baseline's 1 step(s) later" in found.note and "from step 8 on the two agree" in found.note
    assert "warm-up counted from 1 against 0" in found.note
    # a warm-up of another length is no shift, and gets no such note
    other = _first(base, np.where(s < 6, 5e-3 * s / 6, decay))
    assert "one phase of its schedule" not in (other.note or ""), other.note


def test_one_boundary_of_a_piecewise_schedule_shifted_names_the_steps_apart() -> None:
    """``PiecewiseConstantDecay`` with boundaries [10, 20] ported as [9, 20] (a ``<`` for a ``<=``):
    numpy, the runs differ at step 9 alone, where the port's value is TF1's at step 10. The phase
    note said the shift held from step 9 to step 18 and the two agreed from step 19 on (the lr is
    flat there, so the shift held as well), and gave a warm-up as the cause."""
    s = STEPS.astype(np.float64)
    base = np.where(s < 10, 1e-2, np.where(s < 20, 1e-3, 1e-4))
    cand = np.where(s < 9, 1e-2, np.where(s < 20, 1e-3, 1e-4))
    assert np.flatnonzero(base != cand).tolist() == [9] and cand[9] == base[10]
    found = _first(base, cand)
    assert found.step == 9 and "from step 9 to step 9 (1 steps both runs logged)" in (found.note or ""), found.note
    assert "from step 10 on the two agree" in found.note and "a boundary" in found.note, found.note
    # [10, 20] ported as [12, 20]: apart at steps 10 and 11 alone, the baseline's 2 steps earlier
    late = _first(base, np.where(s < 12, 1e-2, np.where(s < 20, 1e-3, 1e-4)))
    assert late.step == 10 and "from step 10 to step 11 (2 steps" in (late.note or ""), late.note
    assert "2 step(s) earlier" in late.note and "from step 12 on the two agree" in late.note, late.note


def _plateau(cuts: list[int], lr: float = 0.1) -> np.ndarray:
    """A plateau rule's lr over 36 steps, written out: halved at each step of ``cuts`` (epochs of 3
    steps: a cut takes effect at an epoch's first step)."""
    return lr * 0.5 ** np.searchsorted(np.asarray(cuts), np.arange(36), side="right")


def test_a_plateau_cut_one_epoch_early_names_a_value_set_per_epoch() -> None:
    """A trial's ReduceLROnPlateau port with its patience one short of the TF1 rule's cut the lr one
    epoch (3 steps) early at each cut, and was told only of a step count read after its increment
    or a warm-up counted from 1. Every change of either run falls on an epoch's first step."""
    base, cand = _plateau([15, 27]), _plateau([12, 24])
    assert np.allclose(cand[:-3], base[3:])  # numpy: the port's lr is TF1's 3 steps later
    found = _first(base, cand)
    assert found.step == 12 and "the baseline's 3 step(s) later" in (found.note or ""), found.note
    assert "if an epoch is 3 steps" in found.note and "one epoch early" in found.note, found.note
    # one cut each is no evidence of epochs: a shifted run's changes always share the other's residue
    one = _first(_plateau([15]), _plateau([12]))
    assert one.step == 12 and "if an epoch is" not in (one.note or ""), one.note
    # a warm-up changing at every step two steps behind is no value set per epoch
    behind = _first(_warmup_then_decay(STEPS), _warmup_then_decay(STEPS - 2))
    assert "if an epoch is" not in (behind.note or ""), behind.note


def test_a_cut_one_run_made_after_agreeing_steps_is_no_other_initial_value() -> None:
    """A trial's plateau rule, its min_delta relative in TF1 and absolute in the port, cut the lr at
    step 27 in TF1 only, after 27 steps alike: the note named another initial or peak value, or the
    replicas."""
    base, cand = _plateau([27]), _plateau([])
    assert np.all(base[:27] == cand[:27]) and np.allclose(cand[27:], 2 * base[27:])  # numpy
    found = _first(base, cand)
    assert found.step == 27, found
    assert "'tf1' changed it at step 27 and 'tf2' did not" in (found.note or ""), found.note
    assert "initial or peak" not in found.note and "min_delta" in found.note
    # a schedule scaled from its first step is still told so
    scaled = _first(_warmup_then_decay(STEPS), 2 * _warmup_then_decay(STEPS))
    assert "initial or peak" in (scaled.note or ""), scaled.note
