"""Multi-replica runs: set each replica's copies apart, and name a replica that disagrees.

A run recorded under a distribution strategy holds, beside each tensor ``<name>`` (what one
device would have computed on the global batch: the all-reduced gradient, the concatenated
activations, the variable's single copy), each replica's own copy ``<name>@replica<k>``
(records/metadata.REPLICA_MARK). The comparison with a one-device baseline uses the former
only (:func:`split`); the copies of a *variable* must all equal its single copy, and one that
does not (an unsynchronised batch-norm statistic) is a finding of its own (:func:`disagreements`).
Per-replica losses, gradients and activations differ legitimately (each replica saw other
data) and are kept for display only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from tb_parity_plugin.engine import stat_bounds
from tb_parity_plugin.engine.structure import VARIABLE_KINDS
from tb_parity_plugin.engine.tolerance import SYNC_TOLERANCE, Tolerance, TolerancePolicy, since_first
from tb_parity_plugin.records import metadata

Key = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Replicas:
    """A run's per-replica copies: ``(kind, name) -> [series of replica 0, 1, ...]``."""

    count: int
    copies: dict[Key, list[Any]]
    #: Why the copies cannot be trusted as one replica set (the replica count changed mid-run).
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "tensors": sorted(f"{k}/{n}" for k, n in self.copies),
            "warnings": list(self.warnings),
        }


def split(run: Any) -> tuple[Any, Replicas]:
    """``run`` without its per-replica copies (a new RunData), and the copies."""
    count = int(run.info.get("replicas", 1) or 1)
    if not any(metadata.REPLICA_MARK in key[1] for key in run.tensors):  # most runs: one scan, no copy
        return run, Replicas(count, {})
    copies: dict[Key, list[tuple[int, Any]]] = {}
    kept = {}
    for key, series in run.tensors.items():
        base, replica = metadata.split_replica(series.name)
        if replica is None:
            kept[key] = series
        else:
            copies.setdefault((series.kind, base), []).append((replica, series))
    ordered = {key: [s for _, s in sorted(found, key=lambda r: r[0])] for key, found in copies.items()}
    if not ordered:
        return run, Replicas(count, {})
    seen = max(count, *(len(v) for v in ordered.values()))
    warnings = [
        f"{run.name}: {kind}/{name} has replica copies at other steps than its one-device value "
        f"(replicas {', '.join(str(k) for k, s in enumerate(series) if not np.array_equal(s.steps, kept[(kind, name)].steps))}): "
        "the replica count changed during the run; replica checks of this tensor cover the steps both hold"
        for (kind, name), series in ordered.items()
        if (kind, name) in kept and any(not np.array_equal(s.steps, kept[(kind, name)].steps) for s in series)
    ]
    return dataclasses.replace(run, tensors=kept, derived={}), Replicas(seen, ordered, tuple(warnings))


def disagreements(run: Any, replicas: Replicas, policy: TolerancePolicy) -> list[dict[str, Any]]:
    """Variables whose replica copy differs from the single copy, first step of each (Divergence kwargs).

    Held to the tensor's own tolerance at each step, the warm-up's rtol included (values
    element-wise when both are kept, else what the statistics prove: engine/stat_bounds), so a
    finding is a difference the policy would flag. It once used the rtol after the warm-up (5%)
    at every step: a new user's moving variance near 1, updated per replica and 3% apart, was
    "every variable's copies agree".
    """
    found = []
    for (kind, name), series in replicas.copies.items():
        single = run.tensors.get((kind, name))
        if kind not in VARIABLE_KINDS or single is None:
            continue
        tol = policy.for_tag(f"{kind}/{name}")
        for k, copy in enumerate(series):
            hit = _first_difference(single, copy, tol)
            if hit is not None:
                step, worst, evidence = hit
                by = "" if evidence == "values" else ", by statistics: a copy is too large for full values"
                found.append(
                    {
                        "step": step,
                        "tensor": name,
                        "kind": kind,
                        "candidate_tensor": copy.name,
                        "order": int(single.order),
                        "reason": "replica",
                        "evidence": evidence,
                        "error_ratio": worst,
                        "note": f"{run.name}: replica {k}'s copy of {kind}/{name} differs from the variable's "
                        f"single copy (error ratio {worst:.3g}{by}): the replicas are not in sync",
                    }
                )
                break  # one finding per variable: its first replica out of sync
    return sorted(found, key=lambda d: (d["step"], d["order"]))


