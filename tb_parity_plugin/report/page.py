"""One self-contained HTML page (or notebook fragment) showing a parity report.

It renders what the engine decided (``ParityReport.to_dict()``, its steps x tensors
matrix) and the runs' lr/loss; it never judges anything itself. Everything is inline
(CSS, SVG charts, a PNG heat map as a data URI) and every name is HTML-escaped, so the
file opens offline, in exported notebooks, VS Code and GitHub previews, and a tensor
named ``<script>`` stays text. The standalone page also forbids any fetch by CSP.
"""

from __future__ import annotations

import html
import shlex
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np
import numpy.typing as npt

from tb_parity_plugin.engine import colour_scale, replicas
from tb_parity_plugin.engine import matrix as matrix_mod
from tb_parity_plugin.engine.verdicts import mismatch_text, statistics_only_text
from tb_parity_plugin.report.graphics import Series, fmt, line_chart, png_data_uri

if TYPE_CHECKING:  # verdicts imports this module for ParityReport._repr_html_
    from tb_parity_plugin.engine.verdicts import ParityReport

#: run -> (steps, values), per scalar name ("lr", "loss").
Scalars = Mapping[str, Mapping[str, tuple[npt.ArrayLike, npt.ArrayLike]]]

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

_STYLE = """
.tbp-report{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#212121;background:#fff;
 padding:12px 16px;max-width:1100px}
.tbp-report h2{font-size:20px;margin:4px 0 8px}.tbp-report h3{font-size:15px;margin:18px 0 6px}
.tbp-report .verdict{padding:10px 14px;border-radius:4px;font-size:16px;font-weight:600;margin:6px 0}
.tbp-report .verdict.diverge{background:#fdecea;border-left:5px solid #c62828;color:#7f1d1d}
.tbp-report .verdict.agree{background:#e8f5e9;border-left:5px solid #2e7d32;color:#1b5e20}
.tbp-report .verdict.incomplete{background:#fff8e1;border-left:5px solid #f9a825;color:#6d4c00}
.tbp-report .problems{margin:4px 0 10px}
.tbp-report .meta{color:#616161;margin:4px 0}
.tbp-report table{border-collapse:collapse;font-size:13px;margin:4px 0}
.tbp-report th,.tbp-report td{border-bottom:1px solid #e0e0e0;padding:3px 8px;text-align:left;vertical-align:top}
.tbp-report td.num{text-align:right;font-variant-numeric:tabular-nums}
.tbp-report tr.first td{background:#fff3e0;font-weight:600}
.tbp-report code{font:12px ui-monospace,Menlo,Consolas,monospace;word-break:break-all}
.tbp-report .charts{display:flex;flex-wrap:wrap;gap:8px}
.tbp-report svg text{font:11px system-ui,sans-serif;fill:#424242}.tbp-report svg .ctitle{font-weight:600;font-size:12px}
.tbp-report svg .plot{fill:#fafafa;stroke:#e0e0e0}
.tbp-report svg .base{fill:none;stroke:#1565c0;stroke-width:1.6}
.tbp-report svg .cand{fill:none;stroke:#ef6c00;stroke-width:1.6;stroke-dasharray:5 3}
.tbp-report svg .diff{fill:none;stroke:#6a1b9a;stroke-width:1.4}
.tbp-report svg .marker{stroke:#c62828;stroke-dasharray:3 3}
.tbp-report svg .outline{fill:none;stroke:#00e5ff;stroke-width:2}
.tbp-report svg.heat{max-width:100%;height:auto}.tbp-report .heat image{image-rendering:pixelated}
.tbp-report .swatch{display:inline-block;width:12px;height:12px;vertical-align:-2px;margin:0 3px 0 10px}
"""

#: Heat-map columns; longer runs are bucketed by the engine (``ParityMatrix.bucketed``).
MAX_COLUMNS = 1000


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _verdict(summary: Mapping[str, Any]) -> str:
    """The verdict, then the read problems right under it: a verdict from damaged files says so."""
    return _verdict_box(summary) + _problems(summary)


