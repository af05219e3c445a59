// Wires the tab together: run picker and tolerance controls -> routes -> card, charts,
// heat map, detail and panels. All verdicts come from the server; this only displays.
import { api, ApiError, Divergence, isAbort, Latest, MatrixResponse, Params, RunsResponse, ScalarsResponse, Summary, TensorResponse } from "./api";
import { renderCard } from "./card";
import { palette, Palette, ScalarCharts } from "./charts";
import { TensorDetail } from "./detail";
import { el, replaceChildren } from "./dom";
import { CellRef, HeatMap, heatPalette } from "./heatmap";
import { parseFlags, withFlag } from "./flags";
import { renderPanels } from "./panels";
import { loadState, saveState, ViewState } from "./state";
import { watchTheme } from "./theme";

const POLL_MS = 5000;
const DEBOUNCE_MS = 400;

function numberInput(label: string, key: keyof ViewState, step: string): [HTMLElement, HTMLInputElement] {
  const input = el("input", { attrs: { type: "number", min: "0", step, "data-testid": `tol-${key}`, "aria-label": label } });
  return [el("label", {}, label, input), input];
}

export class App {
  private state: ViewState = loadState();
  private runs: RunsResponse | null = null;
  private summary: Summary | null = null;
  private scalars: ScalarsResponse | null = null;
  private matrix: MatrixResponse | null = null;
  private tensor: TensorResponse | null = null;
  private replica: number | null = null; // the candidate replica shown in the detail (null: one-device value)
  // One request of each kind in flight: a newer one aborts the older, whose late answer
  // would otherwise show the first tensor's data after the second was asked for.
  private runsReq = new Latest();
  private refreshReq = new Latest();
  private tensorReq = new Latest();
  private pal: Palette = palette(false);

  private errorBar = el("div", { cls: "tbp-error", attrs: { "data-testid": "error", role: "alert" } });
  private pairSelect = el("select", { attrs: { "data-testid": "pair", "aria-label": "pair" } });
  private baseSelect = el("select", { attrs: { "data-testid": "baseline", "aria-label": "baseline" } });
  private candSelect = el("select", { attrs: { "data-testid": "candidate", "aria-label": "candidate" } });
  private tol: Record<"atol" | "rtol" | "warmup", HTMLInputElement>;
  private flags = el("input", {
    attrs: {
      type: "text",
      "data-testid": "flags",
      "aria-label": "comparison flags",
      placeholder: "--map OLD=NEW --allow-unmatched PATTERN --override PATTERN:atol=X --equal-nan",
      spellcheck: "false",
    },
  }) as HTMLInputElement;
  private auto = el("input", { attrs: { type: "checkbox", checked: "", "data-testid": "auto-refresh" } });
  private status = el("span", { cls: "tbp-status", attrs: { "data-testid": "status" } });
  private card = el("div", { cls: "tbp-card", attrs: { "data-testid": "card" } });
  private alerts = el("div", { cls: "tbp-alerts" });
  private chartsBox = el("div", { cls: "tbp-charts" });
  private lr: ScalarCharts;
  private loss: ScalarCharts;
  private heat: HeatMap;
  private detail: TensorDetail;
  private panels = el("div", { cls: "tbp-panels" });
  private empty = el("div", { cls: "tbp-section", attrs: { "data-testid": "empty" } });
  private main = el("div");

