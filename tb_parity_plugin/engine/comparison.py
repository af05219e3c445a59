"""The comparison: verdicts per tensor and step, the first divergence, the report.

Works on the reader's :class:`~tb_parity_plugin.logdir.rundata.RunData` snapshots (numpy only,
no TensorFlow). A :class:`Comparison` keeps per-tensor, per-step verdicts over the
steps both runs logged; :meth:`Comparison.update` with newer snapshots keeps what is
still valid, so a refresh after appended steps only computes the new steps.

Speed comes from never looping in Python per (step, tensor): each pair checks a chunk
of steps at once (:mod:`~tb_parity_plugin.engine.pair`), chunks are scanned in step
order and the scan stops at the first chunk holding a divergence.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import operator
import re
from typing import Any, Callable, Optional, Sequence

import numpy as np

from tb_parity_plugin.engine import align, allclose, batch, kinks, refresh, replicas, structure
from tb_parity_plugin.engine.matrix import ABSENT, OK, REASONS, SHAPE, VALUE, ParityMatrix
from tb_parity_plugin.engine.nonfinite import FirstNonfinite
from tb_parity_plugin.engine.pair import GradientScale, Pair, take_rows
from tb_parity_plugin.engine.tolerance import (
    GRAD_NOISE_OF_MAX,
    HPARAM_KINDS,
    HPARAM_RTOL,
    MARGINAL_RATIO,
    OUTPUT_ATOL_OF_MAX,
    StepClock,
    TolerancePolicy,
)
from tb_parity_plugin.engine.verdict_table import VerdictTable
from tb_parity_plugin.engine.verdicts import FIGURES, Divergence, ParityReport, TensorDetail, ended_early
from tb_parity_plugin.records import metadata

__all__ = ["Comparison", "compare_runs"]


#: Bytes of data one scan chunk touches: big enough to amortise per-call overhead,
#: small enough that a divergence early in the run is found without reading the rest.
_CHUNK_BYTES = 256 << 20
_MIN_CHUNK_STEPS = 16


class Comparison:
    """Baseline vs candidate, with verdicts cached per tensor and step.

    ``report()`` finds the first divergence scanning forward only as far as needed;
    ``matrix()`` and ``detail()`` fill in the rest on demand. ``update()`` with newer
    snapshots of the same runs reuses every verdict whose inputs did not change.
    """

    def __init__(
        self, base: Any, cand: Any, policy: TolerancePolicy = TolerancePolicy(), mapping: Sequence[str] = ()
    ) -> None:
        self.policy = policy
        self.mapping = tuple(mapping)
        self._pairs: list[Pair] = []
        self._table = VerdictTable()  # the pairs' verdicts, one column each (batched engine)
        self._chunk: Optional[int] = None  # steps per scan chunk, once per set of pairs
        self._groups: list[list[Pair]] = []  # pairs settled together (engine/batch.py)
        self._alignment: Optional[align.Alignment] = None
        #: (the alignment it is of, what else it read, the structure): see structure()
        self._structure: Optional[tuple[align.Alignment, tuple[Any, ...], structure.Structure]] = None
        #: (alignment, base keys, candidate keys) whose sizes the structure reads (structure.sized_keys)
        self._sized: Optional[tuple[align.Alignment, list[tuple[str, str]], list[tuple[str, str]]]] = None
        self._keys: Optional[tuple[Any, ...]] = None  # what align() read of both runs
        self._samples: set[int] = set()  # the alignment's matches that pair element samples
        #: slot match -> (its variable's gradient's match, ``align.slot_rule``), once per alignment
        self._feeding: dict[int, tuple[int, int, bool]] = {}
        self._weight_grads: dict[int, int] = {}  # weight match -> its gradient's match
        self._grad_of: Optional[dict[int, Pair]] = None  # id(weight pair) -> gradient pair, when asked
        self._average_of: Optional[dict[tuple[str, str], Pair]] = None  # (variables) -> their averages' pair
        self._fed: list[Pair] = []  # the pairs given a feeder by the last update
        self._unused: Optional[tuple[Any, list[str]]] = None  # (the keys it is for, the warnings)
        self._gradient_scales: dict[str, GradientScale] = {}  # the last update's, per layer, for its fed slots
        #: (step index, the pairs up to the first divergent one, their statistics-only tags): _unproven_before
        self._unproven: Optional[tuple[int, list[Pair], list[str]]] = None
        self._earlier: Optional[tuple[int, list[Pair], list[str]]] = None
        #: (the alignment, the matrix's column names and kinds): the same lists while it is unchanged
        self._columns: Optional[tuple[align.Alignment, list[str], list[str], list[str]]] = None
        self._nonfinite_scans: dict[str, FirstNonfinite] = {}
        self._replicas: dict[str, replicas.Replicas] = {}
        self.steps = np.zeros(0, dtype=np.int64)
        self._clock = StepClock()  # self.steps, for the pairs' warm-up rule
        self.base = base
        self.cand = cand
        self.update(base, cand)

    # -- building and refreshing -------------------------------------------------
    def update(self, base: Any, cand: Any) -> None:
        """Switch to newer snapshots of the two runs, keeping still-valid verdicts.

        A pair's cached verdicts survive when the compared steps only grew at the end
        and both series still hold the same rows (same steps, same statistics) there.
        """
        (base, reps_b), (cand, reps_c) = replicas.split(base), replicas.split(cand)
        self._replicas = {base.name: reps_b, cand.name: reps_c}
        tensors = (_align_inputs(base), _align_inputs(cand))
        read = None if self._alignment is None else align.evidence(self._alignment, base, cand)
        same_tensors = (tensors, read) == self._keys
        if not same_tensors:
            self._alignment = align.align(
                list(base.tensors.values()), list(cand.tensors.values()), self.mapping, self.policy.allow_unmatched
            )
            self._keys = (tensors, align.evidence(self._alignment, base, cand))
            self._samples = {i for i, m in enumerate(self._alignment.matches) if metadata.is_sample(m.base[1])}
            matches = self._alignment.matches
            found = align.gradient_matches(matches)
            self._feeding = {
                i: (j, *align.slot_rule(matches[i].base[1], matches[i].cand[1]))
                for i, j in found.items()
                if matches[i].base[0] == "slot"
            }
            self._weight_grads = {i: j for i, j in found.items() if matches[i].base[0] == "weight"}
        old_steps = self.steps
        steps = _common_steps(base.steps, cand.steps)
        prefix = len(old_steps) <= len(steps) and np.array_equal(steps[: len(old_steps)], old_steps)
        # One pair per match, in the alignment's order: an unchanged alignment pairs them up as they are.
        old_pairs = {} if same_tensors else {(p.match.base, p.match.cand): p for p in self._pairs}
        reuse = refresh.Reuse(steps, in_place=prefix and same_tensors)
        pairs = []
        kept = 0
        assert self._alignment is not None
        samples, base_tensors, cand_tensors = self._samples, base.tensors, cand.tensors
        # The common refresh: each batch group's layout checked once, its pairs grown together.
        grown = {id(p) for g in self._groups if reuse.keep_group(g, base_tensors, cand_tensors) for p in g}
        for i, match in enumerate(self._alignment.matches):
            old = self._pairs[i] if same_tensors else old_pairs.get((match.base, match.cand))
            if old is not None and id(old) in grown:
                pairs.append(old)
                kept += 1
                continue
            b, c = base_tensors[match.base], cand_tensors[match.cand]
            keep, sampled = True, i in samples
            # a sample's tolerance reads its tensor's rows (Pair.scale): its verdicts last while they do
            scaled = not sampled or old is None or refresh.scale_unchanged(old.scale, base_tensors, b)
            if sampled:
                ib, ic, one_sided = _where_both_sampled(reuse.rows_of(b), reuse.rows_of(c))
                keep = not one_sided and scaled
            if keep and old is not None and reuse.keep(old, b, c):  # the common refresh: grown, not rebuilt
                pairs.append(old)
                kept += 1
                continue
            if not sampled:  # a kept pair takes its rows from keep(): looked up only for one rebuilt
                ib, ic = reuse.rows_of(b), reuse.rows_of(c)
            n = len(steps)
            pair = Pair(
                match=match,
                base=b,
                cand=c,
                tol=self.policy.for_tag(f"{b.kind}/{b.name}"),
                ib=ib,
                ic=ic,
                reason=np.zeros(n, dtype=np.uint8),
                ratio=np.full(n, np.nan, dtype=np.float32),
                clock=self._clock,
            )
            if prefix and old is not None and scaled:
                reuse.copy_verdicts(old, pair)
            pairs.append(pair)
        if not (same_tensors and kept == len(pairs) == len(self._pairs)):
            self._chunk = None  # the chunk depends on each pair's evidence: kept pairs keep theirs
        self._link_feeders(pairs)
        self._link_scales(pairs, base_tensors)
        self._pairs = pairs
        self._grad_of = None
        self._average_of = None
        if batch.ENABLED:
            self._table.bind(pairs, len(steps))
        grouped = sum(len(g) for g in self._groups)
        if not (same_tensors and kept == len(pairs) == len(self._pairs) and len(grown) == grouped):
            # else every pair was kept and every group grew whole: the groups are still the same
            self._groups = batch.groups(pairs)
        self.steps = self._clock.steps = steps
        self.base, self.cand = base, cand
        self._nonfinite = {run.name: self._first_nonfinite(run) for run in (base, cand)}

    def _unused_patterns(self) -> list[str]:
        """:meth:`Policy.unused_patterns` of the two runs' tags, kept while their tensors are (the
        alignment's keys): a refresh's report asked again for each of 400 tags."""
        if self._unused is None or self._unused[0] is not self._keys:
            tags = ([f"{s.kind}/{s.name}" for s in run.tensors.values()] for run in (self.base, self.cand))
            self._unused = (self._keys, self.policy.unused_patterns(*tags))
        return list(self._unused[1])

    def _link_scales(self, pairs: list[Pair], base_tensors: Any) -> None:
        """Give each element sample its tensor's baseline series (``Pair.scale``: its tolerance's
        share of the largest element is the tensor's), on every update (the series is the
        snapshot's)."""
        for i in self._samples:
            p = pairs[i]
            p.scale = base_tensors.get((p.base.kind, metadata.sample_parent(p.base.name)))

    def _link_feeders(self, pairs: list[Pair]) -> None:
        """Give each slot its gradient's pair (``Pair.feeder``: its atol allows what the gradient's
        differences add up to), and take it from a pair kept from the last alignment that no
        longer has one. Only the slots are visited, not every pair. A slot compared by statistics
        only gets one too: its statistics prove a divergence against that atol (a wide bias's slot
        before batch norm, float32 noise on both sides, was a false DIVERGE without it)."""
        fed = []
        scales: dict[str, GradientScale] = {}
        layers: Optional[dict[str, list[Pair]]] = None
        for i, (j, moment, averages) in self._feeding.items():
            p = pairs[i]
            if layers is None:  # each layer's gradients: the sums whose rounding a slot of it carries
                layers = {}
                for q in pairs:
                    if q.base.kind == "grad":
                        layers.setdefault(align.layer_scope(q.base.name), []).append(q)
            layer = align.layer_scope(pairs[j].base.name)  # its whole scope: wide/dense is not deep/dense
            if layer not in scales:
                scales[layer] = GradientScale(layers.get(layer, [pairs[j]]), self._gradient_scales.get(layer))
            p.link_feeder(pairs[j], self.policy.equal_nan, moment, averages, scales[layer])
            fed.append(p)
        now = {id(p) for p in fed}
        for p in self._fed:
            if id(p) not in now:
                p.link_feeder(None, self.policy.equal_nan, 0, False)
        self._fed = fed
        self._gradient_scales = scales

    def _first_nonfinite(self, run: Any) -> Optional[dict[str, Any]]:
        """A run's first NaN/Inf, once per snapshot (kept in ``run.derived`` when it has one).

        What the scanner that found it knew is kept there too, and a comparison that reads the
        cached answer starts from a copy of it, so its next refresh scans the new rows only, not
        the whole run again (a scanner's memory is self-checking: each array it scanned is kept
        with what it found)."""
        derived = getattr(run, "derived", None)
        if derived is not None and "first_nonfinite" in derived:
            if "nonfinite_scanner" in derived and run.name not in self._nonfinite_scans:
                self._nonfinite_scans[run.name] = derived["nonfinite_scanner"].copy()
            return dict(derived["first_nonfinite"]) if derived["first_nonfinite"] else None
        scanner = self._nonfinite_scans.setdefault(run.name, FirstNonfinite())
        found = scanner.find(run)
        if derived is not None:
            derived["first_nonfinite"], derived["nonfinite_scanner"] = found, scanner.copy()
        return dict(found) if found else None

    # -- the scan ----------------------------------------------------------------
    def _chunk_steps(self) -> int:
        if self._chunk is None:  # once per set of pairs, not per scan
            per_step = sum(p.row_bytes() for p in self._pairs) or 1
            self._chunk = max(_MIN_CHUNK_STEPS, _CHUNK_BYTES // per_step)
        return self._chunk

    def _scan_first(self) -> Optional[int]:
        """Index (into ``self.steps``) of the first divergent step, scanning lazily."""
        n = len(self.steps)
        chunk = self._chunk_steps()
        equal_nan = self.policy.equal_nan
        while True:
            done, first = n, n  # every pair's verdicts are known up to done; the earliest divergence
            for p in self._pairs:
                if p.done < done:
                    done = p.done
                if 0 <= p.first_bad < first:
                    first = p.first_bad
            if first < done:
                return first
            if done >= n:
                return None
            end = min(n, done + chunk)
            for group in self._groups:
                batch.settle(group, end, equal_nan, self._table)
            for p in self._pairs:
                p.ensure(end, equal_nan)

    def fill(self) -> None:
        """Compute every verdict and ratio (the matrix needs them all)."""
        n = len(self.steps)
        for group in self._groups:
            batch.settle(group, n, self.policy.equal_nan, self._table, ratios=True)
            batch.settle_ratios(group, n, self._table)
        for p in self._pairs:
            p.ensure(n, self.policy.equal_nan)
            p.ensure_ratios(n)

    # -- results -----------------------------------------------------------------
    def _divergence(
        self,
        pair: Pair,
        k: int,
        kink: Optional[str] = None,
        loud: bool = False,
        slot_gaps: Sequence[tuple[Pair, float]] = (),
    ) -> Divergence:
        """``kink``: the step's :func:`kinks.note`, for a gradient; ``loud``: another tensor diverges
        past the noise at this step (:func:`_loud`), so no difference there is called marginal;
        ``slot_gaps``: (pair, largest element difference) of the slots diverging at this step
        element-wise."""
        b, c = pair.base, pair.cand
        found = pair.finding(k, self.policy.equal_nan)
        parent = metadata.sample_parent(b.name)
        if parent is not None and found.get("evidence") == "values":  # element-wise, on a few elements
            found["evidence"] = "sample"
            found["note"] = found.get("note") or (
                f"{metadata.SAMPLE_SIZE} elements at fixed positions of {parent}, recorded beside its statistics "
                "for the steps whose full values it does not keep: these elements differ beyond tolerance"
            )
            if self._shapes_differ(b.kind, parent, k):
                # positions follow the tensor's size: a new user's conv output of another length had its
                # sample "73% apart", elements of unrelated positions compared
                found.update({name: None for name in FIGURES})
                found["note"] = (
                    f"{parent} has another shape in each run at this step (its own divergence), so the sampled "
                    "positions hold unrelated elements: no figure of the sample means anything"
                )
        if pair.reason[k] == VALUE:
            notes = [
                found.get("note"),
                (self._overwritten_by_average(pair, k) or self._moved_by_the_update(pair, k, slot_gaps))
                if b.kind == "weight" and not found.get("note")
                else None,
                (
                    self._slot_starts_otherwise(pair, k)
                    or self._momentum_at_lr_change(pair, k)
                    or self._noise_fed(pair, k)
                    or self._slot_fed_otherwise(pair, k)
                )
                if b.kind == "slot"
                else None,
                kink if b.kind == "grad" else None,
                (
                    self._grad_scale(pair, k)
                    or self._decay_note(pair, k)
                    or (None if kink else self._jump_from_agreeing_inputs(pair, k))
                )
                if b.kind == "grad"
                else None,
                self._schedule_note(pair, k) if b.kind in HPARAM_KINDS else None,
                None
                if loud
                else _marginal_note(
                    b.kind, found, lambda: self._growth(pair, k), lambda: pair.atol_at(k), self._amplifiers
                ),
            ]
            found["note"] = "; ".join(n for n in notes if n) or None
        return Divergence(
            step=int(self.steps[k]),
            tensor=b.name,
            kind=b.kind,
            candidate_tensor=c.name,
            order=int(b.order),
            reason=REASONS[int(pair.reason[k])],
            **found,
        )

    def _divergences_at(self, k: int) -> list[Divergence]:
        """Every pair's divergence at compared step ``k``, in execution order."""
        diverged = [p for p in self._pairs if p.first_bad == k]
        kink = kinks.note(kinks.kinked(self._pairs, k)) if any(p.base.kind == "grad" for p in diverged) else None
        # a tensor is loud-stepped by those at or before it in execution order only: a difference is
        # the effect of one before it, never of one after (a trial's faithful 300-step CNN had its
        # first divergence, conv1 at 1.08, left without a note because bn1 after it reached 2.03)
        loud = list(itertools.accumulate((_loud(p, k, self.policy.equal_nan) for p in diverged), operator.or_))
        slot_gaps = [
            (p, float(gap))
            for p in diverged
            if p.base.kind == "slot" and p.reason[k] == VALUE and p.by_values_at(k)
            if (gap := p.finding(k, self.policy.equal_nan).get("max_abs_diff")) is not None
        ]
        found = [self._divergence(p, k, kink, before, slot_gaps) for p, before in zip(diverged, loud)]
        first = diverged[0] if diverged else None
        if (
            first is not None
            and first.reason[k] == VALUE
            and first.base.kind in ("activation", "output", "loss", "state")
        ):
            # past the noise only: a difference rounding can reach is no sign of another input; a
            # state's notes that rest on exact evidence (a run that did not update it, an agreeing
            # moving mean) hold at any ratio (a trial's biased moving variance, 1.18, got none)
            note = None
            past_noise = _loud(first, k, self.policy.equal_nan)
            if first.base.kind == "state":
                note = self._state_note(first, k, past_noise)
            elif past_noise:
                note = self._input_note(first, k)
            if note:
                found[0].note = "; ".join(n for n in (found[0].note, note) if n)
        return found

    def _shapes_differ(self, kind: str, name: str, k: int) -> bool:
        """Whether the pair of baseline tensor ``kind/name`` diverges by shape at compared step ``k``."""
        return any(p.base.kind == kind and p.base.name == name and p.reason[k] == SHAPE for p in self._pairs)

    def _state_note(self, first: Pair, k: int, past_noise: bool = True) -> Optional[str]:
        """What a state tensor (moving statistics, a moving average) diverging first at step ``k``
        means, from its own values at the last step it agreed: one run did not update it, its
        first update differs (the rule), or, after updates that agreed, one run updated it once
        more in between. A new user's Keras validation pass run with ``training=True`` moved the
        moving statistics, and the divergence said nothing of why. Unless ``past_noise`` (its
        error ratio past what rounding reaches), only the notes exact evidence proves."""
        seen = np.flatnonzero((first.ib[:k] >= 0) & (first.ic[:k] >= 0))
        if not len(seen):
            return None
        j = int(seen[-1])
        now, before = first.step_values(k), first.step_values(j)
        if now is None or before is None:
            # too large for full values (a batch norm over 5000 features): a run whose statistics
            # (min, max, mean, std, norm and counts) are the very same at both steps did not update
            # it; a helper's forgotten UPDATE_OPS there got no note
            rows = ((first.base, first.ib), (first.cand, first.ic))
            held = [take_rows(series.stats, np.array([at[j], at[k]])) for series, at in rows]
            still, by_statistics = [bool(np.array_equal(h[0], h[1], equal_nan=True)) for h in held], True
        elif len(before[0]) != len(now[0]):
            return None
        else:
            still, by_statistics = [bool(np.array_equal(a, b, equal_nan=True)) for a, b in zip(before, now)], False
        s_j, s_k = int(self.steps[j]), int(self.steps[k])
        bn = _MOVING_STATS.search(f"{first.base.name} {first.cand.name}") is not None
        average = any(align.variable_of("state", n) is not None for n in (first.base.name, first.cand.name))
        if still[0] != still[1]:
            who = (self.base.name, self.cand.name)[still.index(True)]
            held_text = (
                f"its statistics are its step-{s_j} ones" if by_statistics else f"it still holds its step-{s_j} value"
            )
            return (
                f"'{who}' did not update it between steps {s_j} and {s_k} ({held_text}) "
                "and the other did: an update left out of one training step ("
                + (
                    "TF1: the train op not run with tf.compat.v1.get_collection(UPDATE_OPS); Keras: the layer "
                    "called with training=False"
                    if bn
                    else "TF1: the op that updates it not run with the train op; Keras: the layer or callback "
                    "that updates it not called"
                )
                + ")"
            )
        loosened = self._apart_under_override(self._weights_before(first, k), k)
        if loosened:  # a helper's moving mean, fed by a bias loosened as its note said, was told "momentum"
            tag, gap = loosened[0]
            return (
                f"{tag} agrees here only under your override ({gap:.3g} apart at this step): that difference "
                + ("may reach the batch means it averages" if bn else "may reach what it averages")
                + f"; loosen it as well (--override '{first.base.kind}/{first.base.name}:atol=...'), or drop the "
                "variable on both sides (README: What counts as a divergence)"
            )
        if bn and (past_noise or _one_signed(now)) and self._moving_mean_agrees(first, k):
            return (
                "its moving mean agrees at this step (the same momentum, the same batch means): the batch variance "
                "it averages differs: TF1's fused batch norm (tf.compat.v1.layers.batch_normalization's default on "
                "4-D inputs) averages the unbiased variance (x n / (n - 1) of the n values per channel); Keras 3's "
                "BatchNormalization (every one: tf.keras in TF 2.16+ without TF_USE_LEGACY_KERAS) and tf_keras's "
                "BatchNormalization(synchronized=True) or SyncBatchNormalization average the biased one (TF1: "
                "fused=False averages the biased one too); or the two layers normalize over other axes"
            )
        if not past_noise:
            return None
        rule = (
            " (batch normalization's momentum: Keras and tf.compat.v1.layers default 0.99)"
            if bn
            else " (an average's decay: TF1 ExponentialMovingAverage with num_updates caps it at "
            "(1 + step) / (10 + step); Keras use_ema's ema_momentum)"
            if average
            else " (an accumulator or counter reset, scaled or written otherwise)"
        )
        if len(seen) == 1:
            return (
                f"it agreed at step {s_j}{' (by statistics)' if by_statistics else ''}, the only step compared before: "
                f"its update rule differs{rule}, or the two runs "
                "updated it from inputs no recorded tensor shows"
            )
        if before is None:  # how far apart it already was needs its values
            return None
        b_j, c_j = (np.asarray(x, np.float64) for x in before)
        with np.errstate(invalid="ignore"):
            gap = float(np.nanmax(np.abs(c_j - b_j), initial=0.0))
            scale = float(np.nanmax(np.abs(b_j), initial=0.0))
        # apart already, within tolerance, past rounding and past 1% of atol: its rule, grown past
        # tolerance (a review's momentum 0.999 against 0.99, 6e-6 apart at step 1, was told "its
        # updates agreed ... once more, by an evaluation pass"); a faithful port's 6e-8 of float32
        # noise before an extra update is no such sign (the next review's)
        if not gap <= max(2.0**-20 * scale, 0.01 * first.atol_at(j)):
            return (
                f"it was within tolerance at the {len(seen)} steps compared before but already apart ({gap:.3g} at "
                f"step {s_j}): its update rule differs{rule} and the difference grew past tolerance, or the two runs "
                "updated it from inputs no recorded tensor shows"
            )
        return (
            f"it agreed element-wise at the {len(seen)} steps compared before (last at step {s_j}, to float32 "
            f"rounding), so its updates agreed until then: between steps {s_j} and {s_k} one run updated it otherwise: "
            + (
                "once more, by an evaluation or validation pass in training mode (Keras: the model or layer "
                "called with training=True; TF1: a sess.run of UPDATE_OPS beside the evaluation)"
                if bn
                else "once more, outside the training step"
            )
            + ", or from an input no recorded tensor shows"
        )

    def _weights_before(self, state: Pair, k: int) -> list[Pair]:
        """The weights compared at step ``k`` that may feed ``state``: all but those of layers whose
        output is recorded after the output of ``state``'s own layer; when that is not recorded, the
        weights recorded before it (variables are recorded in creation order)."""
        layer = _layer_of(state.base.name)
        outputs = {p.base.name: p.base.order for p in self._pairs if p.base.kind in _OUTPUTS}
        own = outputs.get(layer)
        return [
            p
            for p in self._pairs
            if p.base.kind == "weight"
            and p.ib[k] >= 0
            and p.ic[k] >= 0
            and (
                p.base.order < state.base.order  # no output recorded: the weights created before it
                if own is None
                else outputs.get(_layer_of(p.base.name), -1) <= own
            )
        ]

    def _moving_mean_agrees(self, variance: Pair, k: int) -> bool:
        """Whether ``variance`` is a batch normalization's moving variance whose moving mean (the same
        scope) was compared element-wise at step ``k`` and agrees there. A new user's TF1 fused batch
        norm against Keras's synchronized one (moving variances n/(n-1) apart, means within 1e-8) was
        told "batch normalization's momentum", which the agreeing mean rules out."""
        names = [variance.base.name.replace("moving_variance", "moving_mean")]
        if names[0] == variance.base.name:
            return False
        for p in self._pairs:
            if p.base.kind == "state" and p.base.name in names and p.by_values_at(k):
                p.ensure(k + 1, self.policy.equal_nan)
                return bool(p.reason[k] == OK)
        return False

    def _apart_under_override(self, pairs: list[Pair], k: int) -> list[tuple[str, float]]:
        """(tag, largest |c - b|) at compared step ``k`` of the ``pairs`` (compared by values) that an
        ``--override`` matches and whose values differ there: they agree by the user's word, not by
        the policy's, so what they feed is no proof of anything else."""
        found = []
        plain_policy = dataclasses.replace(self.policy, overrides=())
        for p in pairs:
            tag = f"{p.base.kind}/{p.base.name}"
            if not any(o.matches(tag) for o in self.policy.overrides):
                continue
            both = p.step_values(k)
            if both is None:
                continue
            # apart past what it would be held to at this step without the overrides: a broad
            # override on a weight 3e-9 apart is no cause (a review's), nor one 1e-4 apart past the
            # warm-up, where the default rtol is 5% (the next review's)
            plain = plain_policy.for_tag(tag)
            rtol = plain.rtol_at(int(p.clock.since(k)))
            if allclose.isclose(both[1], both[0], rtol, plain.atol, self.policy.equal_nan).all():
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                gap = float(
                    np.nan_to_num(np.abs(both[1].astype(np.float64) - both[0].astype(np.float64))).max(initial=0.0)
                )
            found.append((tag, gap))
        return sorted(found, key=lambda t: -t[1])

    def _input_note(self, first: Pair, k: int) -> Optional[str]:
        """What an output diverging first at step ``k`` (nothing before it in execution order
        does) means when every weight recorded at ``k`` agrees there: its input differs, or the
        layer computes another function of it. A new user's faithful port under Keras ``fit``'s
        default ``shuffle=True`` diverged on its first layer's output at step 0, with nothing to
        say that the batches differed."""
        alignment = self._alignment
        # a weight one run alone has (a bias the port dropped, an LSTM cell declared with
        # --allow-unmatched) is not known to agree: the note says so and names them instead
        unpaired = (
            []
            if alignment is None
            else [
                (side, name)
                for side, keys in enumerate((alignment.unmatched_base, alignment.unmatched_cand))
                for kind, name in keys
                if kind in ("weight", "state")
            ]
        )
        # a weight of a layer whose output is recorded after this one cannot move it: a new user's
        # 1024x1024 dense after the batch norm, compared by statistics, took the note away
        later = {p.base.name for p in self._pairs if p.base.kind in _OUTPUTS and p.base.order > first.base.order}
        logged = [p for p in self._pairs if p.base.kind == "weight" and p.ib[k] >= 0 and p.ic[k] >= 0]
        weights = [p for p in logged if p.by_values_at(k) or _layer_of(p.base.name) not in later]
        if not weights:
            return None
        for p in weights:
            if p.by_values_at(k):
                p.ensure(k + 1, self.policy.equal_nan)
        if any(p.by_values_at(k) and p.reason[k] != OK for p in weights):
            return None
        loose = [p for p in weights if not p.by_values_at(k)]
        if loose:
            # statistics cannot prove a weight agrees: a faithful Adam port's embedding, compared by
            # statistics, held one element 2.7e-5 apart, and this note sent its user to the data; but
            # a batch norm whose replicas' moving statistics parted normalized each replica's share
            # whatever its weights (a ResNet's synchronized=False port, its 3x3x16x32 kernels kept as
            # statistics, got no note)
            return self._per_replica_batch_norm_note(first, k, self._earlier_by_statistics(first, k) + loose)
        loosened = self._apart_under_override(weights, k)
        if (
            loosened
        ):  # a helper loosened a noise-fed bias as its note said, and its output was told "every weight agrees"
            tag, gap = loosened[0]
            return (
                f"{tag} agrees here only under your override ({gap:.3g} apart at this step): that difference reaches "
                "this output; loosen what it feeds as well (the layer's output, a normalization's moving mean), or drop "
                "the variable on both sides (README: What counts as a divergence)"
            )
        earlier = [
            p
            for p in self._pairs
            if p.base.kind in _RECORDED_BEFORE and p.base.order < first.base.order and p.ib[k] >= 0 and p.ic[k] >= 0
        ]
        if not all(p.by_values_at(k) for p in earlier):
            # an output compared by statistics only is no proof that it agrees; but a batch norm
            # whose replicas' moving statistics parted normalized each replica's share, whatever
            # came before it
            return self._per_replica_batch_norm_note(first, k, self._earlier_by_statistics(first, k))
        agree = (
            ("every weight both runs recorded" if unpaired else "every recorded weight")
            + (
                " (but those of layers recorded after it, which statistics alone compare)"
                if len(weights) < len(logged)
                else ""
            )
            + (" and the outputs recorded before it agree" if earlier else " agrees")
        )
        note = self._what_is_left(agree, first, k, bool(earlier))
        upstream = self._maybe_upstream(first, unpaired)
        return note + self._unpaired_clause(first, upstream) if upstream else note

    def _what_is_left(self, agree: str, first: Pair, k: int, earlier: bool) -> str:
        """:meth:`_input_note`'s reading of the output's own values and of what was recorded before
        it, after ``agree`` (what agrees): padded steps, zeros in one run, replicas, this layer's
        function or its input, and at which sequence positions it differs."""
        padded = self._repeats_last_step(first, k)
        if padded:
            return f"{agree} at this step; {padded}"
        dropout = self._dropout_in_one_run(first, k)
        if dropout is not None:
            on, out, scale = dropout
            off = self.cand.name if on == self.base.name else self.base.name
            return (
                f"{agree} at this step, and in '{on}' each of its {out} elements out of tolerance is 0 or "
                f"{scale:.6g} times its value in '{off}': dropout of rate {1 - 1 / scale:.3g} is on in '{on}' only (inverted "
                "dropout keeps x / (1 - rate)). tf.compat.v1.layers.dropout and a Keras layer called without "
                "training=True leave it off, and so does a keep_prob of 1 or a rate of 0 fed at this step"
            ) + self._positions_note(first, k)
        masked = self._zero_in_one_run(first, k)
        if masked:
            return (
                f"{agree} at this step, and each of its {masked} elements out of tolerance is exactly 0 in one run "
                "only: a different random mask (dropout: its seed, or another random op drawn before it; README: "
                "Porting a real model, step 1), padding one run masks, or units a ReLU switched off in one run"
            ) + self._positions_note(first, k)
        loss = first.base.kind == "loss"
        counts = self._replica_counts_of_batch_norm(first)
        if counts and not self._batch_norm_in_sync():
            # a new user's port under MirroredStrategy normalized each replica's half of the batch
            # (numpy: 1.8e-7 from per-half batch norm) and was told of activations and padding
            return f"{agree} at this step, and the runs ran {counts[0]} and {counts[1]} replicas: {_PER_REPLICA_BN}"
        if earlier:
            if loss:
                return (
                    f"{agree} at this step: the loss is computed differently (reduction, from_logits, label "
                    "smoothing, regularization terms, per-example weights: fit's class_weight= or sample_weight= "
                    "against TF1's weights=), its labels differ, or a layer after the last recorded output does"
                )
            return (
                f"{agree} at this step: this layer computes another function of its input (activation, padding, "
                "epsilon, a training flag: dropout or batch normalization in training mode in one run only), or "
                "reads an input not recorded" + self._positions_note(first, k)
            )
        # both, neither first: a new user's attention scaled by 1/d_model in a custom loop was told of
        # fit's shuffling first; record the layer's input (rec.activation) to tell the two apart
        step = int(self.steps[k])
        resumed = [run.name for run in (self.base, self.cand) if step in getattr(run, "resumed_at", ())]
        if resumed and not loss:
            # a helper's TF1 run resumed from a checkpoint at step 6, its one-shot iterator back at its
            # first batch, diverged there on its first layer's output and was told of fit's shuffling
            return (
                f"{agree} at this step and no output is recorded before it, and '{resumed[0]}' was resumed at this "
                "step (an event file of it begins here): an input pipeline no checkpoint holds (a one-shot "
                "iterator, a generator, a dataset without its iterator in the checkpoint) starts again from its "
                "first batch on a resume; or the layer computes another function of its input; recording the "
                "input too tells the two apart" + self._positions_note(first, k)
            )
        return (
            f"{agree} at this step and no output is recorded before it: "
            f"{'the model or the loss' if loss else 'the layer'} computes another function of its input"
            + ("" if loss else " (activation, a scale, epsilon, padding, data format)")
            + ", or its input differs (another batch: Keras fit shuffles unless shuffle=False, a tf.data shuffle "
            "or batching on one side); recording the input too tells the two apart" + self._positions_note(first, k)
        )

    def _earlier_by_statistics(self, first: Pair, k: int) -> list[Pair]:
        """The outputs recorded before ``first`` that both runs logged at ``k`` and compare by
        statistics only there."""
        return [
            p
            for p in self._pairs
            if p.base.kind in _RECORDED_BEFORE
            and p.base.order < first.base.order
            and p.ib[k] >= 0
            and p.ic[k] >= 0
            and not p.by_values_at(k)
        ]

    def _per_replica_batch_norm_note(self, first: Pair, k: int, loose: list[Pair]) -> Optional[str]:
        """:meth:`_input_note`'s replicas clause where a weight or an output recorded before
        ``first`` (``loose``) was compared by statistics only at ``k``, so that nothing proves it
        agrees: given only when the runs ran different replica counts, ``first`` is a batch
        normalization's and a run's recorded moving statistics show its replicas apart
        (:func:`replicas.kept_in_sync` False), which an unsynchronized batch norm does whatever its
        input. A new user's U-Net under MirroredStrategy, its first conv's output (8192 elements)
        kept as statistics, diverged at step 0 on the batch norm after it with no note, beside a
        replicas line saying its moving statistics were out of sync; so did a ResNet whose larger
        conv kernels were kept as statistics. None otherwise."""
        counts = self._replica_counts_of_batch_norm(first)
        if counts is None or False not in self._batch_norm_sync():
            return None
        outputs = [p.base.name for p in loose if p.base.kind != "weight"]
        weights = [p.base.name for p in loose if p.base.kind == "weight"]
        named = " and ".join(
            part for part in (", ".join(outputs) + " before it" if outputs else "", ", ".join(weights)) if part
        )
        return (
            f"the runs ran {counts[0]} and {counts[1]} replicas, and the replicas' copies of the batch "
            f"normalization's moving statistics parted: {_PER_REPLICA_BN}; every "
            + ("weight compared by values" if weights else "recorded weight")
            + f" agrees at this step, but {named} {'was' if len(loose) == 1 else 'were'} compared by "
            "statistics only, so a difference upstream is not ruled out"
        )

    def _replica_counts_of_batch_norm(self, first: Pair) -> Optional[tuple[int, int]]:
        """(fewer, more) replicas when the runs ran different counts and ``first`` is a batch
        normalization's (either run's name); None otherwise."""
        counts = [self._replicas[run.name].count for run in (self.base, self.cand) if run.name in self._replicas]
        if len(set(counts)) < 2 or not any(_BATCH_NORM.search(name) for name in (first.base.name, first.cand.name)):
            return None
        return min(counts), max(counts)

    def _batch_norm_sync(self) -> list[Optional[bool]]:
        """:func:`replicas.kept_in_sync` of each run's batch-norm moving statistics, for the runs
        that recorded replica copies of any."""
        found = []
        for run in (self.base, self.cand):
            copies = self._replicas[run.name].copies if run.name in self._replicas else {}
            keys = [key for key in copies if key[0] == "state" and _BATCH_NORM.search(key[1]) and "moving" in key[1]]
            if keys:
                found.append(replicas.kept_in_sync(run, self._replicas[run.name], keys))
        return found

    def _batch_norm_in_sync(self) -> bool:
        """Whether the multi-replica run's batch-norm moving statistics stayed in sync across its
        replicas at every step it logged past the first: a synchronized batch norm. A helper's
        ``BatchNormalization(synchronized=True, epsilon=1e-5)`` was told its replicas normalize each
        share of the batch alone, beside a replicas line saying every copy agrees."""
        synced = self._batch_norm_sync()
        return bool(synced) and all(s is True for s in synced)

    def _positions_note(self, pair: Pair, k: int) -> str:
        """For a sequence output (rank 3: ``[batch, time, features]``) whose elements out of
        tolerance at ``k`` lie at some (batch, time) positions only, every element at the others
        agreeing: which share, and when each sample's are a run at its start or end (padding), a
        mask on one side. A helper's ``Embedding(mask_zero=True)`` on one side moved only the padded
        query rows of its attention and the note spoke of activations and epsilon. "" otherwise."""
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None:
            return ""
        shape = pair.runtime_shape("base", int(pair.ib[k]))
        if len(shape) != 3 or None in shape:
            return ""
        n, t, f = (int(d) for d in shape)  # type: ignore[arg-type]
        if n * t * f != len(both[0]):
            return ""
        apart = np.zeros((n, t), bool)
        apart.flat[np.unique(out // f)] = True
        if apart.all():
            return ""
        rows = apart.any(axis=1)
        share = f"; its elements out of tolerance lie at {int(apart.sum())} of its {n * t} (batch, time) positions"
        # a mask or another sample moves most features of a position: a trial's single element 2.2x
        # past tolerance at a sample's last position was told "the runs mask them differently"
        per_position = np.bincount(out // f, minlength=n * t).reshape(n, t)[apart]
        if not (2 * per_position >= f).all():
            return (
                share
                + f" ({len(out)} element(s) of their {int(apart.sum()) * f}), every element at the others agreeing"
            )
        if (apart[rows].all(axis=1)).all():  # whole rows of the first axis: not a mask
            return share + (
                f", every position of {int(rows.sum())} entries of the first axis and none of the others (whole "
                "samples, or whole time steps if the output is time-major)"
            )
        runs = True
        for row in apart[rows]:
            at = np.flatnonzero(row)
            runs &= bool(at[-1] - at[0] + 1 == len(at) and (at[0] == 0 or at[-1] == t - 1))
        if not runs:
            return share + ", every element at the others agreeing"
        # the others all 0 in both runs: padding both recorded as 0 (``mask=``, ``zero_masked``), so
        # the positions apart are the real ones. A port with LayerNormalization's default epsilon,
        # padding masked on both sides, was told its runs mask padding differently.
        others = ~apart & apart.any(axis=1, keepdims=True)  # the agreeing positions of the samples apart
        base, cand = (v.reshape(n, t, f) for v in both)
        if others.any() and not (base[others] != 0).any() and not (cand[others] != 0).any():
            return share + (
                ", every element at the others agreeing, and those others 0 in both runs in each sample apart "
                "(padding both runs recorded as 0): its real positions differ, so masking does not explain it"
            )
        return share + (
            ", in each sample a run at its start or end, every element at the others agreeing: when those "
            "are padded positions, the runs mask them differently (Keras Embedding(mask_zero=True) or Masking "
            "on one side only, an attention or padding mask, a sequence_length), and only the real positions "
            "need agree: record those alone on both sides, rec.activation(name, t, mask=real_positions) in "
            "TF1 and instrument(..., zero_masked=True) for a Keras mask (README: padded positions)"
        )

    def _dropout_in_one_run(self, pair: Pair, k: int) -> Optional[tuple[str, int, float]]:
        """(the run, elements out of tolerance, the scale) when at step ``k`` each element out of
        tolerance is, in one run, 0 or the other run's value times one scale above 1, some of each:
        inverted dropout on in that run only. The classic porting bug: TF1's
        ``tf.compat.v1.layers.dropout(h, rate)`` is off unless given ``training=True``, and a
        trial's port with dropout on was told "another function (... training flag)"."""
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None:
            return None
        width = pair.base.shape[-1] if len(pair.base.shape) > 1 else None
        for name, one, other in ((self.base.name, *both), (self.cand.name, *both[::-1])):
            a, b = one[out].astype(np.float64), other[out].astype(np.float64)
            dropped = (a == 0) & (b != 0)
            kept = ~dropped
            if not dropped.any() or not kept.any() or (b[kept] == 0).any():
                continue
            ratio = a[kept] / b[kept]
            scale = float(np.median(ratio))
            # float32 rounding of x * (1 / (1 - rate)): a few ulps; 1e-5 is a hundred of them
            if not (scale > 1 and bool(np.all(np.abs(ratio - scale) <= 1e-5 * scale))):
                continue
            # a mask drawn at the rate: its zeros, among the elements the other run holds nonzero, within
            # 4 standard deviations of the binomial's mean; and not whole rows of the last axis, which
            # is padding (a review's embedding scaled by sqrt(d) with padded rows zeroed, 30% zeros,
            # was told "dropout of rate 0.75")
            live = other != 0
            n, zeros, rate = int(live.sum()), int((live & (one == 0)).sum()), 1.0 - 1.0 / scale
            if abs(zeros - n * rate) > 4.0 * math.sqrt(n * rate * (1.0 - rate)) + 1.0:
                continue
            if isinstance(width, int) and width > 1 and len(one) % width == 0:
                rows = (one.reshape(-1, width) == 0) & (other.reshape(-1, width) != 0)
                if rows.any() and bool((rows.all(axis=1) | ~rows.any(axis=1)).all()):
                    continue
            return name, len(out), scale
        return None

    def _zero_in_one_run(self, pair: Pair, k: int) -> int:
        """How many elements are out of tolerance at step ``k`` when each of them is exactly 0 in
        one run and not in the other (a dropout mask drawn differently), else 0. A new user's
        dropout seeded otherwise was told "this layer computes another function (... training
        flag)" though both ran in training mode."""
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None:
            return 0
        b, c = both
        return len(out) if ((b[out] == 0) != (c[out] == 0)).all() else 0

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

    def _maybe_upstream(self, first: Pair, unpaired: list[tuple[int, str]]) -> list[str]:
        """The variables of ``unpaired`` ((side, name): 0 baseline, 1 candidate) that may feed
        ``first``: not those whose scope is a layer whose output that run records after ``first``'s
        (a review's dense layer before a declared LSTM was told of the LSTM's cells), matched per
        run and by whole scope (the next review's: a port's renumbered ``dense_1`` and a scoped
        ``encoder/dense`` lost their own unpaired bias to the other run's or scope's later output);
        never those of ``first``'s own layer."""
        later: list[set[str]] = [set(), set()]
        for p in self._pairs:
            if p.base.kind in _OUTPUTS:
                if p.base.order > first.base.order:
                    later[0].add(p.base.name)
                if p.cand.order > first.cand.order:
                    later[1].add(p.cand.name)
        own = (first.base.name, first.cand.name)

        def under(scope: str, layer: str) -> bool:  # the layer's name as whole components of the scope
            return f"/{layer}/" in f"/{scope}/"

        kept = []
        for side, name in unpaired:
            scope = name.removesuffix(":0").rpartition("/")[0]
            if under(scope, own[side]) or not any(under(scope, layer) for layer in later[side]):
                kept.append(name)
        return kept

    def _unpaired_clause(self, first: Pair, unpaired: list[str]) -> str:
        """What :meth:`_input_note` adds when some weight or state that may feed ``first`` was
        recorded by one run only (declared with ``--allow-unmatched`` or not): those were never
        compared, so it names them, and what a recurrent cell's port must convert when the recurrent
        layer itself diverges. A new user's TF1 ``LSTMCell`` against Keras ``LSTM`` (the cells
        declared, as the warning says) diverged on the LSTM's output at step 0 with a wrong gate
        order or forget bias, and got no note; a helper's GRU port fed padded steps through its GRU
        was told only of the cells (what the output's values show now comes first)."""
        shown = ", ".join(unpaired[:3]) + (f" and {len(unpaired) - 3} more" if len(unpaired) > 3 else "")
        note = (
            f"; {len(unpaired)} variable(s) recorded by one run only were never compared ({shown}): a difference "
            "in them reaches this output if they feed it"
        )
        names = " ".join([first.base.name, first.cand.name])  # the recurrent layer itself diverges
        if _LSTM.search(names):
            note += (
                "; an LSTM converted from TF1 (LSTMCell, LSTMBlockCell) to Keras LSTM: the gate order (TF1 i, j, f, "
                "o; Keras i, f, c, o), the forget bias (TF1 adds forget_bias=1.0 at run time, Keras holds it in the "
                "bias: add 1 to TF1's forget block), TF1's kernel [input + units, 4 units] split into Keras's kernel "
                "(its first input rows) and recurrent kernel (the last units rows)"
            )
        elif _GRU.search(names):
            note += (
                "; a GRU converted from TF1 GRUCell to Keras GRU: Keras's default reset_after=True (TF1 resets "
                "before the candidate's matmul: reset_after=False), the gate order (TF1 gates r, u; Keras z, r, h), "
                "and the kernels split into input and recurrent rows"
            )
        return note

    def _repeats_last_step(self, pair: Pair, k: int) -> Optional[str]:
        """For a sequence output (``[batch, time, ...]``) whose every element out of tolerance at
        ``k`` is exactly 0 in one run and, in the other, the same element one time step earlier:
        padded time steps, which TF1's ``dynamic_rnn`` zeroes and a masked Keras RNN with
        ``return_sequences`` fills with the last state (None otherwise)."""
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None:
            return None
        known = pair.runtime_shape("base", int(pair.ib[k]))
        shape = [d for d in known if d is not None]
        if len(shape) < 3 or len(shape) < len(known) or math.prod(shape) != len(both[0]):
            return None
        inner = math.prod(shape[2:])  # elements per time step
        if (out // inner % shape[1] == 0).any():
            return None  # the first time step has no earlier one to repeat
        for zero, side, other in ((both[0], "candidate", both[1]), (both[1], "baseline", both[0])):
            if (zero[out] == 0).all() and (other[out] != 0).all() and (other[out] == other[out - inner]).all():
                return (
                    f"each of its {len(out)} elements out of tolerance is 0 in one run and, in the {side}, the same "
                    "element one time step earlier: padded time steps, which TF1's dynamic_rnn(sequence_length=...) "
                    "fills with zeros and a masked Keras LSTM/GRU with return_sequences=True with the last state "
                    "(zero_output_for_mask); compare the real steps only, or zero the padded ones by the mask"
                )
        return None

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
        if self._grad_of is None:  # once per set of pairs, when a weight first diverges
            self._grad_of = {id(self._pairs[i]): self._pairs[j] for i, j in self._weight_grads.items()}
        g = self._grad_of.get(id(pair))
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
                f"not the step size): the slot's own rule ({'momentum' if momentum_only else 'betas, momentum'}), "
                "clipping between the recorded gradient and the update (clipnorm clips each variable by its own norm, "
                "clip_by_global_norm / global_clipnorm all by one), or a weight decay added to the gradient"
            )
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
                    f"an epsilon under a square root that sets the step's size (Adadelta's first updates scale "
                    f"with sqrt(epsilon): TF1 1e-8 against Keras's 1e-7 gives {math.sqrt(10):.4g})"
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
        return (
            f"every element starts at {starts[0]:g} in the baseline and {starts[1]:g} in the candidate: the "
            "optimizers initialise this slot differently (TF1's RMSProp starts its mean square at 1, Keras at 0: "
            "build the optimizer and assign ones; Adagrad's and Ftrl's initial_accumulator_value)"
        )

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
        scale = _uniform_scale(b, c, pair.tol.atol, rounding)
        if scale is None:
            return note
        power, averaging = align.slot_rule(pair.base.name, pair.cand.name)
        before = pair.step_values(k - 1) if int(self.steps[k - 1]) == int(self.steps[k]) - 1 else None
        first = before is not None and not np.any(before[0]) and not np.any(before[1])
        note += f"; every element is the baseline's times {scale:.4g}"
        if first and averaging and power in (1, 2):
            beta, default = ("beta_1", 0.9) if power == 1 else ("beta_2", 0.999)
            # either side may be the one left at Keras's default: a trial's GAN had TF1's beta_1 0.5 and
            # the port's default 0.9, and was offered only "the candidate's is 0.98"
            implied = 1.0 - scale * (1.0 - default)
            implied_base = 1.0 - (1.0 - default) / scale
            note += (
                f": on its first update a moving average holds (1 - {beta}) x the gradient"
                + ("" if power == 1 else " squared")
                + f", so either the two {beta}s differ (the candidate's 1 - {beta} is {scale:.4g}x the baseline's"
                + (
                    f"; if the baseline's is Adam's default {default}, the candidate's is {implied:.4g}"
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
        for rate in sorted(r for r in rates if r > 0):
            for factor, held in ((-rate, "candidate"), (-1.0 / rate, "baseline")):
                allowed = 1e-4 * np.abs(factor * b) + abs(factor) * rounding[0] + rounding[1]
                if np.all(np.abs(c - factor * b)[large] <= allowed[large]):
                    other = "baseline" if held == "candidate" else "candidate"
                    return (
                        f"; every element is the baseline's times {factor:.4g} = -{'' if held == 'candidate' else '1/'}"
                        f"lr ({rate:g}): the {held} holds this slot as Keras "
                        f"SGD's velocity (-lr x accumulator) and the {other} as TF1's accumulator. The shim records a "
                        "Keras SGD's slot divided by -lr unless its class overrides the update rule (update_step): "
                        "a subclass that overrides it but keeps Keras's rule is recorded as held"
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
        rounding = tuple(GRAD_NOISE_OF_MAX * float(np.abs(side).max(initial=0.0)) for side in both)
        scale = _uniform_scale(both[0], both[1], pair.tol.atol, (rounding[0], rounding[1]))
        if scale is None:
            return None
        return (
            f"every element is the baseline's times {scale:.4g} (the same direction, another size): a scale between "
            "the loss and this gradient (the loss's reduction: a sum against a mean, a global batch size under a "
            "strategy; accumulated gradients not divided by their micro-batches; a loss scale not undone), or "
            "gradients recorded after clipping by one run and before it by the other (every gradient then has one "
            "factor, the global norm over the clip norm, and the weights agree)"
        )

    def _jump_from_agreeing_inputs(self, pair: Pair, k: int) -> Optional[str]:
        """For a gradient whose error ratio at step ``k`` is at least :data:`JUMP_FACTOR` times its
        largest at every earlier step both runs logged, while every weight, state and slot both
        recorded at ``k``, and the loss, agree: the difference arises inside the step from agreeing
        inputs, which a ReLU-like unit at its kink does when no activation is recorded to show it
        (:mod:`kinks` names the unit when one is). New users' faithful ResNet ports (a conv's bias
        and batch norm, Momentum, 100 steps, float64 replays bit-equal) diverged so on a kernel's
        gradient at steps 6, 19 and 42 with no note, one unit flipping at its kink."""
        if k == 0 or not pair.by_values_at(k):
            return None
        few = pair.finding(k, self.policy.equal_nan).get("mismatch_fraction")
        jump = self._jump(pair, k)
        if few is None or jump is None:
            return None
        now, before = jump
        nearest = None
        if few > JUMP_FEW:
            # a unit at its kink moves the elements it feeds, not all, of the gradient nearest it; the
            # backward pass carries that to every element of the gradients before it (a helper's
            # faithful ResNet: one unit of its last block flipped and moved 3 % of that block's
            # gradients, 82 % of the first conv's, which came first and got no note)
            local = []
            for p in self._pairs:
                if p is pair or p.base.kind != "grad" or not p.by_values_at(k) or p.ib[k] < 0 or p.ic[k] < 0:
                    continue
                p.ensure(k + 1, self.policy.equal_nan)
                share = p.finding(k, self.policy.equal_nan).get("mismatch_fraction")
                if p.reason[k] == VALUE and share is not None and share <= JUMP_FEW and self._jump(p, k):
                    local.append((share, p))
            if not local:
                return None
            nearest = min(local, key=lambda t: t[0])
        weights = 0
        for p in self._pairs:
            if p.base.kind not in ("weight", "state", "slot", "loss") or p.ib[k] < 0 or p.ic[k] < 0:
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
            else f"{few:.2%} of its elements moved, but only {nearest[0]:.2%} of those of {nearest[1].base.name}, "
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
        weight = next((self._pairs[i] for i, j in self._weight_grads.items() if self._pairs[j] is pair), None)
        if weight is None or not weight.use_values:
            return None
        grads, weights = pair.step_values(k), weight.step_values(k)
        if grads is None or weights is None or len(weights[0]) != len(grads[0]):
            return None
        weight.ensure(k + 1, self.policy.equal_nan)
        if weight.reason[k] != OK:
            return None
        b, c = (np.asarray(a, np.float64) for a in grads)
        w = np.asarray(weights[0], np.float64)
        if not (np.isfinite(b).all() and np.isfinite(c).all() and np.isfinite(w).all()):
            return None
        d, used = c - b, np.abs(w) > 0
        if used.sum() < 2 or not np.any(d):
            return None
        if np.ptp(w[used]) <= 1e-3 * float(np.abs(w).max()):
            return None  # a weight of one value (a bias at 0.1, a gamma of ones): an offset explains it as well
        factor = float(d @ w / (w @ w))
        rounding = GRAD_NOISE_OF_MAX * max(float(np.abs(b).max()), float(np.abs(c).max()))
        if factor == 0 or not np.all(np.abs(d - factor * w) <= rounding + 1e-3 * np.abs(factor * w)):
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
                    )
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
        phase = _shifted_phase_note(steps, b, c, at, close)
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
                return (
                    f"from step {step_k} on, the candidate's value is the baseline's times {factor:.4g} at every "
                    f"step both logged ({len(b[rest])}): the same schedule at another scale (its initial or peak "
                    "value; a learning rate scaled by the replicas or the batch size on one side)"
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
        if not (np.abs(b) > pair.tol.atol).any():
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
                if keras not in keras_sides or not (before > 0 and now > 0) or abs(before - now) <= HPARAM_RTOL * now:
                    continue
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
                factor = scale if keras == "candidate" else 1 / scale
                slot_of = f"the {keras}'s slot is the {other}'s"
                if abs(lrs[other][1] - now) > HPARAM_RTOL * now or abs(lrs[other][0] - before) > HPARAM_RTOL * before:
                    return (
                        f"{slot_of} times the {keras}'s {ratio} = {factor:.4g}: {rule}, so each slot holds what "
                        f"the other does in its own optimizer's units, and the difference is the {keras}'s lr, "
                        f"which changed where the {other}'s did not change alike ({lr_name} differs between the runs "
                        "at these steps: its schedule is the difference)"
                    )
                return (
                    f"{slot_of} times {ratio} = {factor:.4g}: {rule}, and at an lr change their rules part (TF1 "
                    "applies the new lr to the whole accumulator, Keras to the new gradient only): a real difference "
                    "from this step's update on, which a port needs its own update rule to remove"
                )
        return None

    def _elements_out(self, pair: Pair, k: int) -> Optional[np.ndarray]:
        """Flat indices of a pair's elements out of tolerance at compared step ``k`` (None
        without full values on both sides there)."""
        both = pair.step_values(k)
        if both is None:
            return None
        b, c = both
        close = allclose.isclose(c, b, pair.rtol_at(k), pair.atol_at(k), self.policy.equal_nan)
        found: np.ndarray = np.flatnonzero(~close)
        return found

    def report(self) -> ParityReport:
        """The report; scans only as far as the first divergent step.

        Structure divergences (a tensor recorded by one run only) come first: they hold at
        every step, so the first divergence is one of them when there are any; the first
        divergence among the compared steps is still reported (``first_step_divergence``).
        """
        k = self._scan_first()
        at_step = [] if k is None else self._divergences_at(k)
        from_pairs = at_step[0] if at_step else None
        out_of_sync = {
            run.name: [Divergence(**d) for d in replicas.disagreements(run, self._replicas[run.name], self.policy)]
            for run in (self.base, self.cand)
        }
        found = sorted((d for ds in out_of_sync.values() for d in ds), key=lambda d: (d.step, d.order))
        if found and (not at_step or found[0].step <= at_step[0].step):  # a replica out of sync first
            at_step = sorted(
                [d for d in at_step if d.step == found[0].step] + [d for d in found if d.step == found[0].step],
                key=lambda d: d.order,
            )
        struct = self.structure()
        first_step = int(self.steps[0]) if len(self.steps) else 0
        orders = {**{(s.kind, s.name): s.order for s in self.base.tensors.values()}}
        at_structure = [
            Divergence(step=first_step, order=int(orders.get((d["kind"], d["tensor"]), -1)), **d)
            for d in structure.first_of(struct, self._damaged())
        ]
        at_first = at_structure or at_step
        alignment = self._alignment
        assert alignment is not None
        base, cand = self.base, self.cand
        samples = self._samples
        tensors = [p for i, p in enumerate(self._pairs) if i not in samples] if samples else self._pairs
        sampled = {  # tensors whose element samples are compared
            (m.base[0], metadata.sample_parent(m.base[1])) for i, m in enumerate(alignment.matches) if i in samples
        }
        problems = [
            {"run": run.name, "path": p.path, "offset": int(p.offset), "message": p.message}
            for run in (base, cand)
            for p in run.problems
        ]
        return ParityReport(
            baseline=base.name,
            candidate=cand.name,
            steps_compared=len(self.steps),
            tensors_compared=len(tensors),
            first_divergence=at_first[0] if at_first else None,
            divergences_at_first_step=at_first,
            first_nonfinite=dict(self._nonfinite),
            unmatched={
                base.name: [f"{k}/{n}" for k, n in alignment.unmatched_base],
                cand.name: [f"{k}/{n}" for k, n in alignment.unmatched_cand],
            },
            mapping=[
                {"baseline": m.base[1], "candidate": m.cand[1], "kind": m.base[0], "how": m.how}
                for m in alignment.matches
            ],
            steps_only={run.name: len(run.steps) - len(self.steps) for run in (base, cand)},  # steps are unique
            ended_early=ended_early({run.name: np.asarray(run.steps) for run in (base, cand)}),
            policy=self.policy,
            problems=problems,
            structure=copy.deepcopy(struct.to_dict()),  # the structure is kept between reports
            first_step_divergence=at_step[0] if at_step else None,
            warnings=[f"{run.name}: {notice}" for run in (base, cand) for notice in getattr(run, "notices", ())]
            + list(alignment.warnings)
            + [w for reps in self._replicas.values() for w in reps.warnings]
            + [warning for run in (base, cand) for warning in _layout_warnings(run)]
            + self._unused_patterns(),
            statistics_only=[f"{p.base.kind}/{p.base.name}" for p in tensors if not p.use_values],
            partly_values={f"{p.base.kind}/{p.base.name}": list(p.valued_steps()) for p in tensors if p.partial},
            # only when the first divergence is a pair's (not structure, not a replica's copies)
            unproven_before_first=(
                self._unproven_before(k) if k is not None and at_first and at_first[0] is from_pairs else []
            ),
            unproven_earlier=(
                self._unproven_earlier(k) if k is not None and at_first and at_first[0] is from_pairs else []
            ),
            hparam_divergence=self._later_hparam(at_step[0].step if at_step else None),
            evidence={
                "values": sum(1 for p in tensors if p.use_values),
                "statistics": sum(1 for p in tensors if not p.use_values),
                "sampled": sum(1 for p in tensors if not p.use_values and p.match.base in sampled),
            },
            replicas={
                name: {**reps.to_dict(), "disagreements": [d.to_dict() for d in out_of_sync[name]]}
                for name, reps in self._replicas.items()
                if reps.count > 1 or reps.copies
            },
            comparison=self,
        )

    def _later_hparam(self, first_step: Optional[int]) -> Optional[Divergence]:
        """The first divergence of an ``lr`` or ``hparam`` pair after ``first_step`` (the first
        divergent step among the pairs' and replicas'), scanning those few scalar pairs to the end:
        the report's scan stops at the first divergent step, and a schedule that differs later is
        never noise."""
        if first_step is None:
            return None
        n, found = len(self.steps), None
        for p in self._pairs:
            if p.base.kind in HPARAM_KINDS:
                p.ensure(n, self.policy.equal_nan)
                if p.first_bad >= 0 and int(self.steps[p.first_bad]) > first_step:
                    if found is None or p.first_bad < found[1]:
                        found = (p, p.first_bad)
        return None if found is None else self._divergence(*found)

    def _unproven_before(self, k: int) -> list[str]:
        """Tags logged by both runs at compared step ``k`` and compared there by statistics only,
        before the first pair diverging at ``k`` (pairs are in the baseline's execution order).
        Kept while those pairs are the same objects (a refresh that grows them keeps their rows at
        ``k``, which is below every pair's ``done``): each refresh's report asks again."""
        end = next((i for i, p in enumerate(self._pairs) if p.first_bad == k), len(self._pairs))
        before = self._pairs[: end + 1]
        kept = self._unproven
        if kept is not None and kept[0] == k and len(kept[1]) == len(before):
            if all(a is b for a, b in zip(kept[1], before)):
                return list(kept[2])
        first = before[end] if end < len(before) else None
        itself = None if first is None else (first.base.kind, metadata.sample_parent(first.base.name))
        found = [  # not the divergent sample's own tensor: that is where it diverges, not upstream
            f"{p.base.kind}/{p.base.name}"
            for i, p in enumerate(before[:end])
            if i not in self._samples
            and (p.base.kind, p.base.name) != itself
            and p.ib[k] >= 0
            and p.ic[k] >= 0
            and not p.by_values_at(k)
            and not _one_constant(p, k)
        ]
        self._unproven = (k, before, found)
        return list(found)

    def _unproven_earlier(self, k: int) -> list[str]:
        """Tags compared by statistics only at some compared step before ``k`` (both runs logged
        them there, without full values on both sides): a difference there smaller than the
        statistics prove may have started before the first step proven to diverge (an embedding row
        wrong from step 0 shows first in the output of the step that looks it up). Kept while the
        pairs are the same objects, as :meth:`_unproven_before`."""
        kept = self._earlier
        if kept is not None and kept[0] == k and len(kept[1]) == len(self._pairs):
            if all(a is b for a, b in zip(kept[1], self._pairs)):
                return list(kept[2])
        found = []
        for i, p in enumerate(self._pairs):
            if i in self._samples or p.use_values or not k:
                continue
            ib, ic = p.ib[:k], p.ic[:k]
            both = int(np.count_nonzero((ib >= 0) & (ic >= 0)))
            if both and all(_one_constant(p, int(j)) for j in np.flatnonzero((ib >= 0) & (ic >= 0))):
                continue
            if both and (not p.partial or p.valued_before(k) < both):
                found.append(f"{p.base.kind}/{p.base.name}")
        self._earlier = (k, list(self._pairs), found)
        return list(found)

    def _damaged(self) -> set[str]:
        """Runs whose unaccepted read problems may have cost them records (see ``structure.first_of``)."""
        if self.policy.accept_read_problems:
            return set()
        return {run.name for run in (self.base, self.cand) if run.problems}

    def structure(self) -> structure.Structure:
        """What each run recorded, side by side (computed from the layouts, no step needed); kept
        while the alignment and what else it reads are unchanged (a refresh's usual case)."""
        alignment = self._alignment
        assert alignment is not None
        if self._sized is None or self._sized[0] is not alignment:
            self._sized = (
                alignment,
                structure.sized_keys(self.base, alignment.unmatched_base),
                structure.sized_keys(self.cand, alignment.unmatched_cand),
            )
        reads = (
            self.base.name,
            self.cand.name,
            tuple(self.policy.allow_unmatched),
            structure.sizes_read(self.base, self._sized[1], alignment.unmatched_base),
            structure.sizes_read(self.cand, self._sized[2], alignment.unmatched_cand),
        )
        kept = self._structure
        if kept is None or kept[0] is not alignment or kept[1] != reads:
            kept = self._structure = (
                alignment,
                reads,
                structure.structure_of(self.base, self.cand, alignment, self.policy.allow_unmatched),
            )
        return kept[2]

    def matrix(self, max_steps: Optional[int] = None) -> ParityMatrix:
        """Steps x tensors matrix (baseline execution order), bucketed to ``max_steps`` rows."""
        self.fill()
        n = len(self.steps)
        reason, ratio = self._table.matrix(self._pairs, n)
        tensors, candidate_tensors, kinds = self._column_names()
        evidence = [p.evidence for p in self._pairs]
        # a statistics column's cells are all by statistics (absent ones are drawn as absent): only a
        # partial column is read row by row (a per-pair pass over every row cost a refresh 1 ms)
        by_statistics = np.repeat(np.array([e == "statistics" for e in evidence], dtype=bool)[None, :], n, axis=0)
        for j, p in enumerate(self._pairs):
            if evidence[j] == "partial":
                by_statistics[:, j] = p.by_statistics(n)
        first = None
        k = self._scan_first()
        if k is not None:
            col = next(i for i, p in enumerate(self._pairs) if p.first_bad == k)
            first = (k, col)
        m = ParityMatrix(
            step_start=self.steps.copy(),
            step_end=self.steps.copy(),
            tensors=list(tensors),
            candidate_tensors=list(candidate_tensors),
            kinds=list(kinds),
            error_ratio=ratio,
            reason=reason,
            first_divergence=first,
            evidence=evidence,
            by_statistics=by_statistics,
        )
        return m.bucketed(max_steps) if max_steps else m

    def _column_names(self) -> tuple[list[str], list[str], list[str]]:
        """The matrix's baseline tags, candidate tags and kinds, one per pair: the pairs follow the
        alignment's matches, so they are built once per alignment, not on every refresh."""
        alignment = self._alignment
        assert alignment is not None
        if self._columns is None or self._columns[0] is not alignment:
            matches = alignment.matches
            self._columns = (
                alignment,
                [f"{m.base[0]}/{m.base[1]}" for m in matches],
                [f"{m.cand[0]}/{m.cand[1]}" for m in matches],
                [m.base[0] for m in matches],
            )
        return self._columns[1], self._columns[2], self._columns[3]

    def allowance(self, kind: str, tensor: str, step: int) -> float:
        """What a slot's gradient's differences add up to by ``step`` (:meth:`Pair.allowance`; 0
        for any other tensor or a step not compared): its atol's share the policy does not show."""
        k = int(np.searchsorted(self.steps, step))
        if k >= len(self.steps) or self.steps[k] != step:
            return 0.0
        for p in self._pairs:
            if p.base.kind == kind and p.base.name == tensor and p.feeder is not None:
                return float(p.allowance(k + 1)[k])
        return 0.0

    def _pair(self, tensor: str) -> Pair:
        """Tags before names: an activation *named* ``grad/w`` must not shadow the tag ``grad/w``."""
        for field in ("tag", "name"):
            for side in ("base", "cand"):
                for p in self._pairs:
                    if getattr(getattr(p, side), field) == tensor:
                        return p
        raise KeyError(f"no compared tensor {tensor!r}")

    def detail(self, tensor: str, step: Optional[int] = None, replica: Optional[int] = None) -> TensorDetail:
        """One pair's series (``tensor``: baseline or candidate tag or name), values at ``step``.

        ``replica``: show that candidate replica's own copy instead of its one-device value.
        """
        p = self._pair(tensor)
        if replica is not None:
            return self._replica_detail(p, step, replica)
        n = len(self.steps)
        p.ensure(n, self.policy.equal_nan)
        p.ensure_ratios(n)
        d = TensorDetail(
            tensor=p.base.name,
            candidate_tensor=p.cand.name,
            kind=p.base.kind,
            how=p.match.how,
            evidence=p.evidence,
            by_statistics=p.by_statistics(n),
            atol=p.tol.atol,
            rtol=p.tol.rtol,
            warmup_steps=p.tol.warmup_steps,
            steps=self.steps,
            reason=p.reason[:n].copy(),  # the pair's column of the table, which later refreshes extend
            error_ratio=p.ratio[:n].copy(),
            base_steps=p.base.steps,
            base_stats=p.base.stats,
            cand_steps=p.cand.steps,
            cand_stats=p.cand.stats,
        )
        if step is not None:
            hits = np.flatnonzero(self.steps == step)
            if not len(hits):
                raise KeyError(f"step {step} was not logged by both runs")
            k = int(hits[0])
            d.step, d.figures = int(step), p.figures(k, self.policy.equal_nan)
            d.step_atol, d.step_rtol = p.atol_at(k), p.rtol_at(k)
            rb, rc = int(p.ib[k]), int(p.ic[k])
            if rb >= 0:
                d.base_values = p.values_at("base", rb)
            if rc >= 0:
                d.cand_values = p.values_at("cand", rc)
            if p.by_values_at(k) and d.base_values is not None and d.cand_values is not None:
                cand_values = d.cand_values.reshape(d.base_values.shape) if p.reshaped else d.cand_values
                if d.base_values.shape == cand_values.shape:  # in the baseline's shape
                    d.diff = cand_values.astype(np.float64) - d.base_values.astype(np.float64)
        return d

    def _replica_detail(self, p: Pair, step: Optional[int], replica: int) -> TensorDetail:
        copies = self._replicas[self.cand.name].copies.get((p.cand.kind, p.cand.name), [])
        if replica >= len(copies):
            raise KeyError(f"{self.cand.name!r} keeps no replica {replica} of {p.cand.kind}/{p.cand.name}")
        copy = copies[replica]
        d = dataclasses.replace(
            self.detail(f"{p.base.kind}/{p.base.name}", step),
            replica=replica,
            candidate_tensor=copy.name,
            cand_steps=copy.steps,
            cand_stats=copy.stats,
            cand_values=None,
            diff=None,  # a replica's copy is not what is compared
        )
        rows: Any = np.flatnonzero(copy.steps == step) if step is not None else []
        if len(rows) and copy.values is not None:
            shape = tuple(copy.shape) if None not in tuple(copy.shape) else (-1,)
            d.cand_values = np.asarray(copy.values[int(rows[0])]).reshape(shape)
        return d


#: Kinds that, recorded before an output, are its input or what led to it (an agreeing one rules
#: out another batch).
_RECORDED_BEFORE = frozenset({"input", "activation", "output"})

#: Batch normalization's moving statistics, by name on either side (TF1 and Keras alike).
_MOVING_STATS = re.compile(r"moving_(mean|variance)", re.IGNORECASE)

#: A recurrent cell's tensors by name (TF1 ``lstm_cell``, ``LSTMBlockCell``, Keras ``lstm``; ``gru_cell``, ``gru``).
_LSTM = re.compile(r"lstm", re.IGNORECASE)
_GRU = re.compile(r"gru", re.IGNORECASE)
_RECURRENT = re.compile(r"lstm|gru|rnn|recurrent", re.IGNORECASE)
_POOL = re.compile(r"max_?pool", re.IGNORECASE)
_RELU = re.compile(r"relu", re.IGNORECASE)

#: A batch normalization's output, by the names both frameworks give it.
_BATCH_NORM = re.compile(r"batch_?norm|(^|/)bn\d*(/|$)", re.IGNORECASE)

#: A momentum slot's name on either side (TF1 ``Momentum``, tf_keras ``momentum``, Keras 3 ``velocity``).
#: Kinds of a layer's output, named after the layer (``rec.activation(layer.name, ...)``, instrument).
_OUTPUTS = ("activation", "output")


def _layer_of(variable: str) -> str:
    """The layer a variable belongs to: its scope's last part (``dense_1`` of ``model/dense_1/kernel:0``)."""
    return variable.rpartition("/")[0].rpartition("/")[2]


#: Step offsets a schedule note tries, nearest first (:meth:`Comparison._schedule_note`).
SHIFTS = (1, -1, 2, -2, 3, -3)


def _shifted_phase_note(steps: np.ndarray, b: np.ndarray, c: np.ndarray, at: int, close: float) -> Optional[str]:
    """When the candidate's value is the baseline's a few steps later or earlier (:data:`SHIFTS`)
    at step ``steps[at]`` and each step after it up to some step (at least 2), and equal to the
    baseline's at every step from at most that many steps past it on (at least 2): one phase of the
    schedule is shifted, the rest not. BERT's warm-up, ``lr * step / warmup_steps`` before a decay
    that reads the step itself, ported as ``(step + 1) / warmup_steps``: a helper's port diverged
    at step 0 on ``lr`` with no note, since the shift holds during the warm-up only."""
    index = {int(s): i for i, s in enumerate(steps)}
    agree = np.abs(c - b) <= close
    for shift in SHIFTS:
        run = 0
        for i in range(at, len(steps)):
            j = index.get(int(steps[i]) + shift)
            if j is None or abs(c[i] - b[j]) > close:
                break
            run += 1
        end = at + run  # the first step the shift no longer holds at
        if run < 2 or end >= len(steps):
            continue
        rest = np.flatnonzero(~agree[end:])
        settled = end + (int(rest[-1]) + 1 if len(rest) else 0)  # agreeing from here on
        if settled - end > abs(shift) or len(steps) - settled < 2:
            continue
        side, n = ("later", "ahead") if shift > 0 else ("earlier", "behind")
        return (
            f"from step {int(steps[at])} to step {int(steps[end - 1])} ({run} steps both runs logged), the "
            f"candidate's value at each step is the baseline's {abs(shift)} step(s) {side} (at step "
            f"{int(steps[at])}: the baseline's at step {int(steps[at]) + shift}), and from step {int(steps[settled])} "
            f"on the two agree: one phase of its schedule runs {abs(shift)} step(s) {n} and the rest does not, "
            "as a warm-up counted from 1 against 0 ((step + 1) / warmup_steps) before a decay that reads the "
            "step itself"
        )
    return None


#: Longer shifts tried for a hyper-parameter in stairs (``Comparison._stair_shifts``).
MAX_STAIR_SHIFTS = 8
#: How many times its largest earlier error ratio a gradient's must jump to be told it arose inside
#: the step (``Comparison._jump_from_agreeing_inputs``): a unit flipping at its kink moved faithful
#: ResNet ports' kernel gradients about 100x their earlier gap in one step.
JUMP_FACTOR = 10.0
#: ...and the largest share of its elements out of tolerance there: one unit's flip moved 0.3-8 % of
#: those faithful ResNets' kernel gradients; a clipping first reached moves all of them.
JUMP_FEW = 0.5
#: Time scales tried for a schedule that runs some whole number of times as fast (``_time_scale_note``).
MAX_TIME_SCALES = 16

#: Why a batch normalization's output differs across replica counts, said by every note that names it.
_PER_REPLICA_BN = (
    "a batch normalization under a strategy normalizes each replica's share of the batch with that share's "
    "statistics unless it is synchronized (Keras SyncBatchNormalization, or BatchNormalization(synchronized=True))"
)

_MOMENTUM = re.compile(r"momentum|velocity", re.IGNORECASE)

#: Kinds computed from a batch: a partial last batch retraces them (one warning per run for those).
_BATCHED_KINDS = frozenset({"input", "activation", "output", "loss", "metric"})


#: A difference just past tolerance is followed over this many compared steps after it ...
GROWTH_STEPS = 50
#: ... and called growing when its largest |difference| there reaches this many times its own.
GROWTH_FACTOR = 10.0
#: ... and said not to grow when at least this many later steps were read ...
STEADY_STEPS = 5
#: ... and none reaches this many times its own (a faithful port's stays within about 4x).
STEADY_FACTOR = 4.0


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


def _layout_warnings(run: Any) -> list[str]:
    """A run's tensors whose layout changed mid-run, one warning each, but those only traced again
    for a partial last batch (every ``tf.function`` loop over a ``None`` batch has them) in one
    line: a new user's every diff ended with one such warning per recorded output."""
    changed = [s for s in run.tensors.values() if getattr(s, "layout_change", None)]
    prefix = "was " + metadata.BATCH_SIZES
    batch = [s for s in changed if s.layout_change.startswith(prefix) and s.kind in _BATCHED_KINDS]
    out = [f"{run.name}: {s.kind}/{s.name} {s.layout_change}" for s in changed if s not in batch]
    if len(batch) > 1:
        first = batch[0]
        shapes = first.layout_change[len(prefix) :]
        out.append(
            f"{run.name}: {len(batch)} tensors were {metadata.BATCH_SIZES}, e.g. {first.kind}/{first.name}{shapes}"
        )
    elif batch:
        out.append(f"{run.name}: {batch[0].kind}/{batch[0].name} {batch[0].layout_change}")
    return out


def _one_value(stats: np.ndarray, fewest: int = 2) -> Optional[float]:
    """The one value every element of a recorded tensor holds, from its statistics row (its exact
    min and max), or None: fewer than ``fewest`` elements, a non-finite one, or two values. Past
    2**53 the float64 min and max of an int64 tensor can be equal for unequal elements: None there."""
    i = metadata.STAT_INDEX
    if stats[i["size"]] < fewest or any(stats[i[f]] for f in metadata.NONFINITE_FIELDS):
        return None
    low, high = float(stats[i["min"]]), float(stats[i["max"]])
    return low if low == high and abs(low) < 2.0**53 else None


def _one_constant(pair: Any, k: int) -> bool:
    """Both runs' rows at compared step ``k`` say every element of the tensor is one and the same
    finite value (the same size, min == max on both sides, equal): the statistics then prove
    element-wise equality, so the tensor holds no difference they could miss (an optimizer's
    slots at step 0, all zeros, were named as possibly hiding one)."""
    rb, rc = int(pair.ib[k]), int(pair.ic[k])
    if rb < 0 or rc < 0:
        return False
    b, c = pair.base.stats[rb], pair.cand.stats[rc]
    size = metadata.STAT_INDEX["size"]
    if b[size] != c[size]:
        return False
    value = _one_value(b, fewest=1)
    return bool(b[size] == 0 or (value is not None and value == _one_value(c, fewest=1)))


def _one_signed(values: Optional[tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether the candidate's values are above the baseline's at every element, or below at every
    one: what the n / (n - 1) between a biased and an unbiased batch variance leaves on a moving
    variance. Rounding noise leaves both signs: a review's faithful run 1.11x past tolerance was
    sent to the batch variance by an agreeing moving mean alone."""
    if values is None or not len(values[0]):
        return False
    d = np.asarray(values[1], np.float64) - np.asarray(values[0], np.float64)
    return bool((d > 0).all() or (d < 0).all())


def _loud(pair: Pair, k: int, equal_nan: bool) -> bool:
    """Whether ``pair`` diverges at compared step ``k`` past anything float32 noise reaches: another
    reason than values (NaN/Inf, shape, dtype, missing), or an error ratio of at least
    :data:`MARGINAL_RATIO`. Then a tensor just past tolerance at that step is that divergence's
    effect, not noise: a new user's layer-norm epsilon bug (ratio 3378) had its gradients at 1.4 and
    1.6 told "faithful ports reach this"."""
    if pair.reason[k] != VALUE:
        return True
    ratio = pair.finding(k, equal_nan).get("error_ratio")
    return ratio is None or not ratio < MARGINAL_RATIO


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
    layers the runs have (:func:`_amplifiers`)."""
    ratio = found.get("error_ratio")
    if kind not in ("activation", "grad") or found.get("evidence") != "values" or ratio is None:
        return None
    if not 1.0 < ratio < MARGINAL_RATIO:
        return None
    grown, atol = growth(), held()
    steady = ""
    if grown is not None and grown[0] > 0:
        now, later, step, seen = grown
        if later >= GROWTH_FACTOR * now:
            return (
                f"just past tolerance here (error ratio {ratio:.3g}), but its largest difference grows from {now:.3g} "
                f"to {later:.3g} by step {step} ({later / now:.3g}x): follow it upstream before loosening atol (the "
                "weights' differences over the steps before; an optimizer setting such as weight decay, or a schedule)"
            )
        if seen >= STEADY_STEPS and later <= STEADY_FACTOR * now:
            steady = (
                f" It does not grow: over the next {seen} steps both runs logged, its largest difference is {later:.3g} "
                f"at most (step {step}), {later / now:.3g}x this step's {now:.3g}."
            )
    return (
        f"just past tolerance (error ratio {ratio:.3g}): float32 rounding amplified by the network ({amplifiers()}) "
        "reaches this on faithful ports within a few steps, and so does a small real difference (a normalization "
        "layer's epsilon: Keras LayerNormalization and BatchNormalization 1e-3, TF1 code often 1e-12 or 1e-5; "
        "an optimizer setting: Adam's epsilon, TF1 1e-8 against Keras 1e-7; a decay); a difference that grows "
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


def _looser(held: float) -> float:
    """The power of ten at or above twice ``held``: an atol that at least halves an error ratio."""
    return float(10.0 ** math.ceil(math.log10(max(2.0 * held, 1e-300))))


def _where_both_sampled(ib: np.ndarray, ic: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """The rows of a pair of element samples at the compared steps both runs sampled (-1 elsewhere on
    both sides), and whether some step was sampled by one run only. A tensor's size can cross
    ``full_values_limit`` between steps: a run whose graph knew the size (a ``tf.function`` traced
    per batch shape) samples only its large steps, one fed ``placeholder([None, n])`` samples every
    step. A step sampled by one run is no difference of the tensor (its own pair compares it)."""
    one = (ib >= 0) != (ic >= 0)
    if not one.any():
        return ib, ic, False
    return np.where(one, -1, ib), np.where(one, -1, ic), True


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
    :data:`MAX_TIME_SCALES`); it must hold at every step both logged where the other's step exists
    inside its record (at least 2), and the candidate's value must move there."""
    index = {int(v): i for i, v in enumerate(steps)}
    first, last = int(steps[0]), int(steps[-1])
    b_changes = [int(v) for v in steps[1:][np.abs(np.diff(b)) > close] if v > 0]
    c_changes = [int(v) for v in steps[max(at, 1) :][np.abs(np.diff(c[max(at - 1, 0) :])) > close] if v > 0]
    tries = sorted({(j // i, True) for j in b_changes for i in c_changes if j % i == 0 and j // i >= 2})
    tries += sorted({(i // j, False) for i in c_changes for j in b_changes if i % j == 0 and i // j >= 2})
    for m, faster in tries[:MAX_TIME_SCALES]:
        found = []
        for i in range(at, len(steps)):
            t = int(steps[i]) * m if faster else int(steps[i]) // m
            if t in index:
                found.append((i, index[t]))
            elif first <= t <= last:
                found = []  # a step the baseline did not log inside its record: no evidence either way
                break
        if len(found) < 2 or np.ptp([c[i] for i, _ in found]) <= close:
            continue
        if all(abs(c[i] - b[j]) <= close for i, j in found):
            step_k = int(steps[at])
            counterpart = step_k * m if faster else step_k // m
            pace = f"{m} times as fast as" if faster else f"{m} times as slow as"
            mapped = f"{m} s" if faster else f"s // {m}"
            return (
                f"from step {step_k} on, the candidate's value at each step s is the baseline's at step "
                f"{mapped} ({len(found)} steps both runs logged; at step {step_k}: the "
                f"baseline's at step {counterpart}): its schedule runs {pace} the baseline's: a decay counted in steps "
                f"on one side and in epochs on the other (decay_steps, boundaries or a LearningRateScheduler's epoch, if "
                f"an epoch is {m} steps), or gradient accumulation of {m} micro-batches counted per micro-batch on one "
                "side"
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


def _scalar_at(series: Any, rows: np.ndarray, j: int) -> float:
    """A scalar series' value (an lr) at compared step ``j``, which its ``rows`` must hold."""
    return float(np.ravel(series.values[int(rows[j])])[0])


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


def _common_steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The steps both runs logged (each sorted and unique): the runs' own array when they logged
    the same steps, a refresh's usual case (``intersect1d`` sorts both again: 0.1 ms at 2000 steps)."""
    if len(a) == len(b) and np.array_equal(a, b):
        return a.astype(np.int64, copy=False)
    return np.intersect1d(a, b, assume_unique=True).astype(np.int64)


def _align_inputs(run: Any) -> dict[Any, tuple[Any, ...]]:
    """What :func:`align.align` reads of a run's tensors besides their statistics (those are in
    ``Alignment.read``): names, and the execution order and shape of each (a run that changes
    layout mid-run changes them), and whether each has full values at every step (its element
    sample is compared only if not)."""
    return {key: (s.order, s.shape, s.values is None) for key, s in run.tensors.items()}


def compare_runs(
    base: Any, cand: Any, policy: TolerancePolicy = TolerancePolicy(), mapping: Sequence[str] = ()
) -> ParityReport:
    """Compare two runs (reader ``RunData``); ``mapping`` items are ``OLD=NEW`` or ``re:PAT=REPL``."""
    return Comparison(base, cand, policy, mapping).report()
