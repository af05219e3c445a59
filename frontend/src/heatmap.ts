// Steps x tensors heat map on a canvas. One pixel per (bucket, tensor) in an
// offscreen ImageData, scaled up once per draw: 2000 x 200 cells cost one
// putImageData, and hover is arithmetic on the mouse position (no per-cell DOM).
import { MatrixResponse } from "./api";
import { el, fmt, replaceChildren } from "./dom";

type RGBA = [number, number, number, number];

export interface HeatPalette { okLow: RGBA; okHigh: RGBA; badLow: RGBA; badHigh: RGBA; nonfinite: RGBA; structural: RGBA; missing: RGBA; outline: string; select: string }

export function heatPalette(dark: boolean): HeatPalette {
  return dark
    ? { okLow: [52, 64, 56, 255], okHigh: [67, 160, 71, 255], badLow: [255, 183, 77, 255], badHigh: [244, 67, 54, 255], nonfinite: [186, 104, 200, 255], structural: [121, 134, 203, 255], missing: [120, 120, 120, 255], outline: "#ffffff", select: "#4dd0e1" }
    : { okLow: [232, 245, 233, 255], okHigh: [129, 199, 132, 255], badLow: [255, 183, 77, 255], badHigh: [198, 40, 40, 255], nonfinite: [142, 36, 170, 255], structural: [57, 73, 171, 255], missing: [158, 158, 158, 255], outline: "#000000", select: "#1976d2" };
}

function mix(a: RGBA, b: RGBA, t: number): RGBA {
  const u = Math.min(1, Math.max(0, t));
  return [0, 1, 2, 3].map((i) => Math.round(a[i] + (b[i] - a[i]) * u)) as RGBA;
}

/** Colour of one cell: green shades inside tolerance, orange->red by how far outside (log). */
export function cellColor(ratio: number, reason: string, p: HeatPalette): RGBA | null {
  if (reason === "nonfinite") return p.nonfinite;
  if (reason === "shape" || reason === "dtype") return p.structural;
  if (reason === "missing") return p.missing;
  if (Number.isNaN(ratio)) return null;
  if (reason === "value" || ratio > 1) return mix(p.badLow, p.badHigh, Math.log10(Math.max(ratio, 1)) / 3);
  return mix(p.okLow, p.okHigh, ratio <= 1e-4 ? 0 : (Math.log10(ratio) + 4) / 4);
}

export interface CellRef { bucket: number; tensor: number }

export class HeatMap {
  readonly root: HTMLElement;
  private labels = el("div", { cls: "tbp-heat-labels" });
  private canvasBox = el("div", { cls: "tbp-heat-canvas" });
  private canvas = el("canvas", { attrs: { "data-testid": "heatmap" } });
  private axis = el("div", { cls: "tbp-axis" });
  private tooltip = el("div", { cls: "tbp-tooltip", attrs: { "data-testid": "heat-tooltip" } });
  private image: HTMLCanvasElement = document.createElement("canvas");
  private m: MatrixResponse | null = null;
  private rowH = 4;
  private selected: CellRef | null = null;
  private pal: HeatPalette = heatPalette(false);

  constructor(private onPick: (cell: CellRef) => void) {
    this.canvasBox.appendChild(this.canvas);
    this.root = el(
      "div",
      {},
      el("div", { cls: "tbp-heat" }, this.labels, this.canvasBox),
      this.axis,
      this.legend(),
      this.tooltip,
    );
    this.canvas.addEventListener("mousemove", (ev) => this.hover(ev));
    this.canvas.addEventListener("mouseleave", () => (this.tooltip.style.display = "none"));
    this.canvas.addEventListener("click", (ev) => {
      const cell = this.cellAt(ev);
      if (cell) this.onPick(cell);
    });
  }

  /** Columns the server should bucket steps into: one per CSS pixel of the canvas. */
  wantedWidth(): number {
    return Math.max(50, Math.min(4096, Math.floor(this.canvasBox.clientWidth || 800)));
  }

  private legend(): HTMLElement {
    const item = (cls: string, text: string): HTMLElement => el("span", {}, el("i", { cls }), text);
    const box = el("div", { cls: "tbp-legend" });
    const swatches: [string, string][] = [
      ["ok", "within tolerance (darker = closer to the limit)"],
      ["bad", "out of tolerance (red = 1000x)"],
      ["nonfinite", "NaN/Inf pattern differs"],
      ["structural", "shape/dtype differs"],
      ["missing", "logged by one run only"],
    ];
    for (const [key, text] of swatches) {
      const sw = item("", text);
      sw.firstElementChild?.setAttribute("data-swatch", key);
      box.appendChild(sw);
    }
    return box;
  }

  setPalette(p: HeatPalette): void {
    this.pal = p;
    const colors: Record<string, RGBA> = { ok: p.okHigh, bad: p.badHigh, nonfinite: p.nonfinite, structural: p.structural, missing: p.missing };
    this.root.querySelectorAll<HTMLElement>("[data-swatch]").forEach((node) => {
      const c = colors[node.dataset.swatch ?? ""];
      node.style.background = `rgba(${c[0]},${c[1]},${c[2]},1)`;
    });
    if (this.m) this.paint();
  }

