// Typed access to the plugin's JSON routes. Every fetch is relative ("./summary"),
// resolved against the <base href="plugin/tb_parity/"> of TensorBoard's plugin
// entry page, so --path_prefix and notebook proxies keep working.
//
// Non-finite numbers arrive as the strings "NaN", "Infinity", "-Infinity"
// (TensorBoard's json_util.Cleanse); the heat map matrix arrives as base64 float32.

export type Num = number | string | null;

export interface RunInfo {
  name: string;
  folder: string;
  side: string;
  mode: string;
  steps: number;
  first_step: number | null;
  last_step: number | null;
  tensors: number;
  generation: number;
  problems: number;
}
export interface Pair { folder: string; baseline: string; candidate: string }
export interface RunsResponse {
  runs: RunInfo[];
  pairs: Pair[];
  suggested: Pair | null;
  loaded: boolean;
  error: string | null;
}

export interface Divergence {
  step: number;
  tensor: string;
  kind: string;
  candidate_tensor: string | null;
  order: number;
  reason: string;
  max_abs_diff: Num;
  max_rel_diff: Num;
  cosine: Num;
  mismatch_fraction: Num;
  error_ratio: Num;
  /** What the verdict rests on: values | statistics | counts | shape | dtype | layout | presence. */
  evidence: string | null;
  /** One line saying what was found, from what (e.g. both runtime shapes). */
  note: string | null;
}
export interface Nonfinite { step: number; tensor: string; kind: string }
export interface MappingRow { baseline: string; candidate: string; kind: string; how: string }
export interface OnlyIn {
  tag: string;
  kind: string;
  shape: (number | null)[];
  size: number;
  expected: boolean;
  candidates?: string[];
  /** What the entry looks like it is from how it starts (a shared weight's copy, a tied weight), worded by the engine. */
  hints?: string[];
}
export interface ShapeMismatch { kind: string; baseline: string; candidate: string; baseline_shape: (number | null)[]; candidate_shape: (number | null)[]; how: string }
/** What each run recorded, from its layouts (engine/structure.py); empty before the engine computed it. */
export interface Structure {
  only_in?: Record<string, OnlyIn[]>;
  variables?: Record<string, { count: number; size: number }>;
  shape_mismatches?: ShapeMismatch[];
  created_twice?: Record<string, { tag: string; like: string }[]>;
  suggested_maps?: string[];
  allow_unmatched?: string[];
  agree?: boolean;
}
export type Verdict = "diverge" | "agree" | "agree within statistics" | "incomplete";
export interface Summary {
  baseline: string;
  candidate: string;
  agree: boolean;
  verdict: Verdict;
  /** The verdict in one line, worded by the engine for every front end. */
  verdict_text: string;
  /** Tensor pairs compared element-wise (values) and by statistics only. */
  evidence: { values: number; statistics: number };
  /** The tensors compared by statistics only and the remedy, in the CLI's words (null when none). */
  statistics_only_text?: string | null;
  structure: Structure;
  first_step_divergence: Divergence | null;
  steps_compared: number;
  tensors_compared: number;
  first_divergence: Divergence | null;
  divergences_at_first_step: Divergence[];
  first_nonfinite: Record<string, Nonfinite | null>;
  unmatched: Record<string, string[]>;
  mapping: MappingRow[];
  steps_only: Record<string, number>;
  /** Runs that end before the other: run -> its last step, the other's, and the steps never compared. */
  ended_early?: Record<string, { last: number; other_last: number; steps: number }>;
  policy: { atol: Num; rtol: Num; warmup_steps: number; equal_nan: boolean; accept_read_problems?: boolean; accept_fewer_steps?: boolean };
  problems: { run: string; path: string; offset: number; message: string }[];
  warnings: string[];
  /** Tensors before the first divergent one that only statistics compared at its step, in words (or null). */
  unproven_text?: string | null;
  hparam_text?: string | null;
  generations: Record<string, number>;
}

export type RGB = [number, number, number];
/** The heat map's colour scale, defined once in Python (engine/colour_scale.py) for the tab and the report. */
export interface ColourScale {
  ok_floor: number;
  bad_ceiling: number;
  palettes: Record<"light" | "dark", Record<string, RGB>>;
  /** reason name -> palette key, for reasons drawn in one flat colour */
  flat: Record<string, string>;
  legend: [string, string][];
}
/** ``evidence``: how the column's cells were compared; "statistics" means moments within bounds only. */
export type Evidence = "values" | "partial" | "statistics";
export interface MatrixTensor { tag: string; kind: string; name: string; candidate_tag: string | null; evidence: Evidence }
export interface MatrixResponse {
  tensors: MatrixTensor[];
  /** The columns counted as the headline counts tensors: "776 tensors and 56 element samples". */
  columns_text: string;
  step_start: number[];
  step_end: number[];
  n_steps: number;
  ratio: Float32Array; // decoded; [bucket * n_tensors + tensor]
  reason: Uint8Array;
  /** 1 where the cell's verdict rests on statistics alone (no element compared), same layout. */
  by_statistics: Uint8Array;
  reason_codes: string[];
  no_data: number;
  first: { bucket: number; tensor: number; step: number } | null;
  colour_scale: ColourScale;
}