def kept_in_sync(run: Any, replicas: Replicas, keys: Sequence[Key]) -> Optional[bool]:
    """Whether every replica copy of the variables ``keys`` agrees with its single copy at every
    step within :data:`SYNC_TOLERANCE` (rounding of its own scale, not the training tolerance),
    when there is evidence: None unless some of them has copies past its first step (a moving
    statistic starts alike on every replica, so only its updates tell)."""
    seen = False
    for key in keys:
        single = run.tensors.get(key)
        if single is None:
            continue
        for copy in replicas.copies.get(key, []):
            if len(np.intersect1d(single.steps, copy.steps)) < 2:
                continue
            seen = True
            if _first_difference(single, copy, SYNC_TOLERANCE) is not None:
                return False
    return True if seen else None


def _first_difference(single: Any, copy: Any, tol: Tolerance) -> Optional[tuple[int, float, str]]:
    """(first step, error ratio, evidence: values or statistics) where ``copy`` breaks the tolerance
    against ``single``, or None.
    The warm-up counts training steps from the first step both hold, as a comparison counts
    them from its first compared step."""
    steps, ia, ib = np.intersect1d(single.steps, copy.steps, return_indices=True)
    if not len(steps):
        return None
    rtol = tol.rtols(since_first(steps))
    atol = np.broadcast_to(np.asarray(tol.atols(single.stats[ia]), dtype=np.float64), (len(steps),))
    if single.values is not None and copy.values is not None and single.values.shape[1:] == copy.values.shape[1:]:
        a = single.values[ia].reshape(len(steps), -1).astype(np.float64)
        b = copy.values[ib].reshape(len(steps), -1).astype(np.float64)
        with np.errstate(invalid="ignore"):
            ratio = np.abs(b - a) / (atol[:, None] + rtol[:, None] * np.abs(a))
        # Equal elements are in sync whatever the tolerance: inf - inf (and 0 / 0 under atol 0) is
        # NaN, which only a NaN on one side, or infs of other signs, may mean.
        ratio = np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, np.nan_to_num(ratio, nan=np.inf))
        per_step, evidence = (ratio.max(axis=1) if ratio.shape[1] else np.zeros(len(steps))), "values"
    else:
        per_step, evidence = stat_bounds.ratios(single.stats[ia], copy.stats[ib], atol, rtol).max(axis=1), "statistics"
    bad = np.flatnonzero(per_step > 1)
    if not len(bad):
        return None
    return int(steps[bad[0]]), float(per_step[bad[0]]), evidence


def describe(report_replicas: dict[str, dict[str, Any]]) -> list[str]:
    """The report's ``replicas`` in plain lines, worded once for the CLI, the HTML report and notebooks."""
    lines = []
    for run, r in report_replicas.items():
        bad = r.get("disagreements") or []
        text = f"{run!r} ran {r['count']} replicas; {len(r.get('tensors') or [])} tensors keep per-replica copies"
        for warning in r.get("warnings") or []:
            text += f"; warning: {warning}"
        if bad:
            text += "; out of sync: " + ", ".join(
                f"{d['kind']}/{d['tensor']} from step {d['step']}"
                + (" (by statistics)" if d.get("evidence") == "statistics" else "")
                for d in bad
            )
        else:
            text += "; every variable's copies agree"
        lines.append(text)
    return lines
