"""Python API: compare two runs of a logdir, or assert they agree (for pytest).

The CLI's ``--json`` output is ``compare(...).to_dict()``; both go through one engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from tb_parity_plugin.engine import Comparison, Divergence, ParityReport
from tb_parity_plugin.engine.tolerance import TolerancePolicy

if TYPE_CHECKING:  # imported when used: the reader is not needed to compare runs already read
    from tb_parity_plugin.logdir.reader import LogdirReader
    from tb_parity_plugin.logdir.rundata import RunData


class ParityInputError(ValueError):
    """The logdir or runs cannot be compared (missing, empty, ambiguous, nothing in common)."""


def _pick_runs(
    logdir: str, names: list[str], infos: dict[str, dict[str, Any]], baseline: Optional[str], candidate: Optional[str]
) -> tuple[str, str]:
    """Choose (baseline, candidate): given names, or with two runs the TF1 one as baseline."""
    for name in (baseline, candidate):
        if name is not None and name not in names:
            raise ParityInputError(f"no run {name!r} in {logdir} (runs: {', '.join(names) or 'none'})")
    if baseline is not None and candidate is not None:
        return baseline, candidate
    listing = ", ".join(names) or "none"
    given = baseline if baseline is not None else candidate
    if given is not None:  # exactly one of them named
        others = [n for n in names if n != given]
        if len(others) != 1:
            raise ParityInputError(
                f"{logdir} holds {len(names)} runs ({listing}); pass both --baseline and --candidate"
            )
        return (given, others[0]) if baseline is not None else (others[0], given)
    if len(names) != 2:
        raise ParityInputError(f"{logdir} holds {len(names)} runs ({listing}); pass --baseline RUN and --candidate RUN")
    tf1 = [n for n in names if infos[n].get("side") == "tf1"]
    tf2 = [n for n in names if infos[n].get("side") == "tf2"]
    if len(tf1) == 1:
        return tf1[0], next(n for n in names if n != tf1[0])
    if len(tf2) == 1:
        return next(n for n in names if n != tf2[0]), tf2[0]
    raise ParityInputError(f"cannot tell which of {listing} is the TF1 run; pass --baseline RUN")


def load_runs(
    logdir: str,
    baseline: Optional[str] = None,
    candidate: Optional[str] = None,
    reload: Optional[Callable[[LogdirReader], object]] = None,
) -> tuple[RunData, RunData]:
    """Read ``logdir`` and return the (baseline, candidate) ``RunData`` to compare.

    ``reload(reader)`` replaces ``reader.reload()`` (the HTML report wraps it in a progress bar).
    """
    from tb_parity_plugin.logdir.reader import LogdirReader

    try:
        reader = LogdirReader(logdir)
        reader.reload() if reload is None else reload(reader)
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        raise ParityInputError(str(exc) or f"cannot read {logdir}") from None
    try:
        names = reader.run_names()
        infos = {n: reader.run(n).info for n in names}
        base_name, cand_name = _pick_runs(logdir, names, infos, baseline, candidate)
        if base_name == cand_name:
            raise ParityInputError(f"baseline and candidate are the same run {base_name!r}")
        runs = reader.run(base_name), reader.run(cand_name)
    finally:
        reader.close()
    for run in runs:
        if not len(run.steps):
            raise ParityInputError(f"run {run.name!r} in {logdir} holds no tb_parity records")
    return runs


def make_policy(
    policy: Optional[TolerancePolicy] = None,
    *,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    warmup_steps: Optional[int] = None,
    equal_nan: bool = False,
    overrides: Sequence[Any] = (),
) -> TolerancePolicy:
    """``policy`` as given, or one built from the keyword settings (mixing is an error)."""
    if policy is not None:
        if any(v is not None for v in (atol, rtol, warmup_steps)) or equal_nan or overrides:
            raise ParityInputError("pass either policy= or atol/rtol/warmup_steps/equal_nan/overrides, not both")
        return policy
    try:
        return TolerancePolicy.build(atol, rtol, warmup_steps, equal_nan, overrides)
    except ValueError as exc:
        raise ParityInputError(str(exc)) from None


def compare(
    logdir: str,
    baseline: Optional[str] = None,
    candidate: Optional[str] = None,
    *,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    warmup_steps: Optional[int] = None,
    equal_nan: bool = False,
    mapping: Sequence[str] = (),
    overrides: Sequence[Any] = (),
    policy: Optional[TolerancePolicy] = None,
    reload: Optional[Callable[[LogdirReader], object]] = None,
) -> ParityReport:
    """Compare two runs of ``logdir``; the report's ``to_dict()`` is the CLI's JSON.

    With two runs and no names, the TF1 run (``run_info`` side ``tf1``) is the baseline.
    Raises :class:`ParityInputError` for a missing logdir or run, an ambiguous choice, an
    empty run, or runs with no step or no tensor in common.
    """
    tolerance = make_policy(
        policy, atol=atol, rtol=rtol, warmup_steps=warmup_steps, equal_nan=equal_nan, overrides=overrides
    )
    base, cand = load_runs(logdir, baseline, candidate, reload)
    try:
        report = Comparison(base, cand, tolerance, mapping).report()
    except ValueError as exc:  # a malformed mapping
        raise ParityInputError(str(exc)) from None
    if report.steps_compared == 0:
        raise ParityInputError(f"runs {base.name!r} and {cand.name!r} share no logged step")
    if report.tensors_compared == 0:
        raise ParityInputError(f"no tensor of {base.name!r} could be paired with one of {cand.name!r}")
    return report


def _fmt(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def describe(d: Divergence) -> str:
    """One line: tag, candidate name if different, reason and figures."""
    alias = "" if d.candidate_tensor == d.tensor else f" (candidate {d.candidate_tensor})"
    mismatch = "n/a" if d.mismatch_fraction is None else f"{100 * d.mismatch_fraction:.3g}%"
    return (
        f"{d.kind}/{d.tensor}{alias}: {d.reason}; max_abs_diff={_fmt(d.max_abs_diff)} "
        f"max_rel_diff={_fmt(d.max_rel_diff)} cosine={_fmt(d.cosine)} mismatch={mismatch} "
        f"error_ratio={_fmt(d.error_ratio)}"
    )


def assert_parity(
    logdir: str,
    baseline: Optional[str] = None,
    candidate: Optional[str] = None,
    **kwargs: Any,
) -> ParityReport:
    """Like :func:`compare`, but raise ``AssertionError`` naming the step, tensor and figures."""
    report = compare(logdir, baseline, candidate, **kwargs)
    first = report.first_divergence
    if first is not None:
        others = report.divergences_at_first_step[1:]
        lines = [
            f"{report.candidate!r} diverges from {report.baseline!r} at step {first.step}: {describe(first)}",
            f"tolerance: {report.policy.to_dict()}",
        ]
        lines += [f"  also at step {first.step}: {describe(d)}" for d in others[:10]]
        if len(others) > 10:
            lines.append(f"  ... and {len(others) - 10} more")
        raise AssertionError("\n".join(lines))
    return report