  setData(m: MatrixResponse, selected: CellRef | null): void {
    this.m = m;
    this.selected = selected;
    const nt = m.tensors.length;
    this.rowH = Math.max(2, Math.min(16, Math.floor(480 / Math.max(1, nt))));
    replaceChildren(
      this.labels,
      ...(this.rowH >= 10
        ? m.tensors.map((t) => el("div", { text: t.tag, title: t.tag, attrs: { style: `height:${this.rowH}px;line-height:${this.rowH}px;font-size:${Math.min(11, this.rowH - 1)}px` } }))
        : [el("div", { text: `${nt} tensors, execution order top to bottom` })]),
    );
    const nb = m.step_start.length;
    replaceChildren(
      this.axis,
      el("span", { text: nb ? `step ${m.step_start[0]}` : "" }),
      el("span", { text: `${m.n_steps} steps in ${nb} columns` }),
      el("span", { text: nb ? `step ${m.step_end[nb - 1]}` : "" }),
    );
    this.paint();
  }

  select(cell: CellRef | null): void {
    this.selected = cell;
    this.draw();
  }

  /** Rebuild the 1-pixel-per-cell image, then draw it scaled. */
  private paint(): void {
    const m = this.m;
    if (!m) return;
    const nb = m.step_start.length;
    const nt = m.tensors.length;
    this.image.width = Math.max(1, nb);
    this.image.height = Math.max(1, nt);
    const ctx = this.image.getContext("2d");
    if (!ctx || !nb || !nt) {
      this.draw();
      return;
    }
    const img = ctx.createImageData(nb, nt);
    for (let b = 0; b < nb; b++) {
      for (let t = 0; t < nt; t++) {
        const i = b * nt + t;
        const code = m.reason[i];
        const c = code === m.no_data ? null : cellColor(m.ratio[i], m.reason_codes[code] ?? "", this.pal);
        if (!c) continue;
        const o = (t * nb + b) * 4;
        img.data[o] = c[0];
        img.data[o + 1] = c[1];
        img.data[o + 2] = c[2];
        img.data[o + 3] = c[3];
      }
    }
    ctx.putImageData(img, 0, 0);
    this.draw();
  }

  private draw(): void {
    const m = this.m;
    const cssW = this.canvasBox.clientWidth || 800;
    const nt = m ? m.tensors.length : 0;
    const cssH = Math.max(20, nt * this.rowH);
    const dpr = window.devicePixelRatio || 1;
    this.canvas.style.width = `${cssW}px`;
    this.canvas.style.height = `${cssH}px`;
    this.canvas.width = Math.round(cssW * dpr);
    this.canvas.height = Math.round(cssH * dpr);
    const ctx = this.canvas.getContext("2d");
    if (!ctx || !m) return;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.clearRect(0, 0, cssW, cssH);
    const nb = m.step_start.length;
    if (nb && nt) ctx.drawImage(this.image, 0, 0, nb, nt, 0, 0, cssW, cssH);
    if (m.first) this.outline(ctx, m.first.bucket, m.first.tensor, this.pal.outline, [], cssW);
    if (this.selected) this.outline(ctx, this.selected.bucket, this.selected.tensor, this.pal.select, [3, 2], cssW);
  }

  /** Outline a cell, at least 8 px wide so the first divergence is visible at any zoom. */
  private outline(ctx: CanvasRenderingContext2D, bucket: number, tensor: number, color: string, dash: number[], cssW: number): void {
    const m = this.m as MatrixResponse;
    const cw = cssW / Math.max(1, m.step_start.length);
    const w = Math.max(8, cw);
    const h = Math.max(8, this.rowH);
    const x = bucket * cw + cw / 2 - w / 2;
    const y = tensor * this.rowH + this.rowH / 2 - h / 2;
    ctx.save();
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.setLineDash(dash);
    ctx.strokeRect(x, y, w, h);
    ctx.restore();
  }

  private cellAt(ev: MouseEvent): CellRef | null {
    const m = this.m;
    if (!m || !m.step_start.length || !m.tensors.length) return null;
    const r = this.canvas.getBoundingClientRect();
    const bucket = Math.floor(((ev.clientX - r.left) / r.width) * m.step_start.length);
    const tensor = Math.floor((ev.clientY - r.top) / this.rowH);
    if (bucket < 0 || bucket >= m.step_start.length || tensor < 0 || tensor >= m.tensors.length) return null;
    return { bucket, tensor };
  }

  private hover(ev: MouseEvent): void {
    const cell = this.cellAt(ev);
    const m = this.m;
    if (!cell || !m) {
      this.tooltip.style.display = "none";
      return;
    }
    const i = cell.bucket * m.tensors.length + cell.tensor;
    const t = m.tensors[cell.tensor];
    const s0 = m.step_start[cell.bucket];
    const s1 = m.step_end[cell.bucket];
    const code = m.reason[i];
    const reason = code === m.no_data ? "not compared" : m.reason_codes[code] || "within tolerance";
    replaceChildren(
      this.tooltip,
      el("div", { text: t.tag }),
      t.candidate_tag && t.candidate_tag !== t.tag ? el("div", { text: `↔ ${t.candidate_tag}` }) : null,
      el("div", { text: s0 === s1 ? `step ${s0}` : `steps ${s0}–${s1} (worst shown)` }),
      el("div", { text: `error / tolerance: ${fmt(m.ratio[i])}` }),
      el("div", { text: reason }),
    );
    this.tooltip.style.display = "block";
    this.tooltip.style.left = `${Math.min(ev.clientX + 14, window.innerWidth - 300)}px`;
    this.tooltip.style.top = `${ev.clientY + 14}px`;
  }

  redraw(): void {
    this.draw();
  }
}
