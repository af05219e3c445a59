// Tensor detail: both runs' statistics per step side by side, the per-step verdict,
// FULL_HEALTH counts with NaN/Inf highlighted, and full values at the chosen step.
import { num, Num, optNum, RunTensor, TensorResponse } from "./api";
import { Palette, SeriesChart, onto } from "./charts";
import { el, fmt, replaceChildren, shapeText } from "./dom";

const COUNTS = ["neg_inf", "pos_inf", "nan", "neg_finite", "zero", "pos_finite"];
const COUNT_LABELS: Record<string, string> = { neg_inf: "−Inf", pos_inf: "+Inf", nan: "NaN", neg_finite: "< 0", zero: "= 0", pos_finite: "> 0" };
const NONFINITE = new Set(["neg_inf", "pos_inf", "nan"]);
const MOMENTS = ["mean", "l2", "min", "max", "std"];
const WINDOW = 8;
const MAX_ROWS = 200;

type StatRow = Num[];

function rowAt(side: { steps: number[]; stats: StatRow[] } | null, step: number): StatRow | null {
  if (!side) return null;
  const i = side.steps.indexOf(step);
  return i < 0 ? null : side.stats[i];
}

export class TensorDetail {
  readonly root = el("div", { cls: "tbp-section", attrs: { "data-testid": "detail" } });
  private statChart: SeriesChart;
  private ratioChart: SeriesChart;
  private head = el("div", { cls: "tbp-detail-head" });
  private statSelect = el("select", { attrs: { "aria-label": "statistic" } });
  // multi-replica candidate: the one-device value (what is compared) or one replica's own copy
  private replicaSelect = el("select", { attrs: { "aria-label": "replica", "data-testid": "replica" } });
  private stepsTable = el("div", { cls: "tbp-scroll" });
  private health = el("div");
  private values = el("div", { cls: "tbp-scroll" });
  private data: TensorResponse | null = null;
  private pal: Palette | null = null;

  constructor(
    private onStep: (step: number) => void,
    private onReplica: (replica: number | null) => void = () => undefined,
  ) {
    for (const m of MOMENTS) this.statSelect.appendChild(el("option", { text: m, attrs: { value: m } }));
    this.replicaSelect.addEventListener("change", () => {
      const v = this.replicaSelect.value;
      this.onReplica(v === "" ? null : Number(v));
    });
    this.statSelect.addEventListener("change", () => this.charts());
    const statHost = el("div");
    const ratioHost = el("div");
    this.root.append(
      el("h2", { text: "Tensor detail" }),
      this.head,
      el(
        "div",
        { cls: "tbp-detail-grid" },
        el("div", { cls: "tbp-chart" }, el("h3", {}, "Statistic per step: ", this.statSelect), statHost),
        el("div", { cls: "tbp-chart" }, el("h3", { text: "error / tolerance per step (log; > 1 diverges)" }), ratioHost),
      ),
      el("h3", { text: "Per step (both runs side by side)" }),
      this.stepsTable,
      el("div", { cls: "tbp-detail-grid" }, el("div", {}, el("h3", { text: "FULL_HEALTH counts at the selected step" }), this.health), el("div", {}, el("h3", { text: "Values at the selected step" }), this.values)),
    );
    this.statChart = new SeriesChart(statHost, 150);
    this.ratioChart = new SeriesChart(ratioHost, 150);
    this.root.style.display = "none";
  }

  hide(): void {
    this.root.style.display = "none";
    this.data = null;
  }

  show(t: TensorResponse, step: number | null, roles: [string, string], pal: Palette): void {
    if (t.tag !== this.data?.tag) {
      // another tensor: fresh charts; the same one refreshed keeps the user's zoom
      this.statChart.reset();
      this.ratioChart.reset();
    }
    this.data = t;
    this.pal = pal;
    this.root.style.display = "";
    const cand = t.candidate;
    replaceChildren(
      this.head,
      el("span", { cls: "tensor", attrs: { "data-testid": "detail-tensor" }, text: t.tag }),
      cand && cand.tag && cand.tag !== t.tag ? el("span", { cls: "tbp-mono tbp-hint", text: `↔ ${cand.tag}` }) : null,
      el("span", { cls: "tbp-chip", text: t.kind }),
      el("span", { cls: "tbp-hint", attrs: { "data-testid": "detail-shape" }, text: `${t.baseline.dtype} ${shapeText(t.baseline.shape)}` }),
      cand ? el("span", { cls: "tbp-hint", text: `candidate ${cand.dtype} ${shapeText(cand.shape)}` }) : null,
      el("span", { cls: "tbp-hint", text: `matched: ${t.how}; atol ${fmt(t.tolerance.atol)}, rtol ${fmt(t.tolerance.rtol)} after ${t.tolerance.warmup_steps} steps` }),
      step !== null ? el("span", { cls: "tbp-chip", attrs: { "data-testid": "detail-step" }, text: `step ${step}` }) : null,
      this.runtimeShapes(t, step),
      this.replicaPicker(t),
    );
    this.charts();
    this.stepTable(t, step, roles);
    this.healthTable(t, step, roles);
    this.valuesTable(t);
  }

