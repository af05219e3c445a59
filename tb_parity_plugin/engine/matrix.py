"""The steps x tensors verdict matrix behind the dashboard's heat map, and its bucketing.

Reason codes are ordered by precedence (a higher code wins when several hold):
0 ok, 1 value, 2 nonfinite, 3 dtype, 4 shape, 5 missing. 255 marks a cell where
neither run logged the tensor.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from tb_parity_plugin.records import metadata

OK, VALUE, NONFINITE, DTYPE, SHAPE, MISSING = range(6)
ABSENT = 255
REASONS = {
    OK: "ok",
    VALUE: "value",
    NONFINITE: "nonfinite",
    DTYPE: "dtype",
    SHAPE: "shape",
    MISSING: "missing",
    ABSENT: "absent",
}


def _json_float(value: float) -> Optional[float]:
    return float(value) if np.isfinite(value) else None


@dataclasses.dataclass
class ParityMatrix:
    """Per (step row, tensor column): the largest ``error_ratio`` and the reason code.

    Rows are compared steps, or after :meth:`bucketed` buckets of consecutive steps
    (``step_start[i]..step_end[i]`` inclusive). Columns follow the baseline's execution
    order. ``error_ratio`` is float32: ``|c-b| / (atol + rtol*|b|)`` maximised over
    elements (or moments when only statistics exist); NaN where it does not apply
    (missing, no finite pair), inf where a difference meets a zero tolerance.
    ``first_divergence`` is ``(row, column)`` of the first divergence, or None.
    """

    step_start: np.ndarray  # int64 [rows]
    step_end: np.ndarray  # int64 [rows]
    tensors: list[str]  # baseline tags, [cols]
    candidate_tensors: list[str]  # the paired candidate tags, [cols]
    kinds: list[str]  # [cols]
    error_ratio: np.ndarray  # float32 [rows, cols]
    reason: np.ndarray  # uint8 [rows, cols]
    first_divergence: Optional[tuple[int, int]] = None
    #: Per column, how its cells were compared (``Pair.evidence``: values, partial, statistics).
    evidence: list[str] = dataclasses.field(default_factory=list)
    #: bool ``[rows, cols]``: cells whose verdict rests on statistics alone (``Pair.by_statistics``;
    #: a bucket's when any of its steps does). Empty: none.
    by_statistics: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), bool))

    @property
    def statistics(self) -> np.ndarray:
        """bool ``[rows, cols]``: :attr:`by_statistics`, or all False when not given."""
        if self.by_statistics.shape == self.reason.shape:
            return self.by_statistics
        return np.zeros(self.reason.shape, dtype=bool)

    @property
    def steps(self) -> np.ndarray:
        """Row steps (the first step of each bucket)."""
        return self.step_start

    def columns_text(self) -> str:
        """What the columns are, counted as the verdict counts tensors: ``776 tensors and 56 element
        samples`` (a sample of a tensor too large for full values is a column of its own: a heat map
        headed "832 tensors" under a headline of 776 tensors compared, a helper's check of the front ends)."""
        samples = sum(metadata.is_sample(t) for t in self.tensors)
        n = len(self.tensors) - samples
        text = f"{n} tensor{'' if n == 1 else 's'}"
        return text + (f" and {samples} element sample{'' if samples == 1 else 's'}" if samples else "")

    def bucketed(self, max_rows: int) -> ParityMatrix:
        """At most ``max_rows`` rows: consecutive steps merged, ratio by max.

        A bucket's reason for a tensor is the reason at that tensor's earliest divergent
        step inside the bucket, so the bucket holding the first divergence reports it.
        """
        n = len(self.step_start)
        if max_rows <= 0:
            raise ValueError("max_rows must be positive")
        if n <= max_rows:
            return self
        starts = (np.arange(max_rows, dtype=np.int64) * n) // max_rows
        starts = np.unique(starts)
        ends = np.append(starts[1:], n) - 1
        with np.errstate(invalid="ignore"):
            ratio = np.fmax.reduceat(self.error_ratio, starts, axis=0)
        bad = (self.reason != OK) & (self.reason != ABSENT)
        row_ids = np.where(bad, np.arange(n)[:, None], n)
        earliest = np.minimum.reduceat(row_ids, starts, axis=0)
        reason = np.where(
            earliest < n,
            np.take_along_axis(self.reason, np.minimum(earliest, n - 1), axis=0),
            np.minimum.reduceat(self.reason, starts, axis=0),  # OK unless every row is ABSENT
        ).astype(np.uint8)
        first = None
        if self.first_divergence is not None:
            row, col = self.first_divergence
            first = (int(np.searchsorted(starts, row, side="right") - 1), col)
        return ParityMatrix(
            step_start=self.step_start[starts],
            step_end=self.step_end[ends],
            tensors=self.tensors,
            candidate_tensors=self.candidate_tensors,
            kinds=self.kinds,
            error_ratio=ratio.astype(np.float32),
            reason=reason,
            first_divergence=first,
            evidence=self.evidence,
            by_statistics=np.logical_or.reduceat(self.statistics, starts, axis=0),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form: nested lists, non-finite ratios as None, reasons as codes."""
        return {
            "step_start": self.step_start.tolist(),
            "step_end": self.step_end.tolist(),
            "tensors": list(self.tensors),
            "candidate_tensors": list(self.candidate_tensors),
            "kinds": list(self.kinds),
            "error_ratio": [[_json_float(v) for v in row] for row in self.error_ratio.tolist()],
            "reason": self.reason.tolist(),
            "reason_names": {str(code): name for code, name in REASONS.items()},
            "first_divergence": list(self.first_divergence) if self.first_divergence else None,
            "evidence": list(self.evidence),
            "by_statistics": self.statistics.tolist(),
        }
