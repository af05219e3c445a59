"""Notes on a weight's update: one that differs (its scale, its momentum, an average), a weight
trained, frozen or loaded in one run only, an update not applied or not recorded, rounding
amplified, a gradient that jumps from agreeing inputs. Slots, a gradient scaled as a whole and
decay terms have modules of their own (``slots``, ``gradient_scale``, ``decay``)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from tb_parity_plugin.engine import align
from tb_parity_plugin.engine.matrix import OK, VALUE
from tb_parity_plugin.engine.notes.context import (
    _looser,
)
from tb_parity_plugin.engine.notes.gradient_scale import GradientScaleNotes, _uniform_scale
from tb_parity_plugin.engine.notes.slots import SlotNotes
from tb_parity_plugin.engine.pair import NONFINITE_COLS, Pair, take_rows
from tb_parity_plugin.engine.tolerance import ROUNDED_WEIGHT_ULPS
from tb_parity_plugin.records import metadata

_IDX = metadata.STAT_INDEX
#: The statistics and counts that no order of a tensor's elements changes.
_COUNTS = ("neg_inf", "pos_inf", "nan", "neg_finite", "zero", "pos_finite")
_ORDER_FREE = ("min", "max", "mean", "std", "l2")
#: How far (float32 ulps of the larger of the two, or of the std) a statistic of the same elements in another
#: order may move: mean, std and L2 are sums, whose rounding follows the order of their terms (half an ulp on
#: a trial's 100000-row table gradient, its 63 looked-up rows at other positions).
_SAME_STAT_ULPS = 8


def _all_zero(stats: np.ndarray) -> bool:
    """Every element of the tensor of this statistics row is 0."""
    return bool(stats[_IDX["size"]] > 0 and stats[_IDX["zero"]] == stats[_IDX["size"]])


class UpdateNotes(SlotNotes, GradientScaleNotes):
    """Notes on weights, slots and gradients that diverge: what their updates and gradients show."""

    def _overwritten_by_average(self, pair: Pair, k: int) -> Optional[str]:
        """The run whose weight at step ``k`` is its own recorded moving average there, element for
        element, when the other's is not (None otherwise): that run replaced its weights by their
        averages. tf_keras's ``RMSprop`` alone defaults ``ema_overwrite_frequency`` to 100, so a
        trial's faithful ``use_ema=True`` port jumped at step 100 and was told to compare epsilon,
        betas and clipping. Only a weight that moved since the step compared before and was not
        its average there: a weight an lr of 0 left alone, a frozen one, or an average of decay 0
        equals its average with nothing replaced (a review's warm-up from lr 0 was told so)."""
        if self._average_of is None:  # once per set of pairs: a weight's averages, by both variables
            self._average_of = {}
            for q in self._pairs:
                b, c = align.variable_of("state", q.base.name), align.variable_of("state", q.cand.name)
                if q.base.kind == "state" and b is not None and c is not None and b[1] == c[1] == "average":
                    self._average_of[(b[0], c[0])] = q
        names = (align.variable_of("weight", pair.base.name), align.variable_of("weight", pair.cand.name))
        p = self._average_of.get((names[0][0], names[1][0])) if names[0] and names[1] else None
        if p is None:
            return None
        before = np.flatnonzero((pair.ib[:k] >= 0) & (pair.ic[:k] >= 0) & (p.ib[:k] >= 0) & (p.ic[:k] >= 0))
        if not len(before):
            return None
        values, averages = pair.step_values(k), p.step_values(k)
        was, averaged = pair.step_values(int(before[-1])), p.step_values(int(before[-1]))
        if values is None or averages is None or was is None or averaged is None:
            return None
        same = [
            bool(np.array_equal(w, a)) and not np.array_equal(w, w0) and not np.array_equal(w0, a0)
            for w, a, w0, a0 in zip(values, averages, was, averaged)
        ]
        if same[0] == same[1]:
            return None
        run, other = (self.base.name, self.cand.name) if same[0] else (self.cand.name, self.base.name)
        average = p.base.name if same[0] else p.cand.name
        return (
            f"in '{run}' this weight equals its own moving average ({average}) at this step, element for "
            f"element, and in '{other}' it does not: '{run}' replaced its weights by their averages "
            "(tf_keras's use_ema=True with ema_overwrite_frequency, which RMSprop alone sets to 100 by "
            "default; ema_overwrite_frequency=None keeps the weights), or a model.fit call ended before this "
            "step: with use_ema, fit ends with optimizer.finalize_variable_values, which replaces the weights by "
            "their averages whatever ema_overwrite_frequency is (a port calling fit once per epoch or per "
            "evaluation does so each time, where TF1 swaps the averages in for its evaluation only), or its "
            "code assigns them"
        )

    def _loaded_crosswise(self, pair: Pair, k: int) -> Optional[str]:
        """For a weight diverging at step ``k`` whose candidate values are, element for element, the
        baseline's values of another weight of its shape (None otherwise): the candidate loaded that
        weight's values into this one, both ways when the other's are this one's. A trial's port that
        mapped a TF1 checkpoint onto two 6x6 layers crosswise diverged at step 0 on both kernels and
        biases with no note."""
        mine = pair.step_values(k)
        if mine is None or np.allclose(mine[0], mine[1], rtol=1e-6, atol=0):
            return None
        if len(mine[1]) < 2 or np.all(mine[1] == mine[1][0]):
            return None  # one value (zeros, ones) is any such weight's: no evidence of where it came from
        for q in self._pairs:
            if q is pair or q.base.kind != "weight" or tuple(q.base.shape) != tuple(pair.base.shape):
                continue
            theirs = q.step_values(k)
            if theirs is None or len(theirs[0]) != len(mine[1]):
                continue
            if not np.allclose(mine[1], theirs[0], rtol=1e-6, atol=0):
                continue
            both = len(theirs[1]) == len(mine[0]) and np.allclose(theirs[1], mine[0], rtol=1e-6, atol=0)
            return (
                f"the candidate's values are the baseline's {q.base.kind}/{q.base.name} at this step"
                + (
                    f", and its {q.cand.name} holds the baseline's values of this one: the two are swapped"
                    if both
                    else ""
                )
                + " (weights loaded into the wrong layer of one shape: a checkpoint's or a list's names mapped "
                "crosswise, set_weights in another layer order)"
            )
        return None

    def _trained_in_one_run(self, pair: Pair, k: int) -> Optional[str]:
        """For a weight diverging at step ``k`` that agreed at the compared step before, exactly unchanged
        since the first compared step in one run and moved in the other: one run trains it and the other
        does not (None otherwise). A trial's fine-tuning port that froze its base layer by layer and left one out
        (``trainable = False`` on all but one, where TF1's ``var_list`` is the head's) had that layer's
        kernel diverge at step 1 with no note."""
        if k == 0 or pair.reason[k - 1] != OK:
            return None
        before, now = pair.step_values(k - 1), pair.step_values(k)
        if before is None or now is None or len(before[0]) != len(now[0]) or len(before[1]) != len(now[1]):
            return None
        still = [bool(np.array_equal(a, b)) for a, b in zip(before, now)]
        if still[0] == still[1]:
            return None
        side = 0 if still[0] else 1
        # held since the first compared step: a weight that moved before and stands still once (Adam's step
        # on a gradient that rounds to nothing) is no frozen one. Read from the statistics of every step
        # (values at each step of a large weight were a copy per step), then the first step's values
        if not _stats_held(pair, side, k):
            return None
        earlier = pair.step_values(0)
        if earlier is None or len(earlier[side]) != len(now[side]) or not np.array_equal(earlier[side], now[side]):
            return None
        g = self._gradient_of(pair)
        grads = None if g is None else g.step_values(k - 1)
        if grads is not None and not any(np.any(v) for v in grads):
            return None  # no gradient in either run: what moved it is no training (the update's note: a decay)
        for q in self._pairs if g is not None else ():
            if q.base.kind != "slot" or q.feeder is not g:
                continue
            # a slot of it that moves in the still run: an optimizer updates it there (Adam on gradients that
            # round to no step), no frozen layer
            if not _stats_held(q, side, k):
                return None
        who, other = (self.base.name, self.cand.name) if still[0] else (self.cand.name, self.base.name)
        return (
            f"'{who}' left it unchanged from step {int(self.steps[k - 1])} to step {int(self.steps[k])} where "
            f"'{other}' updated it: one run trains this variable and the other does not (a layer frozen in one run "
            "only: trainable = False, a layer left out of the frozen set or of TF1's var_list, a phase that "
            "unfreezes it at another step; or a gradient that does not reach it in one run)"
        )

    def _moved_by_the_update(self, pair: Pair, k: int, slot_gaps: Sequence[tuple[Pair, float]] = ()) -> Optional[str]:
        """What a weight diverging at step ``k`` after its gradient agreed element-wise at every
        earlier step means (None otherwise): the update that moved it differs although its input
        agreed. When the gradient of the elements out of tolerance stayed below its atol at every
        earlier step, that is likely rounding noise, which an adaptive optimizer turns into steps
        near its learning rate: new users' faithful Adam ports diverged on a dense bias before batch
        normalization (the whole tensor) and on an embedding row first looked up at step 2.

        When a slot of this weight (one its gradient feeds) diverges at this step (past what its
        gradient's differences allow: ``Pair.allowance``) by more than that gradient's atol
        (``slot_gaps``), another optimizer's slots being no evidence, that is said first and
        nothing else: noise in a gradient that cancels leaves its slots at rounding scale, so the
        update's input differs beyond rounding. A new user's ``clipnorm`` in place of
        ``global_clipnorm`` (clipping between the recorded gradient and the update) was told
        "likely rounding noise" beside Adam slots 40-140% apart, and under Momentum (every
        update a per-variable factor of TF1's) "the learning rate or Adam's bias correction"."""
        g = self._gradient_of(pair)
        if g is None or k == 0:
            return None
        if not g.use_values:  # statistics that prove nothing are no evidence that it agreed
            return None
        kept = pair.update_note  # each refresh's report asks again: kept while both pairs are
        if kept is not None and kept[0] is g and kept[1] == k and k < pair.done:
            note, noise = kept[2]
        else:
            earlier = self._earlier_gradients(pair, g, k)
            note, noise = (None, None) if earlier is None else self._update_note(g, *earlier)
            pair.update_note = (g, k, (note, noise))
        if note is None:
            return None
        skipped = self._unrecorded_update(k)
        if skipped is not None:  # read first: an update of one run was never recorded, no setting explains it
            return f"{note}; {skipped}"
        rows = self._unlooked_rows(pair, g, k)
        if rows is not None:  # read first: it says which rows and why, the rest below would not
            return f"{note}; {rows}"
        constrained = self._constrained(pair, k)
        if constrained is not None:  # a projection after the update: no optimizer setting explains it
            return f"{note}; {constrained}"
        momentum_only = self._momentum_only(g)
        adagrad = not momentum_only and self._adagrad_only(g)
        settings = (
            "compare the optimizers' settings ("
            + (
                "momentum, nesterov"
                if momentum_only
                # a helper's Adagrad port (initial_accumulator_value=1e-5 on both sides) was told of Adam's
                # epsilon and betas, RMSProp's start: TF1's Adagrad has no epsilon, Keras's has one
                else "epsilon: TF1's AdagradOptimizer has none, Keras's Adagrad adds 1e-7 (epsilon=) to the "
                "accumulator inside the square root, which moves the elements whose accumulator is small; "
                "initial_accumulator_value"
                if adagrad
                else "epsilon: TF1 Adam 1e-8, Keras 1e-7; betas, momentum, nesterov"
            )
            + ", weight decay"
            # a new user's RMSprop port with Keras's defaults, slots not recorded, was told of Adam alone
            + ("" if momentum_only or adagrad else "; a slot's start: TF1 RMSProp's mean square 1, Keras's 0")
            + ") and clipping between the recorded gradient and the update (clipnorm clips each "
            "variable by its own norm, clip_by_global_norm / global_clipnorm all by one)"
        )
        far = [(p, gap) for p, gap in slot_gaps if p.feeder is g and gap > g.tol.atol]
        if far:  # read first: the update's input differs, whatever the update's size
            slot, gap = far[0]
            if self._sums_rmsprop_steps(slot):
                # a helper's MobileNetV2 port kept Keras RMSprop's epsilon 1e-7 for TF1's 1.0 and was told of
                # the slot's rule, clipping or a decay, "not the step size", which is what this slot sums
                return (
                    f"{note}; yet its optimizer slot {slot.base.kind}/{slot.base.name} differs by {gap:.3g} at this "
                    "step, past atol and past what its gradient's differences allow: that slot is RMSProp's "
                    "momentum, which sums the steps themselves (lr g / sqrt(mean square + epsilon)), so what sets "
                    "a step's size feeds it: epsilon (TF1's RMSPropOptimizer 1e-10, Keras RMSprop 1e-7; MobileNet's "
                    "recipe 1.0), the learning rate, rho, momentum, the mean square's start (TF1 1, Keras 0), "
                    "clipping between the recorded gradient and the update, or a weight decay added to the gradient"
                )
            return (
                f"{note}; yet its optimizer slot {slot.base.kind}/{slot.base.name} differs by {gap:.3g} at this step, past atol and past what "
                "its gradient's differences allow: the update's input differs beyond rounding (what feeds the slot, "
                f"not the step size): the slot's own rule ({'momentum' if momentum_only else 'betas, rho, momentum'}), "
                "clipping between the recorded gradient and the update (clipnorm clips each variable by its own norm, "
                "clip_by_global_norm / global_clipnorm all by one), or a weight decay added to the gradient"
            )
        decay = self._decoupled_decay(pair, g, k)
        if decay is not None:  # its slots agree: the update's own term in the weight differs
            return f"{note}; {decay}"
        corrected = None if momentum_only else self._bias_correction(pair, g, k)
        if corrected is not None:  # its slots agree: the step's size is Adam's bias correction
            return f"{note}; {corrected}"
        ftrl = self._ftrl_constants(g, k)
        if ftrl is not None:  # its slots agree: only the rule's constants are left
            return f"{note}: {ftrl}"
        placed = self._rmsprop_epsilon_placed_otherwise(pair, g, k)
        if placed is not None:
            return f"{note}: {placed}"
        if noise is None:  # the update itself: what a port most often sets otherwise
            scale = self._update_scale(pair, k)
            if scale is None:
                return f"{note}: {settings}"
            causes = ["the learning rate as applied"]
            if not momentum_only:  # a momentum optimizer has no bias correction (a new user's nesterov port)
                causes.append(
                    "Adam's bias correction, which follows the optimizer's step count (a checkpoint restored "
                    "without the optimizer's iterations restarts it at 0; README: optimizer counters are not recorded)"
                )
            causes.append(
                "clipping between the recorded gradient and the update (clipnorm clips each variable by its own "
                "factor, global clipping all by one)"
            )
            if not momentum_only:  # a helper's Adadelta: its first update scales with sqrt(epsilon)
                causes.append(
                    f"an epsilon or a decay under a square root that sets the step's size (Adadelta's first "
                    f"updates scale with sqrt(epsilon / (1 - rho)): epsilon 1e-8 against 1e-7 gives {math.sqrt(10):.4g}, "
                    f"rho 0.95 against 0.9 gives {math.sqrt(0.5):.4g})"
                )
            return (
                f"{note}: the update is the baseline's times {scale:.4g} at every element (the same direction, "
                f"another size): {'; '.join(causes)}"
                + (_nesterov_hint(scale) if self._first_momentum_update(g, k) else "")
            )
        drift = self._largest_gap(pair)
        hold = (
            f"; ruled out, hold this tensor alone to its drift over the {drift[1]} steps both runs logged (at most "
            f"{drift[0]:.3g}): --override '{pair.base.kind}/{pair.base.name}:atol={_looser(drift[0]):g}'"
            if drift is not None
            else ""
        )
        return note + noise + hold + "; README: What counts as a divergence"

    def _gradient_recorded_elsewhere(self, pair: Pair, k: int) -> Optional[str]:
        """For a weight diverging after step 0 with no gradient of it recorded in either run, while the
        runs record other gradients and both record an optimizer's slot of it (an optimizer updates it):
        what moved it is not in these logs. A GAN's phases each on a recorder of their own record the
        generator's gradients in the generator's logdir only: a trial's discriminator logdir said DIVERGE
        at step 1 on the generator's bias before batch norm with no note, where the generator's logdir
        named the rounding noise Adam had turned into steps."""
        if k == 0 or self._gradient_of(pair) is not None:
            return None
        if not any(q.base.kind == "grad" for q in self._pairs):
            return None  # no gradient at all: the structure's lines say how to record them
        var = align.variable_of("weight", pair.base.name)
        if var is None:
            return None
        slots = [
            q.base.name
            for q in self._pairs
            if q.base.kind == "slot" and (align.variable_of("slot", q.base.name) or ("",))[0] == var[0]
        ]
        if not slots:
            return None
        return (
            f"neither run recorded its gradient here, though both record its optimizer's slots ({slots[0]}): the "
            "update that moved it was recorded in another logdir (a GAN's other phase, on a recorder of its own, "
            "where its gradient and the note on its update are) or its gradient was never recorded (record it: "
            "rec.minimize or rec.apply_gradients); compare where its gradient is recorded"
        )

    def _unrecorded_update(self, k: int) -> Optional[str]:
        """When, between the compared step before ``k`` and ``k``, one run logged steps that the other
        did not (None otherwise): the other's step count moved past them in updates it never recorded,
        so its weights at ``k`` hold an update more (or another) than the recorded steps show. A TF1
        hook that fetches the train op in every run it sees (``LoggingTensorHook`` given it, a hook's
        ``run_context.session.run(train_op)``) trains in an evaluation's ``sess.run`` too, which
        ``ParityHook`` does not record: a trial's such original was told to compare epsilon and
        clipping."""
        if k == 0:
            return None
        before, step = int(self.steps[k - 1]), int(self.steps[k])
        logged = []
        for run in (self.base, self.cand):
            steps = np.asarray(run.steps)
            logged.append(steps[(steps > before) & (steps < step)])
        for missing, other, extra in ((self.base, self.cand, logged[1]), (self.cand, self.base, logged[0])):
            own = np.diff(np.asarray(missing.steps))
            # only a run that logs every step otherwise: one logging every n steps skips these by design
            if len(extra) and not len(logged[0 if missing is self.base else 1]) and len(own) and np.median(own) == 1:
                listed = ", ".join(str(int(s)) for s in extra[:4]) + (", ..." if len(extra) > 4 else "")
                return (
                    f"'{missing.name}' did not record step {listed}, which '{other.name}' did, just before: its "
                    f"step count went from {before} to {step} in updates of which one was recorded, so a sess.run "
                    "that trained was not recorded (a hook that fetches the train op in every run it sees, "
                    "LoggingTensorHook given the train op or a hook's run_context.session.run(train_op), trains "
                    "in an evaluation's or an assign's run too; or a second sess.run of the train op), or the step "
                    "count moved otherwise; compare what each run's updates were between these steps"
                )
        return None

    def _not_applied(self, pair: Pair, k: int) -> Optional[str]:
        """For a gradient (or a slot fed by one) logged by one run only at compared step ``k``, whose
        weight both runs logged and held exactly still from ``k`` to the next compared step: no update
        of it was applied in either run there, so the one run computed it without applying it (None
        otherwise). A trial's two-phase fine-tuning, recorded on one recorder a side, diverged at step 0
        on the base's gradients, which TF1 fetched in the head-only phase and Keras did not compute."""
        g = pair if pair.base.kind == "grad" else pair.feeder
        if g is None or k + 1 >= len(self.steps):
            return None
        weights = self._weights_of(g)
        if len(weights) != 1:
            return None
        w = weights[0]
        now, nxt = w.step_values(k), w.step_values(k + 1)
        if now is None or nxt is None or not all(np.array_equal(a, b) for a, b in zip(now, nxt)):
            return None
        run = self.base.name if pair.ib[k] >= 0 else self.cand.name
        return (
            f"neither run moved {w.base.kind}/{w.base.name} from step {int(self.steps[k])} to step "
            f"{int(self.steps[k + 1])}: '{run}' recorded a {pair.base.kind} of a variable no update changed there "
            "(a phase that trains other variables: a TF1 recorder fetched with both phases' train ops records "
            "every gradient and both optimizers' slots at every step, Keras only what it trains; record each "
            "phase on a recorder of its own, README: a schedule that trains other variables in each phase)"
        )

    def _rmsprop_epsilon_placed_otherwise(self, pair: Pair, g: Pair, k: int) -> Optional[str]:
        """For a weight under RMSProp whose mean square is spelled ``rms`` (tf_keras's legacy RMSprop) in
        one run only, that run keeping no momentum, and whose slots agree at step ``k``: the legacy
        RMSprop without momentum adds epsilon outside the square root, TF1 (and tf_keras's current
        RMSprop) inside (None otherwise). A helper's port at epsilon 1 parted at step 1 (numpy) and was
        told the lr, Adam's bias correction, clipping or Adadelta's epsilon."""
        slots = self._slots_fed_by(g)
        sides = [[p.base.name for p in slots], [p.cand.name for p in slots]]
        legacy = [any(n.removesuffix(":0").rpartition("/")[2] == "rms" for n in names) for names in sides]
        if legacy[0] == legacy[1]:
            return None
        side = 0 if legacy[0] else 1
        if any(align.variable_and_role("slot", n)[2] == "m" for n in sides[side]):
            return None  # with momentum the legacy RMSprop puts epsilon inside, as TF1
        if self._update_scale(pair, k) is not None:
            # epsilon's place moves each element's step by its own factor (its mean square's): one factor
            # at every element is the lr's (a helper's port at twice TF1's lr, epsilon 1e-10 on both sides)
            return None
        if not self._all_agree_at(slots, k):
            return None
        run = (self.base.name, self.cand.name)[side]
        return (
            f"its slots agree at this step, and '{run}' runs tf_keras's legacy RMSprop without momentum (its mean "
            "square spelled rms), which adds epsilon outside the square root (lr g / (sqrt(ms) + epsilon)), where "
            "TF1's RMSPropOptimizer and tf_keras's RMSprop add it inside (lr g / sqrt(ms + epsilon)): the steps "
            "differ wherever the mean square is not far above epsilon (use tf.keras.optimizers.RMSprop, or compare "
            "epsilon, the lr and clipping)"
        )

    def _unlooked_rows(self, pair: Pair, g: Pair, k: int) -> Optional[str]:
        """When each element of ``pair`` out of tolerance at step ``k`` had a gradient of exactly 0 in
        both runs at the step before (the update into ``k``: a row of an embedding that batch did not
        look up), one run left every such element where it was and the other moved each of them:
        one optimizer updates a sparse gradient's looked-up rows only (None otherwise). TF1's
        ``MomentumOptimizer`` applies an ``IndexedSlices`` gradient with ``SparseApplyMomentum``, and
        Keras's ``SGD(momentum=...)`` decays and applies every row's velocity: a helper's bi-GRU port,
        faithful in float64 but for this, was told the slot's rule, clipping or a weight decay."""
        if k == 0 or int(self.steps[k - 1]) != int(self.steps[k]) - 1:
            return None
        out = self._elements_out(pair, k)
        now, was, grad = pair.step_values(k), pair.step_values(k - 1), g.step_values(k - 1)
        if out is None or not len(out) or now is None or was is None or grad is None:
            return None
        if len(grad[0]) != len(now[0]) or grad[0][out].any() or grad[1][out].any():
            return None
        # each was looked up before (a momentum to carry): a gradient 0 at every step is a decay's
        looked_up = np.zeros(len(out), bool)
        for j in range(k - 1):
            e = g.step_values(j)
            if e is not None and len(e[0]) == len(grad[0]):
                looked_up |= e[0][out] != 0
        if not looked_up.all():
            return None
        kept = [bool(np.array_equal(w[out], w0[out])) for w, w0 in zip(now, was)]
        moved = [bool(np.all(w[out] != w0[out])) for w, w0 in zip(now, was)]
        if not ((kept[0] and moved[1]) or (kept[1] and moved[0])):
            return None
        still, other = (self.base.name, self.cand.name) if kept[0] else (self.cand.name, self.base.name)
        # either run may be the one that keeps the rows: a TF1 original with one-hot embeddings (a dense
        # gradient, every row's momentum applied) against a port under tf.keras.optimizers.legacy.SGD
        # (sparse momentum) was told to update the looked-up rows alone, which its port already did
        return (
            f"each of them had a gradient of exactly 0 in both runs at step {int(self.steps[k - 1])} (a row that "
            f"batch did not look up, an embedding's), and '{still}' left every one where it was while '{other}' "
            f"moved each: '{still}' updates a sparse gradient's looked-up rows only, '{other}' every row. TF1's "
            "MomentumOptimizer (and RMSProp, Ftrl) and tf.keras.optimizers.legacy.SGD(momentum=...) apply an "
            "embedding lookup's gradient (tf.IndexedSlices) so, neither the accumulator nor the weight of another "
            "row moving, where Keras's SGD(momentum=...) decays and applies every row's velocity, as any momentum "
            "does for a dense gradient (a one-hot matmul embedding: TF1's use_one_hot_embeddings=True): the runs "
            "match only under one rule (an SGD subclass's update_step updating a tf.IndexedSlices' looked-up rows "
            "alone, TF1's sparse rule; or a dense gradient, or Keras's SGD, on both sides)"
        )

    def _largest_gap(self, pair: Pair) -> Optional[tuple[float, int]]:
        """(largest finite |c - b| of ``pair`` over every compared step both runs kept full values at,
        how many such steps): what an override for that tensor alone must allow (a new user's
        attention key bias, whose gradient softmax cancels, drifted to 5.2e-4 by step 23 under Adam)."""
        if not pair.use_values:
            return None
        rows = np.flatnonzero((pair.ib >= 0) & (pair.ic >= 0))
        if not len(rows):
            return None
        n = min(pair.base.values.shape[1], pair.cand.values.shape[1])
        b = take_rows(pair.base.values, pair.ib[rows])[:, :n].astype(np.float64)
        c = take_rows(pair.cand.values, pair.ic[rows])[:, :n].astype(np.float64)
        with np.errstate(invalid="ignore"):
            gap = np.where(np.isfinite(b) & np.isfinite(c), np.abs(c - b), 0.0).max(initial=0.0)
        return float(gap), len(rows)

    def _sums_rmsprop_steps(self, slot: Pair) -> bool:
        """Whether ``slot`` is RMSProp's momentum in either run, which sums each step (lr g / sqrt(ms +
        epsilon)) rather than the gradient: TF1's ``RMSProp_1`` (``RMSProp_2`` when centered), tf_keras's
        ``momentum/<variable>``, the legacy RMSprop's ``<variable>/momentum`` beside its ``rms``."""
        for run, name in ((self.base, slot.base.name), (self.cand, slot.cand.name)):
            bare = name.removesuffix(":0")
            if bare.startswith("momentum/") or bare.endswith("/RMSProp_2"):
                return True
            slots = [n for kind, n in run.tensors if kind == "slot"]
            if bare.endswith("/RMSProp_1"):
                return bare[: -len("/RMSProp_1")] not in align.centered_rmsprop(slots)
            if bare.endswith("/momentum") and any(
                n.removesuffix(":0") == bare[: -len("momentum")] + "rms" for n in slots
            ):
                return True
        return False

    def _momentum_only(self, g: Pair) -> bool:
        """Whether the slots ``g`` feeds are momentum's alone (a summing first moment, no second
        moment: not Adam, whose bias correction gives a factor of the same size)."""
        rules = [align.slot_rule(p.base.name, p.cand.name) for p in self._slots_fed_by(g)]
        return any(rule == (1, False) for rule in rules) and not any(power == 2 for power, _ in rules)

    def _adagrad_only(self, g: Pair) -> bool:
        """Whether the one slot ``g`` feeds is an accumulator of squared gradients alone: Adagrad's
        (TF1 ``<variable>/Adagrad``, Keras ``accumulator``; Ftrl's has a linear term beside it)."""
        fed = self._slots_fed_by(g)
        return len(fed) == 1 and align.variable_and_role("slot", fed[0].base.name)[2] == "accumulator"

    def _first_momentum_update(self, g: Pair, k: int) -> bool:
        """Whether the update into compared step ``k`` was the first with momentum: the slots ``g``
        feeds are momentum's alone and were all 0 on both sides at the step before (a review: the
        Nesterov hint fired at a later update, where the records rule Nesterov's 1 + momentum out)."""
        if not self._momentum_only(g):
            return False
        before = [p.step_values(k - 1) for p in self._slots_fed_by(g)]
        return bool(before) and all(b is not None and not np.any(b[0]) and not np.any(b[1]) for b in before)

    def _update_note(self, g: Pair, grads: list[np.ndarray], out: Optional[np.ndarray]) -> tuple[str, Optional[str]]:
        """:meth:`_moved_by_the_update`'s note, from the gradient's values at the earlier steps
        (:meth:`_earlier_gradients`: at the elements out of tolerance ``out``, when known), and what
        it adds when those gradients stayed below atol (None when they did not)."""
        if out is not None:
            what = f"the {len(out)} elements out of tolerance" if len(out) > 1 else "the element out of tolerance"
        else:  # every element, the finite ones as a tensor's min and max are
            what = "its elements"
            grads = [np.where(np.isfinite(a), a, 0.0) for a in grads]
        largest = max(float(np.abs(a).max(initial=0.0)) for a in grads)
        note = (
            f"its gradient {g.base.kind}/{g.base.name} agreed element-wise at every earlier step: the update "
            f"that moved it differs; {what} had gradients of at most {largest:.3g} there"
        )
        noise = None
        if largest == 0.0:  # nothing for an optimizer to amplify (a review's: called noise under momentum)
            note += (
                ", exactly 0 in both runs: no gradient moved those elements, the update's own rule did (a weight "
                "decay, decoupled or added to the gradient, on one side only)"
            )
        elif largest < g.tol.atol:
            noise = (
                f", below atol {g.tol.atol:g}: likely rounding noise (a gradient 0 in exact math: a bias right "
                "before batch normalization, an attention key's bias, which softmax cancels; or an embedding row "
                "seldom looked up), which an adaptive optimizer (Adam, RMSprop, Adagrad) turns "
                "into steps near its learning rate, so faithful runs drift apart there, and so does a small real "
                "difference in what those gradients came from (a normalization layer's epsilon). Check the "
                "optimizer's epsilon first (TF1 Adam 1e-8, Keras 1e-7), then Adam's betas (tf_keras Adam "
                "decays v by 1 - beta_2 of the Python float, TF1 by 1 - beta_2 rounded to float32, 1.3e-5 of "
                "itself apart from the first step: Adam(beta_1=float(np.float32(0.9)), "
                "beta_2=float(np.float32(0.999))) decays as TF1 does), then the layers' (Keras "
                "LayerNormalization and BatchNormalization 1e-3)"
            )
        return note, noise

    def _noise_fed(self, pair: Pair, k: int) -> Optional[str]:
        """For a slot diverging at step ``k`` whose gradient (its elements out of tolerance, when
        known) stayed below the gradient's atol at every earlier step, compared element-wise: that
        it sums rounding noise. A new user's faithful port diverged at step 3 on the momentum of a
        bias right before batch normalization, 2.6e-8 apart, every other tensor agreeing, and
        nothing said why."""
        g = pair.feeder
        if g is None or not g.use_values or k == 0:
            return None
        earlier = self._earlier_gradients(pair, g, k)
        if earlier is None:
            return None
        grads = earlier[0]
        largest = max(float(np.abs(a).max(initial=0.0)) for a in grads)
        apart = float(np.abs(grads[1] - grads[0]).max(initial=0.0))
        # noise: below atol, and apart by a good share of itself (a small gradient computed alike is
        # 1e-6 of itself apart, and a slot that parts from it has another rule, not noise)
        if not (largest < g.tol.atol and apart >= 0.01 * largest):
            return None
        zero = [side for side, a in zip(("baseline", "candidate"), grads) if not np.any(a)]
        if len(zero) == 1:  # a helper's stop_gradient on one bias: exactly 0 is no rounding noise
            return (
                f"its gradient {g.base.kind}/{g.base.name} stayed below atol {g.tol.atol:g} at every earlier step, "
                f"and is exactly 0 in the {zero[0]} only (at most {largest:.3g} in the other): not rounding noise; "
                "a gradient that does not reach the variable on one side (a stop_gradient, a frozen or detached "
                "variable, a term left out of the loss)"
            )
        return (
            f"its gradient {g.base.kind}/{g.base.name} stayed below atol {g.tol.atol:g} at every earlier step (at "
            f"most {largest:.3g}): rounding noise (a gradient 0 in exact math: a bias right before batch "
            "normalization, an attention key's bias), which a momentum or moving average sums past the slot's own "
            "tolerance on faithful ports; drop that bias on both sides (use_bias=False) or loosen this slot with "
            "--override"
        )

    def _skipped_update(self, pair: Pair, k: int) -> Optional[str]:
        """For a gradient non-finite in one run at step ``k`` whose loss there is finite and whose every
        recorded weight is unchanged at the next compared step, element for element, while the other
        run's weights moved: that run skipped the update, as a ``LossScaleOptimizer`` does when the scaled
        gradients overflow float16 (None otherwise). A new user's faithful ``mixed_float16`` port, its
        dynamic loss scale starting at 2**15, skipped steps 0 and 1, and the verdict said only that its
        gradients turned non-finite, as if the port's math produced inf."""
        if pair.base.kind != "grad" or k + 1 >= len(self.steps):
            return None
        weights = [p for p in self._pairs if p.base.kind == "weight"]
        losses = [p for p in self._pairs if p.base.kind == "loss"]
        if not weights or not losses:
            return None
        for side, other in (("cand", "base"), ("base", "cand")):
            if _rows(pair, side)[k] < 0 or _finite_at(pair, side, k):  # recorded there, and not finite
                continue
            if not all(_finite_at(q, side, k) for q in losses):
                continue
            if all(_unchanged(q, side, k) is True for q in weights) and any(
                _unchanged(q, other, k) is False for q in weights
            ):
                run, applied = (self.cand, self.base) if side == "cand" else (self.base, self.cand)
                nxt = int(self.steps[k + 1])
                cause, remedy = "not an inf of the model's math", ""
                later = [j for j in range(k + 1, len(self.steps)) if _rows(pair, side)[j] >= 0]
                if later and not any(_finite_at(pair, side, j) for j in later):
                    # an overflow ends as the scale halves at each skip; a NaN of the port's math does not: a
                    # group-lasso penalty without its epsilon, sqrt(sum(b**2)) at a zero bias, skipped every
                    # step and was told of an overflow, "not an inf of the model's math"
                    cause = (
                        "or on any NaN or inf of the model's math: this gradient stays non-finite at every later "
                        f"step recorded (through step {int(self.steps[later[-1]])}), which an overflow does only until the "
                        "halved scale fits it, so the longer it lasts, the likelier the model's math (a sqrt or "
                        "norm at 0, a log of 0, a division by 0)"
                    )
                    remedy = ", or run the port without the policy: a gradient non-finite there is the model's math"
                return (
                    f"'{run.name}' has non-finite gradients at this step while its loss is finite, and every weight "
                    f"it recorded is unchanged at step {nxt}, element for element: it skipped this update, as a "
                    "LossScaleOptimizer does when the scaled gradients overflow float16 (mixed precision's dynamic "
                    "loss scale starts at 2**15 and halves at each skip, so a faithful port's first steps often "
                    f"skip), {cause}; '{applied.name}' applied its update, so the weights "
                    f"differ by it from step {nxt} on. To compare the training, start the scale below the overflow "
                    f"(LossScaleOptimizer(opt, initial_scale=...)){remedy}; README: Mixed precision"
                )
        return None

    def _jump_from_agreeing_inputs(self, pair: Pair, k: int) -> Optional[str]:
        """For a gradient whose error ratio at step ``k`` is at least :data:`JUMP_FACTOR` times its
        largest at every earlier step both runs logged, while every weight, state and slot both
        recorded at ``k``, the loss and every recorded output, agree: the difference arises inside the step from agreeing
        inputs, which a ReLU-like unit at its kink does when no activation is recorded to show it
        (:mod:`kinks` names the unit when one is). New users' faithful ResNet ports (a conv's bias
        and batch norm, Momentum, 100 steps, float64 replays bit-equal) diverged so on a kernel's
        gradient at steps 6, 19 and 42 with no note, one unit flipping at its kink. A gradient compared
        by statistics only (an embedding table's) shows that elements moved, not how many: it is told
        so through the gradient nearest the kink, compared element-wise (a new user's faithful port,
        one hidden unit 6e-8 from 0, diverged first on its table's gradient with no note)."""
        if k == 0 or self._rows_cut_off(pair, k) is not None:
            return None
        by_values = pair.by_values_at(k)
        few = self._moved_share(pair, k) if by_values else None
        jump = self._jump(pair, k)
        if (by_values and few is None) or jump is None:
            return None
        now, before = jump
        nearest = None
        if few is None or few > JUMP_FEW:
            # a unit at its kink moves the elements it feeds, not all, of the gradient nearest it; the
            # backward pass carries that to every element of the gradients before it (a helper's
            # faithful ResNet: one unit of its last block flipped and moved 3 % of that block's
            # gradients, 82 % of the first conv's, which came first and got no note)
            local = []
            for p in self._pairs:
                if p is pair or p.base.kind != "grad" or not p.by_values_at(k) or p.ib[k] < 0 or p.ic[k] < 0:
                    continue
                if metadata.sample_parent(p.base.name) == pair.base.name:  # its own elements, not the nearest
                    continue
                p.ensure(k + 1, self.policy.equal_nan)
                share = self._moved_share(p, k)
                if p.reason[k] == VALUE and share is not None and share <= JUMP_FEW and self._jump(p, k):
                    local.append((share, p))
            if not local:
                return None
            nearest = min(local, key=lambda t: t[0])
        weights, rounded = 0, []
        for p in self._pairs:
            # a recorded output apart at this step is a forward pass that differs, which a unit at its
            # kink (its output moved by rounding) does not make: a helper's port that looked up another
            # row for one id had its embedding output apart, and its gradients were told of a kink
            if p.base.kind not in _FORWARD_AND_STATE or p.ib[k] < 0 or p.ic[k] < 0:
                continue
            p.ensure(k + 1, self.policy.equal_nan)
            if p.reason[k] != OK:
                return None
            weights += p.base.kind == "weight"
            both = p.step_values(k) if p.base.kind == "weight" else None
            if both is not None and np.any(both[0] != both[1]):
                rounded.append((_ulps_of_max(*both), p.base.name))
        if not weights:
            return None
        moved = (
            f"Only {few:.2%} of its elements moved"
            if nearest is None
            else (
                "Its statistics show that elements moved, not how many"
                if few is None
                else f"{few:.2%} of its elements moved"
            )
            + f", but only {nearest[0]:.2%} of those of {nearest[1].base.name}, "
            "which also jumped: a unit at its kink moves a few elements of the gradient nearest it, and the "
            "backward pass carries that to every element of the gradients before it"
        )
        both = pair.step_values(k)
        if (
            rounded
            and max(rounded)[0] <= ROUNDED_WEIGHT_ULPS
            and both is not None
            and math.isfinite(_ulps_of_max(*both))
        ):
            # weights apart by rounding alone: a model whose gradients are large carries that rounding into
            # them (a faithful keras.applications MobileNetV2 port, one depthwise weight 1 ulp apart at step
            # 1 after its ZeroPadding2D + 'valid' convolution's own rounding, had the first conv's gradient
            # of 22 apart by 10 ulps of it), which a rerun or op determinism reproduces
            ulps, name = max(rounded)
            return (
                f"every weight, state and slot both runs recorded agrees at this step, and the loss, while this "
                f"gradient's error ratio jumps to {now:.3g} from at most {before:.3g} at the steps before; but the "
                f"weights are not bit-equal: {len(rounded)} recorded with full values "
                f"{'differs' if len(rounded) == 1 else 'differ'} by float32 rounding alone (at most {ulps:.2g} ulps "
                f"of its largest |element|, {name}), and this gradient's largest "
                f"difference is {_ulps_of_max(*both):.3g} float32 ulps of its largest |element| "
                f"({float(np.abs(both[0]).max()):.3g}): float32 rounding carried through the step into a gradient "
                "this large (its sums reordered, or a ReLU-like unit at its kink). A rerun or "
                "tf.config.experimental.enable_op_determinism() reproduces it, the weights being apart already; "
                f"to tell it from the port, compare both runs from the same weights at this step. {moved}."
            )
        return (
            f"every weight, state and slot both runs recorded agrees at this step, and the loss, while this gradient's "
            f"error ratio jumps to {now:.3g} from at most {before:.3g} at the steps before: a difference "
            "that arises inside this step from agreeing inputs, as a ReLU-like unit at its kink makes it (float "
            "rounding decides whether the gradient flows through it); record the activations before it with full "
            "values (a unit at its kink is then named), run both sides again to see whether it recurs at this step, "
            f"or compare with tf.config.experimental.enable_op_determinism() on both sides. {moved}; a port's own "
            "difference that first acts at this step (a threshold first reached, a schedule not recorded) would "
            "show so too, so see whether it recurs"
        )

    def _backward_differs(self, pair: Pair, k: int) -> Optional[str]:
        """For a gradient compared by values at step ``k``, past :data:`BACKWARD_RATIO`, while every
        weight, state, slot, recorded output and the loss both runs recorded at ``k`` agree (a weight
        and the loss among them): what is recorded of the forward pass agrees and the gradient does not
        (a term of the minimised loss the recorded one leaves out, or the backward pass). New users'
        ports with a stop_gradient on one use of a shared siamese tower, and on the tied use of an
        embedding, diverged at step 0 on the gradients with no note."""
        if not pair.by_values_at(k):
            return None
        ratio = pair.finding(k, self.policy.equal_nan).get("error_ratio")
        if ratio is None or not ratio >= BACKWARD_RATIO:
            return None
        kinds = set()
        for p in self._pairs:
            if p.base.kind not in _FORWARD_AND_STATE or p.ib[k] < 0 or p.ic[k] < 0:
                continue
            p.ensure(k + 1, self.policy.equal_nan)
            if p.reason[k] != OK:
                return None
            kinds.add(p.base.kind)
        if not {"weight", "loss"} <= kinds:
            return None
        both = pair.step_values(k)
        none = None
        whole = self._sampled_whole(pair, k)
        if whole is not None:
            # a sample holds 256 of the gradient's elements: its zeros say nothing of the whole (a trial's
            # wide table, its crossed ids hashed to other buckets in the port, was told "the whole gradient is
            # exactly 0" in the port); the whole's statistics say whether it is all 0, or the same values
            moved = self._moved_elsewhere(whole, k, both)
            if moved:
                return moved
            for run, mine, theirs in (
                (self.base.name, whole.base, whole.cand),
                (self.cand.name, whole.cand, whole.base),
            ):
                zero = [_all_zero(s.stats[int(i[k])]) for s, i in ((mine, whole.ib), (theirs, whole.ic))]
                if zero[0] and not zero[1]:
                    none = run
        elif both is not None:
            for run, mine, theirs in ((self.base.name, *both), (self.cand.name, *both[::-1])):
                if mine.size and not np.any(mine) and np.any(theirs):
                    none = run
        cut = None if none is not None or whole is not None else self._rows_cut_off(pair, k)
        rows = (
            f"the whole gradient is exactly 0 in '{none}' alone: no gradient reaches this weight there (a custom "
            "gradient or straight-through estimator that returns zeros where the other passes the gradient on, a "
            "stop_gradient on each of its uses); "
            if none is not None
            else ""
            if cut is None
            else f"its rows out of tolerance ({', '.join(map(str, cut[1][:5]))}{', ...' if len(cut[1]) > 5 else ''}; "
            f"{len(cut[1])} of them) are exactly 0 in '{cut[0]}' alone, the rest agreeing: '{cut[0]}' takes no "
            "gradient into them (a frozen row, a stop_gradient or tf.where on the positions that look them up); "
        )
        # the recorded loss need not be the loss minimised: a new user's custom-loop port left out
        # sum(model.losses) (an L1 kernel regularizer) where TF1 minimised the data loss plus
        # get_regularization_loss() and recorded the data loss; told "the forward pass agrees", it
        # was sent to stop_gradients
        return rows + (
            "every weight, recorded output and the recorded loss agree at this step while this gradient differs: "
            "what is recorded of the forward pass agrees and the gradient does not; a term of the loss one run "
            "minimises that the recorded loss leaves out (a custom loop's loss without sum(model.losses): a "
            "kernel or activity regularizer, add_loss; TF1's data loss recorded while "
            "get_regularization_loss() or an auxiliary head's loss is added to what it minimises), a "
            "stop_gradient (or a frozen or detached use of "
            "the variable) in one run, a weight used more than once (a shared tower, a tied embedding) whose "
            "gradient one run takes from fewer of its uses (a shared weight's gradient is the sum over them), a "
            "custom gradient, or a loss of the same value and another gradient (a clip_by_value, a tf.where); "
            "a ReLU-like unit exactly at its kink moves a few elements so too"
        )

    def _sampled_whole(self, pair: Pair, k: int) -> Optional[Pair]:
        """The pair of the tensor whose element sample ``pair`` is, logged by both runs at ``k``, else None."""
        parent = metadata.sample_parent(pair.base.name)
        if parent is None:
            return None
        for p in self._pairs:
            if p.base.kind == pair.base.kind and p.base.name == parent and p.ib[k] >= 0 and p.ic[k] >= 0:
                return p
        return None

    def _moved_elsewhere(self, whole: Pair, k: int, sampled: Optional[tuple[np.ndarray, np.ndarray]]) -> Optional[str]:
        """When a tensor's sample differs at ``k`` while the whole tensor's statistics, which no order of
        its elements changes (the counts of negative, zero and positive elements, min, max, mean, std,
        L2), agree to float32 rounding and are not all 0: the same values at other positions. An
        embedding's gradient so is the rows a batch looks up being other rows in one run: a trial's wide
        table whose crossed ids the port hashed with ``HashedCrossing`` where TF1 hashed the joined string
        with ``string_to_hash_bucket_fast`` (its outputs and loss agree while the table starts at 0).
        Only when the sampled elements' own change (``sampled``, their values in each run) would move the
        whole's sum or sum of squares past that rounding: statistics it cannot move say nothing of where the
        values are (one element of a million 30% larger in one run was told "likely the same values at
        other positions")."""
        b, c = whole.base.stats[int(whole.ib[k])], whole.cand.stats[int(whole.ic[k])]
        if sampled is None:
            return None
        slack = _SAME_STAT_ULPS * np.finfo(np.float32).eps
        sb, sc = (np.asarray(v, np.float64) for v in sampled)
        size, l2 = float(b[_IDX["size"]]), float(b[_IDX["l2"]])
        spread = max(abs(float(b[_IDX["mean"]])), float(b[_IDX["std"]]))
        if (
            abs(float(np.sum(sc * sc - sb * sb))) <= 2 * slack * l2 * l2
            and abs(float(np.sum(sc - sb))) <= slack * spread * size
        ):
            return None
        if b[_IDX["size"]] != c[_IDX["size"]] or _all_zero(b) or _all_zero(c):
            return None
        if any(b[_IDX[n]] != c[_IDX[n]] for n in _COUNTS):
            return None
        for n in _ORDER_FREE:
            x, y = float(b[_IDX[n]]), float(c[_IDX[n]])
            if not abs(x - y) <= _SAME_STAT_ULPS * np.finfo(np.float32).eps * max(
                abs(x), abs(y), float(b[_IDX["std"]])
            ):
                return None
        return (
            f"the whole of {whole.base.name} has the same statistics in both runs at this step (its counts of "
            "negative, zero and positive elements, min, max, mean, std and L2, which no order of its elements "
            "changes), while its sampled elements differ: likely the same values at other positions. In an embedding's "
            "gradient that is the batch looking up other rows in each run: ids mapped to other rows (another "
            "hash function, e.g. tf.keras.layers.HashedCrossing or Hashing with a salt against "
            "string_to_hash_bucket_fast of a joined string; another vocabulary, OOV or mask index; an id offset), "
            "or a table laid out in another order; the outputs it feeds agree where the rows it reads hold the "
            "same values in both runs (a table that starts at 0) and part once they differ"
        )

    def _rows_cut_off(self, pair: Pair, k: int) -> Optional[tuple[str, list[int]]]:
        """(the run, the rows) when every element of a 2-D gradient out of tolerance at step ``k`` lies in
        a row that is exactly 0 in that run alone, the same run for each: the gradient is cut off at
        those rows there (a frozen or masked embedding row), which a unit at its kink does not do (it
        moves the part of each row that flowed through it). A helper's port that froze one embedding
        row with a tf.where had its table's gradient told of a kink at the step that looked it up."""
        shape = tuple(pair.base.shape)
        both = pair.step_values(k)
        out = self._elements_out(pair, k)
        if len(shape) != 2 or None in shape or both is None or out is None or not len(out):
            return None
        if len(both[0]) != shape[0] * shape[1] or len(both[1]) != len(both[0]):
            return None
        b, c = (np.asarray(v).reshape(shape) for v in both)
        rows = np.unique(out // shape[1])
        zero = [~np.any(v[rows] != 0, axis=1) for v in (b, c)]
        for side, name in ((0, self.base.name), (1, self.cand.name)):
            if zero[side].all() and not zero[1 - side].any():
                return name, [int(r) for r in rows]
        return None

    def _moved_share(self, pair: Pair, k: int) -> Optional[float]:
        """The share of a gradient's elements out of tolerance at ``k`` among those either run holds
        non-zero, or None. An element both hold at exactly 0 (an embedding's row no sample looked up)
        cannot move: counted, an embedding's gradient moved at every row it holds looked moved at 6 %
        of its elements, as a unit at its kink moves its gradient, and lent the kink note to a
        kernel's gradient moved at every element."""
        found = pair.finding(k, self.policy.equal_nan).get("mismatch_fraction")
        if found is None:
            return None
        few = float(found)
        values = pair.step_values(k)
        if values is None:
            return few
        b, c = values
        held = int(np.count_nonzero((b != 0) | (c != 0)))  # elements 0 in both agree: the moved are among these
        return min(1.0, few * b.size / held) if held else few

    def _jump(self, pair: Pair, k: int) -> Optional[tuple[float, float]]:
        """(its error ratio at ``k``, its largest at the steps before) when the first is at least
        :data:`JUMP_FACTOR` times the second; None otherwise."""
        pair.ensure_ratios(k + 1)
        earlier = np.asarray(pair.ratio[:k], dtype=np.float64)
        earlier = earlier[np.isfinite(earlier)]
        now = float(pair.ratio[k])
        if not len(earlier) or not np.isfinite(now) or now < JUMP_FACTOR * float(earlier.max()):
            return None
        return now, float(earlier.max())

    def _update_scale(self, pair: Pair, k: int) -> Optional[float]:
        """The one factor, not 1, by which the candidate's update of a weight from the step before
        ``k`` to ``k`` is the baseline's at every element it moved (None otherwise). A new user's
        port restored Adam's slots but not its step count: every weight's update was 1.9531 times
        TF1's, which is the ratio of the two bias corrections, and the note listed epsilon."""
        if k == 0 or int(self.steps[k - 1]) != int(self.steps[k]) - 1:
            return None
        now, before = pair.step_values(k), pair.step_values(k - 1)
        if now is None or before is None or len(now[0]) != len(before[0]):
            return None
        (nb, nc), (bb, bc) = ((np.asarray(x, np.float64) for x in both) for both in (now, before))
        # each difference of two float32 weights carries their rounding: 1e-5 updates of weights
        # near 0.1 are 6e-4 apart in ratio from rounding alone
        rounding = (2.0**-23 * (np.abs(nb) + np.abs(bb)), 2.0**-23 * (np.abs(nc) + np.abs(bc)))
        return _uniform_scale(nb - bb, nc - bc, pair.tol.atol, rounding)


def _ulps_of_max(b: np.ndarray, c: np.ndarray) -> float:
    """``max |c - b|`` in float32 ulps (2**-23) of ``b``'s largest |element|."""
    scale = float(np.abs(np.asarray(b, np.float64)).max(initial=0.0))
    diff = float(np.abs(np.asarray(c, np.float64) - np.asarray(b, np.float64)).max(initial=0.0))
    return diff / (scale * 2.0**-23) if scale else math.inf


#: A gradient this many times past its tolerance with the whole forward pass agreeing is a backward
#: pass that differs (``_backward_differs``): far past what rounding amplified reaches (ratios under 2).
BACKWARD_RATIO = 10.0
#: What the forward pass reads and computes: agreeing at a step, a gradient there is the backward's.
_FORWARD_AND_STATE = frozenset({"weight", "state", "slot", "loss", "activation", "output"})
#: How many times its largest earlier error ratio a gradient's must jump to be told it arose inside
#: the step (``Comparison._jump_from_agreeing_inputs``): a unit flipping at its kink moved faithful
#: ResNet ports' kernel gradients about 100x their earlier gap in one step.
JUMP_FACTOR = 10.0


#: ...and the largest share of its elements out of tolerance there: one unit's flip moved 0.3-8 % of
#: those faithful ResNets' kernel gradients; a clipping first reached moves all of them.
JUMP_FEW = 0.5


def _nesterov_hint(scale: float) -> str:
    """For an update ``scale`` times the baseline's: ``1 + mu`` (or its inverse) is what Nesterov
    momentum ``mu`` on one side only gives on the first update, whose accumulator is that step's
    gradient (a new user's ``nesterov=True`` showed 1.9, and the note named Adam)."""
    if scale > 1.0:
        mu, form, side = scale - 1.0, "1 + {mu}", "the candidate"
    else:
        mu, form, side = 1.0 / scale - 1.0, "1 / (1 + {mu})", "the baseline"
    if not 0.0 < mu < 1.0:
        return ""
    return (
        f"; on this first update with momentum, {scale:.4g} = {form.format(mu=f'{mu:.3g}')} is what Nesterov "
        f"momentum {mu:.3g} on {side} only gives (nesterov=True)"
    )


def _rows(pair: Pair, side: str) -> np.ndarray:
    rows: np.ndarray = pair.ic if side == "cand" else pair.ib
    return rows


def _finite_at(pair: Pair, side: str, k: int) -> bool:
    """Whether ``side``'s tensor of ``pair`` is recorded at compared step ``k`` with no NaN/Inf."""
    row = int(_rows(pair, side)[k])
    series = pair.cand if side == "cand" else pair.base
    return row >= 0 and not (series.stats[row][NONFINITE_COLS] != 0).any()


def _unchanged(pair: Pair, side: str, k: int) -> Optional[bool]:
    """Whether ``side``'s tensor of ``pair`` holds the same elements at compared steps ``k`` and
    ``k + 1`` (by full values; by every statistic where the values are not kept); None where
    either step is not recorded."""
    rows = _rows(pair, side)
    if rows[k] < 0 or rows[k + 1] < 0:
        return None
    now, nxt = pair.values_at(side, int(rows[k])), pair.values_at(side, int(rows[k + 1]))
    if now is not None and nxt is not None:
        return bool(now.shape == nxt.shape and np.array_equal(now, nxt))
    series = pair.cand if side == "cand" else pair.base
    return bool(np.array_equal(series.stats[int(rows[k])], series.stats[int(rows[k + 1])], equal_nan=True))


def _stats_held(pair: Pair, side: int, k: int) -> bool:
    """Whether ``pair``'s tensor on ``side`` (0 baseline, 1 candidate) has the same statistics at every
    compared step up to ``k`` it was recorded at (NaN equal to NaN): held still, as far as they tell."""
    rows = (pair.ic if side else pair.ib)[: k + 1]
    rows = rows[rows >= 0]
    stats = (pair.cand if side else pair.base).stats[rows]
    return bool(len(rows) and np.array_equal(stats, np.broadcast_to(stats[0], stats.shape), equal_nan=True))
