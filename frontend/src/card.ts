// The verdict card and, beside it, each run's first NaN/Inf (the way Debugger V2's Alerts
// panel points at the first non-finite tensor), the runs' read problems and the engine's
// warnings. The verdict's three strengths (diverge, agree, agree within statistics) and
// its one-line wording come from the engine; this only lays them out.
import { Divergence, num, optNum, Summary } from "./api";
import { el, fmt, replaceChildren } from "./dom";

export interface CardActions {
  /** Open a divergence: its tensor's detail, or the structure panel for a structure one. */
  open: (d: Divergence) => void;
  openNonfinite: (run: string, tensorTag: string, step: number) => void;
}

/** Rows of the divergence list shown in the card; the rest are counted. */
const MAX_LISTED = 20;

function figure(label: string, value: string): HTMLElement {
  return el("span", {}, label + " ", el("b", { text: value }));
}

/** The tensor's name on whichever side recorded it (a structure divergence may name one side only). */
export function divergenceName(d: Divergence): string {
  return d.tensor || d.candidate_tensor || "";
}

/** What the verdict rests on and what was found: the engine's `evidence` and `note`. */
function evidence(d: Divergence): HTMLElement {
  return el(
    "div",
    { cls: "tbp-note", attrs: { "data-testid": "divergence-note" } },
    d.evidence ? el("span", { cls: "tbp-chip", attrs: { "data-testid": "divergence-evidence" }, text: `by ${d.evidence}` }) : null,
    d.note ?? "",
  );
}

function figures(d: Divergence): HTMLElement | null {
  if (d.reason === "structure") return null;
  return el(
    "div",
    { cls: "tbp-figures" },
    // a shape or dtype divergence has no element-wise figures (null): "–" as the report and the CLI's
    // "n/a" say, not "NaN", which reads as the tensor holding NaNs
    figure("max |Δ|", fmt(optNum(d.max_abs_diff))),
    figure("max rel", fmt(optNum(d.max_rel_diff))),
    figure("error / tolerance", fmt(optNum(d.error_ratio)) + (d.error_ratio === null ? "" : "×")),
    d.cosine !== null ? figure("cosine", fmt(num(d.cosine))) : null,
    d.mismatch_fraction !== null ? figure("elements out of tolerance", fmt(num(d.mismatch_fraction) * 100) + "%") : null,
  );
}

/** Every divergence at the first step (or every structure divergence), each with its evidence and note. */
function divergenceList(s: Summary, act: CardActions): HTMLElement | null {
  const all = s.divergences_at_first_step;
  if (all.length < 2) return null;
  const rows = all.slice(0, MAX_LISTED).map((d) =>
    el(
      "tr",
      {
        cls: "click",
        attrs: { "data-testid": "divergence", "data-reason": d.reason },
        on: {
          click: (ev) => {
            ev.stopPropagation(); // the card's own click opens the first one
            act.open(d);
          },
        },
      },
      el("td", { cls: "l", text: d.kind }),
      el("td", { cls: "l tbp-mono", text: divergenceName(d) }),
      el("td", { cls: "l", text: d.reason }),
      el("td", { cls: "l", text: d.evidence ?? "" }),
      el("td", { cls: "l wrap", text: d.note ?? "" }),
    ),
  );
  return el(
    "div",
    { cls: "tbp-scroll" },
    el(
      "table",
      { cls: "tbp-table", attrs: { "data-testid": "divergences" } },
      el("thead", {}, el("tr", {}, ...["kind", "tensor", "reason", "evidence", "what was found"].map((h) => el("th", { cls: "l", text: h })))),
      el("tbody", {}, ...rows),
    ),
    all.length > MAX_LISTED ? el("div", { cls: "tbp-hint", text: `and ${all.length - MAX_LISTED} more` }) : null,
  );
}

function divergeCard(card: HTMLElement, s: Summary, d: Divergence, act: CardActions): void {
  const structure = d.reason === "structure";
  const others = s.divergences_at_first_step.length - 1;
  const later = structure ? s.first_step_divergence : null;
  replaceChildren(
    card,
    el("div", {
      cls: "headline",
      attrs: { "data-testid": "verdict" },
      text: structure
        ? `Structure differs: ${s.divergences_at_first_step.length} tensor(s) recorded by one run only`
        : `First divergence at step ${d.step}`,
    }),
    el(
      "div",
      {},
      el("span", { cls: "tbp-chip", text: d.kind }),
      el("span", { cls: "tbp-chip reason", text: d.reason }),
      el("span", { cls: "tensor", attrs: { "data-testid": "divergence-tensor" }, text: divergenceName(d) }),
      d.tensor && d.candidate_tensor && d.candidate_tensor !== d.tensor ? el("span", { cls: "tbp-hint", text: `  ↔ ${d.candidate_tensor}` }) : null,
    ),
    evidence(d),
    figures(d),
    el("div", { cls: "tbp-hint", attrs: { "data-testid": "verdict-text" }, text: s.verdict_text }),
    divergenceList(s, act),
    later
      ? el(
          "div",
          {
            cls: "tbp-link",
            attrs: { "data-testid": "first-step-divergence" },
            on: {
              click: (ev) => {
                ev.stopPropagation();
                act.open(later);
              },
            },
          },
          `Among the compared steps, the first divergence is at step ${later.step}: ${later.kind}/${later.tensor} (${later.reason}).`,
        )
      : null,
    el(
      "div",
      { cls: "tbp-hint" },
      !structure && others > 0 ? `${others} more tensor(s) also diverge at step ${d.step}. ` : "",
      `Compared ${s.steps_compared} steps × ${s.tensors_compared} tensors. Click to open.`,
    ),
  );
}

