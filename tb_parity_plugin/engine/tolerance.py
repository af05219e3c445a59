"""Tolerance policy: which atol/rtol applies to a tensor at a compared step.

The default is the TF migration guide's: atol 1e-5 at every step, rtol :data:`WARMUP_RTOL`
for the first ``warmup_steps`` training steps from the first compared step, then rtol 5%; ``equal_nan=False`` so a NaN
fails. Overrides adjust it per kind or per tensor-name pattern.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np

from tb_parity_plugin.engine import patterns
from tb_parity_plugin.records import metadata

_MIN, _MAX = metadata.STAT_INDEX["min"], metadata.STAT_INDEX["max"]

#: rtol during the warm-up: numpy's default. The guide's warm-up check is
#: ``np.testing.assert_allclose(tf1_loss[:10], tf2_loss[:10], atol=1e-5, equal_nan=False)``, which
#: passes no rtol and so inherits ``rtol=1e-7``. With 0 instead, a value above 128 whose two runs
#: differ by one float32 ulp (a loss of 2e4 computed in another order) was a divergence that the
#: guide's own check passes. After the warm-up the guide passes ``rtol=0.05`` and so ``atol=0``;
#: we keep ``atol`` there, or every gradient element that cancels to near zero would diverge.
WARMUP_RTOL = 1e-7


def check_settings(atol: Optional[float], rtol: Optional[float], warmup_steps: Optional[int], where: str = "") -> None:
    """Raise ``ValueError`` unless each given setting is finite and >= 0 (``None``: not set)."""
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and (not (value >= 0.0) or value == float("inf")):
            raise ValueError(f"{where}{name} must be a finite number >= 0, got {value!r}")
    if warmup_steps is not None and warmup_steps < 0:
        raise ValueError(f"{where}warmup_steps must be >= 0, got {warmup_steps}")


@dataclasses.dataclass(frozen=True)
class ToleranceOverride:
    """Tolerance for the tensors whose tag ``<kind>/<name>`` matches ``pattern``.

    ``pattern`` is a glob (``"grad/*"``, ``"*/dense*/kernel*"``) or ``"re:<regex>"``
    (RE2, searched in the tag: engine/patterns.py). ``None`` fields keep the policy's value.
    Later overrides win over earlier ones.
    """

    pattern: str
    atol: Optional[float] = None
    rtol: Optional[float] = None
    warmup_steps: Optional[int] = None

    def __post_init__(self) -> None:
        # compiled once here (and so checked): a frozen dataclass keeps it in a hidden field
        object.__setattr__(self, "_match", patterns.matcher(self.pattern, f"override {self.pattern!r}"))
        check_settings(self.atol, self.rtol, self.warmup_steps, f"override {self.pattern!r}: ")

    def matches(self, tag: str) -> bool:
        match: Callable[[str], bool] = self.__dict__["_match"]
        return match(tag)

    @classmethod
    def parse(cls, text: str) -> ToleranceOverride:
        """Parse ``PATTERN:key=value[,key=value]`` (CLI form), e.g. ``grad/*:rtol=0.1,atol=1e-4``.

        The last ``:`` separates the pattern from the settings, so ``re:`` patterns work.
        """
        pattern, sep, settings = text.rpartition(":")
        if not sep or not pattern:
            raise ValueError(f"override {text!r} is not PATTERN:key=value[,key=value]")
        fields: dict[str, Any] = {}
        for item in settings.split(","):
            key, eq, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or key not in ("atol", "rtol", "warmup_steps"):
                raise ValueError(f"override {text!r}: unknown setting {item!r} (atol, rtol, warmup_steps)")
            if key in fields:  # the last one silently won: "atol=1e-3,atol=1e-9" read as 1e-9
                raise ValueError(f"override {text!r} sets {key} twice: give it once")
            try:
                fields[key] = int(value) if key == "warmup_steps" else float(value)
            except ValueError:
                raise ValueError(f"override {text!r}: {key} must be a number, got {value.strip()!r}") from None
        return cls(pattern=pattern, **fields)


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """The resolved tolerance of one tensor."""

    atol: float
    rtol: float
    warmup_steps: int
    #: Added to ``atol`` at each step: this fraction of the baseline's largest finite |element| at
    #: that step (0 for all but optimizer slots: see :data:`SLOT_ATOL_OF_MAX`).
    atol_of_max: float = 0.0
    #: Added to ``atol`` at each step: this fraction of the baseline's largest finite |element| at
    #: any step up to that one (0 for all but hyper-parameters: see :data:`HPARAM_ATOL_OF_PEAK`).
    atol_of_peak: float = 0.0

    def atols(self, base_stats: np.ndarray) -> float | np.ndarray:
        """atol per baseline statistics row (``[rows, N_STATS]``): ``atol`` itself when it does not
        scale (every kind but slots: the same float as before, so nothing else changes), else
        ``atol + atol_of_max * max(|min|, |max|)`` of each row (0 where those are not finite)."""
        if not self.atol_of_max:
            return self.atol
        stats = np.asarray(base_stats, dtype=np.float64).reshape(-1, metadata.N_STATS)
        return self.atols_of_largest(np.maximum(np.abs(stats[:, _MIN]), np.abs(stats[:, _MAX])))

    def atols_of_largest(self, largest: np.ndarray) -> np.ndarray:
        """``atol + atol_of_max * largest`` per row of each row's largest |element| (0 where it is not
        finite): :meth:`atols` from values instead of statistics (a scalar's is its |value|)."""
        largest = np.asarray(largest, dtype=np.float64)
        out: np.ndarray = self.atol + self.atol_of_max * np.where(np.isfinite(largest), largest, 0.0)
        return out

    def peak_atols(self, largest: np.ndarray) -> np.ndarray:
        """What :attr:`atol_of_peak` adds per baseline row, from each row's largest |element|
        (rows in ascending steps, every row of the baseline from its first): that fraction of the
        largest finite one so far (zeros when the tolerance has no such share)."""
        largest = np.asarray(largest, dtype=np.float64)
        if not self.atol_of_peak:
            return np.zeros(len(largest))
        found: np.ndarray = self.atol_of_peak * np.maximum.accumulate(np.where(np.isfinite(largest), largest, 0.0))
        return found

    # The warm-up rule lives here only: rtol is WARMUP_RTOL for the first ``warmup_steps``
    # training steps counted from the first compared step (``since``: a compared step's step
    # minus that first step, :class:`StepClock`), then ``rtol``. It counts training steps, not
    # compared ones: a pair of evaluation runs logged every 10 steps was held to rtol 1e-7
    # through step 90, and a faithful port diverged at step 20 by 1e-3 relative (a new user's).
    def rtol_at(self, since: int) -> float:
        """rtol at a compared step ``since`` training steps after the first compared step."""
        return WARMUP_RTOL if since < self.warmup_steps else self.rtol

    def rtols(self, since: np.ndarray) -> np.ndarray:
        """rtol per compared step (vectorised :meth:`rtol_at`)."""
        return np.where(np.asarray(since) < self.warmup_steps, WARMUP_RTOL, self.rtol)

    def phases(self, since: np.ndarray) -> list[tuple[slice, float]]:
        """``(slice, rtol)`` runs of ascending ``since`` sharing one rtol (warm-up, then after)."""
        n_warm = int(np.searchsorted(since, self.warmup_steps))
        parts = [(slice(0, n_warm), WARMUP_RTOL), (slice(n_warm, len(since)), self.rtol)]
        return [(sel, rtol) for sel, rtol in parts if sel.start != sel.stop]


class StepClock:
    """The compared steps of one comparison, shared by its pairs, for the warm-up rule: compared
    step ``k`` is ``since(k)`` training steps after the first. A refresh keeps a pair only while
    the old steps are a prefix of the new ones, so the first step, and every kept verdict's
    rtol, stay what they were."""

    def __init__(self) -> None:
        self.steps = np.zeros(0, dtype=np.int64)

    def since(self, ks: np.ndarray | int) -> Any:
        """Training steps from the first compared step to compared step(s) ``ks``."""
        return self.steps[ks] - self.steps[0]


def _tensor_tag(tag: str) -> str:
    """``kind/name`` of the tensor ``tag`` names: an element sample's is its tensor's."""
    kind, _, name = tag.partition("/")
    parent = metadata.sample_parent(name)
    return tag if parent is None else f"{kind}/{parent}"


def since_first(steps: np.ndarray) -> np.ndarray:
    """Training steps from the first of ascending ``steps`` to each (a replica's or a scalar's
    common steps: the warm-up counted as a comparison counts it)."""
    steps = np.asarray(steps, dtype=np.int64)
    return steps - steps[0] if len(steps) else steps


#: Kinds that set training rather than result from it: compared by :attr:`TolerancePolicy.hparam_rtol`.
HPARAM_KINDS = frozenset({"lr", "hparam"})
#: One float32 ulp, relative, plus :data:`HPARAM_ATOL_OF_PEAK`: a learning rate computed by the
#: same formula in TF1 and TF2 agrees to float32 resolution; anything more is another schedule
#: (the migration guide compares lr with assert_allclose's defaults, rtol 1e-7, atol 0).
HPARAM_RTOL = 2.0**-23
#: ...plus this fraction of the largest |value| the baseline recorded up to the step (for a
#: hyper-parameter of several values, the smallest of its elements' own: one atol per row, which
#: never passes more than an element's own share would). Why: a schedule's formula rounds at the scale
#: of its peak, not of its value: a new user's faithful warm-up + cosine port (TF1 cosine_decay in a
#: Session, Keras CosineDecay in a tf.function, the same formula to the last float64 bit) was 4 ulps
#: apart at step 38, lr 0.35 of its peak, and diverged on lr (relative 2.7e-7 > 2^-22). At the
#: peak the two add up to 2^-22, the rule before: an exponential decay 0.97 per 1e5 steps one step
#: off (3e-7 relative) is still found at step 0 (a review found 2^-22 here missed it).
HPARAM_ATOL_OF_PEAK = 2.0**-23


#: A value divergence whose error ratio (largest |c - b| over what the tolerance allows) is below
#: this is "just past tolerance": its note says what amplifies float32 noise that far on faithful
#: ports (new users' CNN with batch norm and 64-unit LSTM: ratios 1.05-1.24 at steps 3-6).
MARGINAL_RATIO = 2.0
#: Weights apart by at most this many float32 ulps of their largest |element| at a step differ by
#: rounding alone (an update's order of operations), not by the port's math: a gradient that jumps
#: from such weights is told float32 rounding carried into it (``notes.updates``).
ROUNDED_WEIGHT_ULPS = 4.0


#: Optimizer slots are compared relatively from the first step: Adam's second moment lives
#: around 1e-6 to 1e-10, far below the training atol, where an absolute tolerance would pass
#: any value. atol is the policy's scaled by :data:`SLOT_ATOL_SCALE`; rtol is :data:`SLOT_RTOL`.
SLOT_KINDS = frozenset({"slot"})
SLOT_ATOL_SCALE = 1e-3
SLOT_RTOL = 1e-4
#: ...plus this fraction of the slot's largest |element| at the step: a momentum element that
#: cancels (2e-4 fed by gradients of 0.3) carries the float32 rounding of what it summed, about
#: 1e-8 per step, far above 1e-4 of its own value (a faithful Keras port of MomentumOptimizer was
#: reported DIVERGE at step 13 by 3.5e-8). 1e-4 of the tensor's scale still finds another momentum,
#: beta or decay, which moves every element by percents.
SLOT_ATOL_OF_MAX = 1e-4


#: ...and a slot's gradient differences count in full up to this fraction of the largest |element|
#: of its layer's gradients in the baseline at the step (``Pair.allowance``, ``pair.GradientScale``),
#: past the slot rule's own bound: 1024 float32 ulps of the layer's gradient scale (1.2e-4 of it). A
#: bias right before batch normalization has a gradient of rounding noise (0 in exact math) whose
#: size follows the sums behind it, not the slot rule's floor, and grows as training goes. At 4 ulps
#: (sessions 19-22) a new user's faithful 16 x 16 U-Net (a conv's default bias before batch norm,
#: MomentumOptimizer, 30 steps) was a false DIVERGE on that bias's momentum slot in 3 of 11 runs
#: (TF's CPU reductions are not deterministic from run to run): its gradients were up to 122 ulps
#: apart, 7-14 ulps at step 0, and Keras's conv bias before batch norm measured 5-58 ulps at step 0
#: over 1k-400k positions (batch x height x width). What a slot no longer shows: a gradient
#: difference under 1.2e-4 of its layer's largest gradient element, which the gradient's own atol
#: (1e-5) passes too. A gradient 2x off at 1e-6 in a layer whose gradients are that small is a
#: difference near the layer's scale itself, and still moves its slot past the bound.
SLOT_NOISE_OF_MAX = 2.0**-13

#: A gradient's own float32 rounding, 4 ulps of its largest |element|: how far an element may be off
#: an exact relation and still be told it (one factor at every element; a weight decay's term).
GRAD_NOISE_OF_MAX = 2.0**-21


#: A layer's output (kinds :data:`SCALED_KINDS`) is held to atol plus this fraction of its largest
#: |element| at the step: 32 float32 ulps of its scale. Float32 rounding in reordered sums (TF1's
#: and Keras's kernels) is a few ulps of a tensor's scale, not of each element, and Adam turns
#: rounding noise in small gradients into weight differences that a layer fed inputs of size 3-9
#: multiplies: new users' faithful Adam ports diverged on logits of size 8 by 1.2-1.3x atol 1e-5
#: at steps 2-4 (at most 17 ulps of the peak past atol over the warm-up, and no growth after).
#: 32 ulps of the peak is 3.8e-6 of it. The cost: a port difference that moves a layer's output by
#: less passes (a helper's LayerNorm epsilon 1e-12 against 1e-3 under inputs of size 50: 3e-6 of
#: the output, 8-27x a faithful port's gap, AGREE). A moving average of batch statistics (``state``)
#: rounds the same way: a faithful BatchNormalization port's moving variance of 85 was 2-3 ulps
#: apart, a divergence with no note. The loss (and a metric) is an output too: under atol 1e-5
#: alone, faithful Adam ports with a loss near 25 diverged on it at steps 1-2 in 6 of 6 seeds (one
#: float32 ulp at 25 is 1.9e-6; a regression's loss of 100 is held to 1.3 ulps), and with a loss
#: near 3 in 2 of 6; the migration guide's own check, written for its small losses, fails there too.
SCALED_KINDS = frozenset({"activation", "output", "state", "loss", "metric"})
OUTPUT_ATOL_OF_MAX = 2.0**-18

#: Whether a variable's replica copies are kept in sync (a synchronized batch norm's moving
#: statistics) is judged at 16 float32 ulps of the step's largest |element|, with no atol or rtol
#: of its own: synchronized copies hold one all-reduced value, and copies of per-replica statistics
#: differ by a share of their own size. The training atol (1e-5) made a review's unsynchronized
#: moving means of size 1e-6 look synchronized, and their note was withheld.
SYNC_TOLERANCE = Tolerance(0.0, 0.0, 0, 2.0**-19)


@dataclasses.dataclass(frozen=True)
class TolerancePolicy:
    """Per-tensor tolerance; see the module docstring for the defaults' origin.

    Hyper-parameters (kinds in :data:`HPARAM_KINDS`: the learning rate, values recorded with
    ``rec.hparam``) are compared strictly and relatively at every step, with ``hparam_rtol``
    and atol 0 and no warm-up, separately from the training policy: an lr off by 1e-7 per
    step is another schedule, found at the step it starts, not steps later in the logits.
    Overrides apply on top (``--override 'lr/*:atol=1e-5,rtol=0.05'`` loosens it).
    Optimizer slots (:data:`SLOT_KINDS`) are compared relatively from the first step
    (rtol :data:`SLOT_RTOL`, atol scaled down by :data:`SLOT_ATOL_SCALE` plus
    :data:`SLOT_ATOL_OF_MAX` of the slot's largest element at the step), overrides on top.
    Layer outputs (:data:`SCALED_KINDS`) get :data:`OUTPUT_ATOL_OF_MAX` of their largest element
    at the step on top of atol; an override's atol is the whole atol.
    """

    atol: float = 1e-5
    rtol: float = 0.05
    warmup_steps: int = 10
    equal_nan: bool = False
    overrides: tuple[ToleranceOverride, ...] = ()
    hparam_rtol: float = HPARAM_RTOL
    #: Tags (globs or ``re:``) a run may record without the other: not a structure divergence.
    allow_unmatched: tuple[str, ...] = ()
    #: Read problems in the compared runs (corrupt or truncated records) make "no divergence"
    #: an ``incomplete`` verdict, since what was not read may diverge; True accepts them.
    accept_read_problems: bool = False
    #: A run that ends before the other (the other logged the step it would have logged next, or a
    #: later one: ``verdicts.ended_early``) makes "no divergence" ``incomplete`` too: the steps it did not train
    #: were never compared (a new user's port trained one epoch too few and agreed). True accepts it
    #: (a port still training, or one trained shorter on purpose).
    accept_fewer_steps: bool = False

    def __post_init__(self) -> None:
        check_settings(self.atol, self.rtol, self.warmup_steps)
        for pattern in self.allow_unmatched:  # checked here, so a bad one is a usage error up front
            patterns.matcher(pattern, f"allow_unmatched pattern {pattern!r}")
        check_settings(None, self.hparam_rtol, None, "hparam_")
        object.__setattr__(self, "overrides", tuple(self.overrides))
        object.__setattr__(self, "allow_unmatched", tuple(str(p) for p in self.allow_unmatched))

    def for_tag(self, tag: str) -> Tolerance:
        """The tolerance for tensor ``tag`` after applying every matching override in order (an
        element sample's is its tensor's: the same elements, fewer of them)."""
        atol, rtol, warmup, of_max, of_peak = self.atol, self.rtol, self.warmup_steps, 0.0, 0.0
        tag = _tensor_tag(tag)
        kind = tag.partition("/")[0]
        if kind in HPARAM_KINDS:
            atol, rtol, warmup, of_peak = 0.0, self.hparam_rtol, 0, HPARAM_ATOL_OF_PEAK
        elif kind in SLOT_KINDS:
            atol, rtol, warmup, of_max = self.atol * SLOT_ATOL_SCALE, SLOT_RTOL, 0, SLOT_ATOL_OF_MAX
        elif kind in SCALED_KINDS:
            of_max = OUTPUT_ATOL_OF_MAX
        for override in self.overrides:
            if override.matches(tag):
                if override.atol is not None:  # an atol you set is the whole atol
                    atol, of_max, of_peak = override.atol, 0.0, 0.0
                rtol = override.rtol if override.rtol is not None else rtol
                warmup = override.warmup_steps if override.warmup_steps is not None else warmup
        return Tolerance(float(atol), float(rtol), int(warmup), float(of_max), float(of_peak))

    def unused_patterns(self, base_tags: Sequence[str], cand_tags: Sequence[str]) -> list[str]:
        """Warnings for the overrides that match no baseline tag and the ``allow_unmatched`` patterns
        that match no tag of either run: a typo (``*kye/bias*``) changed nothing and said nothing, and
        an override spelled with the candidate's names (its tolerance is looked up by the baseline's)
        does not apply. Tags are ``kind/name``, an element sample's under its tensor's name."""
        if not self.overrides and not self.allow_unmatched:  # every report of a refresh asks
            return []
        base = sorted({_tensor_tag(t) for t in base_tags})
        cand = sorted({_tensor_tag(t) for t in cand_tags})
        out = []
        for override in self.overrides:
            if any(override.matches(t) for t in base):
                continue
            hint = next((t for t in cand if override.matches(t)), None)
            out.append(
                f"override {override.pattern!r} matches no tensor of the baseline, so it changes nothing"
                + (
                    f": it matches the candidate's {hint}, but overrides name the baseline's tensors (kind/name)"
                    if hint
                    else " (patterns match kind/name, e.g. 'grad/dense/kernel:0'; the report lists the names)"
                )
            )
        for pattern in self.allow_unmatched:
            match = patterns.matcher(pattern, f"allow_unmatched pattern {pattern!r}")
            if not any(match(t) for t in (*base, *cand)):
                out.append(
                    f"allow_unmatched pattern {pattern!r} matches no tensor of either run, so it declares nothing"
                )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "atol": self.atol,
            "rtol": self.rtol,
            "warmup_steps": self.warmup_steps,
            "equal_nan": self.equal_nan,
            "hparam_rtol": self.hparam_rtol,
            "allow_unmatched": list(self.allow_unmatched),
            "accept_read_problems": self.accept_read_problems,
            "accept_fewer_steps": self.accept_fewer_steps,
            "overrides": [dataclasses.asdict(o) for o in self.overrides],
        }

    @classmethod
    def build(
        cls,
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        warmup_steps: Optional[int] = None,
        equal_nan: bool = False,
        overrides: Sequence[Any] = (),
        allow_unmatched: Sequence[str] = (),
        accept_read_problems: bool = False,
        accept_fewer_steps: bool = False,
    ) -> TolerancePolicy:
        """Policy from optional settings (``None`` keeps the default); overrides may be strings."""
        parsed = tuple(o if isinstance(o, ToleranceOverride) else ToleranceOverride.parse(str(o)) for o in overrides)
        default = cls()
        return cls(
            atol=default.atol if atol is None else float(atol),
            rtol=default.rtol if rtol is None else float(rtol),
            warmup_steps=default.warmup_steps if warmup_steps is None else int(warmup_steps),
            equal_nan=bool(equal_nan),
            overrides=parsed,
            allow_unmatched=tuple(allow_unmatched),
            accept_read_problems=bool(accept_read_problems),
            accept_fewer_steps=bool(accept_fewer_steps),
        )