def _problems(summary: Mapping[str, Any]) -> str:
    problems = summary.get("problems") or []
    if not problems:
        return ""
    items = "".join(
        f"<li><code>{_e(p.get('path', ''))}</code> ({_e(p.get('run', ''))}) at byte "
        f"{_e(p.get('offset', ''))}: {_e(p.get('message', ''))}</li>"
        for p in problems
    )
    return f'<div class="problems" data-testid="problems"><b>{len(problems)} read problem(s)</b><ul>{items}</ul></div>'


def _verdict_box(summary: Mapping[str, Any]) -> str:
    first = summary.get("first_divergence")
    if summary.get("verdict") == "incomplete":
        return f'<div class="verdict incomplete">{_e(summary.get("verdict_text", "INCOMPLETE"))}</div>'
    if summary.get("agree") and not first:
        stats = summary.get("verdict") == "agree within statistics"
        text = (
            f"Runs agree within {'statistics' if stats else 'tolerance'} across {summary.get('steps_compared', 0)} "
            f"steps and {summary.get('tensors_compared', 0)} tensors."
        )
        if stats:  # weaker evidence, said so, with the tensors and the remedy the CLI prints
            line = summary.get("statistics_only_text") or statistics_only_text(
                summary.get("statistics_only") or [], summary.get("partly_values") or {}
            )
            return (
                f'<div class="verdict agree stats">{_e(text)} {_e(summary.get("verdict_text", ""))}'
                f'<div class="meta" data-testid="statistics-only">{_e(line)}</div></div>'
            )
        # tensors allow_unmatched declared expected were never compared: the engine's one line says
        # so ("; not compared: N ..."), as `diff` and the tab show it; the page headed a bare agree
        only_in = (summary.get("structure") or {}).get("only_in") or {}
        if any(e.get("expected") for entries in only_in.values() for e in entries):
            line = _e(summary.get("verdict_text", ""))
            return (
                f'<div class="verdict agree">{_e(text)}<div class="meta" data-testid="verdict-text">{line}</div></div>'
            )
        return f'<div class="verdict agree">{_e(text)}</div>'
    if not first:  # disagreement without a divergence: e.g. nothing comparable
        return '<div class="verdict diverge">Runs do not agree (no comparable divergence found).</div>'
    # a tensor one run lacks diverges in structure, at no step, and may be the candidate's only
    # (no baseline name): said as `diff`, the one line and the tab say it
    name = first.get("tensor") or first.get("candidate_tensor") or ""
    what = f"<code>{_e(name)}</code> ({_e(first.get('kind'))}, {_e(first.get('reason'))})"
    if first.get("reason") != "structure":
        return f'<div class="verdict diverge">First divergence at step {_e(first.get("step"))}: {what}</div>'
    count = len(summary.get("divergences_at_first_step") or []) or 1
    later = summary.get("first_step_divergence")
    among = (
        f'<div class="meta" data-testid="first-step-divergence">Among the compared steps, the first divergence is '
        f"at step {_e(later.get('step'))}: <code>{_e(later.get('kind'))}/{_e(later.get('tensor'))}</code> "
        f"({_e(later.get('reason'))}).</div>"
        if later
        else ""
    )
    return (
        f'<div class="verdict diverge">Structure differs: {count} tensor(s) recorded by one run only, first {what}'
        f"{among}</div>"
    )


_DIV_COLUMNS = [
    ("order", "order"),
    ("kind", "kind"),
    ("tensor", "baseline tensor"),
    ("candidate_tensor", "candidate tensor"),
    ("reason", "reason"),
    ("max_abs_diff", "max |diff|"),
    ("max_rel_diff", "max rel diff"),
    ("cosine", "cosine"),
    ("mismatch_fraction", "mismatched"),
    ("evidence", "evidence"),
    ("note", "what was found"),
    ("error_ratio", "error / tolerance"),
]
_TEXT_KEYS = {"kind", "tensor", "candidate_tensor", "reason", "evidence", "note"}