function agreeCard(card: HTMLElement, s: Summary): void {
  const incomplete = s.verdict === "incomplete"; // no divergence in what was read, but read problems
  const stats = s.verdict === "agree within statistics" || incomplete;
  const what = s.verdict === "agree within statistics" ? "within statistics" : "within tolerance";
  const short = Object.keys(s.ended_early ?? {});
  const headline = incomplete
    ? s.problems.length && !s.policy.accept_read_problems
      ? `No divergence in what was read, but ${s.problems.length} read problem(s): not an agreement`
      : `No divergence in what was compared, but ${short.map((r) => `'${r}'`).join(" and ")} ended early: not an agreement`
    : `Runs agree ${what} across ${s.steps_compared} steps and ${s.tensors_compared} tensors`;
  replaceChildren(
    card,
    el("div", {
      cls: "headline",
      attrs: { "data-testid": "verdict" },
      text: s.steps_compared ? headline : "Nothing to compare yet: the runs share no logged step",
    }),
    s.steps_compared
      ? el(
          "div",
          { cls: stats ? "tbp-note" : "tbp-hint", attrs: { "data-testid": "verdict-text" } },
          stats ? el("span", { cls: "tbp-chip", attrs: { "data-testid": "evidence" }, text: `${s.evidence.statistics} by statistics, ${s.evidence.values} element-wise` }) : null,
          s.verdict_text,
        )
      : null,
    // which tensors the weaker evidence covers and how to get an element-wise verdict, as the CLI says
    s.steps_compared && s.verdict === "agree within statistics" && s.statistics_only_text
      ? el("div", { cls: "tbp-hint tbp-mono", attrs: { "data-testid": "statistics-only" }, text: s.statistics_only_text })
      : null,
    el("div", { cls: "tbp-hint", text: `atol ${fmt(num(s.policy.atol))}, rtol ${fmt(num(s.policy.rtol))} after ${s.policy.warmup_steps} warm-up steps.` }),
  );
}

function alert(testid: string, title: string, lines: string[], run?: string): HTMLElement {
  return el(
    "div",
    { cls: "tbp-alert warn", attrs: { "data-testid": testid, ...(run ? { "data-run": run } : {}) } },
    el("div", { cls: "title", text: title }),
    el("ul", { cls: "tbp-list" }, ...lines.map((line) => el("li", { cls: "tbp-mono", text: line }))),
  );
}

export function renderCard(card: HTMLElement, alerts: HTMLElement, s: Summary, roles: Record<string, string>, act: CardActions): void {
  const d = s.first_divergence;
  const stats = s.verdict === "agree within statistics" || s.verdict === "incomplete";
  card.className = "tbp-card " + (d ? "diverge" : stats ? "agree stats" : "agree");
  card.setAttribute("data-verdict", s.verdict ?? (d ? "diverge" : "agree"));
  card.onclick = d ? () => act.open(d) : null;
  card.title = d ? (d.reason === "structure" ? "Show the structure report" : "Show this cell in the heat map and open its detail") : "";
  if (d) divergeCard(card, s, d, act);
  else agreeCard(card, s);
  replaceChildren(alerts);
  if (s.problems.length) {
    // a record that could not be read may hide a divergence: said next to the verdict
    alerts.appendChild(alert("problems-alert", `⚠ ${s.problems.length} read problem(s): the verdict covers what was read`, s.problems.map((p) => `${p.run}: ${p.path} @${p.offset}: ${p.message}`)));
  }
  if (s.unproven_text) alerts.appendChild(alert("unproven-alert", "The divergence may start earlier than named", [s.unproven_text]));
  if (s.hparam_text) alerts.appendChild(alert("hparam-alert", "A hyper-parameter diverges later", [s.hparam_text]));
  if (s.warnings?.length) alerts.appendChild(alert("warnings-alert", "Warnings", s.warnings));
  for (const run of [s.baseline, s.candidate]) {
    const nf = s.first_nonfinite[run];
    const role = roles[run] ?? run;
    if (nf) {
      const tag = `${nf.kind}/${nf.tensor}`;
      alerts.appendChild(
        el(
          "div",
          {
            cls: "tbp-alert nonfinite",
            attrs: { "data-testid": "nan-alert", "data-run": run },
            title: "Open this tensor",
            on: { click: () => act.openNonfinite(run, tag, nf.step) },
          },
          el("div", { cls: "title", text: `⚠ ${role}: first NaN/Inf at step ${nf.step}` }),
          el("div", { cls: "tbp-mono", text: tag }),
          el("div", { cls: "tbp-hint", text: run }),
        ),
      );
    } else {
      alerts.appendChild(
        el("div", { cls: "tbp-alert", attrs: { "data-run": run } }, el("div", { cls: "title", text: `${role}: no NaN/Inf` }), el("div", { cls: "tbp-hint", text: run })),
      );
    }
  }
}
