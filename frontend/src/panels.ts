// Unmatched names on each side, the name mapping the engine used, and read problems.
import { Summary } from "./api";
import { el, replaceChildren } from "./dom";

export function renderPanels(host: HTMLElement, s: Summary, roles: Record<string, string>): void {
  const unmatched = [s.baseline, s.candidate].map((run) => {
    const names = s.unmatched[run] ?? [];
    return el(
      "div",
      { attrs: { "data-testid": "unmatched" } },
      el("b", { text: `${roles[run] ?? run} only (${names.length})` }),
      names.length
        ? el("ul", { cls: "tbp-list tbp-mono" }, ...names.map((n) => el("li", { text: n })))
        : el("div", { cls: "tbp-hint", text: "none" }),
    );
  });
  const renamed = s.mapping.filter((m) => m.how !== "exact");
  const mapping = el(
    "div",
    { cls: "tbp-scroll" },
    el(
      "table",
      { cls: "tbp-table", attrs: { "data-testid": "mapping" } },
      el("thead", {}, el("tr", {}, el("th", { cls: "l", text: "kind" }), el("th", { cls: "l", text: "baseline" }), el("th", { cls: "l", text: "candidate" }), el("th", { cls: "l", text: "how" }))),
      el(
        "tbody",
        {},
        ...s.mapping.map((m) =>
          el("tr", {}, el("td", { cls: "l", text: m.kind }), el("td", { cls: "l tbp-mono", text: m.baseline }), el("td", { cls: "l tbp-mono", text: m.candidate }), el("td", { cls: "l", text: m.how })),
        ),
      ),
    ),
  );
  const problems = s.problems.length
    ? el("ul", { cls: "tbp-list" }, ...s.problems.map((p) => el("li", { text: `${p.run}: ${p.path} @${p.offset}: ${p.message}` })))
    : null;
  replaceChildren(
    host,
    el("div", { cls: "tbp-section" }, el("h2", { text: "Unmatched names" }), ...unmatched),
    el(
      "div",
      { cls: "tbp-section" },
      el("h2", { text: `Name mapping (${s.mapping.length} pairs, ${renamed.length} not exact)` }),
      mapping,
    ),
    problems ? el("div", { cls: "tbp-section" }, el("h2", { text: "Read problems" }), problems) : null,
  );
}