def _divergence_table(summary: Mapping[str, Any]) -> str:
    rows = summary.get("divergences_at_first_step") or []
    first = summary.get("first_divergence")
    if not rows:
        return ""
    head = "".join(f"<th>{_e(label)}</th>" for _, label in _DIV_COLUMNS)
    body = []
    for row in rows:
        is_first = first is not None and all(row.get(k) == first.get(k) for k in ("kind", "tensor", "candidate_tensor"))
        cells = "".join(
            f"<td><code>{_e(row.get(k, ''))}</code></td>"
            if k in ("tensor", "candidate_tensor")
            else f"<td>{_e(row.get(k) or '')}</td>"
            if k in _TEXT_KEYS
            else f'<td class="num">{_e(mismatch_text(row.get(k)) if k == "mismatch_fraction" else fmt(row.get(k)))}</td>'
            for k, _ in _DIV_COLUMNS
        )
        body.append(f'<tr class="{"first" if is_first else ""}">{cells}</tr>')
    step = first.get("step") if first else rows[0].get("step")
    return (
        f"<h3>Tensors that diverged at step {_e(step)}, in execution order</h3>"
        f'<table class="divergences"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


def _nonfinite(summary: Mapping[str, Any]) -> str:
    items = []
    for run, where in (summary.get("first_nonfinite") or {}).items():
        what = "none" if not where else f"step {_e(where.get('step'))}: <code>{_e(where.get('tensor'))}</code>"
        items.append(f"<li><code>{_e(run)}</code>: {what}</li>")
    return f"<h3>First NaN/Inf per run</h3><ul>{''.join(items)}</ul>" if items else ""


def _charts(summary: Mapping[str, Any], scalars: Optional[Scalars]) -> str:
    if not scalars:
        return ""
    base, cand = summary.get("baseline"), summary.get("candidate")
    first = summary.get("first_divergence") or {}
    marker = first.get("step")
    charts = []
    for name in ("lr", "loss"):
        runs = scalars.get(name) or {}
        if base is None or cand is None or base not in runs or cand not in runs:
            continue
        (bs, bv), (cs, cv) = (np.asarray(a) for a in runs[base]), (np.asarray(a) for a in runs[cand])
        charts.append(
            line_chart(
                name,
                [Series(f"baseline {base}", bs, bv, "base"), Series(f"candidate {cand}", cs, cv, "cand")],
                marker_step=marker,
            )
        )
        common, bi, ci = np.intersect1d(bs, cs, return_indices=True)
        diff = np.abs(np.asarray(cv, np.float64)[ci] - np.asarray(bv, np.float64)[bi])
        empty = "identical at every common step" if common.size and not diff.any() else "no finite difference"
        charts.append(
            line_chart(
                f"|{name} candidate − baseline| (log)",
                [Series("|diff|", common, diff, "diff")],
                log=True,
                marker_step=marker,
                empty=empty,
            )
        )
    if not charts:
        return ""
    return f'<h3>Learning rate and loss</h3><div class="charts">{"".join(charts)}</div>'


def _tail(name: str, width: int) -> str:
    """The end of a long name, marked as cut (a new user read "tate/batch_normalization/..." as a
    name): a tensor's leaf is what tells rows apart; the tooltip holds the whole name."""
    return name if len(name) <= width else "\u2026" + name[-(width - 1) :]


def _heat_map(matrix: Optional[matrix_mod.ParityMatrix]) -> str:
    """The engine's matrix as a PNG (tensors down, steps across) in an SVG with the
    first divergence outlined and, for few tensors, their names."""
    if matrix is None or len(matrix.step_start) == 0 or len(matrix.tensors) == 0:
        return ""
    n_steps = len(matrix.step_start)
    shown = matrix.bucketed(MAX_COLUMNS)
    n_cols, n_tensors = shown.error_ratio.shape
    image = png_data_uri(
        colour_scale.cell_colours(shown.error_ratio, shown.reason, statistics=shown.statistics).transpose(1, 0, 2)
    )
    label_w, plot_w = (220 if n_tensors <= 40 else 0), 760
    row_h = min(16.0, 400 / n_tensors)
    width, height = label_w + plot_w, row_h * n_tensors
    parts = [
        f'<svg class="heat" viewBox="-3 -3 {width + 6} {height + 24:.0f}" width="{width}" role="img">',
        f'<image x="{label_w}" y="0" width="{plot_w}" height="{height:.1f}" preserveAspectRatio="none" href="{image}"/>',
    ]
    if label_w:
        for i, name in enumerate(shown.tensors):
            parts.append(
                f'<text x="{label_w - 4}" y="{(i + 0.75) * row_h:.1f}" text-anchor="end">'
                f"{_e(_tail(name, 38))}<title>{_e(name)}</title></text>"
            )
    if shown.first_divergence is not None:
        row, col = shown.first_divergence
        cw = plot_w / n_cols
        parts.append(
            f'<rect class="outline" x="{label_w + row * cw - 2:.1f}" y="{col * row_h - 2:.1f}" width="{cw + 4:.1f}" '
            f'height="{row_h + 4:.1f}"><title>first divergence</title></rect>'
        )
    parts.append(
        f'<text x="{label_w}" y="{height + 14:.0f}">step {_e(fmt(shown.step_start[0]))}</text>'
        f'<text x="{width}" y="{height + 14:.0f}" text-anchor="end">step {_e(fmt(shown.step_end[-1]))}</text></svg>'
    )
    light = colour_scale.PALETTES["light"]
    legend = "".join(
        f'<span class="swatch" style="background:rgb{light[k]}"></span>{_e(t)}' for k, t in colour_scale.LEGEND
    )
    note = (
        f" Each column is a bucket of about {-(-n_steps // n_cols)} steps (its worst cell)." if n_cols < n_steps else ""
    )
    return (
        f"<h3>Divergence map: {_e(matrix.columns_text())} (execution order) × {n_steps} steps</h3>"
        f'<p class="meta">Colour = error relative to tolerance.{_e(note)}</p>{"".join(parts)}'
        f'<p class="meta">{legend}</p>'
    )


def _structure(summary: Mapping[str, Any]) -> str:
    """Structure parity: variables per run, tensors recorded by one run only, shape mismatches, repeats."""
    st = summary.get("structure") or {}
    variables = st.get("variables") or {}
    parts = []
    if variables:
        counts = "; ".join(f"{_e(run)}: {v['count']} ({v['size']} elements)" for run, v in variables.items())
        parts.append(f'<p class="meta">Variables recorded: {counts}.</p>')
    only_in = st.get("only_in") or {}
    if any(only_in.values()):
        items = "".join(
            f"<li>recorded by <code>{_e(run)}</code> only: "
            + ", ".join(
                f"<code>{_e(e['tag'])}</code> {_e(e['shape'])}" + (" (expected)" if e.get("expected") else "")
                for e in entries
            )
            + "</li>"
            for run, entries in only_in.items()
            if entries
        )
        parts.append(f'<ul class="unmatched">{items}</ul>')
    else:
        parts.append('<p class="meta">Every tensor found its counterpart.</p>')
    for m in st.get("shape_mismatches") or []:
        parts.append(
            f"<p>Shape mismatch: <code>{_e(m['baseline'])}</code> {_e(m['baseline_shape'])} vs "
            f"<code>{_e(m['candidate'])}</code> {_e(m['candidate_shape'])}</p>"
        )
    for run, entries in (st.get("created_twice") or {}).items():
        for e in entries:
            parts.append(
                f"<p>Created twice in <code>{_e(run)}</code>? <code>{_e(e['tag'])}</code> repeats <code>{_e(e['like'])}</code></p>"
            )
    if st.get("suggested_maps"):
        maps = " ".join(f"<code>--map {_e(shlex.quote(m))}</code>" for m in st["suggested_maps"])
        parts.append(
            f'<p data-testid="suggested-maps">Suggested: {maps} (layers whose variables went unmatched on both '
            "sides with the same names under them and the same sizes; check each pairing first)</p>"
        )
    parts += [
        f'<p data-testid="replicas">Replicas: {_e(line)}</p>'
        for line in replicas.describe(summary.get("replicas") or {})
    ]
    return "<h3>Structure</h3>" + "".join(parts)


def _unmatched_and_mapping(summary: Mapping[str, Any]) -> str:
    out = [_structure(summary)]
    mapping = summary.get("mapping") or []
    if mapping:
        rows = "".join(
            f"<tr><td>{_e(m.get('kind', ''))}</td><td><code>{_e(m.get('baseline', ''))}</code></td>"
            f"<td><code>{_e(m.get('candidate', ''))}</code></td><td>{_e(m.get('how', ''))}</td></tr>"
            for m in mapping
        )
        out.append(
            f'<details><summary>Name mapping used ({len(mapping)} tensors)</summary><table class="mapping">'
            f"<thead><tr><th>kind</th><th>baseline</th><th>candidate</th><th>how</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></details>"
        )
    return "".join(out)


def _unproven(summary: Mapping[str, Any]) -> str:
    """The tensors before the first divergent one that only statistics compared (``unproven_text``),
    and a hyper-parameter diverging after the first divergent step (``hparam_text``)."""
    out = ""
    for key, testid in (("unproven_text", "unproven"), ("hparam_text", "hparam")):
        text = summary.get(key)
        out += f'<p class="warnings" data-testid="{testid}">{_e(text)}</p>' if text else ""
    return out


def _warnings(summary: Mapping[str, Any]) -> str:
    """The engine's warnings, as the CLI prints them (layers paired by their first values, a
    mapping that matched nothing, a tensor traced for several batch sizes, ...)."""
    warnings = summary.get("warnings") or []
    if not warnings:
        return ""
    items = "".join(f"<li>{_e(w)}</li>" for w in warnings)
    return f'<div class="warnings" data-testid="warnings"><b>{len(warnings)} warning(s)</b><ul>{items}</ul></div>'


def _footer(summary: Mapping[str, Any]) -> str:
    out = []
    only = {run: n for run, n in (summary.get("steps_only") or {}).items() if n}
    if only:
        out.append(
            '<p class="meta">Steps logged by one run only: '
            + ", ".join(f"<code>{_e(r)}</code> {_e(n)}" for r, n in only.items())
            + "</p>"
        )
    policy = summary.get("policy")
    if policy:
        shown = ", ".join(
            f"{_e(k)}={_e(fmt(v) if not isinstance(v, (list, tuple, dict, str)) else v)}" for k, v in policy.items()
        )
        out.append(f'<p class="meta">Tolerance policy: {shown}</p>')
    return "".join(out)


def render_fragment(
    summary: Mapping[str, Any], matrix: Optional[matrix_mod.ParityMatrix] = None, scalars: Optional[Scalars] = None
) -> str:
    """The report as an HTML fragment with scoped CSS (what a notebook output shows)."""
    title = f"tb-parity: {summary.get('baseline')} vs {summary.get('candidate')}"
    meta = (
        f"{summary.get('steps_compared', 0)} steps and {summary.get('tensors_compared', 0)} tensors compared; "
        f"baseline <code>{_e(summary.get('baseline'))}</code>, candidate <code>{_e(summary.get('candidate'))}</code>."
    )
    return "".join(
        [
            f'<div class="tbp-report"><style>{_STYLE}</style><h2>{_e(title)}</h2>',
            _verdict(summary),
            f'<p class="meta">{meta}</p>',
            _divergence_table(summary),
            _unproven(summary),
            _nonfinite(summary),
            _charts(summary, scalars),
            _heat_map(matrix),
            _unmatched_and_mapping(summary),
            _warnings(summary),
            _footer(summary),
            "</div>",
        ]
    )


def render_document(
    summary: Mapping[str, Any], matrix: Optional[matrix_mod.ParityMatrix] = None, scalars: Optional[Scalars] = None
) -> str:
    """The report as one standalone page; its CSP forbids every network request."""
    title = f"tb-parity report: {summary.get('baseline')} vs {summary.get('candidate')}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{_e(title)}</title></head><body style="margin:0;background:#fff">'
        f"{render_fragment(summary, matrix, scalars)}</body></html>\n"
    )


def _report_parts(report: ParityReport) -> tuple[dict[str, Any], Optional[matrix_mod.ParityMatrix], Optional[Scalars]]:
    """(summary, matrix, scalars) of an engine ``ParityReport``; matrix/scalars need its Comparison."""
    summary = report.to_dict()
    comparison = getattr(report, "comparison", None)
    if comparison is None:
        return summary, None, None
    runs = (comparison.base, comparison.cand)
    scalars = {name: {run.name: run.scalars[name] for run in runs if name in run.scalars} for name in ("lr", "loss")}
    return summary, report.matrix(), scalars


def report_fragment(report: ParityReport) -> str:
    """``ParityReport._repr_html_``: the report inline in a notebook, no server needed."""
    return render_fragment(*_report_parts(report))


def report_document(report: ParityReport) -> str:
    """The standalone page ``tb-parity report`` writes."""
    return render_document(*_report_parts(report))


def write_report(path: str, report: ParityReport) -> None:
    """Writes ``report`` as a standalone page (UTF-8)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(report_document(report))