  /** The shapes both runs ran with at `step` (or their first step), when a graph left a dimension unknown. */
  private runtimeShapes(t: TensorResponse, step: number | null): HTMLElement | null {
    const at = (side: RunTensor | null): string => {
      if (!side?.runtime_shapes) return side ? shapeText(side.shape) : "–";
      const i = step === null ? 0 : side.steps.indexOf(step);
      return i < 0 ? "–" : shapeText(side.runtime_shapes[i]);
    };
    if (!t.baseline.runtime_shapes && !t.candidate?.runtime_shapes) return null;
    return el("span", {
      cls: "tbp-hint",
      attrs: { "data-testid": "detail-runtime-shape" },
      text: `ran as ${at(t.baseline)} | ${at(t.candidate)}${step === null ? " (first step)" : ""}`,
    });
  }

  /** The replica select, when the candidate kept per-replica copies of this tensor. */
  private replicaPicker(t: TensorResponse): HTMLElement | null {
    const n = t.replicas ?? 0;
    if (n <= 0) return null;
    const options = [el("option", { text: "candidate: one-device value (compared)", attrs: { value: "" } })];
    for (let k = 0; k < n; k++) options.push(el("option", { text: `candidate: replica ${k}'s own copy`, attrs: { value: String(k) } }));
    replaceChildren(this.replicaSelect, ...options);
    this.replicaSelect.value = t.replica === null || t.replica === undefined ? "" : String(t.replica);
    return el("label", { cls: "tbp-hint" }, this.replicaSelect);
  }

  private charts(): void {
    const t = this.data;
    const p = this.pal;
    if (!t || !p) return;
    const col = t.stats_fields.indexOf(this.statSelect.value);
    const pick = (side: { steps: number[]; stats: StatRow[] } | null) => (side ? { steps: side.steps, values: side.stats.map((r) => r[col]) } : null);
    const xs = [...new Set([...t.baseline.steps, ...(t.candidate?.steps ?? [])])].sort((a, b) => a - b);
    this.statChart.update(
      xs,
      [
        { label: "baseline", color: p.base, values: onto(xs, pick(t.baseline)) },
        { label: "candidate", color: p.cand, values: onto(xs, pick(t.candidate)), dash: [6, 3] },
      ],
      p,
    );
    const ratios = onto(t.diff.steps, { steps: t.diff.steps, values: t.diff.error_ratio }, true);
    this.ratioChart.update(
      t.diff.steps,
      [
        { label: "error / tolerance", color: p.diff, values: ratios },
        { label: "limit", color: p.axis, values: t.diff.steps.map(() => 1), dash: [4, 4] },
      ],
      p,
      true,
    );
  }

  private stepTable(t: TensorResponse, step: number | null, roles: [string, string]): void {
    const steps = t.diff.steps.length ? t.diff.steps : t.baseline.steps;
    const at = step === null ? 0 : Math.max(0, steps.findIndex((s) => s >= step));
    const lo = Math.max(0, at - WINDOW);
    const shown = steps.slice(lo, lo + 2 * WINDOW + 1);
    const idx = (f: string) => t.stats_fields.indexOf(f);
    const sideCells = (row: StatRow | null, grp: string): HTMLElement[] => {
      if (!row) return [el("td", { cls: grp, text: "–" }), el("td", { text: "–" }), el("td", { text: "–" }), el("td", { text: "–" })];
      const nan = num(row[idx("nan")]);
      const inf = num(row[idx("neg_inf")]) + num(row[idx("pos_inf")]);
      return [
        el("td", { cls: grp, text: fmt(num(row[idx("mean")])) }),
        el("td", { text: fmt(num(row[idx("l2")])) }),
        el("td", { cls: nan > 0 ? "nonfinite" : "", text: fmt(nan) }),
        el("td", { cls: inf > 0 ? "nonfinite" : "", text: fmt(inf) }),
      ];
    };
    const rows = shown.map((s) => {
      const k = t.diff.steps.indexOf(s);
      const verdict = k >= 0 ? t.diff.reason[k] : "not compared";
      const reason = verdict === "ok" && k >= 0 && t.diff.by_statistics[k] ? "ok (statistics)" : verdict;
      const ratio = k >= 0 ? num(t.diff.error_ratio[k]) : NaN;
      const tr = el(
        "tr",
        { cls: "click" + (s === step ? " sel" : ""), attrs: { "data-step": String(s) }, on: { click: () => this.onStep(s) } },
        el("td", { text: String(s) }),
        ...sideCells(rowAt(t.baseline, s), "grp-b"),
        ...sideCells(rowAt(t.candidate, s), "grp-c"),
        el("td", { cls: "grp-d", text: k >= 0 ? fmt(num(t.diff.mean_abs_diff[k])) : "–" }),
        el("td", { cls: ratio > 1 ? "out" : "", text: fmt(ratio) }),
        el("td", { cls: "l" + (verdict !== "ok" ? " out" : ""), text: reason }),
      );
      return tr;
    });
    replaceChildren(
      this.stepsTable,
      el(
        "table",
        { cls: "tbp-table", attrs: { "data-testid": "detail-steps" } },
        el(
          "thead",
          {},
          el("tr", {}, el("th", { text: "" }), el("th", { cls: "grp-b tbp-swatch-b", attrs: { colspan: "4" }, text: roles[0] }), el("th", { cls: "grp-c tbp-swatch-c", attrs: { colspan: "4" }, text: roles[1] }), el("th", { attrs: { colspan: "3" }, text: "difference" })),
          el("tr", {}, ...["step", "mean", "l2", "NaN", "±Inf", "mean", "l2", "NaN", "±Inf", "|Δ mean|", "err/tol", "reason"].map((h, i) => el("th", { cls: (i === 1 ? "grp-b" : i === 5 ? "grp-c" : i === 9 ? "grp-d" : "") + (i === 11 ? " l" : ""), text: h }))),
        ),
        el("tbody", {}, ...rows),
      ),
    );
  }

