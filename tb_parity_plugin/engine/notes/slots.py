"""Notes on optimizer slots: a slot started otherwise, carried over from another phase, lost on a
resume or fed by another gradient, momentum in other units, and rows of a table in another order."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from tb_parity_plugin.engine import align, kinks
from tb_parity_plugin.engine.matrix import OK
from tb_parity_plugin.engine.notes.context import (
    _MOMENTUM,
    _one_value,
    _scalar_at,
)
from tb_parity_plugin.engine.notes.decay import DecayNotes
from tb_parity_plugin.engine.notes.gradient_scale import _uniform_scale
from tb_parity_plugin.engine.pair import Pair
from tb_parity_plugin.engine.tolerance import (
    OUTPUT_ATOL_OF_MAX,
)


class SlotNotes(DecayNotes):
    """Slot notes, for :class:`~tb_parity_plugin.engine.notes.Notes`; they name a coupled decay (:class:`DecayNotes`)."""

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
        if int(pair.base.steps[0]) == 0 and int(pair.cand.steps[0]) == 0 and pair.feeder is None:
            # Both runs' counters at 0 and no gradient of its variable here: no optimizer of this logdir's phase
            # has stepped yet, so a slot holding an update there got it from a phase recorded elsewhere in this
            # iteration (a slot whose gradient is recorded here is this phase's own: holding an update at step 0,
            # it was carried over, as by a fine-tuning port that restored its pretraining's optimizer, numbered
            # from 0, which was told of a GAN's phase). A trial's GAN port whose
            # discriminator's phase, and the generator's logdir said the port "starts a new optimizer here".
            return (
                f"every element is 0 in the {fresh} at step 0, where the {kept}'s slot already holds an update, "
                "made before step 0 was recorded: by a phase before this one in the same iteration (a GAN's "
                f"discriminator, updated and recorded on a recorder of its own), which left this slot at 0 in the "
                f"{fresh}: a gradient of 0 there (a loss that clips or saturates, such as Keras's from_logits=False "
                "given logits, clipped to [1e-7, 1 - 1e-7] with no gradient outside; a loss weighted by 0, a "
                "stop_gradient) or no update of this variable in that phase; compare that phase's own logdir, "
                "where its gradients are recorded"
            )
        return (
            f"every element is 0 in the {fresh} at the first step both runs logged, where the {kept}'s slot holds "
            f"earlier updates: the {fresh} starts a new optimizer here and the {kept} carries one over (a second "
            "training phase compiled with the first phase's optimizer object, model.optimizer, or one optimizer "
            "reused where TF1 builds a second; compile with a new optimizer starts its slots at 0, as TF1's "
            "second optimizer does; or a checkpoint restored with its optimizer, tf.train.Checkpoint(model=, "
            "optimizer=), where TF1 restores the weights alone, as init_from_checkpoint does)"
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

    def _numbered_apart(self, pair: Pair, k: int) -> Optional[str]:
        """For a weight diverging at step ``k`` when the runs logged as many steps, every step, one
        run's numbers ``d`` past the other's (1-10 against 0-9), and every weight the later-numbered
        run recorded at ``k`` is the other's at ``k - d``, element for element: its counter is read
        ``d`` updates later, and each step both logged holds another iteration of each (None
        otherwise). A trial's faithful GAN port numbered its generator's phase by the
        discriminator's ``iterations``, read after the discriminator's update: a DIVERGE at step 1
        with no note, every generator weight a step behind TF1's."""
        b_steps, c_steps = (np.asarray(run.steps, np.int64) for run in (self.base, self.cand))
        if len(b_steps) < 2 or len(b_steps) != len(c_steps) or np.any(np.diff(b_steps) != 1):
            return None
        d = int(c_steps[0] - b_steps[0])
        if d == 0 or not np.array_equal(c_steps - d, b_steps):
            return None
        weights = [p for p in self._pairs if p.base.kind == "weight" and p.use_values]
        if pair not in weights:
            return None
        step = int(self.steps[k])
        # the later-numbered run's weights at this step against the other's at the step its numbers mean
        ahead, behind, late_side, early_side, shift = (
            (self.cand, self.base, "cand", "base", d) if d > 0 else (self.base, self.cand, "base", "cand", -d)
        )
        for p in weights:
            late, early = getattr(p, late_side), getattr(p, early_side)
            rows = np.flatnonzero(np.asarray(late.steps) == step)
            other = np.flatnonzero(np.asarray(early.steps) == step - shift)
            if not len(rows) or not len(other):
                return None
            here, there = p.values_at(late_side, int(rows[0])), p.values_at(early_side, int(other[0]))
            if here is None or there is None or here.shape != there.shape:
                return None
            here, there = np.asarray(here, np.float64), np.asarray(there, np.float64)
            if not (np.abs(here - there) <= p.atol_at(k) + 1e-4 * np.abs(there)).all():
                return None
        return (
            f"'{ahead.name}' logged its {len(c_steps)} steps at {int(ahead.steps[0])}-{int(ahead.steps[-1])} and "
            f"'{behind.name}' as many at {int(behind.steps[0])}-{int(behind.steps[-1])}, and every weight "
            f"'{ahead.name}' recorded at this step is the one '{behind.name}' recorded at step {step - shift}: "
            f"'{ahead.name}' numbers its steps {shift} later, so each step both logged holds other iterations of each "
            f"run; its step counter is read after {shift} update(s) of the iteration (a GAN's phase numbered by the "
            "optimizer of the phase before it, read after that phase's update: number every phase by one counter "
            "read before the iteration's first update, such as the generator's optimizer's iterations)"
        )

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
