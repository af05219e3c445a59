"""The marginal note: a difference just past tolerance, whether it grows, and what amplifies rounding."""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, Sequence

import numpy as np

from tb_parity_plugin.engine.notes.context import (
    _BATCH_NORM,
    _OUTPUTS,
    NoteContext,
    _looser,
)
from tb_parity_plugin.engine.pair import Pair, take_rows
from tb_parity_plugin.engine.tolerance import (
    MARGINAL_RATIO,
)
from tb_parity_plugin.records import metadata

#: Significant bits of a Keras mixed policy's compute dtype (float32's 24 for any other policy): a
#: mixed_float16 run against a mixed_bfloat16 one computes apart too (a review found no clause there).
_COMPUTE_BITS = {"float16": 11, "bfloat16": 8}
_COMPUTE_BITS_NAME = {bits: name for name, bits in _COMPUTE_BITS.items()}


class MarginalNotes(NoteContext):
    """The marginal note's reads of the comparison: how a difference grows, what amplifies rounding."""

    def _precision_note(self, kind: Optional[str] = None, k: Optional[int] = None) -> Optional[str]:
        """When one run computed under a Keras mixed-precision policy and the other did not, or under
        one of another precision (the TF2 shim records the policy in its run info; TF1 runs compute in
        their variables' float32): what float16 or bfloat16 compute does to every value compared. A new user's faithful
        ``mixed_float16`` port diverged at step 0 on a layer's output, told it "computes another
        function of its input", with no word of float16. None for a divergence of ``kind`` at compared
        step ``k`` that no compute reaches: a learning rate, or a variable at the first step, read before
        any update (the policy keeps variables in float32): a mixed port's kernel initialised otherwise,
        0.15 apart at step 0, was told that differences of that order are float16's rounding."""
        if kind in ("lr", "hparam") or (kind in ("weight", "slot", "state") and k == 0):
            return None
        policies = [str(run.info.get("keras_policy") or "") for run in (self.base, self.cand)]
        bits = [_COMPUTE_BITS.get(p.removeprefix("mixed_"), 24) if p.startswith("mixed_") else 24 for p in policies]
        if bits[0] == bits[1]:  # the same compute precision (mixed_float16 on both sides: no clause)
            return None
        low = 0 if bits[0] < bits[1] else 1  # the run of the coarser compute
        run, other = (self.base, self.cand) if low == 0 else (self.cand, self.base)
        policy, half = policies[low], policies[low].removeprefix("mixed_")
        against = (
            "did not"
            if bits[1 - low] == 24
            else f"computed under {policies[1 - low]} ({_COMPUTE_BITS_NAME[bits[1 - low]]} compute)"
        )
        return (
            f"'{run.name}' computed under the Keras {policy} policy ({half} compute, {bits[low]} significant bits: "
            f"about {2.0 ** -bits[low]:.0e} of each value per operation) and '{other.name}' {against}: differences "
            "of that order, and what they move later, are its rounding; compare this port against the same port "
            "without the policy for the training's parity, and loosen to its resolution for this one (README: "
            "Mixed precision)"
        )

    def _amplifiers(self) -> str:
        """:func:`_amplifiers` of both runs' tensor names, and whether some output holds exact zeros
        (a ReLU, padding or dropout: a Keras ``Dense(activation="relu")`` is named ``dense``)."""
        names = [s.name for run in (self.base, self.cand) for s in run.tensors.values()]
        zero = metadata.STAT_INDEX["zero"]
        zeros = any(
            s.kind in _OUTPUTS and len(s.stats) and s.stats[:, zero].max() > 0
            for run in (self.base, self.cand)
            for s in run.tensors.values()
        )
        return _amplifiers(names, zeros)

    def _growth(self, pair: Pair, k: int) -> Optional[tuple[float, float, int, int]]:
        """(largest |difference| at compared step ``k``, the largest at the next
        :data:`GROWTH_STEPS` compared steps both runs kept full values at, the step of it, how many
        such steps were read), for a divergence just past tolerance (None without full values). A new user's decoupled weight
        decay of 1e-5 against L2 of 1e-5 was told faithful ports reach such a ratio; its difference
        grew 30x over 25 steps, where a faithful port's stayed within 4x."""
        if not pair.use_values:
            return None
        ib, ic = pair.ib[k : k + GROWTH_STEPS + 1], pair.ic[k : k + GROWTH_STEPS + 1]
        rows = np.flatnonzero((ib >= 0) & (ic >= 0))
        if len(rows) < 2 or rows[0] != 0:
            return None
        n = int(pair.base.stats[ib[0], metadata.STAT_INDEX["size"]])
        b = take_rows(pair.base.values, ib[rows])[:, :n].astype(np.float64)
        c = take_rows(pair.cand.values, ic[rows])[:, :n].astype(np.float64)
        # elements non-finite on both sides (masked scores at -inf) are left out; the window ends
        # before a row where one side alone is not finite (a NaN/Inf is its own finding)
        fin_b, fin_c = np.isfinite(b), np.isfinite(c)
        one_sided = (fin_b != fin_c).any(axis=1)
        end = int(np.argmax(one_sided)) if one_sided.any() else len(rows)
        if end < 2:
            return None
        with np.errstate(invalid="ignore"):
            gaps = np.where(fin_b[:end] & fin_c[:end], np.abs(c[:end] - b[:end]), 0.0).max(axis=1, initial=0.0)
        later = int(np.argmax(gaps[1:])) + 1
        return float(gaps[0]), float(gaps[later]), int(self.steps[k + rows[later]]), end - 1