  private healthTable(t: TensorResponse, step: number | null, roles: [string, string]): void {
    if (step === null) {
      replaceChildren(this.health, el("div", { cls: "tbp-hint", text: "Click a step row (or a heat map cell) to see its counts." }));
      return;
    }
    const line = (label: string, row: StatRow | null) =>
      el(
        "tr",
        {},
        el("td", { cls: "l", text: label }),
        ...COUNTS.map((c) => {
          const v = row ? num(row[t.stats_fields.indexOf(c)]) : NaN;
          return el("td", { cls: NONFINITE.has(c) && v > 0 ? "nonfinite" : "", text: row ? fmt(v) : "–" });
        }),
      );
    replaceChildren(
      this.health,
      el(
        "table",
        { cls: "tbp-table", attrs: { "data-testid": "health" } },
        el("thead", {}, el("tr", {}, el("th", { cls: "l", text: `step ${step}` }), ...COUNTS.map((c) => el("th", { text: COUNT_LABELS[c] })))),
        el("tbody", {}, line(roles[0], rowAt(t.baseline, step)), line(roles[1], rowAt(t.candidate, step))),
      ),
    );
  }

  private valuesTable(t: TensorResponse): void {
    const v = t.values;
    if (!v) {
      replaceChildren(this.values, el("div", { cls: "tbp-hint", text: "Select a step to load its values." }));
      return;
    }
    if (!v.baseline && !v.candidate) {
      replaceChildren(this.values, el("div", { cls: "tbp-hint", text: "This tensor keeps statistics only (too large for full values)." }));
      return;
    }
    const n = Math.max(v.baseline?.length ?? 0, v.candidate?.length ?? 0);
    const rows: HTMLElement[] = [];
    for (let i = 0; i < Math.min(n, MAX_ROWS); i++) {
      // absent (another shape: no difference per element; a shorter side): "–", not "NaN"
      const b = optNum(v.baseline?.[i]);
      const c = optNum(v.candidate?.[i]);
      const d = optNum(v.abs_diff?.[i]);
      const tol = optNum(v.tolerance?.[i]);
      const bad = d !== null && !(tol !== null && d <= tol);
      rows.push(
        el(
          "tr",
          {},
          el("td", { text: String(i) }),
          el("td", { cls: "grp-b" + (b === null || Number.isFinite(b) ? "" : " nonfinite"), text: fmt(b) }),
          el("td", { cls: "grp-c" + (c === null || Number.isFinite(c) ? "" : " nonfinite"), text: fmt(c) }),
          el("td", { cls: bad ? "out" : "", text: fmt(d) }),
          el("td", { text: fmt(tol) }),
        ),
      );
    }
    replaceChildren(
      this.values,
      el(
        "table",
        { cls: "tbp-table", attrs: { "data-testid": "values" } },
        el("thead", {}, el("tr", {}, ...["#", "baseline", "candidate", "|Δ|", "tolerance"].map((h) => el("th", { text: h })))),
        el("tbody", {}, ...rows),
      ),
      n > MAX_ROWS || v.truncated ? el("div", { cls: "tbp-hint", text: `First ${Math.min(n, MAX_ROWS)} elements shown.` }) : null,
      stepAtolHint(t),
    );
  }
}

/** The atol of the selected step when it is not the policy's: an optimizer slot's tolerance grows
 * with its largest element and with its gradient's differences, a layer output's and a moving
 * average's with its largest element, and the table's "tolerance" column must not look
 * inconsistent with the atol shown in the header. */
function stepAtolHint(t: TensorResponse): HTMLElement | null {
  const atol = t.values ? num(t.values.atol) : NaN;
  if (!Number.isFinite(atol) || atol === t.tolerance.atol) return null;
  return el("div", {
    cls: "tbp-hint",
    attrs: { "data-testid": "step-atol" },
    text: `atol at step ${t.values?.step}: ${fmt(atol)} (${t.kind === "slot" ? "a slot's share of its largest element and its gradient's differences within tolerance" : "a share of its largest element at the step"}, on top of atol ${fmt(t.tolerance.atol)})`,
  });
}
