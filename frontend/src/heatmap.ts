// Steps x tensors heat map on a canvas. One pixel per (bucket, tensor) in an
// offscreen ImageData, scaled up once per draw: 2000 x 200 cells cost one
// putImageData, and hover is arithmetic on the mouse position (no per-cell DOM).
import { ColourScale, MatrixResponse, RGB } from "./api";
import { el, fmt, replaceChildren } from "./dom";

/** Outline colours (chrome, not data); the cells' colours come with the matrix. */
export interface HeatPalette { dark: boolean; outline: string; select: string }

export function heatPalette(dark: boolean): HeatPalette {
  return dark ? { dark, outline: "#ffffff", select: "#4dd0e1" } : { dark, outline: "#000000", select: "#1976d2" };
}

function mix(a: RGB, b: RGB, t: number): RGB {
  const u = Math.min(1, Math.max(0, t));
  return [0, 1, 2].map((i) => Math.round(a[i] + (b[i] - a[i]) * u)) as RGB;
}

/**
 * Colour of one cell under the server's scale: the rule of engine/colour_scale.py's
 * cell_colours (the report's), so both colour one ratio alike. The reason decides the ramp.
 */
export function cellColor(ratio: number, reason: string, s: ColourScale, dark: boolean, statistics = false): RGB {
  const p = s.palettes[dark ? "dark" : "light"];
  const flat = s.flat[reason];
  if (flat) return p[flat];
  if (reason === "ok" && statistics) return p.unproven; // moments within bounds: no element was compared
  const r = Number.isNaN(ratio) ? 0 : ratio;
  if (reason === "value") return mix(p.bad_low, p.bad_high, Math.log10(Math.max(r, 1)) / Math.log10(s.bad_ceiling));
  const floor = Math.log10(s.ok_floor);
  return mix(p.ok_low, p.ok_high, (Math.log10(Math.max(r, s.ok_floor)) - floor) / -floor);
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
  private legendBox = el("div", { cls: "tbp-legend" });

  constructor(private onPick: (cell: CellRef) => void) {
    this.canvasBox.appendChild(this.canvas);
    this.root = el(
      "div",
      {},
      el("div", { cls: "tbp-heat" }, this.labels, this.canvasBox),
      this.axis,
      this.legendBox,
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

  /** The legend of the server's scale, in the current theme. */
  private legend(): void {
    const s = this.m?.colour_scale;
    if (!s) return;
    const p = s.palettes[this.pal.dark ? "dark" : "light"];
    replaceChildren(
      this.legendBox,
      ...s.legend.map(([key, text]) => {
        const c = p[key];
        return el("span", {}, el("i", { attrs: { "data-swatch": key, style: `background:rgb(${c[0]},${c[1]},${c[2]})` } }), text);
      }),
    );
  }

  setPalette(p: HeatPalette): void {
    this.pal = p;
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
        : [el("div", { text: `${m.columns_text}, execution order top to bottom` })]),
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

  /** Rebuild the 1-pixel-per-cell image and the legend, then draw it scaled. */
  private paint(): void {
    const m = this.m;
    if (!m) return;
    this.legend();
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
        const statistics = m.by_statistics[i] === 1;
        const c = cellColor(m.ratio[i], code === m.no_data ? "absent" : m.reason_codes[code] ?? "", m.colour_scale, this.pal.dark, statistics);
        const o = (t * nb + b) * 4;
        img.data[o] = c[0];
        img.data[o + 1] = c[1];
        img.data[o + 2] = c[2];
        img.data[o + 3] = 255;
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
    const name = code === m.no_data ? "not compared" : m.reason_codes[code] || "within tolerance";
    const byStats = m.by_statistics[i] === 1 && name === "ok";
    const reason = byStats ? "ok by statistics only: the moments are within their bounds; elements were not compared" : name;
    replaceChildren(
      this.tooltip,
      el("div", { text: t.tag }),
      t.candidate_tag && t.candidate_tag !== t.tag ? el("div", { text: `↔ ${t.candidate_tag}` }) : null,
      el("div", { text: s0 === s1 ? `step ${s0}` : `steps ${s0}–${s1} (worst shown)` }),
      el("div", { text: `${byStats ? "moment difference / bound" : "error / tolerance"}: ${fmt(m.ratio[i])}` }),
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
