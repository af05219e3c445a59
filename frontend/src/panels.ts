// The structure report (what each run recorded: tensors of one run only, variables per
// run, shape mismatches, variables created twice) and the name mapping the engine used.
// Read problems sit beside the verdict (card.ts), not here.
import { ShapeMismatch, Summary } from "./api";
import { el, replaceChildren, shapeText as shape } from "./dom";
import { shellQuote } from "./flags";

function table(testid: string, head: string[], rows: string[][]): HTMLElement {
  return el(
    "table",
    { cls: "tbp-table", attrs: { "data-testid": testid } },
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { cls: "l", text: h })))),
    el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c) => el("td", { cls: "l tbp-mono", text: c }))))),
  );
}

/** Adds ``flag value`` to the tab's flags field and compares again (app.ts). */
export type ApplyFlag = (flag: string, value: string) => void;

function structurePanel(s: Summary, roles: Record<string, string>, apply?: ApplyFlag): HTMLElement {
  const st = s.structure ?? {};
  const runs = [s.baseline, s.candidate];
  const onlyIn = st.only_in ?? {};
  const unexpected = runs.reduce((n, run) => n + (onlyIn[run] ?? []).filter((e) => !e.expected).length, 0);
  const mismatches: ShapeMismatch[] = st.shape_mismatches ?? [];
  const agree = st.agree ?? (unexpected === 0 && mismatches.length === 0);
  const variables = st.variables ?? {};
  const oneSide = runs.map((run) => {
    const entries = onlyIn[run] ?? s.unmatched[run]?.map((tag) => ({ tag, kind: "", shape: [], size: 0, expected: false })) ?? [];
    return el(
      "div",
      { attrs: { "data-testid": "unmatched", "data-run": run } },
      el("b", { text: `${roles[run] ?? run} only (${entries.length})` }),
      entries.length
        ? el(
            "ul",
            { cls: "tbp-list tbp-mono" },
            ...entries.map((e) =>
              el(
                "li",
                { attrs: { "data-testid": "only-in", "data-expected": String(e.expected) } },
                e.tag,
                e.kind ? el("span", { cls: "tbp-hint", text: `  ${shape(e.shape)}, ${e.size} elements` }) : null,
                e.expected ? el("span", { cls: "tbp-chip", text: "expected" }) : null,
                e.candidates?.length ? el("div", { cls: "tbp-hint", text: `same kind and shape, ambiguous: ${e.candidates.join(", ")}` }) : null,
                ...(e.hints ?? []).map((hint) => el("div", { cls: "tbp-hint", attrs: { "data-testid": "only-in-hint" }, text: hint })),
              ),
            ),
          )
        : el("div", { cls: "tbp-hint", text: "none" }),
    );
  });
  const twice = runs.flatMap((run) => (st.created_twice?.[run] ?? []).map((t) => [roles[run] ?? run, t.tag, t.like]));
  const patterns = st.allow_unmatched ?? [];
  return el(
    "div",
    { cls: "tbp-section tbp-wide", attrs: { "data-testid": "structure", "data-agree": String(agree) } },
    el("h2", { text: "Structure (from the layouts, before any step)" }),
    el("div", {
      cls: "headline " + (agree ? "ok" : "bad"),
      text: agree
        ? "Structure agrees: every tensor found its counterpart with the same shape."
        : `Structure differs: ${unexpected} tensor(s) recorded by one run only, ${mismatches.length} shape mismatch(es).`,
    }),
    table(
      "variables",
      ["run", "variables", "elements"],
      runs.filter((run) => variables[run]).map((run) => [roles[run] ?? run, String(variables[run].count), String(variables[run].size)]),
    ),
    el("div", { cls: "tbp-columns" }, ...oneSide),
    mismatches.length
      ? table(
          "shape-mismatches",
          ["kind", "baseline", "shape", "candidate", "shape", "matched by"],
          mismatches.map((m) => [m.kind, m.baseline, shape(m.baseline_shape), m.candidate, shape(m.candidate_shape), m.how]),
        )
      : null,
    twice.length ? el("div", {}, el("b", { text: "Created twice (a layer built again instead of reused)" }), table("created-twice", ["run", "variable", "repeats"], twice)) : null,
    patterns.length ? el("div", { cls: "tbp-hint", text: `Declared expected: ${patterns.join(", ")}` }) : null,
    st.suggested_maps?.length
      ? el(
          "div",
          { cls: "tbp-hint", attrs: { "data-testid": "suggested-maps" } },
          `Suggested: ${st.suggested_maps.map((m) => `--map ${shellQuote(m)}`).join(" ")} ` +
            "(layers whose variables went unmatched on both sides with the same names under them and the same sizes; check each pairing first) ",
          ...(apply
            ? st.suggested_maps.map((m) =>
                el("button", {
                  cls: "tbp-btn",
                  text: `Apply --map ${shellQuote(m)}`,
                  title: "add this --map to the flags field and compare again",
                  attrs: { type: "button", "data-testid": "apply-map" },
                  on: { click: () => apply("--map", m) },
                }),
              )
            : []),
        )
      : null,
  );
}

export function renderPanels(host: HTMLElement, s: Summary, roles: Record<string, string>, apply?: ApplyFlag): void {
  const renamed = s.mapping.filter((m) => m.how !== "exact");
  const mapping = el(
    "div",
    { cls: "tbp-scroll" },
    table("mapping", ["kind", "baseline", "candidate", "how"], s.mapping.map((m) => [m.kind, m.baseline, m.candidate, m.how])),
  );
  replaceChildren(
    host,
    structurePanel(s, roles, apply),
    el(
      "div",
      { cls: "tbp-section" },
      el("h2", { text: `Name mapping (${s.mapping.length} pairs, ${renamed.length} not exact)` }),
      mapping,
    ),
  );
}
