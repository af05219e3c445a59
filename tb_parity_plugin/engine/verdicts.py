"""What every front end receives from the engine: the report, one divergence, one tensor's detail.

Plain value classes (like ``tensorboard.data.provider``'s): the CLI prints them, the API
returns them, the dashboard and the HTML report reshape them. Every figure is a finite
float or ``None`` in ``to_dict()``, so JSON never holds NaN.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import numpy as np

from tb_parity_plugin.engine.matrix import REASONS, ParityMatrix
from tb_parity_plugin.engine.tolerance import TolerancePolicy
from tb_parity_plugin.records import metadata

if TYPE_CHECKING:
    from tb_parity_plugin.engine.comparison import Comparison

#: The error figures of a divergence, in display order.
FIGURES = ("max_abs_diff", "max_rel_diff", "cosine", "mismatch_fraction", "error_ratio")
#: Tags of an embedding table or lookup's output, whose wrong row shows only at the step that looks
#: it up: GPT-style and word-vector names too (model/wte, token_embs, word_vectors), but a token or
#: word name only with a table's suffix or alone (a review's word_logits and tokens_per_sec got it);
#: not a ViT's learned cls/mask token or its patch embedding (a convolution).
_LOOKUP = re.compile(
    r"(?<!patch_)embed|lookup|gather|(^|[/_:.])(embs?|wte|wpe)($|[/_:.\d])"
    r"|(^|[/_:.])(?<!cls_)(?<!mask_)(?<!class_)(tok(en)?|word|vocab(ulary)?)(_?(embs?|vec(tor)?s?|tables?))?($|[/:.\d])",
    re.IGNORECASE,
)


def mismatch_text(fraction: Optional[float]) -> str:
    """The share of elements out of tolerance as every front end prints it (``37.5%``, ``n/a``)."""
    return "n/a" if fraction is None else f"{100 * fraction:.3g}%"


def statistics_only_text(tags: Sequence[str], partly: Mapping[str, Sequence[int]]) -> str:
    """The tensors an agreement compared by statistics only, and what to do for an element-wise
    verdict, worded once for the CLI, ``assert_parity`` and the HTML report."""
    named = [
        f"{tag} (element-wise at {partly[tag][0]} of {partly[tag][1]} steps)" if tag in partly else tag for tag in tags
    ]
    shown = ", ".join(named[:10]) + (f" and {len(named) - 10} more" if len(named) > 10 else "")
    return (
        f"compared by statistics: {shown}; record them with full values at every step "
        "(full_values_limit above their largest size) for an element-wise verdict"
    )


def json_float(value: Any) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return value if np.isfinite(value) else None


@dataclasses.dataclass
class Divergence:
    """One tensor diverging at one step, with its figures (finite floats or None)."""

    step: int
    tensor: str  # baseline name
    kind: str
    candidate_tensor: str
    order: int
    reason: str
    max_abs_diff: Optional[float] = None
    max_rel_diff: Optional[float] = None
    cosine: Optional[float] = None
    mismatch_fraction: Optional[float] = None
    error_ratio: Optional[float] = None
    #: What the verdict rests on: values | sample (values of an element sample) | statistics | counts |
    #: shape | dtype | presence.
    evidence: Optional[str] = None
    #: One line saying what was found and from what evidence (e.g. both runtime shapes).
    note: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def ended_early(steps: dict[str, np.ndarray]) -> dict[str, dict[str, int]]:
    """Runs (name -> sorted unique logged steps) that end before another: that one logged the step
    this run would have logged next, or a later one (its last plus its own largest logging interval:
    a run logged every 3rd step, its last at 27, has not ended early against one logged to step 29;
    a run logged every step to 4 has against one logged to 5)."""
    found = {}
    for name, own in steps.items():
        if not len(own):
            continue
        last = int(own[-1])
        interval = int(np.diff(own).max()) if len(own) > 1 else 1
        for other_name, other in steps.items():
            if other_name != name and len(other) and int(other[-1]) >= last + interval:
                found[name] = {
                    "last": last,
                    "other_last": int(other[-1]),
                    "steps": int(np.count_nonzero(other > last)),
                }
    return found


def counted_twice(steps: dict[str, np.ndarray]) -> list[str]:
    """Warnings for a run that logged as many steps as another, at every k-th step (k >= 2) where the
    other logged every step: its counter likely counts k per iteration, so each step both logged pairs
    another iteration of each. A trial's GAN port that shared one Adam between its generator and
    discriminator numbered both phases by its ``iterations`` (0, 2, 4, ... and 1, 3, 5, ...): it was
    compared at its steps 2 and 4 against TF1's, iterations 1 and 2 against 2 and 4, and told of the
    slots' rule and clipping."""
    found = []
    for name, own in steps.items():
        for other_name, other in steps.items():
            if other_name == name or len(own) != len(other) or len(own) < 3:
                continue
            # steps are sorted and unique: the other logged every step exactly when its span is n - 1, so
            # runs logged at every step (every refresh's case) are passed over without a pass over them
            n, span = len(own), int(own[-1] - own[0])
            if int(other[-1] - other[0]) != n - 1 or span % (n - 1) or span // (n - 1) < 2:
                continue
            k = span // (n - 1)
            if not bool((np.diff(own) == k).all()):
                continue
            nth = {2: "2nd", 3: "3rd"}.get(k, f"{k}th")
            found.append(
                f"{name!r} logged {len(own)} steps, {int(own[0])} to {int(own[-1])}, every {nth}, where {other_name!r} "
                f"logged as many at every step, {int(other[0])} to {int(other[-1])}: its step counter likely counts "
                f"{k} per iteration (one optimizer applied {k} times per iteration: a GAN's generator and "
                "discriminator sharing one optimizer whose iterations number the steps), so the steps both logged "
                f"hold other iterations of each run; number its steps by its iterations (optimizer.iterations // {k}, "
                "or a counter of its own)"
            )
    return found


