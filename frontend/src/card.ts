// The first-divergence card and, beside it, each run's first NaN/Inf (the way
// Debugger V2's Alerts panel points at the first non-finite tensor).
import { num, Summary } from "./api";
import { el, fmt, replaceChildren } from "./dom";

export interface CardActions {
  openDivergence: () => void;
  openNonfinite: (run: string, tensorTag: string, step: number) => void;
}

function figure(label: string, value: string): HTMLElement {
  return el("span", {}, label + " ", el("b", { text: value }));
}

export function renderCard(card: HTMLElement, alerts: HTMLElement, s: Summary, roles: Record<string, string>, act: CardActions): void {
  const d = s.first_divergence;
  card.className = "tbp-card " + (d ? "diverge" : "agree");
  card.setAttribute("data-verdict", d ? "diverge" : "agree");
  card.onclick = d ? () => act.openDivergence() : null;
  card.title = d ? "Show this cell in the heat map and open its detail" : "";
  if (d) {
    const others = s.divergences_at_first_step.length - 1;
    replaceChildren(
      card,
      el("div", { cls: "headline", attrs: { "data-testid": "verdict" }, text: `First divergence at step ${d.step}` }),
      el(
        "div",
        {},
        el("span", { cls: "tbp-chip", text: d.kind }),
        el("span", { cls: "tbp-chip reason", text: d.reason }),
        el("span", { cls: "tensor", attrs: { "data-testid": "divergence-tensor" }, text: d.tensor }),
        d.candidate_tensor && d.candidate_tensor !== d.tensor ? el("span", { cls: "tbp-hint", text: `  ↔ ${d.candidate_tensor}` }) : null,
      ),
      el(
        "div",
        { cls: "tbp-figures" },
        figure("max |Δ|", fmt(num(d.max_abs_diff))),
        figure("max rel", fmt(num(d.max_rel_diff))),
        figure("error / tolerance", fmt(num(d.error_ratio)) + "×"),
        d.cosine !== null ? figure("cosine", fmt(num(d.cosine))) : null,
        d.mismatch_fraction !== null ? figure("mismatched", fmt(num(d.mismatch_fraction) * 100) + "%") : null,
      ),
      el(
        "div",
        { cls: "tbp-hint" },
        others > 0 ? `${others} more tensor(s) also diverge at step ${d.step}. ` : "",
        `Compared ${s.steps_compared} steps × ${s.tensors_compared} tensors. Click to open.`,
      ),
    );
  } else {
    replaceChildren(
      card,
      el("div", {
        cls: "headline",
        attrs: { "data-testid": "verdict" },
        text: s.steps_compared
          ? `Runs agree within tolerance across ${s.steps_compared} steps and ${s.tensors_compared} tensors`
          : "Nothing to compare yet: the runs share no logged step",
      }),
      el("div", { cls: "tbp-hint", text: `atol ${fmt(num(s.policy.atol))}, rtol ${fmt(num(s.policy.rtol))} after ${s.policy.warmup_steps} warm-up steps.` }),
    );
  }
  replaceChildren(alerts);
  for (const run of [s.baseline, s.candidate]) {
    const nf = s.first_nonfinite[run];
    const role = roles[run] ?? run;
    if (nf) {
      const tag = `${nf.kind}/${nf.tensor}`;
      alerts.appendChild(
        el(
          "div",
          {
            cls: "tbp-alert nonfinite",
            attrs: { "data-testid": "nan-alert", "data-run": run },
            title: "Open this tensor",
            on: { click: () => act.openNonfinite(run, tag, nf.step) },
          },
          el("div", { cls: "title", text: `⚠ ${role}: first NaN/Inf at step ${nf.step}` }),
          el("div", { cls: "tbp-mono", text: tag }),
          el("div", { cls: "tbp-hint", text: run }),
        ),
      );
    } else {
      alerts.appendChild(
        el("div", { cls: "tbp-alert", attrs: { "data-run": run } }, el("div", { cls: "title", text: `${role}: no NaN/Inf` }), el("div", { cls: "tbp-hint", text: run })),
      );
    }
  }
}
