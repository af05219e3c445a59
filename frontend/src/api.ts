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
}
export interface Nonfinite { step: number; tensor: string; kind: string }
export interface MappingRow { baseline: string; candidate: string; kind: string; how: string }
export interface Summary {
  baseline: string;
  candidate: string;
  agree: boolean;
  steps_compared: number;
  tensors_compared: number;
  first_divergence: Divergence | null;
  divergences_at_first_step: Divergence[];
  first_nonfinite: Record<string, Nonfinite | null>;
  unmatched: Record<string, string[]>;
  mapping: MappingRow[];
  steps_only: Record<string, number>;
  policy: { atol: Num; rtol: Num; warmup_steps: number; equal_nan: boolean };
  problems: { run: string; path: string; offset: number; message: string }[];
  generations: Record<string, number>;
}

export interface MatrixTensor { tag: string; kind: string; name: string; candidate_tag: string | null }
export interface MatrixResponse {
  tensors: MatrixTensor[];
  step_start: number[];
  step_end: number[];
  n_steps: number;
  ratio: Float32Array; // decoded; [bucket * n_tensors + tensor]
  reason: Uint8Array;
  reason_codes: string[];
  no_data: number;
  first: { bucket: number; tensor: number; step: number } | null;
}

export interface SideSeries { steps: number[]; values: Num[] }
export interface ScalarPanel {
  baseline: SideSeries | null;
  candidate: SideSeries | null;
  diff: { steps: number[]; abs_diff: Num[]; tolerance: Num[] } | null;
}
export type ScalarsResponse = Record<"lr" | "loss", ScalarPanel>;

export interface RunTensor { tag: string; dtype: string; shape: (number | null)[]; steps: number[]; stats: Num[][] }
export interface TensorResponse {
  tag: string;
  kind: string;
  name: string;
  stats_fields: string[];
  baseline: RunTensor;
  candidate: RunTensor | null;
  diff: { steps: number[]; error_ratio: Num[]; reason: string[]; mean_abs_diff: Num[] };
  how: string;
  tolerance: { atol: number; rtol: number; warmup_steps: number };
  values: {
    step: number;
    baseline: Num[] | null;
    candidate: Num[] | null;
    abs_diff: Num[] | null;
    tolerance: Num[] | null;
    truncated: boolean;
  } | null;
}

export class ApiError extends Error {
  constructor(public status: number, message: string) {
    super(message);
  }
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

async function getJson<T>(route: string, params: Params = {}): Promise<T> {
  const res = await fetch("./" + route + query(params), { headers: { Accept: "application/json" } });
  const body = await res.json().catch(() => ({ error: res.statusText }));
  if (!res.ok) throw new ApiError(res.status, String((body as { error?: string }).error ?? res.statusText));
  return body as T;
}

function b64(text: string): Uint8Array {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export const api = {
  runs: () => getJson<RunsResponse>("runs"),
  summary: (p: Params) => getJson<Summary>("summary", p),
  scalars: (p: Params) => getJson<ScalarsResponse>("scalars", p),
  tensor: (p: Params) => getJson<TensorResponse>("tensor", p),
  async matrix(p: Params): Promise<MatrixResponse> {
    const raw = await getJson<Omit<MatrixResponse, "ratio" | "reason"> & { ratio: string; reason: string }>("matrix", p);
    const bytes = b64(raw.ratio);
    return { ...raw, ratio: new Float32Array(bytes.buffer, 0, bytes.length / 4), reason: b64(raw.reason) };
  },
};
