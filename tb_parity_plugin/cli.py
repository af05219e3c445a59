"""The ``tb-parity`` command: ``diff`` (text or JSON verdict) and ``report`` (HTML page).

Exit status, for CI: 0 the runs agree, 1 they diverge, 2 bad input. Errors print one
line on stderr, never a traceback. Both subcommands take the comparison options from
one parent parser (:func:`comparison_options`), so they cannot drift apart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NoReturn, Optional, Sequence, TextIO

from tb_parity_plugin import api
from tb_parity_plugin.engine import ParityReport, replicas

#: 3: no divergence in what was read, but read problems in the compared runs (not accepted).
EXIT_AGREE, EXIT_DIVERGE, EXIT_ERROR, EXIT_INCOMPLETE, EXIT_STATISTICS = 0, 1, 2, 3, 4


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line instead of usage + message
        raise _UsageError(message)


def comparison_options() -> _Parser:
    """The options every comparing subcommand shares: runs, tolerance policy, name mapping."""
    p = _Parser(add_help=False)
    p.add_argument("logdir", nargs="?", help="logdir holding the runs (one subdirectory per run)")
    p.add_argument("--baseline", help="baseline run (default: the TF1 run when LOGDIR holds two)")
    p.add_argument("--candidate", help="candidate run (default: the other run)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default 1e-5, every step)")
    p.add_argument("--rtol", type=float, help="relative tolerance after the warm-up (default 0.05)")
    p.add_argument(
        "--warmup-steps",
        type=int,
        help="the first N training steps, from the first step both runs logged, use rtol=1e-7, numpy's default, "
        "as the guide's check does (default 10)",
    )
    p.add_argument("--equal-nan", action="store_true", help="NaN equals NaN at the same position")
    p.add_argument(
        "--map",
        dest="mapping",
        action="extend",
        nargs="+",
        default=[],
        metavar="OLD=NEW",
        help="pair baseline name OLD with candidate name NEW; re:PATTERN=REPL rewrites by regex",
    )
    p.add_argument(
        "--override",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATTERN:atol=X,rtol=Y",
        help="tolerance for tags <kind>/<name> matching a glob (or re:REGEX)",
    )
    p.add_argument(
        "--allow-unmatched",
        dest="allow_unmatched",
        action="append",
        default=[],
        metavar="PATTERN",
        help="tags <kind>/<name> (glob or re:REGEX) one run may record without the other (not a structure divergence)",
    )
    p.add_argument(
        "--accept-read-problems",
        dest="accept_read_problems",
        action="store_true",
        help="agree even when the compared runs have read problems (corrupt or truncated records); "
        "without it such a run exits 3",
    )
    p.add_argument(
        "--accept-fewer-steps",
        dest="accept_fewer_steps",
        action="store_true",
        help="agree even when one run ends before the other (the steps it did not log are not compared); "
        "without it such a run exits 3",
    )
    p.add_argument(
        "--require-values",
        dest="require_values",
        action="store_true",
        help="an agreement resting partly on statistics (agree within statistics) exits 4, naming the tensors "
        "compared by statistics only",
    )
    return p


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tb-parity", description="Compare a TF1 run with its TF2 port step by step.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    shared = comparison_options()
    diff = sub.add_parser("diff", parents=[shared], help="find the first step and tensor where the runs diverge")
    diff.add_argument("--json", action="store_true", help="print the report as one JSON object")
    report = sub.add_parser("report", parents=[shared], help="write the comparison as one self-contained HTML file")
    report.add_argument("-o", "--output", default="tb_parity_report.html", help="HTML file to write")
    report.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar while reading (default: only for big logdirs)",
    )
    return parser


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    args = _parser().parse_args(argv)
    if args.command is None:
        raise _UsageError("expected a command: tb-parity diff LOGDIR [options] | tb-parity report LOGDIR -o FILE")
    if args.logdir is None and args.mapping and "=" not in args.mapping[-1]:
        args.logdir = args.mapping.pop()  # `--map A=B LOGDIR`: --map swallowed the logdir
    if args.logdir is None:
        raise _UsageError("the following arguments are required: LOGDIR")
    return args


def _policy_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "atol": args.atol,
        "rtol": args.rtol,
        "warmup_steps": args.warmup_steps,
        "equal_nan": args.equal_nan,
        "mapping": args.mapping,
        "overrides": args.overrides,
        "allow_unmatched": args.allow_unmatched,
        "accept_read_problems": args.accept_read_problems,
        "accept_fewer_steps": args.accept_fewer_steps,
    }


def format_report(report: ParityReport) -> str:
    """The short human report: verdict, the first divergent step's tensors, NaN/Inf, leftovers."""
    lines = [
        f"baseline {report.baseline!r} vs candidate {report.candidate!r}: "
        f"{report.steps_compared} steps x {report.tensors_compared} tensors compared"
    ]
    first = report.first_divergence
    if first is None:
        lines.append(report.verdict_text)
    else:
        lines.append(report.verdict_text)
        lines.append(f"tensors diverging at step {first.step}, in execution order:")
        lines += [f"  {api.describe(d)}" for d in report.divergences_at_first_step]
        if report.tolerance_text:
            lines.append(report.tolerance_text)
        if report.unproven_text:
            lines.append(report.unproven_text)
        if report.hparam_text:
            lines.append(report.hparam_text)
    for run, hit in report.first_nonfinite.items():
        if hit is not None:
            lines.append(f"first NaN/Inf in {run!r}: step {hit['step']}, {hit['kind']}/{hit['tensor']}")
    lines += structure_lines(report)
    for run, count in report.steps_only.items():
        if count:
            lines.append(f"{count} steps logged only by {run!r} (not compared)")
    lines += api.problem_lines(report)
    if report.first_divergence is None and report.statistics_only:
        lines.append(api.statistics_only_line(report))
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines)


