"""Notes on hyper-parameters that follow a schedule: shifted, in stairs, running at another pace,
one phase shifted; and momentum carried across an lr change."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from tb_parity_plugin.engine.notes.context import (
    _MOMENTUM,
    NoteContext,
    _scalar_at,
)
from tb_parity_plugin.engine.pair import Pair, take_rows
from tb_parity_plugin.engine.tolerance import (
    HPARAM_RTOL,
)
from tb_parity_plugin.records import metadata


class ScheduleNotes(NoteContext):
    """Notes on hyper-parameters that follow a schedule, and momentum across an lr change."""

    def _schedule_note(self, pair: Pair, k: int) -> Optional[str]:
        """For a scalar hyper-parameter diverging at compared step ``k``: when, at ``k`` and every
        later step both runs logged, the candidate's value is the baseline's a few steps later or
        earlier (:data:`SHIFTS`), or the baseline's times one factor, say so. A new user's warm-up
        off by one step showed lr 0.001 against 0 at step 0, ``max_rel_diff=n/a``, and no note."""
        if not pair.use_values or pair.base.values.shape[1] < 1 or pair.cand.values.shape[1] < 1:
            return None
        if int(pair.base.stats[pair.ib[k], metadata.STAT_INDEX["size"]]) != 1:
            return None
        both = np.flatnonzero((pair.ib >= 0) & (pair.ic >= 0))
        steps = self.steps[both]
        b = pair.base.values[pair.ib[both], 0].astype(np.float64)
        c = pair.cand.values[pair.ic[both], 0].astype(np.float64)
        if not (np.isfinite(b).all() and np.isfinite(c).all()):
            return None
        at = int(np.searchsorted(both, k))  # k's place among the steps both logged
        # a schedule rounds at the scale of its peak (tolerance.HPARAM_ATOL_OF_PEAK): 4 ulps of it
        close = 4.0 * HPARAM_RTOL * float(np.abs(b).max())
        form = self._schedule_form(steps, b, c, at, close)
        held = self._held_per_execution(steps, b, c, at, close)
        if held is not None:
            form = held if form is None else f"{held}; if no callback sets it: {form}"
        applied = self._same_lr_applied(pair, k) if pair.base.kind == "lr" else None
        if applied is None:
            return form
        return applied if form is None else f"{applied}; the recorded values: {form}"

    def _same_lr_applied(self, pair: Pair, k: int) -> Optional[str]:
        """For an lr diverging at compared step ``k``: when every recorded weight agrees at ``k`` and at
        the next compared step, where its update at the candidate's recorded lr would have moved some
        weight far past tolerance, both runs applied one lr at ``k`` and one of them records another
        value than its update applies. A new user's port recorded ``rec.lr(optimizer.learning_rate)``,
        which tf_keras holds at the last update's value before ``apply_gradients``: the faithful port
        was told its schedule ran a step behind. The effect is bounded below element-wise by both
        ``|update| x |c/b - 1|`` (Adam, SGD, TF1 momentum: the whole update scales with the lr) and
        ``|c - b| x |gradient|`` (Keras momentum: the lr scales the gradient's term alone)."""
        if k + 1 >= len(self.steps) or int(self.steps[k + 1]) != int(self.steps[k]) + 1:
            return None
        both = pair.step_values(k)
        if both is None:
            return None
        lr_b, lr_c = (float(np.ravel(v)[0]) for v in both)
        if not (np.isfinite(lr_b) and np.isfinite(lr_c)) or lr_b == 0.0:
            return None
        weights = [p for p in self._pairs if p.base.kind == "weight"]
        if not weights or not self._all_agree_at(weights, k) or not self._all_agree_at(weights, k + 1):
            return None
        reach = 0.0  # the largest effect over its tolerance at k + 1 the candidate's lr would have had
        for w in weights:
            g = self._gradient_of(w)
            now, nxt = w.step_values(k), w.step_values(k + 1)
            grad = None if g is None else g.step_values(k)
            if now is None or nxt is None or grad is None or not now[0].shape == nxt[0].shape == grad[0].shape:
                continue
            w0, w1, gb = (np.asarray(a, np.float64) for a in (now[0], nxt[0], grad[0]))
            effect = np.minimum(np.abs(w1 - w0) * abs(lr_c / lr_b - 1.0), abs(lr_c - lr_b) * np.abs(gb))
            tol = w.atol_at(k + 1) + w.rtol_at(k + 1) * np.abs(w1)
            if np.isfinite(effect).all():
                reach = max(reach, float((effect / np.maximum(tol, 1e-300)).max(initial=0.0)))
        if reach < 10.0:
            return None
        step, after = int(self.steps[k]), int(self.steps[k + 1])
        return (
            f"every recorded weight agrees at step {after}, where an update at the candidate's recorded lr would have "
            f"moved one {reach:.3g} times its tolerance: both runs applied the same lr at step {step}, and one of them "
            "records another value than its update applies (tf_keras's optimizer.learning_rate, read in the step "
            "before apply_gradients, holds the last update's lr: record schedule(optimizer.iterations) instead)"
        )

    def _schedule_form(self, steps: np.ndarray, b: np.ndarray, c: np.ndarray, at: int, close: float) -> Optional[str]:
        """:meth:`_schedule_note`'s reading of the two schedules' values alone (``b``, ``c`` at ``steps``,
        apart first at index ``at``): shifted, in stairs, at another pace or scale."""
        index = {int(s): i for i, s in enumerate(steps)}
        step_k = int(steps[at])
        for shift in (*SHIFTS, *self._stair_shifts(steps, b, c, at, close)):
            later = [(i, int(s) + shift) for i, s in enumerate(steps[at:], at)]
            # a step whose counterpart the baseline did not log counts only past either end of its record
            if any(t not in index and steps[0] <= t <= steps[-1] for _, t in later):
                continue
            found = [(i, index[t]) for i, t in later if t in index]
            if len(found) < 2:
                continue
            if all(abs(c[i] - b[j]) <= close for i, j in found):
                side, n = ("later", "ahead") if shift > 0 else ("earlier", "behind")
                if abs(shift) in SHIFTS:
                    steps_of, runs = "step(s)", f"runs {abs(shift)} step(s) {n}"
                    before = ", before its record begins" if step_k + shift < steps[0] else ""
                    cause = (
                        "a step count read after its increment (optimizer.iterations + 1) where the other reads it "
                        "before, a warm-up counted from 1 against 0, or boundaries shifted by one"
                    ) + _per_epoch_clause(steps, b, c, shift, close)
                else:  # a shift of _stair_shifts
                    steps_of, runs, before = "steps", f"changes {abs(shift)} steps {n}", ""
                    cause = (
                        f"a value set per epoch one epoch {'early' if shift > 0 else 'late'} if an epoch is "
                        f"{abs(shift)} steps (a LearningRateScheduler or ReduceLROnPlateau callback, an epoch counted "
                        "from 1 against 0, a schedule by epoch against one by step), or boundaries that many steps apart"
                    )
                return (
                    f"from step {step_k} on (the {len(found)} steps both runs logged that it can be read at), the "
                    f"candidate's value at each step is the baseline's {abs(shift)} {steps_of} {side} (at step "
                    f"{step_k}: the baseline's at step {step_k + shift}{before}): its schedule {runs}: {cause}"
                )
        epochs = _epoch_length_note(steps, b, c, close)
        if epochs is not None:
            return epochs
        phase = _first_step_only_note(steps, b, c, at, close) or _shifted_phase_note(steps, b, c, at, close)
        if phase is not None:
            return phase
        stairs = _staircase_note(steps, b, c, close) or _time_scale_note(steps, b, c, at, close)
        if stairs is not None:
            return stairs
        rest = slice(at, None)
        if len(b[rest]) >= 2 and np.all(np.abs(b[rest]) > close):
            ratio = c[rest] / b[rest]
            factor = float(np.median(ratio))
            if abs(factor - 1.0) > 1e-3 and np.all(np.abs(c[rest] - factor * b[rest]) <= close * max(1.0, factor)):
                cut = self._one_run_changed(steps, b, c, at, close, factor)
                if cut is not None:
                    return cut
                return (
                    f"from step {step_k} on, the candidate's value is the baseline's times {factor:.4g} at every "
                    f"step both logged ({len(b[rest])}): the same schedule at another scale (its initial or peak "
                    "value; a learning rate scaled by the replicas or the batch size on one side)"
                )
        return None

    def _one_run_changed(
        self, steps: np.ndarray, b: np.ndarray, c: np.ndarray, at: int, close: float, factor: float
    ) -> Optional[str]:
        """For a value the baseline's times ``factor`` from index ``at`` on, after the two agreed at every
        step before: when one run changed it at ``at`` and the other did not, or both by other factors,
        say so (None when they did not agree before at values a scale would have shown on). A trial's plateau rule, its ``min_delta`` relative
        in TF1 and absolute in ReduceLROnPlateau, cut the lr at step 27 in one run only, after 27 steps
        alike, and was told of another initial or peak value, or the replicas."""
        # where the value was 0 (a warm-up's first step) a scale could not show: no evidence it came later
        if at < 1 or np.any(np.abs(c[:at] - b[:at]) > close) or np.any(np.abs(b[:at]) <= close):
            return None
        step_k, prev = int(steps[at]), int(steps[at - 1])
        moved = [abs(x[at] - x[at - 1]) > close for x in (b, c)]
        head = (
            f"the two agreed at every step both logged up to step {prev}, and from step {step_k} on the candidate's "
            f"value is the baseline's times {factor:.4g}: "
        )
        causes = (
            "a plateau rule's patience, cooldown or min_delta (relative in one run, absolute in the other: "
            "ReduceLROnPlateau's min_delta is absolute), a decay boundary or a staircase step in one run only"
        )
        if moved[0] != moved[1]:
            run, other = (self.base.name, self.cand.name) if moved[0] else (self.cand.name, self.base.name)
            return head + f"'{run}' changed it at step {step_k} and '{other}' did not: a change one run made ({causes})"
        if moved[0]:
            return (
                head
                + f"both changed it at step {step_k}, by other factors (a decay rate or a plateau factor other; {causes})"
            )
        return None

    def _held_per_execution(
        self, steps: np.ndarray, b: np.ndarray, c: np.ndarray, at: int, close: float
    ) -> Optional[str]:
        """When a run recorded ``fit``'s ``steps_per_execution`` above 1 (the TF2 shim's run info) and,
        at the first step apart, its value holds from the step before while the other run's changes:
        Keras calls batch callbacks once per execution, so a value a callback sets per batch (a warm-up
        in ``on_train_batch_begin``) is set at every n-th step only. A new user's such port diverged on
        its lr at step 1 with no note."""
        if at < 1 or np.any(np.diff(steps[: at + 1]) != 1):
            return None
        for run, mine, other in ((self.cand, c, b), (self.base, b, c)):
            n = run.info.get("steps_per_execution")
            if not isinstance(n, int) or n < 2:
                continue
            # set at an execution's first step to the other run's value there, held for at most n steps
            starts = np.concatenate([[0], np.flatnonzero(np.abs(np.diff(mine)) > close) + 1])
            starts = starts[starts <= at]
            sampled = bool(np.all(np.abs(mine[starts] - other[starts]) <= close))
            if (
                sampled
                and np.all(np.diff(np.append(starts, at)) <= n)
                and (abs(mine[at] - mine[at - 1]) <= close < abs(other[at] - other[at - 1]))
            ):
                return (
                    f"'{run.name}' ran fit with steps_per_execution={n}, and its value holds at step {int(steps[at])} "
                    f"where the other run's changes: Keras calls batch callbacks (on_train_batch_begin/end) once per "
                    f"execution of {n} steps, so a value a callback sets per batch (a warm-up, a per-step schedule "
                    "by callback) is set at the first step of each execution only; set it in the optimizer (a "
                    "LearningRateSchedule), or compile with steps_per_execution=1"
                )
        return None

    @staticmethod
    def _stair_shifts(steps: np.ndarray, b: np.ndarray, c: np.ndarray, at: int, close: float) -> list[int]:
        """Shifts past :data:`SHIFTS` that would carry the baseline's value changes onto the
        candidate's first change from ``at`` on: an lr set per epoch one epoch late (a
        ``LearningRateScheduler`` callback) is the baseline's one epoch of steps earlier, which the
        shifts of 1-3 steps never reach (a new user's port got no note). Only shifts that align
        a change, nearest first and at most :data:`MAX_STAIR_SHIFTS`, each then checked at every step
        like the short ones."""
        start = max(at - 1, 0)  # the candidate's change may be what diverges at ``at``
        moved = np.flatnonzero(np.abs(np.diff(c[start:])) > close)
        changes = np.flatnonzero(np.abs(np.diff(b)) > close) + 1
        if len(moved) == 0 or len(changes) == 0:
            return []
        first = int(steps[start + int(moved[0]) + 1])
        shifts = {int(steps[j]) - first for j in changes}
        ordered = sorted((s for s in shifts if abs(s) not in SHIFTS and s != 0), key=lambda s: (abs(s), -s))
        return ordered[:MAX_STAIR_SHIFTS]

    def _momentum_at_lr_change(self, pair: Pair, k: int) -> Optional[str]:
        """For a momentum slot diverging at step ``k`` right after an lr changed, when one slot is
        the other's times ``lr(k-1) / lr(k)`` of one run's recorded lr (within ``HPARAM_RTOL``, not
        the slot's own tolerance, which an override may loosen): Keras SGD's momentum kept as
        ``-lr x accumulator``, recorded divided by this step's lr, against TF1's accumulator.

        A new user's port of ``MomentumOptimizer`` under a staircase schedule diverged by 2x on a
        slot, with nothing to say that the two optimizers' rules part at an lr change. Each run's lr
        is tried as the Keras side's (it divides its slot), only the TF2 run's when one run is TF1's
        and the other TF2's: a port with ``staircase=False`` changed the
        candidate's lr alone, and its slots, equal in each optimizer's own units, were blamed on
        clipping or a weight decay."""
        if not _MOMENTUM.search(f"{pair.base.name} {pair.cand.name}") or k == 0:
            return None
        if int(self.steps[k - 1]) != int(self.steps[k]) - 1:
            return None
        both = pair.step_values(k)
        if both is None:
            return None
        b, c = (np.asarray(x, np.float64) for x in both)
        if not (np.abs(b) > pair.tol.atol).any() and not (np.abs(c) > pair.tol.atol).any():
            return None
        # float32 rounding accumulated in the slot, at the scale of its recent values: a new user's
        # conv kernel slot (scale 6e-3) was 2x TF1's within 2.3e-9, and a bias slot's elements that
        # cancelled to 0.006 were 2x within 3e-6 (0.53 the step before). Each step's rounding decays
        # with the momentum, so an old peak counts decayed: the all-time peak of a slot that spiked
        # at step 1 let a slot 1.5x the baseline's, or zeroed, be told "times the lr ratio" at step 100
        rounding = 2.0**-15 * _decayed_peak(pair.base, pair.ib, self.steps, k)
        sides = {str(run.info.get("side", "")) for run in (self.base, self.cand)}
        keras_sides = (
            ("baseline", "candidate")
            if sides != {"tf1", "tf2"}
            else (("candidate",) if self.cand.info.get("side") == "tf2" else ("baseline",))
        )
        for lr in self._pairs:
            if (
                lr.base.kind != "lr"
                or not lr.use_values
                or min(int(x) for x in (*lr.ib[k - 1 : k + 1], *lr.ic[k - 1 : k + 1])) < 0
            ):
                continue
            lrs = {
                side: tuple(_scalar_at(series, rows, j) for j in (k - 1, k))
                for side, series, rows in (("baseline", lr.base, lr.ib), ("candidate", lr.cand, lr.ic))
            }
            for keras, (before, now) in lrs.items():
                if keras not in keras_sides or not (before >= 0 and now > 0) or abs(before - now) <= HPARAM_RTOL * now:
                    continue
                if before == 0:  # a warm-up from lr 0: Keras's velocity -lr x g kept nothing, TF1's accumulator g
                    kept, other_slot = (c, b) if keras == "candidate" else (b, c)
                    if np.any(kept != 0) or not (np.abs(other_slot) > pair.tol.atol).any():
                        continue
                else:
                    scale = before / now if keras == "candidate" else now / before  # c = scale x b
                    if not np.all(np.abs(c - scale * b) <= 1e-4 * scale * np.abs(b) + scale * rounding):
                        continue
                other = "baseline" if keras == "candidate" else "candidate"
                lr_name = f"{lr.base.kind}/{lr.base.name}"
                ratio = f"{lr_name} at step {int(self.steps[k - 1])} / at step {int(self.steps[k])}"
                rule = (
                    "Keras SGD keeps momentum as -lr x accumulator (recorded divided by this step's lr), TF1's "
                    "MomentumOptimizer as the accumulator"
                )
                factor = before / now  # the Keras side's slot over the other's
                slot_of = f"the {keras}'s slot is the {other}'s"
                if abs(lrs[other][1] - now) > HPARAM_RTOL * now or abs(lrs[other][0] - before) > HPARAM_RTOL * before:
                    return (
                        f"{slot_of} times the {keras}'s {ratio} = {factor:.4g}: {rule}, so each slot holds what "
                        f"the other does in its own optimizer's units, and the difference is the {keras}'s lr, "
                        f"which changed where the {other}'s did not change alike ({lr_name} differs between the runs "
                        "at these steps: its schedule is the difference)"
                    )
                zero = (
                    " (from lr 0: the gradients of the steps at lr 0 are in TF1's accumulator and not in Keras's "
                    "velocity, as a warm-up from 0 leaves them)"
                    if before == 0
                    else ""
                )
                return (
                    f"{slot_of} times {ratio} = {factor:.4g}: {rule}, and at an lr change their rules part (TF1 "
                    f"applies the new lr to the whole accumulator, Keras to the new gradient only){zero}: a real "
                    "difference from this step's update on, which a port needs its own update rule to remove"
                )
        return None


#: Step offsets a schedule note tries, nearest first (:meth:`Comparison._schedule_note`).
SHIFTS = (1, -1, 2, -2, 3, -3)


def _first_step_only_note(steps: np.ndarray, b: np.ndarray, c: np.ndarray, at: int, close: float) -> Optional[str]:
    """When the runs differ at step 0 alone (agreeing at every later step, at least 2) and one run's value
    there is the value both have at step 1: that run evaluates its schedule at step 1 for step 0, a step
    clamped to at least 1 (``tf.maximum(step, 1)``, a guard against ``step ** -0.5`` at 0), where the other
    evaluates it at 0. A trial's Transformer port of TF1's noam schedule, ``d ** -0.5 * min(step ** -0.5,
    step * warmup ** -1.5)`` from ``global_step`` (0 at step 0), guarded so, was told one phase of its
    schedule ran a step ahead, as a warm-up counted from 1 before a decay: its warm-up reads the step
    itself at every later step."""
    if at != 0 or int(steps[0]) != 0 or len(steps) < 3 or int(steps[1]) != 1:
        return None
    if abs(c[0] - b[0]) <= close or np.any(np.abs(c[1:] - b[1:]) > close):
        return None
    held = [name for name, x in (("baseline", b), ("candidate", c)) if abs(x[0] - x[1]) <= close]
    if len(held) != 1:
        return None
    run, other = held[0], "candidate" if held[0] == "baseline" else "baseline"
    value_at = {"baseline": b[0], "candidate": c[0]}
    return (
        f"the runs differ at step 0 alone and agree from step 1 on: the {run}'s value at step 0 is the one both "
        f"have at step 1 ({value_at[run]:.6g}), the {other}'s is {value_at[other]:.6g}: the {run} evaluates its "
        "schedule at step 1 for step 0, as a step clamped to at least 1 does (tf.maximum(step, 1), a guard against "
        f"step ** -0.5 or 1 / step at 0), where the {other} evaluates it at step 0 itself (a noam warm-up, "
        "d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5), is 0 there), or a boundary at step 1 moved to 0; "
        "not a whole warm-up shifted, which would differ at its later steps too"
    )


def _shifted_phase_note(steps: np.ndarray, b: np.ndarray, c: np.ndarray, at: int, close: float) -> Optional[str]:
    """When the runs agree at every step from some step on (at least 2), and before it, from step
    ``steps[at]``, the candidate's value is the baseline's a few steps later or earlier
    (:data:`SHIFTS`) at each step they are apart, but for at most that many steps at the end (where
    the shifted phase meets the rest): one phase of the schedule is shifted, the rest not. BERT's
    warm-up, ``lr * step / warmup_steps`` before a decay that reads the step itself, ported as
    ``(step + 1) / warmup_steps``: a helper's port diverged at step 0 on ``lr`` with no note, since the
    shift holds during the warm-up only. The phase ends where the runs agree, not where the shift
    stops holding: over a flat stretch both hold, and one boundary of a piecewise schedule moved by
    one step was told the shift held for the 10 steps it stayed flat after it."""
    apart = np.flatnonzero(np.abs(c - b) > close)
    settled = int(apart[-1]) + 1 if len(apart) else at  # agreeing at every step from here on
    if settled <= at or len(steps) - settled < 2:
        return None
    index = {int(s): i for i, s in enumerate(steps)}
    for shift in SHIFTS:
        run = 0
        for i in range(at, settled):
            j = index.get(int(steps[i]) + shift)
            if j is None or abs(c[i] - b[j]) > close:
                break
            run += 1
        end = at + run  # the first step the shift no longer holds at
        # one step is evidence only when it is every step apart (a boundary moved by one)
        if run < 1 or settled - end > abs(shift) or (settled > end and run < 2):
            continue
        side, n = ("later", "ahead") if shift > 0 else ("earlier", "behind")
        return (
            f"from step {int(steps[at])} to step {int(steps[end - 1])} ({run} steps both runs logged), the "
            f"candidate's value at each step is the baseline's {abs(shift)} step(s) {side} (at step "
            f"{int(steps[at])}: the baseline's at step {int(steps[at]) + shift}), and from step {int(steps[settled])} "
            f"on the two agree: one phase of its schedule runs {abs(shift)} step(s) {n} and the rest does not, "
            "as a warm-up counted from 1 against 0 ((step + 1) / warmup_steps) before a decay that reads the "
            f"step itself, or a boundary of a piecewise schedule moved by {abs(shift)} step(s)"
        )
    return None


def _per_epoch_clause(steps: np.ndarray, b: np.ndarray, c: np.ndarray, shift: int, close: float) -> str:
    """For a schedule shifted by ``shift`` steps (2 or 3: :data:`SHIFTS`), when every change of each run's
    value falls on one residue of ``shift`` (two or more changes in each run): a value set per epoch, one epoch
    early or late, if an epoch is that many steps, said as a clause; "" otherwise. A trial's plateau rule
    with epochs of 3 steps, one epoch early in the port (ReduceLROnPlateau's patience counted otherwise),
    was told only of a step count read after its increment or a warm-up counted from 1."""
    n = abs(shift)
    if n < 2:
        return ""
    each = [steps[1:][np.abs(np.diff(x)) > close] for x in (b, c)]
    changes = np.concatenate(each)
    # a shifted run's changes are the other's moved by the shift, so one change each always shares a residue:
    # two or more in each run that all do are the evidence of epochs
    if min(len(e) for e in each) < 2 or len(np.unique(changes % n)) != 1:
        return ""
    return (
        f"; or, if an epoch is {n} steps (each run changes its value only at steps {int(changes[0] % n)} modulo "
        f"{n}), a value set per epoch one epoch {'early' if shift > 0 else 'late'} (ReduceLROnPlateau's patience "
        "or cooldown counted otherwise than a hand-written plateau rule, a LearningRateScheduler, an epoch counted "
        "from 1 against 0, a callback reading the epoch's logs before they are written)"
    )


def _first_steps(steps: np.ndarray) -> str:
    """The first four of ``steps``, for a note ("3, 6, 9, 12, ...")."""
    return ", ".join(str(int(x)) for x in steps[:4]) + (", ..." if len(steps) > 4 else "")


def _epoch_length_note(steps: np.ndarray, b: np.ndarray, c: np.ndarray, close: float) -> Optional[str]:
    """When each run's value holds in stairs that change every ``P`` steps (at ``P``, ``2 P``, ...,
    at least twice), ``P`` other in the two runs, through the same values in the same order: a value
    set per epoch over epochs of other lengths. A new user's TF1 loop over ``N // batch_size``
    batches dropped the partial last batch that its ``fit`` port kept (epochs of 6 steps against 7,
    a ``LearningRateScheduler`` on both sides) and was told one phase of its schedule ran a step
    behind, as a warm-up counted from 1: the lag grows by a step each epoch. Only a record of every
    step from step 0 on is read (the periods are step numbers)."""
    if len(steps) < 4 or int(steps[0]) != 0 or np.any(np.diff(steps) != 1):
        return None
    periods = []
    for v in (b, c):
        changes = np.flatnonzero(np.abs(np.diff(v)) > close) + 1  # the steps where a stair starts
        if len(changes) < 2 or changes[0] < 2 or np.any(changes != changes[0] * np.arange(1, len(changes) + 1)):
            return None
        periods.append((int(changes[0]), changes))
    (pb, cb), (pc, cc) = periods
    if max(pb, pc) % min(pb, pc) == 0:  # equal, or a whole time scale: _time_scale_note's
        return None
    n = min(len(cb), len(cc))
    starts_b, starts_c = np.concatenate([[0], cb[:n]]), np.concatenate([[0], cc[:n]])
    if np.any(np.abs(b[starts_b] - c[starts_c]) > close):
        return None
    return (
        f"the baseline's value changes every {pb} steps (at step {_first_steps(cb)}) and the candidate's every {pc} "
        f"(at step {_first_steps(cc)}), through the same values: a schedule in steps of another period "
        f"(staircase decay_steps, or evenly spaced boundaries, {pb} against {pc}), or a value set per epoch (a LearningRateScheduler or "
        f"ReduceLROnPlateau callback, a schedule in epochs) over epochs of {pb} steps in the baseline and {pc} in "
        "the candidate: one run keeps a partial last batch that the other drops (a TF1 loop over N // batch_size "
        "batches against fit, which keeps it, or a batch with drop_remainder=True on one side), or the runs "
        "differ in batch size or in the number of examples an epoch holds"
    )


#: Longer shifts tried for a hyper-parameter in stairs (``Comparison._stair_shifts``).
MAX_STAIR_SHIFTS = 8


#: Time scales tried for a schedule that runs some whole number of times as fast (``_time_scale_note``).
MAX_TIME_SCALES = 16


#: how much of a momentum slot's old rounding a step keeps: above the usual 0.9, so a 0.95 momentum's
#: rounding is still covered, and an early spike 100 steps back counts for 0.6 % of itself
_ROUNDING_DECAY = 0.95


def _staircase_note(steps: np.ndarray, b: np.ndarray, c: np.ndarray, close: float) -> Optional[str]:
    """When one run's scalar schedule holds in stairs (changing at a few steps) and the other's
    moves at most steps in the same direction, equal to it (within ``close``) where each stair
    starts: ``staircase=True`` on one side only. A new user's LSTM port diverged on lr at step 1
    (0.0097915 against 0.01) with no note. The flag is named first only where the moving side
    decays as a schedule with that flag does (:func:`_decays_as_staircase_schedule`): a review's
    piecewise-constant against a linear schedule, equal where each piece starts, was told of
    ``staircase`` alone; and a short window cannot tell a linear decay from a geometric one (a
    review's per-epoch linear lr over 300 steps), so an lr set once per epoch is named too."""
    for flat, smooth, flat_name, smooth_name in ((b, c, "baseline", "candidate"), (c, b, "candidate", "baseline")):
        starts = np.flatnonzero(np.abs(np.diff(flat)) > close) + 1
        moves = np.abs(np.diff(smooth)) > close
        if not len(starts) or len(starts) * 2 > len(flat) - 1 or moves.mean() <= 0.5:
            continue
        direction = np.sign(flat[starts[0]] - flat[0])
        if not np.all(np.sign(np.diff(smooth)[moves]) == direction):
            continue
        at = np.concatenate([[0], starts])
        if np.all(np.abs(smooth[at] - flat[at]) <= close):
            where = ", ".join(str(int(s)) for s in steps[starts][:5]) + (", ..." if len(starts) > 5 else "")
            per_epoch = "an lr set once per epoch (a LearningRateScheduler callback) against one computed at every step"
            causes = (
                "staircase=True on one side only (tf.compat.v1.train.exponential_decay, ExponentialDecay, "
                f"InverseTimeDecay), or {per_epoch}"
                if _decays_as_staircase_schedule(steps, smooth)
                else f"the continuous one is neither geometric nor an inverse time, the forms with a staircase flag: "
                f"{per_epoch}, or piecewise-constant boundaries against a continuous schedule; or staircase=True on "
                "one side only under a floor or a warm-up (tf.maximum(lr, floor))"
            )
            return (
                f"the {flat_name}'s value holds in stairs (changing at step {where}) and the {smooth_name}'s changes "
                f"at every step, equal where each stair starts: one schedule is evaluated in stairs and the other at "
                f"every step ({causes})"
            )
    return None


def _time_scale_note(steps: np.ndarray, b: np.ndarray, c: np.ndarray, at: int, close: float) -> Optional[str]:
    """When, from ``at`` on, the candidate's value at each step ``s`` is the baseline's at step ``m s``
    (or ``s // m``) for one whole ``m`` of at least 2: one schedule runs ``m`` times as fast. A new
    user's port decayed its lr every step (``ExponentialDecay(decay_steps=1)``, the epoch count of
    TF1's ``decay_steps=4``, an epoch of 4 steps) and diverged at step 1 with no note. Each ``m`` is
    one that carries a change of one run onto a change of the other (at most
    :data:`MAX_TIME_SCALES`): at ``j = m i`` (stairs of ``floor(s / decay_steps)``) or at
    ``j - 1 = m (i - 1)`` (a piecewise-constant boundary, passed at ``boundary + 1``); it must hold at
    every step both logged where the other's step exists inside its record (at least 2), and the
    candidate's value must move there. Every other whole factor that holds there too (at one step at
    least) is named with it: piecewise-constant boundaries written in epochs (``[1, 2]`` for TF1's
    ``[10, 20]``, 10 steps an epoch) hold for every factor from 7 to 10, and the note named 7 alone,
    "if an epoch is 7 steps", for a port whose epoch is 10."""
    index = {int(v): i for i, v in enumerate(steps)}
    first, last = int(steps[0]), int(steps[-1])
    b_changes = [int(v) for v in steps[1:][np.abs(np.diff(b)) > close] if v > 0]
    c_changes = [int(v) for v in steps[max(at, 1) :][np.abs(np.diff(c[max(at - 1, 0) :])) > close] if v > 0]

    def carried(j: int, i: int) -> set[int]:
        out = {j // i} if j % i == 0 else set()
        return out | ({(j - 1) // (i - 1)} if i > 1 and (j - 1) % (i - 1) == 0 else set())

    tries = sorted({(m, True) for j in b_changes for i in c_changes for m in carried(j, i) if m >= 2})
    tries += sorted({(m, False) for i in c_changes for j in b_changes for m in carried(i, j) if m >= 2})

    def holds(m: int, faster: bool) -> Optional[list[tuple[int, int]]]:
        """The (candidate, baseline) index pairs where the candidate is the baseline's at ``m s`` (or
        ``s // m``), or None when a step logged by both differs or the baseline skipped one inside its record."""
        found = []
        for i in range(at, len(steps)):
            t = int(steps[i]) * m if faster else int(steps[i]) // m
            if t in index:
                if abs(c[i] - b[index[t]]) > close:
                    return None
                found.append((i, index[t]))
            elif first <= t <= last:
                return None  # a step the baseline did not log inside its record: no evidence either way
        return found

    def carries(m: int, faster: bool) -> bool:
        """Whether every change of the candidate whose counterpart lies in the baseline's record (at
        least one) lands on a change of the baseline, as stairs of ``floor(s / decay_steps)`` carry them
        (``j = m i``) or as piecewise-constant boundaries do (``j - 1 = m (i - 1)``)."""
        changes, mine = set(b_changes), [i for i in c_changes if i >= int(steps[at])]
        for stairs in (True, False):
            if faster:
                targets = [m * i if stairs else m * (i - 1) + 1 for i in mine]
                if any(t in changes for t in targets) and all(t in changes for t in targets if t <= last):
                    return True
            else:
                offset = 0 if stairs else 1
                if all((i - offset) % m == 0 and (i - offset) // m + offset in changes for i in mine) and mine:
                    return True
        return False

    for m, faster in tries[:MAX_TIME_SCALES]:
        found = holds(m, faster)
        if found is None or len(found) < 2 or np.ptp([c[i] for i, _ in found]) <= close:
            continue
        low = high = m
        while low > 2 and holds(low - 1, faster):
            low -= 1
        while holds(high + 1, faster):
            high += 1
        carrying = [k for k in range(low, high + 1) if carries(k, faster)]
        if len(carrying) == 1:  # the one factor the schedules' own changes say: name it alone
            low = high = m = carrying[0]
            found = holds(m, faster) or found
        step_k = int(steps[at])
        counterpart = step_k * m if faster else step_k // m
        factor = str(m) if low == high else f"{low} to {high}"
        pace = f"{factor} times as fast as" if faster else f"{factor} times as slow as"
        mapped = f"{m} s" if faster else f"s // {m}"
        also = (
            ""
            if low == high
            else f" (so does every whole factor from {low} to {high}: the steps logged cannot tell them apart)"
        )
        logged = f"{len(found)} step{'' if len(found) == 1 else 's'} both runs logged"
        return (
            f"from step {step_k} on, the candidate's value at each step s is the baseline's at step "
            f"{mapped} ({logged}; at step {step_k}: the "
            f"baseline's at step {counterpart}){also}: its schedule runs {pace} the baseline's: a decay counted in "
            f"steps on one side and in epochs on the other (decay_steps, boundaries or a LearningRateScheduler's "
            f"epoch, if an epoch is {factor} steps), or gradient accumulation of {factor} micro-batches counted per "
            "micro-batch on one side"
        )
    return None


#: how far (relative) a continuous schedule's values may lie from its exact form: float32 rounding of
#: ``lr0 * rate ** (step / decay_steps)``, a few ulps, within 16 (a linear decay over 1% of its value
#: bends 1.2e-5 away from a geometric one)
_SCHEDULE_FORM_RTOL = 2.0**-20


def _decays_as_staircase_schedule(steps: np.ndarray, values: np.ndarray) -> bool:
    """Whether positive ``values`` at ``steps`` follow the continuous form of a schedule that has a
    ``staircase`` flag: geometric (``ExponentialDecay``: log-linear in the step) or an inverse time
    (``InverseTimeDecay``: 1/value linear in the step), within float32 rounding."""
    v = np.asarray(values, dtype=np.float64)
    t = np.asarray(steps, dtype=np.float64)
    if len(v) < 3 or not np.all(np.isfinite(v) & (v > 0)):
        return False
    for form, relative in ((np.log(v), 1.0), (1.0 / v, v)):
        fit = np.polyval(np.polyfit(t, form, 1), t)
        if np.max(np.abs(form - fit) * relative) <= _SCHEDULE_FORM_RTOL:
            return True
    return False


def _decayed_peak(series: Any, rows: np.ndarray, steps: np.ndarray, k: int) -> float:
    """The largest finite magnitude of ``series`` at compared steps ``j <= k``, each decayed by
    ``_ROUNDING_DECAY`` per training step between them (``steps``), from its statistics: the scale of the rounding a momentum slot
    still carries at step ``k``."""
    at = np.arange(min(k + 1, len(rows)))
    taken = rows[at]
    kept = taken >= 0
    if not kept.any():
        return 0.0
    stats = take_rows(series.stats, taken[kept])
    lo, hi = stats[:, metadata.STAT_INDEX["min"]], stats[:, metadata.STAT_INDEX["max"]]
    # decayed per training step, not per logged one: a run logged at steps 1, 50, 99 and 100 kept
    # its step-1 spike nearly whole (a review's 1.5x slot was told "times the lr ratio" again)
    since = (steps[k] - steps[at[kept]]).astype(np.float64)
    big = np.fmax(np.abs(lo), np.abs(hi)) * _ROUNDING_DECAY**since
    return float(np.nanmax(big)) if np.isfinite(big).any() else 0.0