  constructor(root: HTMLElement) {
    const [atolL, atol] = numberInput("atol", "atol", "any");
    const [rtolL, rtol] = numberInput("rtol", "rtol", "any");
    const [warmL, warmup] = numberInput("warm-up steps", "warmup", "1");
    this.tol = { atol, rtol, warmup };
    this.lr = new ScalarCharts(this.chartsBox, "lr");
    this.loss = new ScalarCharts(this.chartsBox, "loss");
    this.heat = new HeatMap((cell) => void this.pickCell(cell));
    this.detail = new TensorDetail(
      (step) => void this.openTensor(this.state.tensor ?? "", step),
      (replica) => {
        this.replica = replica;
        void this.openTensor(this.state.tensor ?? "", this.state.step ? Number(this.state.step) : null);
      },
    );
    this.errorBar.style.display = "none";
    this.empty.style.display = "none";
    const toolbar = el(
      "div",
      { cls: "tbp-toolbar" },
      el("label", {}, "Pair", this.pairSelect),
      el("label", {}, "Baseline", this.baseSelect),
      el("label", {}, "Candidate", this.candSelect),
      atolL,
      rtolL,
      warmL,
      el("label", { cls: "tbp-flags" }, "Flags", this.flags),
      el("label", {}, this.auto, "auto-refresh"),
      el("span", { cls: "grow" }),
      this.status,
    );
    replaceChildren(
      this.main,
      el("div", { cls: "tbp-cardrow" }, this.card, this.alerts),
      el("div", { cls: "tbp-section" }, el("h2", { text: "Learning rate and loss" }), this.chartsBox),
      el("div", { cls: "tbp-section" }, el("h2", { text: "Divergence heat map (steps × tensors in execution order; click a cell)" }), this.heat.root),
      this.detail.root,
      this.panels,
    );
    this.main.style.display = "none";
    replaceChildren(root, el("div", { cls: "tbp" }, toolbar, this.errorBar, this.empty, this.main));

    this.pairSelect.addEventListener("change", () => {
      const [b, c] = JSON.parse(this.pairSelect.value) as [string, string];
      this.choosePair(b, c);
    });
    this.baseSelect.addEventListener("change", () => this.choosePair(this.baseSelect.value, this.state.candidate ?? ""));
    this.candSelect.addEventListener("change", () => this.choosePair(this.state.baseline ?? "", this.candSelect.value));
    let timer = 0;
    for (const [key, input] of Object.entries(this.tol) as ["atol" | "rtol" | "warmup", HTMLInputElement][]) {
      input.value = this.state[key] ?? "";
      input.addEventListener("input", () => {
        this.state[key] = input.value;
        window.clearTimeout(timer);
        timer = window.setTimeout(() => void this.refresh(), DEBOUNCE_MS);
      });
    }
    this.flags.value = this.state.flags ?? "";
    this.flags.addEventListener("input", () => {
      this.state.flags = this.flags.value;
      window.clearTimeout(timer);
      timer = window.setTimeout(() => void this.refresh(), DEBOUNCE_MS);
    });
    window.addEventListener("resize", () => this.heat.redraw());
    watchTheme((dark) => this.setTheme(dark));
  }

  async start(): Promise<void> {
    await this.loadRuns();
    window.setInterval(() => {
      if ((this.auto as HTMLInputElement).checked) void this.poll();
    }, POLL_MS);
  }

  private setTheme(dark: boolean): void {
    document.body.classList.toggle("dark", dark);
    this.pal = palette(dark);
    this.heat.setPalette(heatPalette(dark));
    this.renderAll();
  }

  private showError(err: unknown): void {
    const message = err instanceof ApiError ? `${err.message} (HTTP ${err.status})` : String(err instanceof Error ? err.message : err);
    this.errorBar.textContent = message;
    this.errorBar.style.display = "";
  }

  private clearError(): void {
    this.errorBar.style.display = "none";
  }

  /** The query of every route: the pair, the tolerance fields and the flags (flags.ts; a flag it
   * cannot read throws, and the caller shows the error as it shows a route's). */
  private params(): Params {
    return {
      baseline: this.state.baseline,
      candidate: this.state.candidate,
      atol: this.state.atol,
      rtol: this.state.rtol,
      warmup: this.state.warmup,
      ...parseFlags(this.state.flags ?? ""),
    };
  }

  /** A suggestion taken from a panel: into the flags field (where the user sees and can undo it),
   * kept in the URL, and compared again at once. */
  private applyFlag(flag: string, value: string): void {
    this.flags.value = withFlag(this.flags.value, flag, value);
    this.state.flags = this.flags.value;
    void this.refresh();
  }

  private roles(): Record<string, string> {
    const side = (name?: string) => this.runs?.runs.find((r) => r.name === name)?.side;
    const label = (role: string, name?: string) => (side(name) ? `${role} (${side(name)})` : role);
    const out: Record<string, string> = {};
    if (this.state.baseline) out[this.state.baseline] = label("Baseline", this.state.baseline);
    if (this.state.candidate) out[this.state.candidate] = label("Candidate", this.state.candidate);
    return out;
  }

