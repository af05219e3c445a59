"""Python API: compare two runs of a logdir, or assert they agree (for pytest).

The CLI's ``--json`` output is ``compare(...).to_dict()``; both go through one engine.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from tb_parity_plugin.engine import Comparison, Divergence, ParityReport
from tb_parity_plugin.engine.tolerance import TolerancePolicy
from tb_parity_plugin.engine.verdicts import mismatch_text, statistics_only_text
from tb_parity_plugin.logdir import run_pairs, storage
from tb_parity_plugin.records import metadata

if TYPE_CHECKING:  # imported when used: the reader is not needed to compare runs already read
    from tb_parity_plugin.logdir.reader import LogdirReader
    from tb_parity_plugin.logdir.rundata import RunData


class ParityInputError(ValueError):
    """The logdir or runs cannot be compared (missing, empty, ambiguous, nothing in common)."""


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

    only = (baseline, candidate) if baseline is not None and candidate is not None else None
    try:
        reader = LogdirReader(logdir, runs=only, finished=True)  # the CLI reads only what it compares
        _refuse_from_listing(reader, baseline, candidate, logdir)
        reader.reload() if reload is None else reload(reader)
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        raise ParityInputError(str(exc) or f"cannot read {logdir}") from None
    try:
        sides = {n: str(reader.run(n).info.get("side", "")) for n in reader.run_names()}
        try:
            base_name, cand_name = run_pairs.choose_pair(sides, baseline, candidate, where=logdir)
        except run_pairs.RunPairError as exc:
            raise ParityInputError(f"{exc}{_unlisted(reader)}") from None
        runs = reader.run(base_name), reader.run(cand_name)
    finally:
        reader.close()
    for run in runs:
        error = no_records_error(run, logdir)
        if error is not None:
            raise ParityInputError(error)
    return runs


def no_records_error(run: RunData, where: str) -> Optional[str]:
    """Why ``run`` cannot be compared when it logged no step (the CLI's exit 2, the tab's 404), or None."""
    if len(run.steps):
        return None
    why = "; ".join(f"{p.path} at byte {p.offset}: {p.message}" for p in run.problems[:3])
    cause = f" (read problems: {why})" if why else " (its event files hold no records of ours)"
    return f"run {run.name!r} in {where} holds no tb_parity records{cause}"


def _refuse_from_listing(reader: LogdirReader, baseline: Optional[str], candidate: Optional[str], logdir: str) -> None:
    """Refuse a missing run or an undecidable pair from the listing, before a byte of a logdir
    holding other (possibly huge) runs is read; a missing run's error lists every run, not only
    the ones that would have been read."""
    names = reader.list_runs(every=True)
    if baseline is None and candidate is None and len(names) == 2:
        return  # both are read anyway: their run_info decides which is the TF1 baseline
    try:
        run_pairs.choose_pair(dict.fromkeys(names, ""), baseline, candidate, where=logdir)
    except run_pairs.RunPairError as exc:
        raise ParityInputError(f"{exc}{_unlisted(reader)}") from None


def _unlisted(reader: LogdirReader) -> str:
    """The listing's errors for a pair error, with what to do about a link out of the logdir: the
    error said to pass --baseline and --candidate, and a new user who did was told "no run 'tf1'"."""
    errors = reader.listing_errors
    text = "".join(f"; {e}" for e in errors)
    if any(e.endswith(storage.LINK_OUT) for e in errors):
        text += (
            " (the reader never leaves the logdir: point it at a common parent of both runs and name them, "
            "--baseline and --candidate, or copy the run into it)"
        )
    return text


def make_policy(
    policy: Optional[TolerancePolicy] = None,
    *,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    warmup_steps: Optional[int] = None,
    equal_nan: bool = False,
    overrides: Sequence[Any] = (),
    allow_unmatched: Sequence[str] = (),
    accept_read_problems: bool = False,
    accept_fewer_steps: bool = False,
) -> TolerancePolicy:
    """``policy`` as given, or one built from the keyword settings (mixing is an error)."""
    if policy is not None:
        settings = (equal_nan, overrides, allow_unmatched, accept_read_problems, accept_fewer_steps)
        if any(v is not None for v in (atol, rtol, warmup_steps)) or any(settings):
            raise ParityInputError(
                "pass either policy= or atol/rtol/warmup_steps/equal_nan/overrides/allow_unmatched, not both"
            )
        return policy
    try:
        return TolerancePolicy.build(
            atol, rtol, warmup_steps, equal_nan, overrides, allow_unmatched, accept_read_problems, accept_fewer_steps
        )
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
    allow_unmatched: Sequence[str] = (),
    accept_read_problems: bool = False,
    accept_fewer_steps: bool = False,
    policy: Optional[TolerancePolicy] = None,
    reload: Optional[Callable[[LogdirReader], object]] = None,
) -> ParityReport:
    """Compare two runs of ``logdir``; the report's ``to_dict()`` is the CLI's JSON.

    With two runs and no names, the TF1 run (``run_info`` side ``tf1``) is the baseline.
    Raises :class:`ParityInputError` for a missing logdir or run, an ambiguous choice, an
    empty run, or runs with no step or no tensor in common.
    """
    tolerance = make_policy(
        policy,
        atol=atol,
        rtol=rtol,
        warmup_steps=warmup_steps,
        equal_nan=equal_nan,
        overrides=overrides,
        allow_unmatched=allow_unmatched,
        accept_read_problems=accept_read_problems,
        accept_fewer_steps=accept_fewer_steps,
    )
    base, cand = load_runs(logdir, baseline, candidate, reload)
    try:
        report = Comparison(base, cand, tolerance, mapping).report()
    except ValueError as exc:  # a malformed mapping
        raise ParityInputError(str(exc)) from None
    if report.steps_compared == 0:
        raise ParityInputError(
            f"runs {base.name!r} and {cand.name!r} share no logged step ({_step_range(base)} against "
            f"{_step_range(cand)}: both must number a step alike, e.g. a port resumed from a checkpoint counts from "
            "the restored global step, not from a fresh optimizer.iterations)"
        )
    if report.tensors_compared == 0:
        raise ParityInputError(
            f"no tensor of {base.name!r} could be paired with one of {cand.name!r}: {_recorded(base)}; "
            f"{_recorded(cand)}. Record the same kinds and names on both sides (a forward pass: rec.output in "
            "TF1 for the model's output), or pair names with --map OLD=NEW"
        )
    return report


def _recorded(run: Any, most: int = 4) -> str:
    """What a run recorded, for an error: a new user's runs shared nothing and were told only that."""
    tags = [f"{s.kind}/{s.name}" for s in sorted(run.tensors.values(), key=lambda s: s.order)]
    shown = ", ".join(tags[:most]) + (f" and {len(tags) - most} more" if len(tags) > most else "")
    return f"{run.name!r} recorded {shown or 'nothing'}"


