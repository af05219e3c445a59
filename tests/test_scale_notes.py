"""Notes for a tensor that is the baseline's times one factor: a gradient (a new user's gradient
accumulation not divided by its 4 micro-batches: max_rel_diff=3, cosine 1, and no word of "times
4"), and a weight's update after its gradients agreed (a new user's port restored Adam's slots but
not its step count: every update 1.9531 times TF1's, the ratio of the two bias corrections, and the
note listed epsilon). Each expectation is built with numpy here."""

from __future__ import annotations

import numpy as np
from engine_helpers import run, series

from tb_parity_plugin.engine import Comparison

RNG = np.random.default_rng(4)
G = RNG.standard_normal((6, 5)).astype(np.float32)


def _first(base: list, cand: list):
    return Comparison(run("tf1", base), run("tf2", cand)).report().first_divergence


def test_a_gradient_scaled_by_one_factor_says_so_and_one_scaled_otherwise_does_not() -> None:
    first = _first([series("grad", "dense/kernel:0", [G])], [series("grad", "dense/kernel:0", [G * np.float32(4)])])
    assert first.kind == "grad" and "every element is the baseline's times 4 (the same direction" in first.note
    bent = G * np.float32(4)
    bent[2, 3] *= np.float32(1.01)  # one element off the factor by 1%: not one scale
    first = _first([series("grad", "dense/kernel:0", [G])], [series("grad", "dense/kernel:0", [bent])])
    assert first.kind == "grad" and "times" not in (first.note or "")
    # one element the baseline has at 0 and the candidate does not: not one scale either
    zeroed, moved = G.copy(), G * np.float32(4)
    zeroed[0, 0] = 0.0
    first = _first([series("grad", "dense/kernel:0", [zeroed])], [series("grad", "dense/kernel:0", [moved])])
    assert "times" not in (first.note or "")


def test_a_small_element_off_the_factor_by_rounding_keeps_the_note() -> None:
    """A helper's TF1 recorded gradients after clipping, its port before: every gradient is the
    baseline's times 1.035, and the one the verdict named (an embedding's, repeated ids' rows summed
    in float32) lost the note: one element of 1.31e-5 was 1.02e-4 of itself off the factor, 1.3e-9
    in all, a float32 rounding of the 0.01 its largest element is (4 ulps there: 3.7e-9)."""
    base = (G * np.float32(0.01 / np.abs(G).max())).astype(np.float32)
    base[1, 1] = np.float32(1.31e-5)
    cand = (base * np.float32(1.035)).astype(np.float32)
    cand[1, 1] = np.float32(1.31e-5 * 1.035 * (1 + 1.02e-4))
    assert abs(float(cand[1, 1]) / (1.035 * float(base[1, 1])) - 1) > 1e-4  # past the 1e-4 rule alone
    first = _first([series("grad", "emb:0", [base])], [series("grad", "emb:0", [cand])])
    assert first.kind == "grad" and "every element is the baseline's times 1.035" in first.note, first.note
    # off by 1e-7, 30x that rounding: no longer one factor
    cand[1, 1] = np.float32(1.31e-5 * 1.035 + 1e-7)
    first = _first([series("grad", "emb:0", [base])], [series("grad", "emb:0", [cand])])
    assert "times" not in (first.note or ""), first.note


def _adam_like(scale: float, bend: float = 0.0) -> tuple[list, list]:
    """Weights at steps 0 and 1 from one update of equal gradients, the candidate's update
    ``scale`` times the baseline's (``bend``: plus a relative difference on one half)."""
    w0 = RNG.uniform(-0.2, 0.2, (8, 8)).astype(np.float32)
    update = (RNG.uniform(0.5, 1.0, (8, 8)) * 1e-3).astype(np.float32) * np.sign(G[0, 0])
    bent = update.copy()
    bent[:4] *= np.float32(1 + bend)
    w_b = [w0, (w0 - update).astype(np.float32)]
    w_c = [w0, (w0 - np.float32(scale) * bent).astype(np.float32)]
    grads = [RNG.standard_normal((8, 8)).astype(np.float32) for _ in range(2)]
    base = [series("weight", "dense/kernel:0", w_b), series("grad", "dense/kernel:0", grads, order=2)]
    cand = [series("weight", "dense/kernel:0", w_c), series("grad", "dense/kernel:0", grads, order=2)]
    return base, cand