@dataclasses.dataclass
class ParityReport:
    """What the CLI prints with ``--json`` (:meth:`to_dict`) and what the API returns."""

    baseline: str
    candidate: str
    steps_compared: int
    tensors_compared: int
    first_divergence: Optional[Divergence]
    divergences_at_first_step: list[Divergence]  # execution order
    first_nonfinite: dict[str, Optional[dict[str, Any]]]  # run -> None | {step, tensor, kind}
    unmatched: dict[str, list[str]]  # run -> [tags]
    mapping: list[dict[str, str]]  # of {baseline, candidate, kind, how}
    steps_only: dict[str, int]  # run -> number of steps only that run logged
    policy: TolerancePolicy
    problems: list[dict[str, Any]]  # of {run, path, offset, message}
    warnings: list[str]
    #: What each run recorded (engine/structure.py): tensors of one run only, variable counts, ...
    structure: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The first divergence among the compared steps (``first_divergence`` may be a structure one).
    first_step_divergence: Optional[Divergence] = None
    #: Pairs compared by full values and by statistics only (``sampled``: of those, how many had an
    #: element sample compared too): an agreement resting on statistics is weaker evidence ("agree
    #: within statistics") than an element-wise one.
    evidence: dict[str, int] = dataclasses.field(default_factory=lambda: {"values": 0, "statistics": 0, "sampled": 0})
    #: Tags of the pairs compared by statistics only (in the baseline's execution order): what
    #: to record with full values (``full_values_limit``) for an element-wise verdict.
    statistics_only: list[str] = dataclasses.field(default_factory=list)
    #: Of those, the ones compared element-wise at the steps both runs kept full values (a size
    #: crossing ``full_values_limit``, a partial last batch): tag -> [such steps, steps compared].
    partly_values: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    #: Tags compared at the first divergent step by statistics only (with a sample, if they have
    #: one), earlier in the baseline's execution order than the first divergent tensor: a smaller
    #: difference there is not ruled out, so the divergence may start upstream of the one named.
    unproven_before_first: list[str] = dataclasses.field(default_factory=list)
    #: Tags compared by statistics only at some compared step before the first divergent one: a
    #: difference smaller than the statistics prove may predate the step named.
    unproven_earlier: list[str] = dataclasses.field(default_factory=list)
    #: The first divergence of a learning rate or a recorded hyper-parameter, when it comes after
    #: the first divergent step (:attr:`hparam_text`).
    hparam_divergence: Optional[Divergence] = None
    #: Runs recorded under a distribution strategy: run -> {count, tensors (with per-replica
    #: copies), disagreements (variables whose replica copies are out of sync)}.
    replicas: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: Runs that end before the other: run -> {last: its last step, other_last: the other run's,
    #: steps: how many steps the other logged after it} (:func:`ended_early`).
    ended_early: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    comparison: Optional[Comparison] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def agree(self) -> bool:
        """No divergence, and nothing unread that could hide one (or the problems were accepted)."""
        return self.first_divergence is None and not self.incomplete

    @property
    def incomplete(self) -> bool:
        """No divergence in what was read, but read problems in the compared runs, or a run that
        ended before the other, not accepted."""
        return self.first_divergence is None and bool(self._unread_problems or self._short_runs)

    @property
    def _unread_problems(self) -> list[dict[str, Any]]:
        return [] if self.policy.accept_read_problems else self.problems

    @property
    def _short_runs(self) -> dict[str, dict[str, int]]:
        return {} if self.policy.accept_fewer_steps else self.ended_early

    @property
    def verdict(self) -> str:
        """``diverge``, ``incomplete`` (no divergence in what was read, read problems),
        ``agree`` (every pair element-wise) or ``agree within statistics``."""
        if self.first_divergence is not None:
            return "diverge"
        if self.incomplete:
            return "incomplete"
        return "agree within statistics" if self.evidence.get("statistics") else "agree"

    @property
    def verdict_text(self) -> str:
        """The verdict in one line, worded once for every front end (CLI, report, dashboard)."""
        first = self.first_divergence
        if first is not None and first.reason == "structure":
            n = len(self.divergences_at_first_step)
            return f"DIVERGE in structure: {n} tensor(s) recorded by one run only, first {first.kind}/{first.tensor or first.candidate_tensor}"
        if first is not None:
            return f"DIVERGE at step {first.step}: {first.kind}/{first.tensor} ({first.reason}, by {first.evidence})"
        if self.incomplete:
            reasons = []
            if self._unread_problems:
                reasons.append(
                    f"the compared runs have {len(self.problems)} read problem(s) (corrupt or truncated records, "
                    "listed): what was not read may diverge. Accept them with --accept-read-problems"
                )
            for run, short in self._short_runs.items():
                other = self.candidate if run == self.baseline else self.baseline
                reasons.append(
                    f"{run!r} ends at step {short['last']} and {other!r} logged {short['steps']} step(s) after it "
                    f"(to step {short['other_last']}), never compared: {run!r} trained fewer steps (epochs, "
                    "steps_per_epoch, a dataset that ends early) or is still training. Accept it with "
                    "--accept-fewer-steps"
                )
            return "INCOMPLETE: no divergence in what was compared, but " + "; and ".join(reasons)
        by_stats, by_values = self.evidence.get("statistics", 0), self.evidence.get("values", 0)
        if not by_stats:
            return "AGREE: no divergence within tolerance (every compared tensor element-wise)" + self._declared_text()
        sampled = self.evidence.get("sampled", 0)
        samples = (
            f", {sampled} of them with a sample of {metadata.SAMPLE_SIZE} elements that agrees element-wise"
            if sampled
            else ""
        )
        partly = len(self.partly_values)
        some = f" ({partly} of them element-wise at the steps both runs kept full values)" if partly else ""
        return (
            f"AGREE within statistics: {by_stats} of {by_stats + by_values} tensors were compared by statistics "
            f"at some or every step{some}{samples}; their min/max/mean/std/L2 stay within what the tolerance allows, "
            f"which is weaker evidence than element-wise agreement (the other {by_values} agree element-wise)"
            + self._declared_text()
        )

    def _declared_text(self) -> str:
        """What an agreement leaves out: tensors recorded by one run only that ``allow_unmatched``
        declared expected are not compared at all. "every tensor compared" misled two new users
        whose LSTM cell and partitioned embedding were never checked."""
        only = [e for entries in (self.structure.get("only_in") or {}).values() for e in entries if e.get("expected")]
        if not only:
            return ""
        return (
            f"; not compared: {len(only)} tensor(s) recorded by one run only and declared expected "
            f"(allow_unmatched), first {only[0]['tag']}: compare what they compute another way"
        )

    @property
    def tolerance_text(self) -> Optional[str]:
        """The tolerance the first divergent tensor was held to at its step, worded once for every
        front end (None without a value divergence). The policy alone misled new users: it shows
        the rtol after the warm-up, and neither the warm-up's nor a slot's or an lr's own rule."""
        first = self.first_divergence
        if first is None or first.reason in ("structure", "missing", "shape"):
            return None
        tol = self.policy.for_tag(f"{first.kind}/{first.tensor}")
        steps = None if self.comparison is None or not len(self.comparison.steps) else self.comparison.steps
        if steps is None:
            rtol = f"rtol {tol.rtol_at(0):g} for the first {tol.warmup_steps} training steps, then {tol.rtol:g}"
        else:
            since = first.step - int(steps[0])
            rtol = f"rtol {tol.rtol_at(since):g}"
            if since < tol.warmup_steps:
                rtol += f" (the warm-up: the first {tol.warmup_steps} training steps from step {int(steps[0])})"
        atol = (
            f"atol {tol.atol:g}"
            + (f" + {tol.atol_of_max:g} x its largest |element| at the step" if tol.atol_of_max else "")
            + (f" + {tol.atol_of_peak:g} x its largest |value| up to the step" if tol.atol_of_peak else "")
        )
        allowed = 0.0 if self.comparison is None else self.comparison.allowance(first.kind, first.tensor, first.step)
        if allowed:
            atol += f" + {allowed:g} (its gradient's differences within tolerance, at the steps before)"
        return f"tolerance of {first.kind}/{first.tensor} at step {first.step}: {atol}, {rtol}"

    @property
    def unproven_text(self) -> Optional[str]:
        """What :attr:`unproven_before_first` means, worded once for every front end (None if empty)."""
        tags, earlier, first = self.unproven_before_first, self.unproven_earlier, self.first_divergence
        if not (tags or earlier) or first is None:
            return None

        def listed(found: list[str]) -> str:
            return ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")

        parts = []
        if tags:
            parts.append(
                f"before {first.kind}/{first.tensor} in execution order, compared at step {first.step} by statistics "
                # nearest first: a new user's culprit, the lookup right before, was cut as "and 3 more"
                f"only (and their element samples, where recorded), nearest first: {listed(tags[::-1])}; a "
                "difference there smaller than "
                "the statistics can prove is not ruled out, so the divergence may start upstream"
            )
        if earlier:
            # the lookup's hint only where there is a lookup: a new user's CNN got it on every verdict
            lookup = any(_LOOKUP.search(tag) for tag in [*earlier, first.tensor])
            parts.append(
                f"compared by statistics only at steps before {first.step}: {listed(earlier)}; a difference there "
                f"smaller than the statistics can prove is not ruled out, so the divergence may predate step "
                f"{first.step}"
                + (" (a wrong embedding row shows first at the step that looks it up)" if lookup else "")
            )
        return "; ".join(parts) + ": record them with full values to know"

    @property
    def hparam_text(self) -> Optional[str]:
        """A hyper-parameter diverging after the first divergent step, worded once for every front
        end (None if none). No rounding makes a schedule differ, so it is never noise: a new user's
        warm-up off by one step showed only in the lr chart, behind a weight's drift at step 3."""
        d = self.hparam_divergence
        if d is None:
            return None
        # its note (a schedule one step behind, one epoch late) was in the JSON only: a helper's lr
        # dropped one step late read "error ratio 1e6" in the CLI, the cause one --json away
        why = f" ({d.note})" if d.note else ""
        return (
            f"also: the hyper-parameter {d.kind}/{d.tensor} diverges from step {d.step} ({d.reason}, error ratio "
            f"{d.error_ratio if d.error_ratio is None else f'{d.error_ratio:.3g}'}): compared at float32 resolution, "
            f"no rounding explains it; whatever diverges after it may be its effect{why}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "agree": self.agree,
            "verdict": self.verdict,
            "verdict_text": self.verdict_text,
            "evidence": dict(self.evidence),
            "statistics_only": list(self.statistics_only),
            # the CLI's line, for the tab's card and the report's headline to say it alike
            "statistics_only_text": statistics_only_text(self.statistics_only, self.partly_values)
            if self.statistics_only
            else None,
            "partly_values": {tag: list(n) for tag, n in self.partly_values.items()},
            "unproven_before_first": list(self.unproven_before_first),
            "unproven_earlier": list(self.unproven_earlier),
            "unproven_text": self.unproven_text,
            "hparam_divergence": self.hparam_divergence.to_dict() if self.hparam_divergence else None,
            "hparam_text": self.hparam_text,
            "tolerance_text": self.tolerance_text,
            "steps_compared": self.steps_compared,
            "tensors_compared": self.tensors_compared,
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "divergences_at_first_step": [d.to_dict() for d in self.divergences_at_first_step],
            "first_step_divergence": self.first_step_divergence.to_dict() if self.first_step_divergence else None,
            "structure": self.structure,
            "replicas": self.replicas,
            "ended_early": self.ended_early,
            "first_nonfinite": self.first_nonfinite,
            "unmatched": self.unmatched,
            "mapping": self.mapping,
            "steps_only": self.steps_only,
            "policy": self.policy.to_dict(),
            "problems": self.problems,
            "warnings": self.warnings,
        }

    def _repr_html_(self) -> str:
        """Notebook view of this report, no server needed (drawn by page.py)."""
        from tb_parity_plugin.report import page

        return page.report_fragment(self)

    def matrix(self, max_steps: Optional[int] = None) -> ParityMatrix:
        """The steps x tensors matrix of the comparison behind this report."""
        if self.comparison is None:
            raise ValueError("this report is not attached to a Comparison")
        return self.comparison.matrix(max_steps)

    def detail(self, tensor: str, step: Optional[int] = None) -> TensorDetail:
        if self.comparison is None:
            raise ValueError("this report is not attached to a Comparison")
        return self.comparison.detail(tensor, step)


@dataclasses.dataclass
class TensorDetail:
    """One tensor pair over time, for a detail view.

    ``steps``/``reason``/``error_ratio`` cover the compared steps; ``*_steps`` and
    ``*_stats`` are each run's own series (columns ``metadata.STATS_FIELDS``). With
    ``step`` given and full values on both sides: ``base_values``, ``cand_values`` and
    ``diff`` (cand - base, float64) at that step, shaped like the tensor, and its figures.
    """

    tensor: str
    candidate_tensor: str
    kind: str
    how: str
    #: ``Pair.evidence``: values, partial or statistics (an "ok" by statistics is weaker evidence).
    evidence: str
    #: bool per compared step: its verdict rests on statistics alone (``Pair.by_statistics``).
    by_statistics: np.ndarray
    atol: float
    rtol: float
    warmup_steps: int
    steps: np.ndarray
    reason: np.ndarray
    error_ratio: np.ndarray
    base_steps: np.ndarray
    base_stats: np.ndarray
    cand_steps: np.ndarray
    cand_stats: np.ndarray
    step: Optional[int] = None
    figures: Optional[dict[str, Any]] = None
    base_values: Optional[np.ndarray] = None
    cand_values: Optional[np.ndarray] = None
    diff: Optional[np.ndarray] = None
    #: The candidate replica whose copy ``cand_*`` show (multi-replica runs); the verdict arrays
    #: and figures stay those of the one-device value, which is what is compared.
    replica: Optional[int] = None
    #: The atol ``step`` was held to: ``atol`` plus, for an optimizer slot, its share of the step's
    #: largest element and its gradient's allowance (the per-element tolerance a view draws).
    step_atol: Optional[float] = None
    #: The rtol ``step`` was held to (the warm-up's, or ``rtol`` after it).
    step_rtol: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: non-finite numbers become None."""

        def clean(a: Optional[np.ndarray]) -> Any:
            return None if a is None else nested(np.asarray(a, dtype=np.float64))

        return {
            "tensor": self.tensor,
            "candidate_tensor": self.candidate_tensor,
            "kind": self.kind,
            "how": self.how,
            "evidence": self.evidence,
            "by_statistics": self.by_statistics.tolist(),
            "tolerance": {"atol": self.atol, "rtol": self.rtol, "warmup_steps": self.warmup_steps},
            "steps": self.steps.tolist(),
            "reason": [REASONS[int(c)] for c in self.reason],
            "error_ratio": clean(self.error_ratio),
            "stats_fields": list(metadata.STATS_FIELDS),
            "base": {"steps": self.base_steps.tolist(), "stats": clean(self.base_stats)},
            "candidate": {"steps": self.cand_steps.tolist(), "stats": clean(self.cand_stats)},
            "step": self.step,
            "step_atol": self.step_atol,
            "step_rtol": self.step_rtol,
            "figures": self.figures,
            "base_values": clean(self.base_values),
            "cand_values": clean(self.cand_values),
            "diff": clean(self.diff),
        }


def nested(a: np.ndarray) -> Any:
    """``a.tolist()`` with NaN/Inf replaced by None."""
    if a.ndim == 0:
        return json_float(a)
    return [nested(x) for x in a] if a.ndim > 1 else [json_float(x) for x in a.tolist()]
