"""Notes on terms an update adds besides the gradient: a weight decay coupled into the gradient or
decoupled from it (with its rate), BERT's bias correction, a regularizer counted once per replica, a
constraint's projection and Ftrl's constants."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from tb_parity_plugin.engine import align, allclose
from tb_parity_plugin.engine.matrix import OK
from tb_parity_plugin.engine.notes.context import (
    NoteContext,
    _decay_factor,
    _scalar_at,
)
from tb_parity_plugin.engine.pair import Pair
from tb_parity_plugin.engine.tolerance import GRAD_NOISE_OF_MAX
from tb_parity_plugin.records import metadata

#: How many compared steps before a gradient's divergence :meth:`DecayNotes._decay_found_earlier` looks.
_LOOK_BACK = 10
#: How far past float32 rounding a decay's term must be at that earlier step to be taken for one.
_CLEAR = 10.0
#: How far off the earlier step's decay, relative to the term, the divergent step's difference may be:
#: the weights parted within tolerance move the rest of the gradient (a new user's bias decay: 1%).
_PARTED = 0.05


_STAT = metadata.STAT_INDEX


class DecayNotes(NoteContext):
    """Decay, regularization and constraint notes, for :class:`~tb_parity_plugin.engine.notes.Notes`."""

    def _constrained(self, pair: Pair, k: int) -> Optional[str]:
        """When one run's weight at step ``k`` is the other's projected onto a constraint at each
        element out of tolerance (None otherwise): exactly 0 where the other's is negative, no element
        below 0 (``NonNeg``), or each column (or row) the other's scaled down to one norm that no
        column (row) of it exceeds (``MaxNorm``). TF1's ``tf.compat.v1.train`` optimizers apply a
        variable's ``constraint`` after each update, as Keras optimizers do: a trial's port whose
        layer left out TF1's ``kernel_constraint`` was told to compare the optimizers' epsilon,
        momentum and clipping."""
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None:
            return None
        b, c = (np.asarray(v, dtype=np.float64) for v in both)
        shape = pair.known_shape("base", int(pair.ib[k]))
        names = (self.base.name, self.cand.name)
        tf1 = (
            "TF1's tf.compat.v1.train optimizers apply a variable's constraint after each update, as Keras "
            "optimizers do"
        )
        for side, (a, o) in enumerate(((b, c), (c, b))):
            run, other = names[side], names[1 - side]
            # a projection keeps the elements above 0 (they agree): a weight exactly 0 throughout is no
            # evidence of one (Ftrl's l1 holds a linear model's weights at 0 until |linear| passes it, and a
            # one-element weight left at 0 is any update not applied)
            if np.all(a[out] == 0) and np.all(o[out] < 0) and not np.any(a < 0) and np.any(a > 0):
                return (
                    f"each element out of tolerance is exactly 0 in '{run}' where '{other}' has it negative, and no "
                    f"element of '{run}' is negative: '{run}' clips this weight at 0 after the update "
                    f"(kernel_constraint=NonNeg(), or an assign of it) and '{other}' does not, or applies it before "
                    f"the update. {tf1}"
                )
            if shape is None or len(shape) < 2 or int(np.prod(shape)) != a.size:
                continue
            a2, o2 = a.reshape(-1, shape[-1]), o.reshape(-1, shape[-1])
            for what, (aa, oo, slices) in (
                ("column", (a2, o2, out % shape[-1])),
                ("row", (a2.T, o2.T, out // shape[-1])),
            ):
                norm = _norm_capped(aa, oo, np.unique(slices), pair.rtol_at(k), pair.atol_at(k))
                if norm is not None:
                    return (
                        f"in '{run}' each {what} out of tolerance is the one of '{other}' scaled down to one norm "
                        f"({norm:.4g}), which no {what} of '{run}' exceeds: '{run}' caps the {what}s' norm after the "
                        f"update (kernel_constraint=MaxNorm({norm:.4g}{'' if what == 'column' else ', axis=1'}), "
                        f"UnitNorm, MinMaxNorm) and '{other}' does not, or applies it before the update. {tf1}"
                    )
        return None

    def _ftrl_constants(self, g: Pair, k: int) -> Optional[str]:
        """For a weight under Ftrl (a slot fed by ``g`` holds its linear term) whose every slot agrees
        at step ``k``: Ftrl sets the weight from its accumulator and linear term alone, so its
        constants differ (None otherwise). A helper's port that left out TF1's
        ``l1_regularization_strength`` (Keras's default 0) was told Adam's epsilon, betas, momentum
        and clipping, none of which Ftrl has or which would have moved the slots."""
        slots = self._slots_fed_by(g)
        roles = {
            found[1]
            for p in slots
            for name in (p.base.name, p.cand.name)
            if (found := align.variable_of("slot", name)) is not None
        }
        if "linear" not in roles:
            return None
        if not self._all_agree_at(slots, k):
            return None
        return (
            "Ftrl sets each weight from its accumulator and linear term alone (w = (clip(linear, -l1, l1) - linear) "
            "/ (accumulator^(-learning_rate_power) / lr + 2 l2 + beta / lr)), and both agree at this step: the "
            "optimizers' constants differ (the learning rate, which Ftrl's slots do not hold where a weight starts at 0; "
            "l1_regularization_strength, l2_regularization_strength, beta, learning_rate_power), not the gradients that reached the slots (a weight exactly 0 in one run only: "
            "its |linear| is within that run's l1)"
        )

    def _ftrl_sets_every_row(self, pair: Pair, k: int) -> Optional[str]:
        """For a weight under Ftrl in both runs diverging at step ``k``, from statistics alone: when one
        run's weight is 0 wherever its linear term is 0 and was not at the first step both logged, while
        the other keeps elements its linear term does not set, the first sets the whole variable from its
        slots at each update (tf_keras's ``Ftrl``: ``variable.assign`` over every row, a row no gradient
        reached having linear 0 and so weight 0) where the other updates a sparse gradient's rows only
        (TF1's ``FtrlOptimizer``, ``tf.keras.optimizers.legacy.Ftrl``). They part only where a weight
        starts nonzero: a trial's wide table warm-started from a TF1 checkpoint, its 100000 rows all 0 but
        the 63 looked up at step 0 after the port's first update, got no note (None otherwise)."""
        g = self._gradient_of(pair)
        if g is None or k == 0:
            return None
        linear = next(
            (
                p
                for p in self._slots_fed_by(g)
                if all((align.variable_of("slot", n) or ("", ""))[1] == "linear" for n in (p.base.name, p.cand.name))
            ),
            None,
        )
        if linear is None or linear.ib[k] < 0 or linear.ic[k] < 0:
            return None
        first = np.flatnonzero((pair.ib[:k] >= 0) & (pair.ic[:k] >= 0))
        if not len(first):
            return None
        j, zero, size = int(first[0]), _STAT["zero"], _STAT["size"]
        counts = []  # per run: (weight zeros at k, at the first step, linear zeros at k, size)
        for w, wi, lin, li in (
            (pair.base, pair.ib, linear.base, linear.ib),
            (pair.cand, pair.ic, linear.cand, linear.ic),
        ):
            ws, w0, ls = w.stats[int(wi[k])], w.stats[int(wi[j])], lin.stats[int(li[k])]
            counts.append((float(ws[zero]), float(w0[zero]), float(ls[zero]), float(ws[size])))
        names = (self.base.name, self.cand.name)
        # where both runs kept full values, the claim is read element by element: the counts hold for zeros of
        # another cause too (an l1 only one run has zeroes the looked-up rows, rows no gradient reached kept)
        weights, linears = pair.step_values(k), linear.step_values(k)
        for a in (0, 1):
            (wz, w0z, lz, n), (owz, _, olz, _) = counts[a], counts[1 - a]
            if weights is not None and linears is not None and weights[a].shape == linears[a].shape:
                w, lin, ow, olin = weights[a], linears[a], weights[1 - a], linears[1 - a]
                if np.any(w[lin == 0] != 0) or ow.shape != olin.shape or not np.any(ow[olin == 0] != 0):
                    continue
            # setting every row zeroes only rows no gradient reached beyond the other's zeros: more zeros than
            # that are another cause's (a TF1 l1 the port left out: 32 zeros of 40 against 8 of linear 0)
            if wz >= lz > w0z and owz < olz and wz <= owz + lz:
                return (
                    f"in '{names[a]}' this weight is 0 wherever its Ftrl linear term is 0 ({int(lz)} of its {int(n)} "
                    f"elements), which it was not at step {int(self.steps[j])}, while '{names[1 - a]}' holds at least "
                    f"{int(olz - owz)} nonzero elements that its linear term has not set: "
                    f"'{names[a]}' sets the whole variable from its slots at each update (tf_keras's Ftrl assigns "
                    "every row, and a row no gradient reached, linear 0, becomes 0) where "
                    f"'{names[1 - a]}' updates only the rows a sparse gradient looks up (TF1's FtrlOptimizer, "
                    "tf.keras.optimizers.legacy.Ftrl); they part only where a weight starts nonzero (a table "
                    "warm-started from a checkpoint): a port keeps TF1's rule with tf.keras.optimizers.legacy.Ftrl"
                )
        return None

    def _coupled_decay(self, pair: Pair, g: Pair, k: int, b: np.ndarray, c: np.ndarray) -> str:
        """For Adam's first moment at step ``k``, 0 in both runs at the step before: when the two
        differ by one factor times the weight there at every element, one run added a weight decay
        to the gradient (L2, coupled: ``g + λw``) that the other applies decoupled or not at all. A
        trial's port of BERT's ``AdamWeightDecayOptimizer`` that coupled it was told of clipping,
        the betas or a decay, with no factor. "" otherwise."""
        power, averaging = align.slot_rule(pair.base.name, pair.cand.name)
        if power != 1 or not averaging or int(self.steps[k - 1]) != int(self.steps[k]) - 1:
            return ""
        before = pair.step_values(k - 1)
        if before is None or np.any(before[0]) or np.any(before[1]):
            return ""
        weight = next(iter(self._weights_of(g)), None)
        if weight is None or not weight.use_values:
            return ""
        w = weight.step_values(k - 1)
        if w is None or len(w[0]) != len(b):
            return ""
        factor = _decay_factor(b, c, w[0])
        if factor is None:
            return ""
        beta, default, _ = align.decay_name(pair.base.name, pair.cand.name, power)
        who = self.cand.name if factor > 0 else self.base.name
        return (
            f"; the candidate's minus the baseline's is {factor:.4g} times the weight {weight.base.name} at step "
            f"{int(self.steps[k - 1])} at every element: on its first update a moving average holds (1 - {beta}) x "
            f"what reaches it, so '{who}' adds a weight decay to the gradient (L2, coupled: g + λ·w; λ = "
            f"{abs(factor) / (1.0 - default):.4g} if {beta} is {default}) where the other run decays the weight "
            "decoupled (w -= lr·λ·w: BERT's AdamWeightDecayOptimizer, AdamW) or not at all"
        )

    def _decay_note(self, pair: Pair, k: int) -> Optional[str]:
        """A gradient whose difference at step ``k`` is one factor times its weight's value there at
        every element (the weight compared by values, agreeing): an L2 term on one side only, or of
        another size. A helper's port used Keras ``l2(λ)`` (gradient 2λw) for TF1's
        ``λ * tf.nn.l2_loss(w)`` (gradient λw): every gradient moved by exactly λw, with no note."""
        weight = next(iter(self._weights_of(pair)), None)
        if weight is None or not weight.use_values:
            return None
        grads, weights = pair.step_values(k), weight.step_values(k)
        if grads is None or weights is None or len(weights[0]) != len(grads[0]):
            return None
        weight.ensure(k + 1, self.policy.equal_nan)
        if weight.reason[k] != OK:
            return None
        factor, since = _decay_factor(grads[0], grads[1], weights[0]), ""
        if factor is None:
            found = self._decay_found_earlier(pair, weight, k)
            if found is None:
                return None
            j, factor = found
            d = np.asarray(grads[1], np.float64) - np.asarray(grads[0], np.float64)
            term = factor * np.asarray(weights[0], np.float64)
            off = np.abs(d - term)
            rounding = GRAD_NOISE_OF_MAX * float(np.abs(np.asarray(grads[0], np.float64)).max())
            if not np.all(off <= rounding + _PARTED * np.abs(term)):
                return None
            since = (
                f" (at step {int(self.steps[j])} too, where the weights still agreed; here to "
                f"{float((off / np.maximum(np.abs(term), 1e-300)).max()):.2%}, the runs' weights having parted "
                "within tolerance since)"
            )
        return (
            f"the difference is {factor:.4g} times the weight {weight.base.name} at every element{since}: a weight decay "
            "added to the loss on one side only or of another size (an L2 term: Keras regularizers.l2(λ) adds "
            "λ·Σw², gradient 2λ·w; TF1's λ·tf.nn.l2_loss(w) adds λ·Σw²/2, gradient λ·w; a regularizer on a "
            "layer the other run does not regularize)" + self._replicated_regularizer()
        )

    def _decay_found_earlier(self, pair: Pair, weight: Pair, k: int) -> Optional[tuple[int, float]]:
        """(compared step, factor) of the latest step before ``k`` (at most :data:`_LOOK_BACK` back) where
        gradient ``pair`` differs by one factor times ``weight`` at every element, to :data:`_PARTED` of
        the term, the weight agreeing there and the term far past rounding (:data:`_CLEAR`): a decay that
        is 0 at the start (a bias from 0) passes atol steps later, when the runs' weights have parted
        within tolerance and their gradients' difference is the decay only to a percent or two (a new
        user's CNN port that regularized its bias too was told of float32 rounding and offered an
        --override). The divergent step must then hold the same factor: two steps of other weights
        agreeing on one factor is no chance."""
        for j in range(k - 1, max(-1, k - 1 - _LOOK_BACK), -1):
            grads, weights = pair.step_values(j), weight.step_values(j)
            if grads is None or weights is None or len(weights[0]) != len(grads[0]) or weight.reason[j] != OK:
                continue
            factor = _decay_factor(grads[0], grads[1], weights[0], slack=_PARTED)
            if factor is None:
                continue
            rounding = GRAD_NOISE_OF_MAX * float(np.abs(np.asarray(grads[0], np.float64)).max())
            if float(np.abs(factor * np.asarray(weights[0], np.float64)).max()) >= _CLEAR * rounding:
                return j, factor
        return None

    def _replicated_regularizer(self) -> str:
        """For an L2-like gradient difference when one run ran several replicas: each replica adds
        its whole regularization loss unless scaled by ``tf.nn.scale_regularization_loss``, and the
        all-reduce sums them. A helper's MirroredStrategy port that left it out was told of Keras
        ``l2`` against ``tf.nn.l2_loss`` only."""
        counts = [self._replicas[run.name].count for run in (self.base, self.cand) if run.name in self._replicas]
        n = max(counts, default=1)
        if n < 2:
            return ""
        return (
            f"; or, under the strategy's {n} replicas, a regularization loss not divided by the replica count "
            f"(tf.nn.scale_regularization_loss): each replica adds it whole and the all-reduce sums {n} of them"
        )

    def _last_update(
        self, pair: Pair, k: int
    ) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """A weight's values at compared step ``k`` and at the step just before (consecutive steps, both
        logged by values, finite), as float64 (now base, now cand, before base, before cand), and the
        rounding each element of an update difference carries: each difference of two float32 weights
        carries theirs, and the updates' own (Adam's steps near the lr, rounded at the weight's scale).
        None otherwise."""
        if k == 0 or int(self.steps[k - 1]) != int(self.steps[k]) - 1:
            return None
        now, before = pair.step_values(k), pair.step_values(k - 1)
        if now is None or before is None or len(now[0]) != len(before[0]) or len(now[1]) != len(now[0]):
            return None
        (nb, nc), (bb, bc) = ((np.asarray(x, np.float64).ravel() for x in both) for both in (now, before))
        if not all(np.isfinite(a).all() for a in (nb, nc, bb, bc)):
            return None
        rounding = 2.0**-22 * (np.abs(nb) + np.abs(bb) + np.abs(nc) + np.abs(bc))
        return nb, nc, bb, bc, rounding

    def _under_adam(self, g: Pair) -> bool:
        """Whether a slot fed by gradient ``g`` averages its squares (Adam's, RMSprop's second moment)."""
        return any(
            power == 2 for power, _ in (align.slot_rule(p.base.name, p.cand.name) for p in self._slots_fed_by(g))
        )

    def _decoupled_decay(self, pair: Pair, g: Pair, k: int) -> Optional[str]:
        """When the candidate's update of a weight from the step before ``k`` to ``k`` minus the
        baseline's is one factor times the weight at every element (None otherwise): a decoupled
        weight decay (``w -= lr * λ * w``) in one run only, or of another size. BERT's
        ``AdamWeightDecayOptimizer`` leaves out LayerNorm and bias variables; a trial's port that
        decayed them too was told to compare epsilon, betas and clipping on LayerNorm's gamma."""
        found = self._last_update(pair, k)
        if found is None:
            return None
        nb, nc, bb, bc, rounding = found
        d, used = (nc - bc) - (nb - bb), np.abs(bb) > pair.tol.atol
        if used.sum() < 2 or not np.any(d):
            return None
        factor = float(d[used] @ bb[used] / (bb[used] @ bb[used]))
        if factor == 0 or not np.all(np.abs(d - factor * bb) <= rounding + 1e-3 * np.abs(factor * bb)):
            return None
        if np.any(np.abs(d - factor * bb) > 0.1 * np.abs(factor * bb) + rounding):  # below atol too
            return None
        rates = [
            _scalar_at(series, rows, k - 1)
            for lr in self._pairs
            if lr.base.kind == "lr" and lr.use_values
            for series, rows in ((lr.base, lr.ib), (lr.cand, lr.ic))
            if int(rows[k - 1]) >= 0
        ]
        who = self.cand.name if factor < 0 else self.base.name
        # Adam's decoupled decays are named only under Adam (a momentum's weight decay is no AdamW's)
        adam = self._under_adam(g)
        rate = (
            f" ({-factor / rates[0]:.4g} times the lr {rates[0]:.4g} of step {int(self.steps[k - 1])})"
            if rates and rates[0] > 0 and len(set(rates)) == 1
            else ""
        )
        one = (
            " (the weight holds one value there, so an offset of the update would look the same)"
            if np.ptp(bb[used]) <= 1e-3 * float(np.abs(bb).max())
            else ""
        )
        return (
            f"the update of '{self.cand.name}' minus that of '{self.base.name}' is {factor:.4g} times the weight at "
            f"every element{rate}{one}: a decoupled weight decay (w -= lr·λ·w) that '{who}' applies to this variable "
            "and the other does not, or of another size: the variables left out of the decay differ"
            + (
                " (BERT's AdamWeightDecayOptimizer leaves out names matching LayerNorm, layer_norm and bias; Keras "
                "AdamW decays every variable unless exclude_from_weight_decay(var_names=[...]) is called before it "
                "is built, and its weight_decay defaults to 0.004)"
                if adam
                else ", or one run's optimizer decays its weights and the other's does not"
            )
        )

    def _bias_correction(self, pair: Pair, g: Pair, k: int) -> Optional[str]:
        """When the candidate's update of an Adam-trained weight from the step before ``k`` to ``k``
        is the baseline's times Adam's bias correction at that update, ``sqrt(1 - 0.999^t) /
        (1 - 0.9^t)`` with ``t = steps[k]`` (or the baseline's the candidate's times it), at every
        element, up to a term proportional to the weight (a decoupled decay both apply outside the
        correction): one run corrects its moments and the other does not (None otherwise). BERT's
        ``AdamWeightDecayOptimizer`` has no bias correction and Keras's ``AdamW`` always applies it:
        a trial's ``AdamW`` port was told of epsilon and clipping on its kernels, and of four causes
        on its biases."""
        if int(self.steps[k]) < 1 or not self._under_adam(g):
            return None
        found = self._last_update(pair, k)
        if found is None:
            return None
        nb, nc, bb, bc, rounding = found
        t = int(self.steps[k])
        correction = math.sqrt(1.0 - 0.999**t) / (1.0 - 0.9**t)
        if abs(correction - 1.0) <= 1e-3:
            return None
        ub, uc = nb - bb, nc - bc
        moved = np.abs(ub) > pair.tol.atol
        if moved.sum() < 2:
            return None
        for factor, who, other in (
            (correction, self.cand.name, self.base.name),
            (1.0 / correction, self.base.name, self.cand.name),
        ):
            rest = uc - factor * ub
            decay = float(rest @ bb / (bb @ bb)) if np.any(bb) else 0.0
            if not np.all(np.abs(rest - decay * bb) <= 1e-3 * np.abs(factor * ub) + rounding):
                continue
            if abs(decay) * float(np.abs(bb).max()) <= 1e-3 * float(np.abs(factor * ub).max()):
                decay = 0.0
            plus = (
                f" plus {decay:.4g} times the weight (a decoupled weight decay's term, which the correction does "
                "not scale: the same decay in both runs, or a decay in one run only)"
                if decay
                else ""
            )
            return (
                f"the update of '{self.cand.name}' is the baseline's times {factor:.4g} at every element{plus}: "
                f"{correction:.4g} is sqrt(1 - 0.999^{t}) / (1 - 0.9^{t}), Adam's bias correction at update {t} "
                f"(betas 0.9, 0.999): '{who}' corrects Adam's moments and '{other}' does not (BERT's "
                "AdamWeightDecayOptimizer has no bias correction; Keras Adam and AdamW always apply it, so neither "
                "ports it faithfully: subclass the optimizer with BERT's update instead)"
            )
        return None


def _norm_capped(a: np.ndarray, o: np.ndarray, cols: np.ndarray, rtol: float, atol: float) -> Optional[float]:
    """The norm each of 2-D ``a``'s columns ``cols`` (two or more) is scaled down to from ``o``'s, when
    each is ``o``'s column times a factor below 1, they share that norm and no column of ``a`` is
    longer (None otherwise): a ``MaxNorm`` projection (norm over axis 0) of ``o``."""
    if len(cols) < 2:  # one column scaled down is any smaller update (an Ftrl port's other lr was told MaxNorm)
        return None
    av, ov = a[:, cols], o[:, cols]
    square = (ov * ov).sum(0)
    if not np.all(square > 0):
        return None
    factor = (av * ov).sum(0) / square
    if not np.all((factor > 0) & (factor < 1)) or not np.all(allclose.isclose(av, ov * factor, rtol, atol, False)):
        return None
    norms = np.sqrt((av * av).sum(0))
    cap = float(norms.max())
    if cap <= 0 or norms.min() < cap * (1 - 1e-4) or np.sqrt((a * a).sum(0)).max() > cap * (1 + 1e-4):
        return None
    return cap
