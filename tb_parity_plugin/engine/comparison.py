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
import operator
from typing import Any, Optional, Sequence

import numpy as np

from tb_parity_plugin.engine import align, batch, kinks, refresh, replicas, structure
from tb_parity_plugin.engine.matrix import MISSING, NONFINITE, REASONS, SHAPE, VALUE, ParityMatrix
from tb_parity_plugin.engine.nonfinite import FirstNonfinite
from tb_parity_plugin.engine.notes import Notes
from tb_parity_plugin.engine.notes.context import holds_one_value
from tb_parity_plugin.engine.notes.marginal import _marginal_note
from tb_parity_plugin.engine.pair import GradientScale, Pair
from tb_parity_plugin.engine.tolerance import (
    HPARAM_KINDS,
    MARGINAL_RATIO,
    StepClock,
    TolerancePolicy,
)
from tb_parity_plugin.engine.verdict_table import VerdictTable
from tb_parity_plugin.engine.verdicts import (
    FIGURES,
    Divergence,
    ParityReport,
    TensorDetail,
    counted_twice,
    ended_early,
)
from tb_parity_plugin.records import metadata

__all__ = ["Comparison", "compare_runs"]


#: Bytes of data one scan chunk touches: big enough to amortise per-call overhead,
#: small enough that a divergence early in the run is found without reading the rest.
_CHUNK_BYTES = 256 << 20
_MIN_CHUNK_STEPS = 16


class Comparison(Notes):
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
            # a gradient the other's times one factor, or plus one factor times its weight (a decay), is
            # told so, not that float32 rounding reaches it: a new user's bias decay, 1.9 times atol
            related = (self._grad_scale(pair, k) or self._decay_note(pair, k)) if b.kind == "grad" else None
            notes = [
                self._precision_note(b.kind, k),
                found.get("note"),
                (
                    self._resumed_at_another_step(pair, k)
                    or self._numbered_apart(pair, k)
                    or self._overwritten_by_average(pair, k)
                    or self._loaded_crosswise(pair, k)
                    or self._trained_in_one_run(pair, k)
                    or self._moved_by_the_update(pair, k, slot_gaps)
                    or self._starts_reordered(pair, k)
                    or self._gradient_recorded_elsewhere(pair, k)
                )
                if b.kind == "weight" and not found.get("note")
                else None,
                # read from statistics too: a large table's is all its record holds (a warm-started wide table)
                self._ftrl_sets_every_row(pair, k) if b.kind == "weight" else None,
                (
                    self._slot_lost_on_resume(pair, k)
                    or self._slot_starts_otherwise(pair, k)
                    or self._slot_carried_over(pair, k)
                    or self._momentum_at_lr_change(pair, k)
                    or self._noise_fed(pair, k)
                    or self._slot_fed_otherwise(pair, k)
                )
                if b.kind == "slot"
                else None,
                kink if b.kind == "grad" else None,
                (
                    related
                    or self._grad_scale_within_tolerance(pair, k)
                    or (None if kink else self._jump_from_agreeing_inputs(pair, k) or self._backward_differs(pair, k))
                )
                if b.kind == "grad"
                else None,
                self._schedule_note(pair, k) if b.kind in HPARAM_KINDS else None,
                self._metric_note(pair, k) if b.kind == "metric" else None,
                None
                if loud or related
                else _marginal_note(
                    b.kind, found, lambda: self._growth(pair, k), lambda: pair.atol_at(k), self._amplifiers
                ),
            ]
            found["note"] = "; ".join(n for n in notes if n) or None
        elif pair.reason[k] == SHAPE and b.kind in ("weight", "slot", "grad"):
            found["note"] = "; ".join(n for n in (found.get("note"), self._input_width_upstream(pair, k)) if n) or None
        elif pair.reason[k] == SHAPE and b.kind in ("input", "activation", "output"):
            shape_note = (
                self._batch_axis_note(pair, k) or self._padded_width_note(pair, k) or self._window_padding_note(pair, k)
            )
            found["note"] = "; ".join(n for n in (found.get("note"), shape_note) if n) or None
        elif pair.reason[k] == MISSING and b.kind in ("grad", "slot"):
            found["note"] = "; ".join(n for n in (found.get("note"), self._not_applied(pair, k)) if n) or None
        elif pair.reason[k] == NONFINITE and b.kind == "grad":
            skipped = self._skipped_update(pair, k)
            found["note"] = "; ".join(n for n in (found.get("note"), skipped) if n) or None
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
            and first.base.kind in ("input", "activation", "output", "loss", "state")
        ):
            # past the noise only: a difference rounding can reach is no sign of another input; a
            # state's notes that rest on exact evidence (a run that did not update it, an agreeing
            # moving mean) hold at any ratio (a trial's biased moving variance, 1.18, got none)
            note = None
            past_noise = _loud(first, k, self.policy.equal_nan)
            if first.base.kind == "state":
                note = self._state_note(first, k, past_noise)
            elif past_noise and first.base.kind == "input":
                note = self._recorded_input_note(first, k)
            elif past_noise:
                note = self._input_note(first, k)
            if note:
                found[0].note = "; ".join(n for n in (found[0].note, note) if n)
        return found

    def _shapes_differ(self, kind: str, name: str, k: int) -> bool:
        """Whether the pair of baseline tensor ``kind/name`` diverges by shape at compared step ``k``."""
        return any(p.base.kind == kind and p.base.name == name and p.reason[k] == SHAPE for p in self._pairs)

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
            + [note for note in (self._precision_note(),) if note]
            + counted_twice({run.name: np.asarray(run.steps) for run in (base, cand)})
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
            logged = np.flatnonzero((ib >= 0) & (ic >= 0))
            # the first step alone rules out most tensors (min < max) before every step is read
            if both and _one_constant(p, int(logged[0])) and _one_constant_at(p, logged).all():
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


#: Kinds computed from a batch: a partial last batch retraces them (one warning per run for those).
_BATCHED_KINDS = frozenset({"input", "activation", "output", "loss", "metric"})


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


def _one_constant(pair: Any, k: int) -> bool:
    """Both runs' rows at compared step ``k`` say every element of the tensor is one and the same
    finite value (the same size, min == max on both sides, equal): the statistics then prove
    element-wise equality, so the tensor holds no difference they could miss (an optimizer's
    slots at step 0, all zeros, were named as possibly hiding one)."""
    return bool(_one_constant_at(pair, np.array([k]))[0])


def _one_constant_at(pair: Any, ks: np.ndarray) -> np.ndarray:
    """:func:`_one_constant` at each compared step of ``ks``, in one array operation: the report
    asked it per step of every tensor compared by statistics, and a run's 50 scalars (min = max at
    every step) made a warm first divergence at step 1500 of 2x2000x200 take 0.19 s instead of 0.02."""
    rb, rc = pair.ib[ks], pair.ic[ks]
    out = np.zeros(len(ks), dtype=bool)
    logged = (rb >= 0) & (rc >= 0)
    if not logged.any():
        return out
    b, c = pair.base.stats[rb[logged]], pair.cand.stats[rc[logged]]
    size, low = metadata.STAT_INDEX["size"], metadata.STAT_INDEX["min"]
    one = holds_one_value(b, fewest=1) & holds_one_value(c, fewest=1) & (b[:, low] == c[:, low])
    out[logged] = (b[:, size] == c[:, size]) & ((b[:, size] == 0) | one)
    return out


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