  private async loadRuns(): Promise<void> {
    const signal = this.runsReq.start();
    try {
      const runs = await api.runs(signal);
      if (signal.aborted) return;
      this.runs = runs;
    } catch (err) {
      if (!signal.aborted && !isAbort(err)) this.showError(err);
      return;
    }
    const names = new Set(this.runs.runs.map((r) => r.name));
    if (!names.size) {
      this.main.style.display = "none";
      this.empty.style.display = "";
      replaceChildren(
        this.empty,
        el("h2", { text: "No tb_parity runs in this logdir yet" }),
        el("div", { cls: "tbp-hint", text: this.runs.error ?? "Log a TF1 run and its TF2 port with tb_parity_plugin.v1 / v2 (one subdirectory each); this tab refreshes by itself." }),
      );
      return;
    }
    this.empty.style.display = "none";
    this.main.style.display = "";
    // A pair the URL names is kept even when /runs does not list it: the routes then answer why (the
    // CLI's words: no such run, or a run holding no tb_parity record), where the tab showed the
    // suggested pair's verdict under the link (h102: a link to an empty port read "Runs agree").
    if (!(this.state.baseline && this.state.candidate)) {
      const pair = this.runs.suggested ?? { baseline: this.runs.runs[0].name, candidate: this.runs.runs[Math.min(1, this.runs.runs.length - 1)].name };
      this.state.baseline = pair.baseline;
      this.state.candidate = pair.candidate;
      this.state.tensor = undefined;
      this.state.step = undefined;
    }
    this.fillPickers();
    await this.refresh();
  }

  private fillPickers(): void {
    const runs = this.runs;
    if (!runs) return;
    const current = JSON.stringify([this.state.baseline, this.state.candidate]);
    const options = runs.pairs.map((p) => el("option", { text: p.folder || "(top level)", attrs: { value: JSON.stringify([p.baseline, p.candidate]) } }));
    if (!runs.pairs.some((p) => JSON.stringify([p.baseline, p.candidate]) === current)) options.push(el("option", { text: "(custom)", attrs: { value: current } }));
    replaceChildren(this.pairSelect, ...options);
    this.pairSelect.value = current;
    for (const [select, chosen] of [[this.baseSelect, this.state.baseline], [this.candSelect, this.state.candidate]] as [HTMLSelectElement, string][]) {
      replaceChildren(select, ...runs.runs.map((r) => el("option", { text: r.side ? `${r.name} (${r.side})` : r.name, attrs: { value: r.name } })));
      select.value = chosen;
    }
  }

  private choosePair(baseline: string, candidate: string): void {
    this.state.baseline = baseline;
    this.state.candidate = candidate;
    this.state.tensor = undefined;
    this.state.step = undefined;
    this.tensorReq.cancel();
    this.tensor = null;
    this.detail.hide();
    this.lr.reset();
    this.loss.reset();
    this.fillPickers();
    void this.refresh();
  }

  /** Fetch summary, scalars and matrix for the current pair and policy, then render. */
  private async refresh(): Promise<void> {
    if (!this.state.baseline || !this.state.candidate) return;
    const signal = this.refreshReq.start();
    saveState(this.state);
    try {
      const p = this.params();
      const [summary, scalars, matrix] = await Promise.all([
        api.summary(p, signal),
        api.scalars(p, signal),
        api.matrix({ ...p, width: this.heat.wantedWidth() }, signal),
      ]);
      if (signal.aborted) return;
      this.summary = summary;
      this.scalars = scalars;
      this.matrix = matrix;
      for (const key of ["atol", "rtol", "warmup"] as const) {
        const value = key === "warmup" ? summary.policy.warmup_steps : summary.policy[key];
        this.tol[key].placeholder = String(value);
      }
      this.clearError();
      this.renderAll();
      if (this.state.tensor) await this.openTensor(this.state.tensor, this.state.step ? Number(this.state.step) : null, false);
    } catch (err) {
      if (!signal.aborted && !isAbort(err)) this.showError(err);
    }
  }

  private async poll(): Promise<void> {
    let runs: RunsResponse;
    const signal = this.runsReq.start();
    try {
      runs = await api.runs(signal);
    } catch {
      return; // aborted, or the server may be restarting; the next poll retries
    }
    if (signal.aborted) return;
    const before = JSON.stringify(this.runs?.runs.map((r) => [r.name, r.generation]));
    this.runs = runs;
    if (JSON.stringify(runs.runs.map((r) => [r.name, r.generation])) === before) return;
    if (!this.summary) {
      await this.loadRuns();
      return;
    }
    this.fillPickers();
    const gens = this.summary.generations;
    const changed = runs.runs.some((r) => (r.name === this.state.baseline || r.name === this.state.candidate) && gens[r.name] !== r.generation);
    if (changed) await this.refresh();
  }