def structure_lines(report: ParityReport) -> list[str]:
    """The structure report: what one run recorded without the other, counts, shapes, repeats."""
    st = report.structure
    lines = []
    step_line = api.first_step_line(report)
    if step_line:
        lines.append(step_line)
    variables = st.get("variables", {})
    if variables:
        lines.append(
            "variables: " + "; ".join(f"{run!r} {v['count']} ({v['size']} elements)" for run, v in variables.items())
        )
    for run, entries in st.get("only_in", {}).items():
        if entries:
            shown = ", ".join(e["tag"] + (" (expected)" if e["expected"] else "") for e in entries[:20])
            more = f", ... and {len(entries) - 20} more" if len(entries) > 20 else ""
            lines.append(f"recorded by {run!r} only ({len(entries)}): {shown}{more}")
    for m in st.get("shape_mismatches", []):
        lines.append(
            f"shape mismatch: {m['kind']}/{m['baseline']} {m['baseline_shape']} vs {m['candidate']} {m['candidate_shape']}"
        )
    for run, entries in st.get("created_twice", {}).items():
        for e in entries:
            lines.append(f"created twice in {run!r}? {e['tag']} repeats {e['like']}")
    if st.get("suggested_maps"):
        lines.append(api.suggested_maps_line(st["suggested_maps"]))
    lines += [f"replicas: {line}" for line in replicas.describe(report.replicas)]
    return lines


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _run_diff(args: argparse.Namespace, out: TextIO) -> ParityReport:
    report = api.compare(args.logdir, args.baseline, args.candidate, **_policy_kwargs(args))
    if args.json:
        _say(json.dumps(report.to_dict(), allow_nan=False), out)
    else:
        _say(format_report(report), out)
    return report


def _run_report(args: argparse.Namespace, out: TextIO) -> ParityReport:
    from tb_parity_plugin.report import page
    from tb_parity_plugin.report.progress import compare_with_progress

    report = compare_with_progress(
        args.logdir, args.baseline, args.candidate, progress=args.progress, **_policy_kwargs(args)
    )
    page.write_report(args.output, report)
    first = report.first_divergence
    if first is None:
        verdict = report.verdict
    else:  # as `diff` says it: a tensor one run lacks diverges in structure, at no step
        verdict = "diverge in structure" if first.reason == "structure" else f"diverge at step {first.step}"
    if report.problems:  # the one line must not read as a clean verdict
        verdict += f", {len(report.problems)} read problem(s) (listed in the report)"
    _say(f"wrote {args.output}: {report.baseline} vs {report.candidate}, {verdict}", out)
    return report


def _say(text: str, out: TextIO) -> None:
    """Print ``text``; a reader that stopped reading (``| head``) ends the output, not the verdict:
    the exit status still says it, and the rest of the output goes nowhere (Python's own advice)."""
    try:
        print(text, file=out)
        out.flush()
    except BrokenPipeError:
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _wants_json(argv: Sequence[str], prog: str) -> bool:
    """Whether ``tb-parity diff`` was asked for JSON, as argparse reads it: ``--json`` or a prefix of it
    (``--js``; no other option starts so), before any ``--`` (a review's ``--js`` got no JSON error)."""
    words = list(argv[: argv.index("--")] if "--" in argv else argv)
    return prog == "tb-parity" and any(len(w) >= 3 and "--json".startswith(w) for w in words)


def _error(message: str, as_json: bool, out: TextIO, err: TextIO) -> int:
    """Exit 2 with one line on stderr and, under ``--json``, ``{"error": ..., "exit": 2}`` on stdout: a CI
    script that reads the report with ``json.loads(stdout)`` crashed on the empty output of a bad flag or a
    missing logdir (a new user's did)."""
    line = _one_line(message)
    print(line, file=err)
    if as_json:
        print(json.dumps({"error": line, "exit": EXIT_ERROR}), file=out)
    return EXIT_ERROR


def main(argv: Optional[Sequence[str]] = None, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None) -> int:
    """Entry point of the ``tb-parity`` console script; returns the exit status."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = "tb-parity report" if argv[:1] == ["report"] else "tb-parity"
    try:
        args = _parse(argv)
        run = _run_report if args.command == "report" else _run_diff
        report = run(args, out)
    except SystemExit as exc:  # --help
        return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_AGREE
    except (_UsageError, api.ParityInputError, OSError) as exc:
        return _error(f"{prog}: error: {exc}", _wants_json(argv, prog), out, err)
    except Exception as exc:  # corrupt input must not end in a traceback
        return _error(f"{prog}: error: {type(exc).__name__}: {exc}", _wants_json(argv, prog), out, err)
    if report.first_divergence is not None:
        return EXIT_DIVERGE
    if report.incomplete:
        return EXIT_INCOMPLETE
    if getattr(args, "require_values", False) and report.statistics_only:
        print(
            f"{prog}: --require-values: the agreement rests on statistics for {len(report.statistics_only)} "
            f"tensor(s) (exit {EXIT_STATISTICS})",
            file=err,
        )
        return EXIT_STATISTICS
    return EXIT_AGREE


if __name__ == "__main__":
    sys.exit(main())