_RECURRENT = re.compile(r"lstm|gru|rnn|recurrent", re.IGNORECASE)


_POOL = re.compile(r"max_?pool", re.IGNORECASE)


_RELU = re.compile(r"relu", re.IGNORECASE)


#: A difference just past tolerance is followed over this many compared steps after it ...
GROWTH_STEPS = 50


#: ... and called growing when its largest |difference| there reaches this many times its own.
GROWTH_FACTOR = 10.0


#: ... and said not to grow when at least this many later steps were read ...
STEADY_STEPS = 5


#: ... and none reaches this many times its own (a faithful port's stays within about 4x).
STEADY_FACTOR = 4.0


def _marginal_note(
    kind: str,
    found: dict[str, Any],
    growth: Callable[[], Optional[tuple[float, float, int, int]]] = lambda: None,
    held: Callable[[], float] = lambda: 1e-5,
    amplifiers: Callable[[], str] = lambda: _amplifiers(),
) -> Optional[str]:
    """For an activation or gradient compared element-wise just past tolerance (an error ratio
    under :data:`MARGINAL_RATIO`): what reaches that on a faithful port and what on a bug, and how to
    tell them apart; when its largest difference grows :data:`GROWTH_FACTOR` times within the next
    steps (``growth()``: :meth:`Comparison._growth`, asked only here: it reads those steps' values),
    that instead, and no advice to loosen atol, which hid a new user's weight-decay bug. It says the
    difference stays the same size only over at least :data:`STEADY_STEPS` later steps within
    :data:`STEADY_FACTOR` of it, and never that this makes it noise: a new user's Keras epsilon of
    1e-7 against TF1's 1e-8 moved an activation a steady 1.06x past tolerance and was told "noise".
    The override it offers is above ``held()``, the atol that step was held to, asked only here: an
    override's atol replaces an output's share, and a review's 1e-4 tightened an activation of peak
    100. The divergence is real and stays one. ``amplifiers()``: what amplifies rounding, among the
    layers the runs have (:func:`_amplifiers`).

    An output too large for full values is told too, by its element sample (evidence ``sample``: the
    sample's own ratio and growth) or by its statistics alone (a lower bound on its elements' ratio,
    so it sends the user to full values first): a new user's faithful Adam U-Net port, its
    transposed convolution's output of 8192 elements 1.13x past tolerance at step 9 by its
    statistics and 1.08x by its sample, got no note at all, where the same run recorded with full
    values was told this."""
    ratio = found.get("error_ratio")
    evidence = found.get("evidence")
    if kind not in ("activation", "grad") or evidence not in ("values", "sample", "statistics") or ratio is None:
        return None
    if not 1.0 < ratio < MARGINAL_RATIO:
        return None
    if evidence == "statistics":
        return (
            f"its statistics put it just past tolerance (error ratio {ratio:.3g}, a lower bound: statistics show how "
            "far a figure moved, not each element): float32 rounding amplified by the network "
            f"({amplifiers()}) reaches that on faithful ports within a few steps, and so does a small real "
            "difference (a normalization layer's epsilon; an optimizer setting: Adam's epsilon, TF1 1e-8 against "
            "Keras 1e-7, or its betas, which tf_keras subtracts from 1 before rounding to float32 and TF1 after; "
            "a decay), and so can a larger difference in a few elements; its element sample, where recorded, "
            "says more. Record it with full values (full_values_limit above its size) to compare every element "
            "and see whether it grows, before loosening atol"
        )
    grown, atol = growth(), held()
    steady = ""
    if grown is not None and grown[0] > 0:
        now, later, step, seen = grown
        if later >= GROWTH_FACTOR * now:
            return (
                f"just past tolerance here (error ratio {ratio:.3g}), but its largest difference grows from {now:.3g} "
                f"to {later:.3g} by step {step} ({later / now:.3g}x): follow it upstream before loosening atol (the "
                "weights' differences over the steps before; an optimizer setting such as weight decay, Adam's "
                "epsilon or betas, or a schedule)"
            )
        if seen >= STEADY_STEPS and later <= STEADY_FACTOR * now:
            steady = (
                f" It does not grow: over the next {seen} steps both runs logged, its largest difference is {later:.3g} "
                f"at most (step {step}), {later / now:.3g}x this step's {now:.3g}."
            )
    return (
        f"just past tolerance{' on its sampled elements' if evidence == 'sample' else ''} (error ratio {ratio:.3g}): "
        f"float32 rounding amplified by the network ({amplifiers()}) "
        "reaches this on faithful ports within a few steps, and so does a small real difference (a normalization "
        "layer's epsilon: Keras LayerNormalization and BatchNormalization 1e-3, TF1 code often 1e-12 or 1e-5; "
        "an optimizer setting: Adam's epsilon, TF1 1e-8 against Keras 1e-7, or its betas, which tf_keras subtracts "
        "from 1 before rounding to float32 and TF1 after: Adam(beta_1=float(np.float32(0.9)), "
        "beta_2=float(np.float32(0.999))) decays as TF1 does; a decay); a difference that grows "
        "over the next steps (the heat map) is no noise." + steady + " Rule out those settings before loosening "
        f"this kind with --override '{kind}/*:atol={_looser(atol):g}' (this step was held to atol {atol:.3g}; an "
        "override's atol replaces the share of the largest element)."
    )


def _amplifiers(names: Sequence[str] = (), zeros: bool = False) -> str:
    """What amplifies float32 rounding in a network whose tensors are named ``names`` (both runs'):
    reordered sums everywhere, then only the layers it has, each name matched on its own; ``zeros``:
    some output holds exact zeros. A new user's LSTM text model was told of batch normalization and
    max-pooling, which it did not have."""

    def has(pattern: re.Pattern[str]) -> bool:
        return any(pattern.search(name) for name in names)

    found = ["sums reordered from layer to layer" + (" and over time steps" if has(_RECURRENT) else "")]
    if has(_BATCH_NORM):
        found.append("batch normalization over features of small batch variance")
    if has(_POOL):
        found.append("ties in max-pooling")
    if has(_RELU) or zeros:
        found.append("elements at a ReLU's 0" if has(_RELU) else "outputs' exact zeros (a ReLU's 0, padding, dropout)")
    return ", ".join(found)
