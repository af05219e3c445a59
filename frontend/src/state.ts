// The dashboard's selection lives in URL hash parameters so that a reload keeps it.
// Two places: the iframe's own hash (standalone entry page, notebooks) and, when the
// tab runs inside TensorBoard, the top page's hash as `#tb_parity&p.tb_parity.KEY=V`,
// the legacy tf_storage convention TensorBoard itself parses (key=value after `&`).

export interface ViewState {
  baseline?: string;
  candidate?: string;
  tensor?: string;
  step?: string;
  atol?: string;
  rtol?: string;
  warmup?: string;
  /** `tb-parity diff`'s --map, --allow-unmatched, --override, --equal-nan and the --accept-* flags, as typed (flags.ts). */
  flags?: string;
}
const KEYS: (keyof ViewState)[] = ["baseline", "candidate", "tensor", "step", "atol", "rtol", "warmup", "flags"];
const PREFIX = "p.tb_parity.";

/** decodeURIComponent that yields null for a malformed escape (`%zz`) instead of throwing. */
function decode(text: string): string | null {
  try {
    return decodeURIComponent(text);
  } catch {
    return null;
  }
}

function parseHash(hash: string, prefix: string): ViewState {
  const out: ViewState = {};
  for (const part of hash.replace(/^#/, "").split("&")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    const key = decode(part.slice(0, eq));
    if (key === null || !key.startsWith(prefix)) continue;
    const k = key.slice(prefix.length) as keyof ViewState;
    const value = decode(part.slice(eq + 1));
    if (KEYS.includes(k) && value !== null) out[k] = value;
  }
  return out;
}

function encode(state: ViewState, prefix: string): string[] {
  return KEYS.filter((k) => state[k] !== undefined && state[k] !== "").map(
    (k) => encodeURIComponent(prefix + k) + "=" + encodeURIComponent(state[k] as string),
  );
}

function parentWindow(): Window | null {
  try {
    if (window.parent === window) return null;
    void window.parent.location.hash; // throws when cross-origin
    return window.parent;
  } catch {
    return null;
  }
}

export function loadState(): ViewState {
  const own = parseHash(window.location.hash, "");
  if (Object.keys(own).length) return own;
  const parent = parentWindow();
  return parent ? parseHash(parent.location.hash, PREFIX) : {};
}

export function saveState(state: ViewState): void {
  const own = "#" + encode(state, "").join("&");
  // A bare "#..." would resolve against the entry page's <base href="plugin/tb_parity/">
  // and move the frame to a URL that 404s on reload: keep path and query explicitly.
  if (own !== window.location.hash) {
    history.replaceState(null, "", window.location.pathname + window.location.search + own);
  }
  const parent = parentWindow();
  if (!parent) return;
  // Keep TensorBoard's own parts of its hash (the active tab and other plugins' keys).
  const kept = parent.location.hash
    .replace(/^#/, "")
    .split("&")
    .filter((part) => part && !(decode(part.split("=")[0]) ?? "").startsWith(PREFIX));
  if (!kept.length || kept[0].includes("=")) kept.unshift("tb_parity");
  const next = "#" + [...kept, ...encode(state, PREFIX)].join("&");
  if (next !== parent.location.hash) {
    try {
      const url = new URL(parent.location.href);
      url.hash = next;
      parent.history.replaceState(parent.history.state, "", url.toString());
    } catch {
      /* the top page refused; the iframe hash still holds the state */
    }
  }
}
