// DOM helpers that only ever set text: tensor and run names come from user logs and
// may hold HTML, so nothing here (or anywhere in the tab) assigns innerHTML.

export type Child = Node | string | null | undefined | false;

export interface Props {
  cls?: string;
  text?: string;
  title?: string;
  attrs?: Record<string, string>;
  on?: Partial<Record<keyof HTMLElementEventMap, (ev: Event) => void>>;
}

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: Props = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (props.cls) node.className = props.cls;
  if (props.text !== undefined) node.textContent = props.text;
  if (props.title !== undefined) node.title = props.title;
  for (const [k, v] of Object.entries(props.attrs ?? {})) node.setAttribute(k, v);
  for (const [k, fn] of Object.entries(props.on ?? {})) node.addEventListener(k, fn as EventListener);
  append(node, ...children);
  return node;
}

export function append(parent: Node, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    parent.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  }
}

/** Replace every child of `parent` (textContent = "" is safe: it only removes). */
export function replaceChildren(parent: Element, ...children: Child[]): void {
  parent.textContent = "";
  append(parent, ...children);
}

/** A shape as "[?, 16]": a dimension the graph left unknown (`None`, sent as null) shows as "?". */
export function shapeText(dims: readonly (number | null)[]): string {
  return `[${dims.map((d) => (d === null ? "?" : String(d))).join(", ")}]`;
}

/** Compact number formatting for figures: 3 significant digits, exponent when tiny/huge. */
export function fmt(x: number | null | undefined): string {
  if (x === null || x === undefined) return "–";
  if (Number.isNaN(x)) return "NaN";
  if (x === Infinity) return "+Inf";
  if (x === -Infinity) return "−Inf";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (Number.isInteger(x) && a < 1e6) return String(x);
  if (a >= 1e4 || a < 1e-3) return x.toExponential(2);
  return x.toPrecision(4).replace(/\.?0+$/, "");
}