def test_an_update_scaled_by_one_factor_names_the_bias_correction() -> None:
    # numpy: Adam's bias correction at step 1 against step 21 (betas 0.9, 0.999)
    ratio = (np.sqrt(1 - 0.999**1) / (1 - 0.9**1)) / (np.sqrt(1 - 0.999**21) / (1 - 0.9**21))
    assert abs(ratio - 1.9531) < 1e-4
    first = _first(*_adam_like(ratio))
    assert (first.step, first.kind) == (1, "weight"), first
    assert f"the update is the baseline's times {ratio:.4g} at every element" in first.note, first.note
    assert "bias correction" in first.note
    assert "Adadelta's first updates scale with sqrt(epsilon / (1 - rho))" in first.note  # 3.162 = sqrt(10)
    first = _first(*_adam_like(1.0, bend=0.5))  # half the elements moved 1.5x: settings, not one scale
    assert (first.step, first.kind) == (1, "weight") and "compare the optimizers' settings" in first.note
    # slots unrecorded: the settings named include where a slot starts (TF1 RMSProp's mean square at 1,
    # Keras's at 0: a new user's port with Keras's defaults was told of Adam's epsilon alone)
    assert "TF1 RMSProp's mean square 1, Keras's 0" in first.note, first.note


def test_a_negated_or_vanished_gradient_is_no_scale() -> None:
    """A review: a sign flipped was told "times -1 (the same direction)", a gradient of zeros
    "times 0", and a frozen weight's update "times 0 ... Adam's bias correction"."""
    for factor in (-1.0, 0.0):
        first = _first(
            [series("grad", "dense/kernel:0", [G])], [series("grad", "dense/kernel:0", [G * np.float32(factor)])]
        )
        assert first.kind == "grad" and "times" not in (first.note or ""), first.note
    for factor in (-1.0, 0.0):
        first = _first(*_adam_like(factor))
        assert first.kind == "weight" and "the update is the baseline's times" not in first.note, first.note


def test_the_nesterov_hint_needs_the_first_update_with_momentum() -> None:
    """A review: an lr applied 1.5x at a later update of plain momentum was told "Nesterov momentum
    0.5". The hint needs momentum's slots all 0 before the update (its first); here they are not."""
    w0 = RNG.uniform(-0.2, 0.2, (8, 8)).astype(np.float32)
    update = (RNG.uniform(0.5, 1.0, (8, 8)) * 1e-3).astype(np.float32)
    grads = [RNG.standard_normal((8, 8)).astype(np.float32) for _ in range(3)]

    def runs(slot_before: np.ndarray, scale_at: int, scale: float) -> tuple:
        w_b = [w0, w0 - update, w0 - 2 * update]
        w_c = [w0, w0 - update, w0 - update - np.float32(scale) * update]
        if scale_at == 1:
            w_c = [w0, w0 - np.float32(scale) * update, w0 - np.float32(scale) * update - update]
        slots = [slot_before, slot_before + 1.0, slot_before + 2.0]
        slots[scale_at - 1] = slot_before
        common = [
            series("grad", "dense/kernel:0", grads, order=2),
            series("slot", "dense/kernel/Momentum:0", slots, order=3),
        ]
        return (
            [series("weight", "dense/kernel:0", [w.astype(np.float32) for w in w_b]), *common],
            [series("weight", "dense/kernel:0", [w.astype(np.float32) for w in w_c]), *common],
        )

    first = _first(*runs(np.zeros((8, 8), np.float32), 1, 1.9))  # the first update: slots all 0 before it
    assert (first.step, first.kind) == (1, "weight") and "Nesterov momentum 0.9" in first.note, first.note
    assert "bias correction" not in first.note
    later = _first(*runs(np.full((8, 8), 0.5, np.float32), 2, 1.5))  # a later one: the slot holds momentum
    assert (later.step, later.kind) == (2, "weight"), later
    assert "the update is the baseline's times 1.5" in later.note and "Nesterov" not in later.note, later.note


def test_a_weight_moved_with_no_gradient_at_all_is_not_called_noise() -> None:
    """A review: a kernel whose gradient is exactly 0 in both runs (an input feature always 0),
    decayed by lr x wd = 1e-3 on the candidate only under momentum, was told "likely rounding noise
    ... an adaptive optimizer ... check Adam's epsilon"; identical zeros are no noise."""
    w0 = RNG.uniform(-0.2, 0.2, (8, 8)).astype(np.float32)
    zeros = [np.zeros((8, 8), np.float32)] * 3
    decayed = [w0, w0 * np.float32(0.999), w0 * np.float32(0.999) ** 2]  # numpy: 2e-4 apart at step 1
    assert np.abs(decayed[1] - w0).max() > 1e-4
    common = [
        series("grad", "dense/kernel:0", zeros, order=2),
        series("slot", "dense/kernel/Momentum:0", zeros, order=3),
    ]
    first = _first(
        [series("weight", "dense/kernel:0", [w0, w0, w0]), *common],
        [series("weight", "dense/kernel:0", decayed), *common],
    )
    assert (first.step, first.kind) == (1, "weight"), first
    assert "exactly 0 in both runs" in first.note and "weight decay" in first.note, first.note
    assert "rounding noise" not in first.note and "Adam" not in first.note, first.note
