"""``tb-parity report LOGDIR [--baseline R] [--candidate R] -o report.html``.

Writes the engine's report as one self-contained HTML page (html_report.py), to attach
to a CI run or a bug. Exit status follows ``tb-parity diff``: 0 agree, 1 diverge,
2 bad input (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, Sequence, TextIO

from tb_parity_plugin import api, html_report
from tb_parity_plugin.cli import EXIT_AGREE, EXIT_DIVERGE, EXIT_ERROR
from tb_parity_plugin.progress import compare_with_progress


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, like `tb-parity diff`
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tb-parity report", description="Write the parity report as one self-contained HTML file.")
    p.add_argument("logdir", help="logdir holding the runs (one subdirectory per run)")
    p.add_argument("--baseline", help="baseline run (default: the TF1 run when LOGDIR holds two)")
    p.add_argument("--candidate", help="candidate run (default: the other run)")
    p.add_argument("-o", "--output", default="tb_parity_report.html", help="HTML file to write")
    p.add_argument("--atol", type=float, help="absolute tolerance (default 1e-5, every step)")
    p.add_argument("--rtol", type=float, help="relative tolerance after the warm-up (default 0.05)")
    p.add_argument("--warmup-steps", type=int, help="first N compared steps use rtol=0 (default 10)")
    p.add_argument("--map", dest="mapping", action="append", default=[], metavar="OLD=NEW",
                   help="pair baseline name OLD with candidate name NEW (re:PATTERN=REPL by regex)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar while reading (default: only for big logdirs)")
    return p


def write_report(path: str, report: Any) -> None:
    """Writes ``report`` as a standalone page (UTF-8)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(html_report.report_document(report))


def main(argv: Optional[Sequence[str]] = None, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None) -> int:
    """``tb-parity report``; returns the exit status."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        args = _parser().parse_args(argv)
        report = compare_with_progress(args.logdir, args.baseline, args.candidate, progress=args.progress,
                                       atol=args.atol, rtol=args.rtol, warmup_steps=args.warmup_steps,
                                       mapping=args.mapping)
        write_report(args.output, report)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_AGREE
    except (_UsageError, api.ParityInputError, OSError) as exc:
        print(" ".join(f"tb-parity report: error: {exc}".split()), file=err)
        return EXIT_ERROR
    verdict = "agree" if report.agree else f"diverge at step {report.first_divergence.step}"
    print(f"wrote {args.output}: {report.baseline} vs {report.candidate}, {verdict}", file=out)
    return EXIT_AGREE if report.agree else EXIT_DIVERGE
