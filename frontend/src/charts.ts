// Line charts (uPlot, bundled): lr and loss of both runs overlaid, and |difference|
// on a log scale under the shaded tolerance band it must stay inside.
import uPlot from "uplot";

import { el, fmt, replaceChildren } from "./dom";
import { num, Num, ScalarPanel, SideSeries } from "./api";

export interface Palette { base: string; cand: string; diff: string; band: string; axis: string; grid: string }

export function palette(dark: boolean): Palette {
  return dark
    ? { base: "#ff9e40", cand: "#4dd0e1", diff: "#f06292", band: "rgba(129,201,149,0.25)", axis: "#b0b0b0", grid: "#4a4a4a" }
    : { base: "#e8710a", cand: "#12b5cb", diff: "#e52592", band: "rgba(46,125,50,0.15)", axis: "#616161", grid: "#eeeeee" };
}

type Col = (number | null)[];

/** Values of `series` on the union x axis `xs` (null where the run has no step). */
function onto(xs: number[], series: { steps: number[]; values: Num[] } | null, positive = false): Col {
  const out: Col = new Array(xs.length).fill(null);
  if (!series) return out;
  const index = new Map<number, number>();
  xs.forEach((x, i) => index.set(x, i));
  series.steps.forEach((s, i) => {
    const v = num(series.values[i]);
    const keep = Number.isFinite(v) && (!positive || v > 0);
    const at = index.get(s);
    if (at !== undefined && keep) out[at] = v;
  });
  return out;
}

function unionSteps(...series: ({ steps: number[] } | null)[]): number[] {
  const all = new Set<number>();
  for (const s of series) s?.steps.forEach((x) => all.add(x));
  return [...all].sort((a, b) => a - b);
}

function axes(p: Palette, logY: boolean): uPlot.Axis[] {
  const common = { stroke: p.axis, grid: { stroke: p.grid, width: 1 }, ticks: { stroke: p.grid, width: 1 }, font: "11px Roboto, sans-serif" };
  return [
    { ...common },
    { ...common, size: 60, values: (_u: uPlot, splits: (number | null)[]) => splits.map((v) => (v === null || v === undefined ? "" : logY ? v.toExponential(0) : fmt(v))) },
  ];
}

/** What makes two option sets draw different series: labels, colours, dashes, scales, axes (functions drop out). */
function signature(opts: Omit<uPlot.Options, "width" | "height">): string {
  return JSON.stringify({ series: opts.series, scales: opts.scales, axes: opts.axes });
}

/**
 * One uPlot in `host`, sized to it and resized with it. A refresh with the same series
 * updates it in place (setData), so a user's zoom survives auto-refresh and re-queries;
 * only another series set (theme, labels, log scale) or reset() recreates it.
 * The x window is mirrored in the host's data-x-min / data-x-max (tests read it).
 */
class Chart {
  private plot: uPlot | null = null;
  private sig = "";
  private observer: ResizeObserver;

  constructor(private host: HTMLElement, private height = 180) {
    this.observer = new ResizeObserver(() => this.plot?.setSize({ width: this.width(), height: this.height }));
    this.observer.observe(host);
  }

  private width(): number {
    return Math.max(200, this.host.clientWidth);
  }

  show(opts: Omit<uPlot.Options, "width" | "height">, data: uPlot.AlignedData): void {
    const sig = signature(opts);
    if (this.plot && sig === this.sig) {
      this.update(this.plot, data);
      return;
    }
    this.reset();
    this.host.textContent = "";
    this.sig = sig;
    const mirror = (u: uPlot, key: string): void => {
      if (key !== "x") return;
      this.host.dataset.xMin = String(u.scales.x.min);
      this.host.dataset.xMax = String(u.scales.x.max);
    };
    const hooks = { ...opts.hooks, setScale: [...(opts.hooks?.setScale ?? []), mirror] };
    this.plot = new uPlot({ ...opts, hooks, width: this.width(), height: this.height }, data, this.host);
  }

  /** New data in place; a zoomed x window (narrower than the old data) is kept, else it follows the data. */
  private update(u: uPlot, data: uPlot.AlignedData): void {
    const xs = u.data[0];
    const { min, max } = u.scales.x;
    const zoomed = xs.length > 0 && min != null && max != null && (min > xs[0] || max < xs[xs.length - 1]);
    u.setData(data, true); // every scale ranges to the new data (y included) ...
    if (zoomed) u.setScale("x", { min: min as number, max: max as number }); // ... then the user's window returns
  }