def _fmt(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def describe(d: Divergence) -> str:
    """One line: tag, candidate name if different, reason and figures."""
    alias = "" if d.candidate_tensor in (d.tensor, "", None) or not d.tensor else f" (candidate {d.candidate_tensor})"
    mismatch = mismatch_text(d.mismatch_fraction)
    if d.reason == "structure":  # no figures: nothing was compared
        return f"{d.kind}/{d.tensor or d.candidate_tensor}: structure; {d.note}"
    # a sample's figures are of its elements, not of its tensor (a new user read mismatch=0.391% as
    # the tensor's, where 1 element of 1M was out)
    of = f" (of its {metadata.SAMPLE_SIZE} sampled elements)" if d.evidence == "sample" else ""
    return (
        f"{d.kind}/{d.tensor}{alias}: {d.reason}; max_abs_diff={_fmt(d.max_abs_diff)} "
        f"max_rel_diff={_fmt(d.max_rel_diff)} cosine={_fmt(d.cosine)} mismatch={mismatch} "
        f"error_ratio={_fmt(d.error_ratio)}{of}" + (f"; {d.note}" if d.note else "")
    )


def assert_parity(
    logdir: str,
    baseline: Optional[str] = None,
    candidate: Optional[str] = None,
    *,
    require_values: bool = False,
    **kwargs: Any,
) -> ParityReport:
    """Like :func:`compare`, but raise ``AssertionError`` naming the step, tensor and figures.

    ``require_values``: an agreement resting partly on statistics (``agree within
    statistics``: statistics cannot prove every difference, e.g. a wrong learning rate on a
    large embedding) fails too, naming the tensors to record with full values."""
    report = compare(logdir, baseline, candidate, **kwargs)
    first = report.first_divergence
    if first is not None:
        others = report.divergences_at_first_step[1:]
        # a structure divergence is at no step: said so, as the CLI, the report and the tab say it,
        # with the first divergence among the steps they all name after it
        where = "in structure" if first.reason == "structure" else f"at step {first.step}"
        lines = [
            f"{report.candidate!r} diverges from {report.baseline!r} {where}: {describe(first)}",
            f"{report.tolerance_text or 'tolerance'}; policy: {report.policy.to_dict()}",
        ]
        lines += [f"  also {where}: {describe(d)}" for d in others[:10]]
        if len(others) > 10:
            lines.append(f"  ... and {len(others) - 10} more")
        step_line = first_step_line(report)
        if step_line:
            lines.append(step_line)
        if report.unproven_text:
            lines.append(report.unproven_text)
        if report.hparam_text:
            lines.append(report.hparam_text)
        suggested = report.structure.get("suggested_maps")
        if first.reason == "structure" and suggested:
            lines.append(suggested_maps_line(suggested))
        # how the runs were paired (a layer re-paired by its values, a map that matched nothing)
        lines += [f"warning: {w}" for w in report.warnings]
        raise AssertionError("\n".join(lines + problem_lines(report)))
    if report.incomplete:  # what was not read may diverge: not a pass
        # in Python's spelling: a new user's test was told "--accept-fewer-steps", a flag no keyword takes
        text = report.verdict_text.replace("--accept-fewer-steps", "accept_fewer_steps=True").replace(
            "--accept-read-problems", "accept_read_problems=True"
        )
        raise AssertionError("\n".join([text, *problem_lines(report)]))
    if require_values and report.statistics_only:
        raise AssertionError(f"{report.verdict_text}\n{statistics_only_line(report)}")
    return report


def _step_range(run: Any) -> str:
    """``steps A-B`` of a run (how a run numbers its steps, for an error)."""
    steps = run.steps
    return f"steps {int(steps[0])}-{int(steps[-1])}" if len(steps) else "no step"


def first_step_line(report: ParityReport) -> Optional[str]:
    """After a structure divergence (at no step), the first divergence among the compared steps
    (CLI text and assert_parity); None otherwise."""
    first, fs = report.first_divergence, report.first_step_divergence
    if first is None or fs is None or first.reason != "structure":
        return None
    return (
        f"first divergence among the steps: step {fs.step}, {fs.kind}/{fs.tensor} ({fs.reason}), "
        "among the paired tensors only: one recorded by one run (above) may differ earlier"
    )


def suggested_maps_line(maps: list[str]) -> str:
    """The structure report's suggested ``--map`` items as one line a user can paste."""
    return (
        "suggested: "
        + " ".join(f"--map {shlex.quote(m)}" for m in maps)
        + " (layers whose variables went unmatched on both "
        "sides with the same names under them and the same sizes; check each pairing, then pass it; in Python, "
        "mapping=[...])"
    )


def statistics_only_line(report: ParityReport) -> str:
    """The tensors compared by statistics only, and what to do for an element-wise verdict."""
    return statistics_only_text(report.statistics_only, report.partly_values)


def problem_lines(report: ParityReport) -> list[str]:
    """One line per read problem in the compared runs (CLI text and assert_parity)."""
    return [f"read problem in {p['run']!r}: {p['path']} at byte {p['offset']}: {p['message']}" for p in report.problems]
