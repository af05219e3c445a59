"""JSON payloads of the dashboard routes, built from reader snapshots and engine results.

Nothing here decides a verdict: the engine's report, matrix and detail are
reshaped for the browser. Encoding rules (see docs/dashboard.md):

* Non-finite floats in JSON are the strings ``"NaN"``, ``"Infinity"``,
  ``"-Infinity"`` (``json_util.Cleanse``, applied by ``http_util.Respond``);
  ``null`` only ever means "absent".
* The heat map matrix travels as base64 little-endian float32 (ratios, row-major
  ``[bucket][tensor]``) and uint8 (reason codes), which keeps NaN/Inf exact and costs
  nothing to encode at 2000 x 200 cells.
"""

from __future__ import annotations

import base64
import posixpath
from typing import Any, Optional

import numpy as np

from tb_parity_plugin.engine import ParityMatrix, ParityReport, TensorDetail, colour_scale
from tb_parity_plugin.engine.matrix import ABSENT, REASONS
from tb_parity_plugin.engine.tolerance import TolerancePolicy, since_first
from tb_parity_plugin.records import metadata

#: Full values sent for one step at most (the detail table shows the first few hundred).
MAX_VALUES = 10_000


def run_entry(run: Any) -> dict[str, Any]:
    """One run of /runs: where it is, which side it is, how far it got."""
    steps = run.steps
    return {
        "name": run.name,
        "folder": posixpath.dirname(run.name),
        "side": str(run.info.get("side", "")),
        "mode": str(run.info.get("mode", "")),
        "tensorflow": str(run.info.get("tensorflow", "")),
        "steps": int(len(steps)),
        "first_step": int(steps[0]) if len(steps) else None,
        "last_step": int(steps[-1]) if len(steps) else None,
        "tensors": len(run.tensors),
        "generation": int(run.generation),
        "problems": len(run.problems),
    }


def summary_payload(report: ParityReport, generations: tuple[int, int]) -> dict[str, Any]:
    """The engine's report as the CLI's ``--json`` prints it, plus the runs' generations."""
    body = report.to_dict()
    body["generations"] = {report.baseline: generations[0], report.candidate: generations[1]}
    return body


def _b64(array: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()).decode(
        "ascii"
    )


def matrix_payload(m: ParityMatrix, report: ParityReport) -> dict[str, Any]:
    """The (bucketed) matrix; ``first`` is the bucket, column and exact step of the first divergence.

    The engine's bucketing keeps the first divergence's reason in its bucket (ratio by
    max, reason from the earliest divergent step), so it cannot be averaged away.
    """
    first = None
    # the matrix outlines the first divergence among the steps: after a structure divergence (a
    # tensor of one run only, at no step) that is the report's first step divergence, whose step a
    # click on the outline opens (it opened the structure divergence's step 0, where the cell agrees)
    at_step = report.first_divergence
    if at_step is not None and at_step.reason == "structure":
        at_step = report.first_step_divergence
    if m.first_divergence is not None and at_step is not None:
        row, col = m.first_divergence
        first = {"bucket": int(row), "tensor": int(col), "step": int(at_step.step)}
    codes = max(k for k in REASONS if k != ABSENT) + 1
    return {
        "tensors": [
            {
                "tag": tag,
                "kind": kind,
                "name": tag.split("/", 1)[1] if "/" in tag else tag,
                "candidate_tag": cand,
                "evidence": evidence,
            }
            for tag, kind, cand, evidence in zip(m.tensors, m.kinds, m.candidate_tensors, m.evidence)
        ],
        "columns_text": m.columns_text(),
        "step_start": m.step_start.tolist(),
        "step_end": m.step_end.tolist(),
        "n_steps": int(report.steps_compared),
        "ratio": _b64(m.error_ratio, "float32"),
        "reason": _b64(m.reason, "uint8"),
        "by_statistics": _b64(m.statistics, "uint8"),
        "reason_codes": [REASONS[c] for c in range(codes)],
        "no_data": ABSENT,
        "first": first,
        # the report colours its heat map with the same scale (engine/colour_scale.py)
        "colour_scale": colour_scale.to_dict(),
        "encoding": "base64 little-endian: ratio float32, reason uint8, by_statistics uint8 (0/1), row-major [bucket][tensor]",
    }


def _floats(a: Optional[np.ndarray], limit: Optional[int] = None) -> Optional[list[float]]:
    """Plain floats (Cleanse later turns NaN/Inf into strings); None when absent."""
    if a is None:
        return None
    flat = np.asarray(a, dtype=np.float64).reshape(-1)
    floats: list[float] = flat[:limit].tolist() if limit is not None else flat.tolist()
    return floats


def _replica_count(run: Any, kind: str, name: str) -> int:
    """How many per-replica copies ``run`` keeps of ``kind/name`` (0 for a one-device tensor)."""
    base, _ = metadata.split_replica(name)
    return sum(1 for k, n in run.tensors if k == kind and metadata.split_replica(n)[0] == base and n != base)


