"""Notes on weights, slots and gradients: an update that differs (its scale, its momentum, an
average), a slot fed by another gradient or started otherwise, rounding amplified, a decay term,
a gradient that jumps from agreeing inputs."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

from tb_parity_plugin.engine import align, allclose, kinks
from tb_parity_plugin.engine.matrix import ABSENT, OK, VALUE
from tb_parity_plugin.engine.notes.context import (
    _MOMENTUM,
    NoteContext,
    _decay_factor,
    _looser,
    _one_value,
    _scalar_at,
)
from tb_parity_plugin.engine.pair import NONFINITE_COLS, Pair, take_rows
from tb_parity_plugin.engine.tolerance import (
    GRAD_NOISE_OF_MAX,
    OUTPUT_ATOL_OF_MAX,
)
from tb_parity_plugin.records import metadata


class UpdateNotes(NoteContext):
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
            "default; ema_overwrite_frequency=None keeps the weights), or its code assigns them"
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
        settings = (
            "compare the optimizers' settings ("
            + (
                "momentum, nesterov"
                if momentum_only
                else "epsilon: TF1 Adam 1e-8, Keras 1e-7; betas, momentum, nesterov"
            )
            + ", weight decay"
            # a new user's RMSprop port with Keras's defaults, slots not recorded, was told of Adam alone
            + ("" if momentum_only else "; a slot's start: TF1 RMSProp's mean square 1, Keras's 0")
            + ") and clipping between the recorded gradient and the update (clipnorm clips each "
            "variable by its own norm, clip_by_global_norm / global_clipnorm all by one)"
        )
        far = [(p, gap) for p, gap in slot_gaps if p.feeder is g and gap > g.tol.atol]
        if far:  # read first: the update's input differs, whatever the update's size
            slot, gap = far[0]
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

    def _all_agree_at(self, pairs: Sequence[Pair], k: int) -> bool:
        """Whether each of ``pairs`` was logged by both runs at compared step ``k`` and agrees there."""
        for p in pairs:
            p.ensure(k + 1, self.policy.equal_nan)
            if p.ib[k] < 0 or p.ic[k] < 0 or p.reason[k] != OK:
                return False
        return True

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

    def _slots_fed_by(self, g: Pair) -> list[Pair]:
        """The slot pairs gradient pair ``g`` feeds (``Pair.feeder``)."""
        return [p for p in self._pairs if p.base.kind == "slot" and p.feeder is g]

    def _momentum_only(self, g: Pair) -> bool:
        """Whether the slots ``g`` feeds are momentum's alone (a summing first moment, no second
        moment: not Adam, whose bias correction gives a factor of the same size)."""
        rules = [align.slot_rule(p.base.name, p.cand.name) for p in self._slots_fed_by(g)]
        return any(rule == (1, False) for rule in rules) and not any(power == 2 for power, _ in rules)

    def _first_momentum_update(self, g: Pair, k: int) -> bool:
        """Whether the update into compared step ``k`` was the first with momentum: the slots ``g``
        feeds are momentum's alone and were all 0 on both sides at the step before (a review: the
        Nesterov hint fired at a later update, where the records rule Nesterov's 1 + momentum out)."""
        if not self._momentum_only(g):
            return False
        before = [p.step_values(k - 1) for p in self._slots_fed_by(g)]
        return bool(before) and all(b is not None and not np.any(b[0]) and not np.any(b[1]) for b in before)

    def _earlier_gradients(
        self, pair: Pair, g: Pair, k: int
    ) -> Optional[tuple[list[np.ndarray], Optional[np.ndarray]]]:
        """The values of ``pair``'s gradient ``g`` (compared by values) at the compared steps before
        ``k`` both runs logged, ``[baseline, candidate]`` in float64, only at ``pair``'s elements out
        of tolerance at ``k`` when they are known (returned with them, else None); None unless the
        gradient agreed at every one of those steps (its verdicts settled here). What a weight's
        update note and a slot's noise note both read."""
        g.ensure(k, self.policy.equal_nan)
        seen = (g.ib[:k] >= 0) & (g.ic[:k] >= 0)
        if not seen.any() or ((g.reason[:k] != OK) & (g.reason[:k] != ABSENT)).any():
            return None
        out = self._elements_out(pair, k)
        width = min(g.base.values.shape[1], g.cand.values.shape[1])
        known = out if out is not None and len(out) and out.max() < width else None
        cols = slice(None) if known is None else known
        grads = [
            take_rows(side.values, r)[:, cols].astype(np.float64)
            for side, r in ((g.base, g.ib[:k][seen]), (g.cand, g.ic[:k][seen]))
        ]
        return grads, known

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

    def _starts_reordered(self, pair: Pair, k: int) -> Optional[str]:
        """For a weight diverging at step 0 of both runs (before any update), each run holding the
        same values in another order: the port converted the weight in another layout. A new user's
        TF1 attention ported to ``MultiHeadAttention`` with its kernels reshaped ``[d, key_dim,
        heads]`` and transposed (heads split in another order) diverged at step 0 on its query
        kernel with no note. When one axis of the baseline's shape, read as two and swapped, gives
        the candidate, that is named too (an index ``i * q + j`` of the one against ``j * p + i``
        of the other)."""
        if int(pair.base.steps[int(pair.ib[k])]) != 0 or int(pair.cand.steps[int(pair.ic[k])]) != 0:
            return None  # an update applied since: other values in another order mean nothing
        both = pair.step_values(k)
        if both is None or both[0].size < 2:
            return None
        b, c = (np.asarray(a, np.float64) for a in both)
        tol = float(pair.atol_at(k))
        if np.allclose(b, c, rtol=0, atol=tol) or not np.allclose(np.sort(b), np.sort(c), rtol=0, atol=tol):
            return None
        note = (
            "before any update the two runs hold the same values in another order: the weight was converted "
            "(or copied) in another layout"
        )
        held = pair.values_at("base", int(pair.ib[k]))
        shape = [] if held is None or held.size != b.size else [int(d) for d in held.shape]
        for axis, n in enumerate(shape):
            # the split acts along ``axis`` alone, so it holds on the whole only if on one element of each
            # other axis: tried there first (a [1M, 128] table was 49 full passes, one per divisor of 1M)
            one = tuple(slice(None) if a == axis else slice(0, 1) for a in range(len(shape)))
            bs, cs = b.reshape(shape)[one], c.reshape(shape)[one]
            for p in range(2, n):
                if n % p:
                    continue
                q = n // p
                if not np.allclose(np.swapaxes(bs.reshape(p, q), 0, 1).reshape(-1), cs.reshape(-1), rtol=0, atol=tol):
                    continue
                split = b.reshape(shape[:axis] + [p, q] + shape[axis + 1 :])
                if np.allclose(np.swapaxes(split, axis, axis + 1).reshape(-1), c, rtol=0, atol=tol):
                    return (
                        f"{note}: the baseline's axis {axis} of {n} read as [{p}, {q}] and transposed to [{q}, {p}] "
                        "gives the candidate's, e.g. heads split in another order when converting a [d, heads * key_dim] "
                        "kernel to [d, heads, key_dim] (reshape it to [d, heads, key_dim] directly, not [d, key_dim, "
                        "heads] then transposed)"
                    )
        if len(shape) == 2 and shape[0] > 1:
            rows = _rows_moved(b.reshape(shape), c.reshape(shape), tol)
            if rows:
                # a faithful StringLookup port of a vocabulary_list embedding copies TF1's table with its OOV
                # row first, and was told of a transposed kernel, heads or gates
                return (
                    f"{note}: its rows are the baseline's {rows}, as a table whose lookup ids differ holds them (Keras "
                    "StringLookup and IntegerLookup put the OOV index first, TF1's vocabulary_list column and a "
                    "StaticHashTable with default_value=len(vocabulary) after the vocabulary), or a kernel whose input "
                    "features come in another order (TF1's input_layer concatenates its columns sorted by name): when "
                    "the ids or features moved with the rows, the port computes the same and the layer's output "
                    "agrees; give it TF1's ids and order (a StaticHashTable in its input pipeline) to compare the "
                    "weight itself"
                )
        return f"{note} (a transposed kernel, heads or gates in another order)"

    def _slot_starts_otherwise(self, pair: Pair, k: int) -> Optional[str]:
        """For a slot diverging at the first step both runs logged, each run's every element one
        value, the two apart: the optimizers start it differently. New users' TF1 RMSProp (its mean
        square starts at 1, Keras's at 0), Adagrad's and Ftrl's ``initial_accumulator_value`` were
        found there with no note. Read from the exact min and max, so a slot kept as statistics only
        tells it too (a new user's 5000-wide RMSProp mean square read "min 1 vs 0" with no note)."""
        if int(pair.ib[k]) != 0 or int(pair.ic[k]) != 0:
            return None  # not where both runs' slot was first logged (rows follow the steps): updated since
        # One element is always "one value", so it tells a start only at step 0 in both runs (no update
        # applied yet; a run resumed at step 100 is no slot's start): a sigmoid output's bias [1], in
        # every CTR model, was the one slot of a wrong initial_accumulator_value without the note.
        fewest = 1 if int(pair.base.steps[0]) == 0 and int(pair.cand.steps[0]) == 0 else 2
        starts = [_one_value(pair.base.stats[0], fewest), _one_value(pair.cand.stats[0], fewest)]
        if starts[0] is None or starts[1] is None or starts[0] == starts[1]:
            return None
        if fewest == 1 and not all(
            _one_value(run.stats[0], 1) is not None
            for q in self._pairs
            if q.base.kind == "slot"
            for run in (q.base, q.cand)
            if int(run.steps[0]) == 0
        ):
            # Step 0 is no start when another slot already holds several values there: a GAN's
            # generator phase, recorded after the discriminator's update in the same iteration (its
            # one-unit output bias's first moment was said to start at 0.033 against 0).
            return None
        return (
            f"every element starts at {starts[0]:g} in the baseline and {starts[1]:g} in the candidate: the "
            "optimizers initialise this slot differently (TF1's RMSProp starts its mean square at 1, Keras at 0: "
            "build the optimizer and assign ones; Adagrad's and Ftrl's initial_accumulator_value)"
        )

    def _slot_carried_over(self, pair: Pair, k: int) -> Optional[str]:
        """For a slot diverging at the first step both runs logged it, every element 0 in one run and not
        in the other: that run starts a new optimizer there, the other's slot holds earlier updates (a
        second phase compiled with the first phase's optimizer object, or a phase's optimizer reused,
        where TF1's second optimizer and Keras's ``compile`` with a new one start at 0). A trial's
        fine-tuning port that compiled its second phase with ``model.optimizer`` got no note there."""
        if int(pair.ib[k]) != 0 or int(pair.ic[k]) != 0:
            return None  # not where both runs' slot was first logged
        zero = [_one_value(run.stats[0], 1) == 0.0 for run in (pair.base, pair.cand)]
        if zero[0] == zero[1]:
            return None
        fresh, kept = ("baseline", "candidate") if zero[0] else ("candidate", "baseline")
        return (
            f"every element is 0 in the {fresh} at the first step both runs logged, where the {kept}'s slot holds "
            f"earlier updates: the {fresh} starts a new optimizer here and the {kept} carries one over (a second "
            "training phase compiled with the first phase's optimizer object, model.optimizer, or one optimizer "
            "reused where TF1 builds a second; compile with a new optimizer starts its slots at 0, as TF1's "
            "second optimizer does)"
        )

    def _resumed_at_another_step(self, pair: Pair, k: int) -> Optional[str]:
        """For a weight diverging at a step where one run was resumed (``RunData.resumed_at``), when
        that run's every weight there is the other run's at one later step, element for element: the
        resume restored the weights of that step but numbered its steps from this one (None
        otherwise). A helper's ports resumed from a checkpoint without the optimizer (and fit resumed
        from h5 weights) counted ``optimizer.iterations`` from 0 again: the reader took the new file
        for a rerun, and the report said the weights differ at step 0, with no note, of runs that
        agreed up to the resume at step 10."""
        step = int(self.steps[k])
        weights = [p for p in self._pairs if p.base.kind == "weight" and p.use_values]
        if pair not in weights:
            return None
        for run, mine, theirs in ((self.cand, "cand", "base"), (self.base, "base", "cand")):
            if step not in getattr(run, "resumed_at", ()):
                continue
            found: Optional[set[int]] = None
            for p in weights:
                own, other = getattr(p, mine), getattr(p, theirs)
                i = int((p.ic if mine == "cand" else p.ib)[k])
                if i < 0:
                    return None
                here = np.asarray(own.values[i], np.float64)
                if other.values.shape[1:] != here.shape:
                    found = set()  # no later step holds this weight as it is here
                    break
                # only the later steps every weight before matched (all of them for the first), a block
                # of rows at a time: a long run's every row of every weight was compared one by one
                rows = np.flatnonzero(other.steps > step if found is None else np.isin(other.steps, list(found)))
                bound = p.atol_at(k) + 1e-4 * np.abs(here)
                at: set[int] = set()
                for start in range(0, len(rows), 256):
                    block = rows[start : start + 256]
                    same = (np.abs(np.asarray(other.values[block], np.float64) - here) <= bound).all(axis=1)
                    at.update(int(s) for s in other.steps[block[same]])
                found = at if found is None else found & at
                if not found:
                    break
            if not found:
                continue
            later = min(found)
            return (
                f"'{run.name}' was resumed at this step (an event file of it begins here), and every weight it "
                f"recorded here is the other run's at step {later}: it restored a checkpoint of step {later} but "
                f"numbers its steps from {step} again, so each of its steps is compared with another; the step "
                "counter it records by was not restored (optimizer.iterations: a tf.train.Checkpoint without "
                "optimizer=, the model's weights saved alone, h5 weights in fit), and the steps its earlier file "
                "wrote from there on are left out as a rerun's; restore the optimizer with the model (its "
                "iterations and slots) to compare the resume"
            )
        return None

    def _slot_lost_on_resume(self, pair: Pair, k: int) -> Optional[str]:
        """For a slot diverging at a step where one run was resumed (``RunData.resumed_at``), every
        element 0 in that run there, where it held other values at its step before and the other
        run's does not hold 0: the resume did not restore the optimizer (None otherwise). A helper's
        port whose ``tf.train.Checkpoint`` held the model but not the optimizer restarted Adam's
        moments at step 10 and was told of clipping, betas and an initial accumulator."""
        step = int(self.steps[k])
        for run, rows, own, other, theirs in (
            (self.cand, pair.cand, pair.ic, pair.base, pair.ib),
            (self.base, pair.base, pair.ib, pair.cand, pair.ic),
        ):
            i, j = int(own[k]), int(theirs[k])
            if step not in getattr(run, "resumed_at", ()) or i < 1 or j < 0:
                continue
            if _one_value(rows.stats[i], 1) != 0.0 or _one_value(rows.stats[i - 1], 1) == 0.0:
                continue  # not 0 here, or 0 before too (a slot that never moved)
            if _one_value(other.stats[j], 1) == 0.0:
                continue
            return (
                f"'{run.name}' was resumed at this step (an event file of it begins here) and every element of "
                f"this slot is 0 there, after holding other values at its step {int(rows.steps[i - 1])}: the "
                "resume did not restore the optimizer's state (a tf.train.Checkpoint without optimizer=, "
                "model.save_weights / load_weights, fit resumed without BackupAndRestore), so its slots start "
                "again, and with them its iterations (Adam's bias correction)"
            )
        return None

    def _slot_fed_otherwise(self, pair: Pair, k: int) -> Optional[str]:
        """For a slot diverging at step ``k`` whose gradient agreed element-wise at every earlier step
        and was past its atol there (below it: :meth:`_noise_fed`): what reaches the slot differs from
        the recorded gradient, or the slot's rule does; when every element is the baseline's times one
        factor, that factor, and on a moving average's first update what it is made of. New users'
        ``clipnorm`` in place of global clipping (Adam's first moment 1.0348x TF1's: TF1's global norm)
        and ``beta_2=0.98`` (the second moment 20x) diverged first on the slot, with no note."""
        g = pair.feeder
        if g is None or not g.use_values or k == 0:
            return None
        earlier = self._earlier_gradients(pair, g, k)
        if earlier is None or not max(float(np.abs(a).max(initial=0.0)) for a in earlier[0]) >= g.tol.atol:
            return None
        carried = self._carried_gradient_difference(pair, g, k, earlier)
        if carried is not None:
            return carried
        note = (
            f"its gradient {g.base.kind}/{g.base.name} agreed element-wise at every earlier step: what reaches "
            "the slot differs from the recorded gradient (clipping between the two: clipnorm clips each variable "
            "by its own norm, clip_by_global_norm / global_clipnorm all by one; a weight decay added to the "
            "gradient), or the slot's own rule does (betas, momentum, rho, an initial accumulator)"
        )
        both = pair.step_values(k)
        if both is None:
            return note
        b, c = (np.asarray(x, np.float64) for x in both)
        rounding = (OUTPUT_ATOL_OF_MAX * float(np.abs(b).max(initial=0.0)), 0.0)
        units = self._velocity_units(pair, k, b, c, rounding)
        if units:
            return note + units
        coupled = self._coupled_decay(pair, g, k, b, c)
        if coupled:
            return note + coupled
        scale = _uniform_scale(b, c, pair.tol.atol, rounding)
        if scale is None:
            return note
        power, averaging = align.slot_rule(pair.base.name, pair.cand.name)
        before = pair.step_values(k - 1) if int(self.steps[k - 1]) == int(self.steps[k]) - 1 else None
        first = before is not None and not np.any(before[0]) and not np.any(before[1])
        note += f"; every element is the baseline's times {scale:.4g}"
        if first and averaging and power in (1, 2):
            beta, default, whose = align.decay_name(pair.base.name, pair.cand.name, power)
            # either side may be the one left at Keras's default: a trial's GAN had TF1's beta_1 0.5 and
            # the port's default 0.9, and was offered only "the candidate's is 0.98"
            implied = 1.0 - scale * (1.0 - default)
            implied_base = 1.0 - (1.0 - default) / scale
            note += (
                f": on its first update a moving average holds (1 - {beta}) x the gradient"
                + ("" if power == 1 else " squared")
                + f", so either the two {beta}s differ (the candidate's 1 - {beta} is {scale:.4g}x the baseline's"
                + (
                    f"; if the baseline's is {whose} default {default}, the candidate's is {implied:.4g}"
                    if 0.0 < implied < 1.0
                    else ""
                )
                + (
                    f"; if the candidate's is {default}, the baseline's is {implied_base:.4g}"
                    if 0.0 < implied_base < 1.0
                    else ""
                )
                + ") or the gradients reaching it differ by "
                + (f"{scale:.4g}" if power == 1 else f"{math.sqrt(scale):.4g} (its square root)")
                + " (clipping: one side's clip factor over the other's; a global norm over the clip norm when the "
                "other side leaves this variable unclipped)"
            )
        elif first and power == 1:
            note += (
                ": on its first update a momentum holds the gradient itself, so the gradients reaching it differ by "
                f"{scale:.4g} (clipping: one side's clip factor over the other's), or one side scales it (dampening)"
            )
        return note

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

    def _velocity_units(self, pair: Pair, k: int, b: np.ndarray, c: np.ndarray, rounding: tuple[float, float]) -> str:
        """For a momentum slot whose values at step ``k`` (``b``, ``c``) are one another's times
        ``-lr`` of a recorded lr at step ``k`` or the one before: that one run holds Keras SGD's
        velocity (``-lr x accumulator``) and the other TF1's accumulator. A port's ``SGD`` subclass
        that overrides ``update_step`` but keeps Keras's rule is recorded as held (the shim cannot
        tell its rule), and its slot, cosine -1, was blamed on clipping or a weight decay. ""
        otherwise. (:func:`_uniform_scale` takes positive factors only.)"""
        if not _MOMENTUM.search(f"{pair.base.name} {pair.cand.name}"):
            return ""
        rates = {
            _scalar_at(series, rows, j)
            for lr in self._pairs
            if lr.base.kind == "lr" and lr.use_values
            for series, rows in ((lr.base, lr.ib), (lr.cand, lr.ic))
            for j in (k - 1, k)
            if j >= 0 and int(rows[j]) >= 0
        }
        large = np.abs(b) > pair.tol.atol
        if large.sum() < 2 or not (np.isfinite(b).all() and np.isfinite(c).all()):
            return ""
        # lr x accumulator moves the weight as TF1's accumulator does: its weight agrees at this step. A
        # first momentum of (1 - momentum) x the gradient (m = b*m + (1-b)*g) is the same factor when the
        # lr equals 1 - momentum (0.1 and 0.9), and its weight has moved otherwise already
        weight = next(iter(self._weights_of(pair.feeder)), None)
        signs = [-1.0]
        if weight is not None and weight.use_values and pair.feeder is not None:
            weight.ensure(k + 1, self.policy.equal_nan)
            if weight.ib[k] >= 0 and weight.ic[k] >= 0 and weight.reason[k] == OK:
                signs.append(1.0)
        for rate in sorted(r for r in rates if r > 0):
            for sign in signs:
                for factor, held in ((sign * rate, "candidate"), (sign / rate, "baseline")):
                    allowed = 1e-4 * np.abs(factor * b) + abs(factor) * rounding[0] + rounding[1]
                    if not np.all(np.abs(c - factor * b)[large] <= allowed[large]):
                        continue
                    other = "baseline" if held == "candidate" else "candidate"
                    named = f"{'-' if sign < 0 else ''}{'' if held == 'candidate' else '1/'}lr ({rate:g})"
                    if sign < 0:
                        return (
                            f"; every element is the baseline's times {factor:.4g} = {named}: the {held} holds this "
                            f"slot as Keras SGD's velocity (-lr x accumulator) and the {other} as TF1's accumulator. "
                            "The shim records a Keras SGD's slot divided by -lr unless its class overrides the update "
                            "rule (update_step): a subclass that overrides it but keeps Keras's rule is recorded as held"
                        )
                    # a hand-written update that folds lr into the slot (m = momentum*m + lr*g; var -= m): a new
                    # user's tf.Module port was told of clipping or dampening, its factor 0.1 being its lr
                    return (
                        f"; every element is the baseline's times {factor:.4g} = {named}: the {held} holds this "
                        f"slot as a velocity in weight units (lr x accumulator, as a hand-written m = momentum*m + "
                        f"lr*g; var -= m keeps it) and the {other} as TF1's accumulator (m = momentum*m + g; "
                        "var -= lr*m): the two update alike while the lr is constant and part from the first step it "
                        "changes (the weights show it); record the slot divided by lr to compare it"
                    )
        return ""

    def _carried_gradient_difference(
        self, pair: Pair, g: Pair, k: int, earlier: tuple[list[np.ndarray], Optional[np.ndarray]]
    ) -> Optional[str]:
        """For :meth:`_slot_fed_otherwise`: when the gradient's differences at the earlier steps (each
        within the gradient's tolerance) add up to the slot's difference at ``k``, the slot only
        carries them, and says so rather than blame its rule. A new user's loosened ``grad/*`` atol
        admitted a gradient 3.3e-4 apart after an epsilon difference; its Adam slot, 0.1 of that
        apart, was told of clipping, weight decay or its betas (the same on both sides)."""
        both = pair.step_values(k)
        if both is None:
            return None
        b, c = (np.asarray(x, np.float64) for x in both)
        cols = earlier[1] if earlier[1] is not None else slice(None)
        gb, gc = earlier[0]
        with np.errstate(invalid="ignore", over="ignore"):
            slot_gap = float(np.nan_to_num(np.abs(c - b)[cols]).max(initial=0.0))
            d = np.nan_to_num(np.abs(gc - gb))
        # what the slot's rule moves it by, uncapped: d, or g²'s change for a second moment (a review's
        # wrong beta2 on v was told its gradient's 1e-6 accounted for 9e-7)
        per_step = pair._moved(gb, gc, np.full(len(gb), np.inf))
        total = float(per_step.max(initial=0.0) if pair.feeder_averages else per_step.sum())
        if not len(per_step) or slot_gap <= 0 or slot_gap > 1.01 * total:
            return None
        seen = np.flatnonzero((g.ib[:k] >= 0) & (g.ic[:k] >= 0))
        most = int(seen[int(np.argmax(per_step))])
        at = int(self.steps[most])
        # a unit at its kink there moved the gradient (a helper's faithful ResNet, its ReLU outputs
        # recorded: the slot diverged a step after one unit flipped, and was told of epsilon)
        kink = kinks.note(kinks.kinked(self._pairs, most), at)
        return (
            f"its gradient {g.base.kind}/{g.base.name} agreed within its tolerance (atol {g.tol.atol:g}) at every "
            f"earlier step but differed by up to {float(d.max()):.3g} (at step {at}); by the slot's rule those "
            f"differences move it by up to {total:.3g}, enough for its {slot_gap:.3g}: the slot carries the "
            "gradient's difference, which the gradient's tolerance admits and the slot's rule (1e-4 of the "
            "gradient) does not; "
            + (
                kink
                if kink
                else "look for what moved the gradient there (the weights or inputs before it, a setting such as an "
                "optimizer's epsilon, or a tolerance loosened with --override) rather than the slot's rule"
            )
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

    def _grad_scale(self, pair: Pair, k: int) -> Optional[str]:
        """A gradient that is the baseline's times one factor at every element (compared by
        values): a new user's gradient accumulation not divided by its 4 micro-batches showed every
        gradient with max_rel_diff=3 and cosine 1, and nothing said "times 4". Each element may be
        off the factor by a gradient's rounding (:data:`GRAD_NOISE_OF_MAX` of each side's largest
        element): a helper's embedding gradient, its repeated rows summed in float32, had one small
        element 1e-4 of itself off the factor and lost the note every other gradient had."""
        both = pair.step_values(k)
        if both is None:
            return None
        scale = self._exact_grad_scale(pair, k)
        if scale is None:
            return self._loss_scale_kept(pair, k, both)
        heads = self._other_grad_scale(pair, k, scale)
        if heads and heads[1]:
            return (
                f"every element is the baseline's times {scale:.4g} (the same direction, another size), while "
                f"{heads[0]}, and in '{heads[1]}' both have one norm: gradients recorded after clipping by one run "
                "and before it by the other, each variable clipped by its own norm (clipnorm=, tf.clip_by_norm per "
                "gradient), so each clipped gradient has its own factor, its norm over the clip norm"
            )
        if heads:
            # a helper's two-head fit port with compile's loss_weights= swapped had its classification head's
            # gradients at 0.5x and its regression head's at 2x, each told of a sum against a mean, a global
            # batch size, micro-batches or a loss scale: none of which scales the gradients by two factors
            return (
                f"every element is the baseline's times {scale:.4g} (the same direction, another size), while "
                f"{heads[0]}: the loss's terms are weighted otherwise, one factor per term (a multi-output model's "
                "per-head loss weights: compile's loss_weights= against TF1's weighted sum, the heads' weights "
                "swapped, or one head's loss reduced otherwise: a sum against a mean), and the layers both "
                "terms reach mix the factors"
            )
        loss = self._loss_times(k, scale)
        if loss:
            # a helper's fit port with zero sample weights (0.625 = 5/8 of TF1's loss and gradients) and a port
            # summing where TF1 averaged had their gradients told of a scale between the loss and the gradient,
            # of micro-batches, a loss scale or clipping: the loss itself carried the factor
            return (
                f"every element is the baseline's times {scale:.4g} (the same direction, another size), and so is "
                f"{loss} at this step: the loss as a whole is scaled (its reduction: a sum against a mean, a division "
                "by the non-zero weights against the batch size, a global batch size under a strategy; a constant "
                "factor), nothing between it and this gradient; the loss's note says more"
            )
        return (
            f"every element is the baseline's times {scale:.4g} (the same direction, another size): a scale between "
            "the loss and this gradient (the loss's reduction: a sum against a mean, a global batch size under a "
            "strategy; accumulated gradients not divided by their micro-batches; a loss scale not undone), or "
            "gradients recorded after clipping by one run and before it by the other (every gradient then has one "
            "factor, the global norm over the clip norm, and the weights agree)"
        )

    def _grad_scale_within_tolerance(self, pair: Pair, k: int) -> Optional[str]:
        """A gradient that is the baseline's times one factor at every element up to the tolerance it is
        held to (the factor times it), when another gradient of the step is the baseline's times that
        factor exactly (:meth:`_grad_scale`): gradients recorded after ``tf.clip_by_global_norm`` by one
        run and before it by the other all differ by the global norm over the clip norm, and each also by
        what the two runs' own gradients differ by, which the tolerance admits and one side's rounding of
        its largest element need not. A helper's faithful Adam port (an outlier batch of inputs 6x larger,
        clipped at step 5) had its raw kernel gradient 6.7e-6 apart there, 28 float32 ulps of its largest
        element: the three other gradients got the factor note, and the first, which the verdict named,
        was told of a loss term left out or a stop_gradient. Tried after the weight-decay note."""
        both = pair.step_values(k)
        if both is None:
            return None
        tol = pair.atol_at(k) + pair.rtol_at(k) * np.abs(np.asarray(both[0], np.float64))
        scale = _uniform_scale(both[0], both[1], pair.tol.atol, (tol, 0.0))
        if scale is None:
            return None
        for other in self._pairs:
            if other is pair or other.base.kind != "grad":
                continue
            exact = self._exact_grad_scale(other, k)
            if exact is not None and abs(exact / scale - 1.0) <= 1e-3:
                return (
                    f"every element is the baseline's times {scale:.4g} within this gradient's tolerance, the "
                    f"factor {other.base.name}'s gradient has at every element (the same direction, another size): "
                    "gradients recorded after clipping by one run and before it by the other (every gradient then "
                    "has one factor, the global norm over the clip norm, and the weights agree), or a scale between "
                    "the loss and the gradients (the loss's reduction: a sum against a mean, a global batch size "
                    "under a strategy; accumulated gradients not divided by their micro-batches)"
                )
        return None

    def _other_grad_scale(self, pair: Pair, k: int, scale: float) -> Optional[tuple[str, str]]:
        """Another gradient of step ``k`` that is the baseline's times one other factor at every element
        (:meth:`_exact_grad_scale`), in words ("cls/kernel:0's is its times 2"), else None. One factor
        on every gradient is a scale of the whole loss; two factors at one step cannot be: the loss is a
        sum of terms weighted otherwise, each reaching its own layers alone (a model's output heads)."""
        for other in self._pairs:
            if other is pair or other.base.kind != "grad" or other.ib[k] < 0 or other.ic[k] < 0:
                continue
            exact = self._exact_grad_scale(other, k)
            if exact is not None and abs(exact / scale - 1.0) > 1e-3:
                return f"{other.base.name}'s is its baseline's times {exact:.4g}", self._clipped_each(
                    pair, other, k, scale, exact
                )
        return None

    def _clipped_each(self, pair: Pair, other: Pair, k: int, scale: float, exact: float) -> str:
        """The run whose gradients of ``pair`` and ``other`` (the baseline's times ``scale`` and ``exact``
        at step ``k``) are both the smaller and of one norm (within 1e-3): each clipped by its own norm to
        one clip norm in that run and recorded after it (``clipnorm=`` against a run recording before
        clipping), not terms of the loss weighted otherwise; "" otherwise."""
        if (scale > 1.0) != (exact > 1.0):
            return ""
        side = 0 if scale > 1.0 else 1  # the smaller gradients: the clipped ones
        norms = []
        for p in (pair, other):
            both = p.step_values(k)
            if both is None:
                return ""
            norms.append(float(np.linalg.norm(np.asarray(both[side], np.float64))))
        if not norms[0] > 0.0 or abs(norms[1] / norms[0] - 1.0) > 1e-3:
            return ""
        return str((self.base.name, self.cand.name)[side])

    def _loss_times(self, k: int, scale: float) -> Optional[str]:
        """The tag of a scalar loss both runs recorded at compared step ``k`` that is the baseline's times
        ``scale`` (within 1e-4 of it), else None."""
        for p in self._pairs:
            if p.base.kind != "loss" or p.ib[k] < 0 or p.ic[k] < 0:
                continue
            both = p.step_values(k)
            if both is None or len(both[0]) != 1 or len(both[1]) != 1:
                continue
            b, c = float(both[0][0]), float(both[1][0])
            if math.isfinite(b) and math.isfinite(c) and b != 0.0 and abs(c / b - scale) <= 1e-4 * abs(scale):
                return f"{p.base.kind}/{p.base.name}"
        return None

    def _exact_grad_scale(self, pair: Pair, k: int) -> Optional[float]:
        """The one factor, not 1, by which ``pair``'s gradient at step ``k`` is the baseline's at every
        element up to each side's rounding (:data:`GRAD_NOISE_OF_MAX` of its largest element)."""
        both = pair.step_values(k)
        if both is None:
            return None
        rounding = tuple(GRAD_NOISE_OF_MAX * float(np.abs(side).max(initial=0.0)) for side in both)
        return _uniform_scale(both[0], both[1], pair.tol.atol, (rounding[0], rounding[1]))

    def _loss_scale_kept(self, pair: Pair, k: int, both: tuple[np.ndarray, np.ndarray]) -> Optional[str]:
        """A gradient that is the baseline's times a power of two of at least 2**4 at every element up
        to the tolerance it is held to (the factor times it), which float16 compute needs: a loss scale
        not undone. A new user's mixed_float16 custom step that applied and recorded the gradients of
        ``get_scaled_loss`` without ``get_unscaled_gradients`` had every gradient 32768 times TF1's, each
        element off the factor by float16 rounding (1e-3 of itself), and was told of a stop_gradient
        or a shared weight."""
        b = np.asarray(both[0], np.float64)
        tol = pair.atol_at(k) + pair.rtol_at(k) * np.abs(b)
        scale = _uniform_scale(both[0], both[1], pair.tol.atol, (tol, 0.0))
        if scale is None or scale < 16.0:
            return None
        power = round(math.log2(scale))
        if abs(scale / 2.0**power - 1.0) > 1e-3:
            return None
        return (
            f"every element is the baseline's times {scale:.6g}, 2**{power}, within this gradient's tolerance "
            "(the same direction, another size): a loss scale not undone (mixed precision: the gradients of "
            "LossScaleOptimizer.get_scaled_loss taken without get_unscaled_gradients, or recorded before it; "
            "the dynamic scale starts at 2**15), or another scale between the loss and this gradient"
        )

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
        weights = 0
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
        if both is not None:
            for run, mine, theirs in ((self.base.name, *both), (self.cand.name, *both[::-1])):
                if mine.size and not np.any(mine) and np.any(theirs):
                    none = run
        cut = None if none is not None else self._rows_cut_off(pair, k)
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
        factor = _decay_factor(grads[0], grads[1], weights[0])
        if factor is None:
            return None
        return (
            f"the difference is {factor:.4g} times the weight {weight.base.name} at every element: a weight decay "
            "added to the loss on one side only or of another size (an L2 term: Keras regularizers.l2(λ) adds "
            "λ·Σw², gradient 2λ·w; TF1's λ·tf.nn.l2_loss(w) adds λ·Σw²/2, gradient λ·w; a regularizer on a "
            "layer the other run does not regularize)" + self._replicated_regularizer()
        )

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


def _uniform_scale(
    b: np.ndarray, c: np.ndarray, floor: float, rounding: tuple[Any, Any] = (0.0, 0.0)
) -> Optional[float]:
    """The one factor ``c / b`` takes at every element where ``|b|`` is above ``floor`` (``c``
    within 1e-4 of ``scale x b``, plus ``rounding``: each side's rounding error per element; at
    least 2 such elements, none where ``b`` is below ``floor`` but ``c`` is not), when it is not 1:
    the same direction, another size (None otherwise)."""
    b, c = np.asarray(b, np.float64).ravel(), np.asarray(c, np.float64).ravel()
    if not (np.isfinite(b).all() and np.isfinite(c).all()):
        return None
    large = np.abs(b) > floor
    if large.sum() < 2:
        return None
    scale = float(np.median(c[large] / b[large]))
    if not scale > 0:  # a sign flipped, or nothing moved: not "the same direction" (a review's)
        return None
    round_b, round_c = (np.broadcast_to(np.asarray(r, np.float64).ravel(), b.shape)[large] for r in rounding)
    allowed = 1e-4 * np.abs(scale * b[large]) + abs(scale) * round_b + round_c
    if not np.all(np.abs(c[large] - scale * b[large]) <= allowed) or abs(scale - 1) <= 1e-3:
        return None
    if np.any(np.abs(c[~large]) > abs(scale) * floor * 2):  # what b left small, c did not
        return None
    return scale


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


def _rows_moved(b: np.ndarray, c: np.ndarray, tol: float) -> Optional[str]:
    """How the candidate's rows ``c`` are the baseline's ``b`` in another order (each a row of the
    other, one to one, within ``tol``): rolled by some rows, or otherwise; None when they are not."""
    n = b.shape[0]
    # rows sorted as tuples, once each (a table of 1024 rows compared row by row was a million checks)
    if not np.allclose(b[np.lexsort(b.T[::-1])], c[np.lexsort(c.T[::-1])], rtol=0, atol=tol):
        return None
    # a roll by r puts b's row n - r first: only the rows of b equal to c's first are candidates (a few
    # at most; trying every r was n passes over a table of a million rows)
    starts = np.flatnonzero(np.all(np.abs(b - c[0]) <= tol, axis=1))[:8]
    for r in sorted(int((n - i) % n) for i in starts):
        if r and np.allclose(np.roll(b, r, axis=0), c, rtol=0, atol=tol):
            return (
                f"rolled by {r} row(s) (its last {r} first)"
                if r < n - r
                else f"rolled back by {n - r} row(s) (its first {n - r} last)"
            )
    return "in another order"


def _stats_held(pair: Pair, side: int, k: int) -> bool:
    """Whether ``pair``'s tensor on ``side`` (0 baseline, 1 candidate) has the same statistics at every
    compared step up to ``k`` it was recorded at (NaN equal to NaN): held still, as far as they tell."""
    rows = (pair.ic if side else pair.ib)[: k + 1]
    rows = rows[rows >= 0]
    stats = (pair.cand if side else pair.base).stats[rows]
    return bool(len(rows) and np.array_equal(stats, np.broadcast_to(stats[0], stats.shape), equal_nan=True))