  /** Forget the chart: the next show() creates a fresh one (another pair or tensor). */
  reset(): void {
    this.plot?.destroy();
    this.plot = null;
    this.sig = "";
  }

  empty(message: string): void {
    this.reset();
    replaceChildren(this.host, el("div", { cls: "empty", text: message }));
  }
}

export interface OverlayLabels { baseline: string; candidate: string }

/** The overlay of both runs and, below it, |Δ| with the tolerance band, for lr or loss. */
export class ScalarCharts {
  private overlay: Chart;
  private diff: Chart;

  constructor(parent: HTMLElement, private title: string) {
    const overlayHost = el("div");
    const diffHost = el("div");
    parent.appendChild(
      el(
        "div",
        { cls: "tbp-chart", attrs: { "data-testid": `chart-${title}` } },
        el("h3", { text: title }),
        overlayHost,
        el("h3", { text: `|Δ ${title}| (log) and tolerance` }),
        diffHost,
      ),
    );
    this.overlay = new Chart(overlayHost, 170);
    this.diff = new Chart(diffHost, 130);
  }

  /** Another pair: the next update draws fresh charts (the old zoom belonged to other runs). */
  reset(): void {
    this.overlay.reset();
    this.diff.reset();
  }

  update(panel: ScalarPanel, labels: OverlayLabels, p: Palette): void {
    const base: SideSeries | null = panel.baseline;
    const cand: SideSeries | null = panel.candidate;
    if (!base && !cand) {
      this.overlay.empty(`No ${this.title} logged by either run.`);
      this.diff.empty("");
      return;
    }
    const xs = unionSteps(base, cand);
    this.overlay.show(
      {
        legend: { show: true },
        cursor: { drag: { x: true, y: false } },
        scales: { x: { time: false } },
        axes: axes(p, false),
        series: [
          { label: "step" },
          { label: labels.baseline, stroke: p.base, width: 1.5, spanGaps: true, points: { fill: p.base }, value: (_u, v) => fmt(v) },
          { label: labels.candidate, stroke: p.cand, width: 1.5, dash: [6, 3], spanGaps: true, points: { fill: p.cand }, value: (_u, v) => fmt(v) },
        ],
      },
      [xs, onto(xs, base), onto(xs, cand)],
    );
    const d = panel.diff;
    if (!d || !d.steps.length) {
      this.diff.empty("No common steps to compare.");
      return;
    }
    const absDiff = onto(d.steps, { steps: d.steps, values: d.abs_diff }, true);
    const tol = onto(d.steps, { steps: d.steps, values: d.tolerance }, true);
    if (absDiff.every((v) => v === null) && tol.every((v) => v === null)) {
      this.diff.empty(`|Δ ${this.title}| is 0 at every common step.`);
      return;
    }
    this.diff.show(
      {
        legend: { show: true },
        scales: { x: { time: false }, y: { distr: 3 } },
        axes: axes(p, true),
        series: [
          { label: "step" },
          { label: "tolerance", stroke: p.band, fill: p.band, width: 1, spanGaps: true, points: { show: false }, value: (_u, v) => fmt(v) },
          { label: "|Δ|", stroke: p.diff, width: 1.5, spanGaps: false, points: { show: true, size: 3, fill: p.diff }, value: (_u, v) => fmt(v) },
        ],
      },
      [d.steps, tol, absDiff],
    );
  }
}

/** A generic chart for the tensor detail: several named series on one step axis. */
export class SeriesChart {
  private chart: Chart;

  constructor(host: HTMLElement, height = 160) {
    this.chart = new Chart(host, height);
  }

  reset(): void {
    this.chart.reset();
  }

  update(xs: number[], series: { label: string; color: string; values: Col; dash?: number[] }[], p: Palette, logY = false): void {
    if (!xs.length || series.every((s) => s.values.every((v) => v === null))) {
      this.chart.empty("Nothing to plot.");
      return;
    }
    this.chart.show(
      {
        legend: { show: true },
        scales: { x: { time: false }, y: logY ? { distr: 3 } : {} },
        axes: axes(p, logY),
        series: [
          { label: "step" },
          ...series.map((s) => ({ label: s.label, stroke: s.color, width: 1.5, dash: s.dash, spanGaps: true, points: { fill: s.color }, value: (_u: uPlot, v: number | null) => fmt(v) })),
        ],
      },
      [xs, ...series.map((s) => s.values)],
    );
  }
}

export { onto, unionSteps };