def tensor_payload(d: TensorDetail, base: Any, cand: Any, values_at: Optional[int]) -> dict[str, Any]:
    """One tensor pair over time: both runs' stats, the per-step verdict, values at one step."""
    fig_rows = _per_step_figures(d)
    body: dict[str, Any] = {
        "tag": f"{d.kind}/{d.tensor}",
        "kind": d.kind,
        "name": d.tensor,
        "how": d.how,
        "evidence": d.evidence,
        "tolerance": {"atol": d.atol, "rtol": d.rtol, "warmup_steps": d.warmup_steps},
        "stats_fields": list(metadata.STATS_FIELDS),
        "baseline": _side(base, d.kind, d.tensor, d.base_steps, d.base_stats),
        "candidate": _side(cand, d.kind, d.candidate_tensor, d.cand_steps, d.cand_stats),
        "diff": {
            "steps": d.steps.tolist(),
            "error_ratio": _floats(d.error_ratio),
            "reason": [REASONS[int(c)] for c in d.reason],
            "by_statistics": d.by_statistics.tolist(),
            **fig_rows,
        },
        "values": None,
        # multi-replica candidate: the replicas it keeps copies of this tensor for, and the one shown
        "replicas": _replica_count(cand, d.kind, d.tensor if d.replica is None else d.candidate_tensor),
        "replica": d.replica,
    }
    if values_at is not None:
        size = max((np.asarray(v).size for v in (d.base_values, d.cand_values, d.diff) if v is not None), default=0)
        tol = None
        if d.base_values is not None:
            rtol = d.rtol if d.step_rtol is None else d.step_rtol
            atol = d.atol if d.step_atol is None else d.step_atol
            tol = atol + rtol * np.abs(np.asarray(d.base_values, dtype=np.float64))
        body["values"] = {
            "step": int(values_at),
            "baseline": _floats(d.base_values, MAX_VALUES),
            "candidate": _floats(d.cand_values, MAX_VALUES),
            "abs_diff": _floats(None if d.diff is None else np.abs(d.diff), MAX_VALUES),
            "tolerance": _floats(tol, MAX_VALUES),
            "atol": d.step_atol,
            "figures": d.figures,
            "truncated": size > MAX_VALUES,
        }
    return body


def _side(run: Any, kind: str, name: str, steps: np.ndarray, stats: np.ndarray) -> dict[str, Any]:
    series = run.tensors.get((kind, name)) or next((s for s in run.tensors.values() if s.name == name), None)
    return {
        "run": run.name,
        "tag": series.tag if series is not None else "",
        "dtype": series.dtype if series is not None else "",
        "shape": list(series.shape) if series is not None else [],
        "steps": steps.tolist(),
        "stats": np.asarray(stats, dtype=np.float64).tolist(),
        # per step, the shape it ran with, when the graph did not know it (-1: not recorded)
        "runtime_shapes": (
            [list(s) for s in series.runtime_shapes]
            if series is not None and None in tuple(series.shape) and series.dims is not None
            else None
        ),
    }


def _per_step_figures(d: TensorDetail) -> dict[str, Any]:
    """|mean difference| per compared step, from the statistics (display only)."""
    mean = metadata.STAT_INDEX["mean"]
    b = dict(zip(d.base_steps.tolist(), np.asarray(d.base_stats)[:, mean].tolist()))
    c = dict(zip(d.cand_steps.tolist(), np.asarray(d.cand_stats)[:, mean].tolist()))
    return {"mean_abs_diff": [abs(c[s] - b[s]) if s in b and s in c else None for s in d.steps.tolist()]}


def scalars_payload(base: Any, cand: Any, report: ParityReport, policy: TolerancePolicy) -> dict[str, Any]:
    """lr and loss of both runs, |difference| at common steps and the tolerance there."""
    body: dict[str, Any] = {}
    for key in metadata.SCALAR_TAGS:
        b, c = base.scalars.get(key), cand.scalars.get(key)
        body[key] = {
            "baseline": _scalar_series(b),
            "candidate": _scalar_series(c),
            "diff": _scalar_diff(b, c, _tolerance_tag(base, key), policy) if b is not None and c is not None else None,
        }
    return body


def _scalar_series(series: Optional[tuple[np.ndarray, np.ndarray]]) -> Optional[dict[str, Any]]:
    if series is None:
        return None
    steps, values = series
    return {"steps": np.asarray(steps).tolist(), "values": np.asarray(values, dtype=np.float64).tolist()}


def _tolerance_tag(run: Any, kind: str) -> str:
    """The tag whose tolerance applies to the ``lr``/``loss`` scalar: its logged tensor's."""
    candidates = sorted((s for s in run.tensors.values() if s.kind == kind), key=lambda s: s.order)
    return candidates[0].tag if candidates else f"{kind}/{kind}"


def _scalar_diff(
    b: tuple[np.ndarray, np.ndarray], c: tuple[np.ndarray, np.ndarray], tag: str, policy: TolerancePolicy
) -> dict[str, Any]:
    steps, ib, ic = np.intersect1d(np.asarray(b[0]), np.asarray(c[0]), return_indices=True)
    bv = np.asarray(b[1], dtype=np.float64)[ib]
    cv = np.asarray(c[1], dtype=np.float64)[ic]
    tol = policy.for_tag(tag)
    rtol = tol.rtols(since_first(steps))
    peak = tol.peak_atols(np.abs(np.asarray(b[1], dtype=np.float64)))[ib]  # an lr's share of its peak so far
    with np.errstate(invalid="ignore"):
        return {
            "steps": steps.tolist(),
            "abs_diff": np.abs(cv - bv).tolist(),
            # atol and the loss's share of itself (a scalar's largest |element| is its |value|)
            "tolerance": (tol.atols_of_largest(np.abs(bv)) + peak + rtol * np.abs(bv)).tolist(),
        }