  private renderAll(): void {
    const s = this.summary;
    if (!s) return;
    const roles = this.roles();
    renderCard(this.card, this.alerts, s, roles, {
      open: (d) => void this.openDivergence(d),
      openNonfinite: (run, tag, step) => void this.openNonfinite(run, tag, step),
    });
    const labels = { baseline: roles[s.baseline] ?? "baseline", candidate: roles[s.candidate] ?? "candidate" };
    if (this.scalars) {
      this.lr.update(this.scalars.lr, labels, this.pal);
      this.loss.update(this.scalars.loss, labels, this.pal);
    }
    if (this.matrix) this.heat.setData(this.matrix, this.selectedCell());
    renderPanels(this.panels, s, roles, (flag, value) => this.applyFlag(flag, value));
    const base = this.runs?.runs.find((r) => r.name === s.baseline);
    this.status.textContent = `${s.steps_compared} steps compared${base?.last_step !== undefined && base?.last_step !== null ? `, last step ${base.last_step}` : ""} · ${new Date().toLocaleTimeString()}`;
    if (this.tensor && this.tensor.tag === this.state.tensor) this.detail.show(this.tensor, this.state.step ? Number(this.state.step) : null, [labels.baseline, labels.candidate], this.pal);
  }

  private selectedCell(): CellRef | null {
    const m = this.matrix;
    if (!m || !this.state.tensor) return null;
    const tensor = m.tensors.findIndex((t) => t.tag === this.state.tensor);
    if (tensor < 0) return null;
    const step = this.state.step ? Number(this.state.step) : m.step_start[0];
    let bucket = m.step_end.findIndex((end) => end >= step);
    if (bucket < 0) bucket = m.step_start.length - 1;
    return { bucket, tensor };
  }

  private async openDivergence(d: Divergence): Promise<void> {
    if (d.reason === "structure") {
      // a tensor of one run only has no pair to detail: show the structure report
      this.panels.querySelector("[data-testid=structure]")?.scrollIntoView({ block: "start", behavior: "smooth" });
      return;
    }
    await this.openTensor(`${d.kind}/${d.tensor}`, d.step);
    this.heat.root.scrollIntoView({ block: "nearest" });
    this.detail.root.scrollIntoView({ block: "start", behavior: "smooth" });
  }

  private async openNonfinite(run: string, tag: string, step: number): Promise<void> {
    // A candidate-side name maps back to its baseline tag through the mapping in use.
    let target = tag;
    const s = this.summary;
    if (s && run === s.candidate) {
      const [kind, ...rest] = tag.split("/");
      const m = s.mapping.find((row) => row.kind === kind && row.candidate === rest.join("/"));
      if (m) target = `${m.kind}/${m.baseline}`;
    }
    await this.openTensor(target, step);
    this.detail.root.scrollIntoView({ block: "start", behavior: "smooth" });
  }

  private async pickCell(cell: CellRef): Promise<void> {
    const m = this.matrix;
    if (!m) return;
    const tag = m.tensors[cell.tensor].tag;
    let step = m.step_start[cell.bucket];
    if (m.first && m.first.bucket === cell.bucket && m.first.tensor === cell.tensor) step = m.first.step;
    else if (m.step_end[cell.bucket] !== step) {
      // A bucket of several steps: open its first step that diverges, if any.
      const signal = this.tensorReq.start();
      try {
        const t = await api.tensor({ ...this.params(), tensor: tag }, signal);
        if (signal.aborted) return;
        const k = t.diff.steps.findIndex((s, i) => s >= step && s <= m.step_end[cell.bucket] && t.diff.reason[i] !== "ok");
        if (k >= 0) step = t.diff.steps[k];
      } catch (err) {
        if (signal.aborted || isAbort(err)) return; // another cell or tensor was asked for since
        /* else fall back to the bucket's first step */
      }
    }
    await this.openTensor(tag, step);
  }

  /** Load and show one tensor's detail (values at `step` when given). */
  async openTensor(tag: string, step: number | null, remember = true): Promise<void> {
    if (!tag) return;
    if (tag !== this.state.tensor) this.replica = null; // another tensor starts on its compared value
    this.state.tensor = tag;
    this.state.step = step === null ? undefined : String(step);
    if (remember) saveState(this.state);
    const signal = this.tensorReq.start();
    try {
      const t = await api.tensor({ ...this.params(), tensor: tag, values_at: step ?? undefined, replica: this.replica ?? undefined }, signal);
      if (signal.aborted) return;
      this.tensor = t;
      this.clearError();
      this.heat.select(this.selectedCell());
      const roles = this.roles();
      this.detail.show(t, step, [roles[this.state.baseline ?? ""] ?? "baseline", roles[this.state.candidate ?? ""] ?? "candidate"], this.pal);
    } catch (err) {
      if (signal.aborted || isAbort(err)) return;
      if (err instanceof ApiError && err.status === 404 && step !== null) {
        // The step was not logged by both runs: show the series without values.
        await this.openTensor(tag, null, remember);
        return;
      }
      this.showError(err);
    }
  }
}