export interface SideSeries { steps: number[]; values: Num[] }
export interface ScalarPanel {
  baseline: SideSeries | null;
  candidate: SideSeries | null;
  diff: { steps: number[]; abs_diff: Num[]; tolerance: Num[] } | null;
}
export type ScalarsResponse = Record<"lr" | "loss", ScalarPanel>;

export interface RunTensor {
  tag: string;
  dtype: string;
  shape: (number | null)[];
  steps: number[];
  stats: Num[][];
  /** Per step, the shape it ran with, when the graph left a dimension unknown (null otherwise). */
  runtime_shapes?: number[][] | null;
}
export interface TensorResponse {
  tag: string;
  kind: string;
  name: string;
  stats_fields: string[];
  baseline: RunTensor;
  candidate: RunTensor | null;
  /** ``by_statistics``: per step, its verdict rests on statistics alone (no element compared). */
  diff: { steps: number[]; error_ratio: Num[]; reason: string[]; by_statistics: boolean[]; mean_abs_diff: Num[] };
  how: string;
  evidence: Evidence;
  tolerance: { atol: number; rtol: number; warmup_steps: number };
  /** Multi-replica candidate: how many replicas keep copies, and the one shown (null: the one-device value). */
  replicas?: number;
  replica?: number | null;
  values: {
    step: number;
    baseline: Num[] | null;
    candidate: Num[] | null;
    abs_diff: Num[] | null;
    tolerance: Num[] | null;
    /** The atol this step was held to (a slot's is more than the policy's atol), null if not compared. */
    atol: Num;
    truncated: boolean;
  } | null;
}

export class ApiError extends Error {
  constructor(public status: number, message: string) {
    super(message);
  }
}

/** A figure the JSON may leave absent (null): kept absent, so it reads "–", never "NaN". */
export function optNum(x: Num | undefined): number | null {
  return x === null || x === undefined ? null : num(x);
}

export function num(x: Num | undefined): number {
  if (x === null || x === undefined) return NaN;
  if (typeof x === "number") return x;
  if (x === "Infinity") return Infinity;
  if (x === "-Infinity") return -Infinity;
  return NaN;
}

export type Params = Record<string, string | number | string[] | undefined>;

function query(params: Params): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === "") continue;
    if (Array.isArray(v)) v.forEach((item) => q.append(k, item));
    else q.append(k, String(v));
  }
  const s = q.toString();
  return s ? "?" + s : "";
}

/** True for the rejection of a request its caller aborted (a newer one replaced it). */
export function isAbort(err: unknown): boolean {
  return err instanceof DOMException && err.name === "AbortError";
}

async function getJson<T>(route: string, params: Params = {}, signal?: AbortSignal): Promise<T> {
  const res = await fetch("./" + route + query(params), { headers: { Accept: "application/json" }, signal });
  const body = await res.json().catch((err: unknown) => {
    if (isAbort(err)) throw err; // aborted while reading the body: not an answer
    return { error: res.statusText };
  });
  if (!res.ok) throw new ApiError(res.status, String((body as { error?: string }).error ?? res.statusText));
  return body as T;
}

function b64(text: string): Uint8Array {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/**
 * One kind of request at a time: start() aborts the previous one's fetches, so a late
 * answer to a superseded request can neither arrive nor be shown. Callers check
 * signal.aborted after every await (an answer may have been parsed just before the abort).
 */
export class Latest {
  private controller: AbortController | null = null;

  start(): AbortSignal {
    this.controller?.abort();
    this.controller = new AbortController();
    return this.controller.signal;
  }

  cancel(): void {
    this.controller?.abort();
    this.controller = null;
  }
}

export const api = {
  runs: (signal?: AbortSignal) => getJson<RunsResponse>("runs", {}, signal),
  summary: (p: Params, signal?: AbortSignal) => getJson<Summary>("summary", p, signal),
  scalars: (p: Params, signal?: AbortSignal) => getJson<ScalarsResponse>("scalars", p, signal),
  tensor: (p: Params, signal?: AbortSignal) => getJson<TensorResponse>("tensor", p, signal),
  async matrix(p: Params, signal?: AbortSignal): Promise<MatrixResponse> {
    const raw = await getJson<Omit<MatrixResponse, "ratio" | "reason" | "by_statistics"> & { ratio: string; reason: string; by_statistics: string }>("matrix", p, signal);
    const bytes = b64(raw.ratio);
    return { ...raw, ratio: new Float32Array(bytes.buffer, 0, bytes.length / 4), reason: b64(raw.reason), by_statistics: b64(raw.by_statistics) };
  },
};
