"""The verdict's strength, the evidence behind each divergence and the structure report, in the tab.

Issue 9's front-end parts: "agree within statistics" shown apart from a plain agree, each
divergence's ``evidence`` and ``note``, a structure panel (tensors of one run only,
variables per run, shape mismatches, variables created twice) and read problems beside
the verdict. Expected values come from the engine (``api.compare``), as in test_dashboard.
"""

from __future__ import annotations

import os
import re
import sys
from urllib.parse import quote

import numpy as np
import pytest
from playwright.sync_api import expect

from tb_parity_plugin import api
from tb_parity_plugin.engine import tolerance

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import plugin_fixtures as fx

from browser.test_dashboard import TIMEOUT, open_tab, verdict

one_server = pytest.mark.parametrize("server", ["load_fast_false"], indirect=True)


def engine(logdir: str, pair: str) -> api.ParityReport:
    """The engine's report with the runs named as the tab names them (notes quote run names)."""
    return api.compare(logdir, f"{pair}/tf1", f"{pair}/tf2")


def amber_card(page, server: str, pair: str, report: api.ParityReport, headline: str):  # type: ignore[no-untyped-def]
    """The tab's card for ``pair`` drawn in amber (a verdict weaker than an agreement), its headline
    holding ``headline`` and its text the engine's ``verdict_text``: (frame, card)."""
    frame = open_tab(page, server, pair)
    card = frame.locator("[data-testid=card]")
    assert verdict(frame) == report.verdict
    assert "stats" in card.get_attribute("class")
    assert headline in card.locator("[data-testid=verdict]").inner_text()
    assert report.verdict_text in card.locator("[data-testid=verdict-text]").inner_text()
    return frame, card


@one_server
def test_structure_divergence_and_the_structure_panel(page, server: str, demo_logdir: str) -> None:
    report = engine(demo_logdir, "structure")
    first = report.first_divergence
    assert first is not None and first.reason == "structure"
    st = report.structure
    frame = open_tab(page, server, "structure")
    assert verdict(frame) == "diverge"
    card = frame.locator("[data-testid=card]")
    assert "Structure differs" in card.locator("[data-testid=verdict]").inner_text()
    assert card.locator("[data-testid=divergence-tensor]").inner_text() == first.tensor  # the HTML name, as text
    assert card.locator("[data-testid=divergence-evidence]").first.inner_text() == f"by {first.evidence}"
    assert first.note and first.note in card.locator("[data-testid=divergence-note]").first.inner_text()
    assert card.locator("[data-testid=verdict-text]").inner_text() == report.verdict_text
    rows = card.locator("[data-testid=divergences] [data-testid=divergence]")
    assert rows.count() == len(report.divergences_at_first_step)
    for i, d in enumerate(report.divergences_at_first_step):
        assert d.note in rows.nth(i).inner_text() and d.evidence in rows.nth(i).inner_text()
    later = report.first_step_divergence
    assert later is not None
    link = card.locator("[data-testid=first-step-divergence]")
    assert f"step {later.step}" in link.inner_text() and later.tensor in link.inner_text()

    panel = frame.locator("[data-testid=structure]")
    assert panel.get_attribute("data-agree") == "false"
    variables = panel.locator("[data-testid=variables] tbody tr")
    for i, run in enumerate(("structure/tf1", "structure/tf2")):
        cells = variables.nth(i).locator("td").all_inner_texts()
        assert cells[1:] == [str(st["variables"][run]["count"]), str(st["variables"][run]["size"])]
    for run, entries in st["only_in"].items():
        shown = panel.locator(f"[data-testid=unmatched][data-run='{run}'] [data-testid=only-in]")
        assert shown.count() == len(entries)
        for k, e in enumerate(entries):
            assert shown.nth(k).inner_text().startswith(e["tag"])
    # a structure hint (the engine's words) under its entry: the tied projection ported as a layer
    (tied,) = [e for e in st["only_in"]["structure/tf2"] if e.get("hints")]
    assert tied["tag"] == "weight/lm/out/kernel" and tied["transpose_of"] == "weight/lm/embedding"
    entry = panel.locator("[data-testid=unmatched][data-run='structure/tf2'] [data-testid=only-in]", has_text="lm/out")
    assert entry.locator("[data-testid=only-in-hint]").all_inner_texts() == tied["hints"]
    (mismatch,) = st["shape_mismatches"]
    text = panel.locator("[data-testid=shape-mismatches] tbody tr").inner_text()
    assert mismatch["baseline"] in text and "[4]" in text and "[5]" in text
    (twice,) = st["created_twice"]["structure/tf2"]
    text = panel.locator("[data-testid=created-twice] tbody tr").inner_text()
    assert twice["tag"] in text and twice["like"] in text
    assert st["suggested_maps"] == ["re:^enc/attn/=mha/attn/"]
    assert "--map 're:^enc/attn/=mha/attn/'" in panel.locator("[data-testid=suggested-maps]").inner_text()
    # user-controlled names stay text everywhere (the baseline-only weight is named with HTML)
    assert frame.locator("img").count() == 0
    for f in page.frames:
        assert f.evaluate("() => window.__xss === undefined"), f.url

    card.click()  # a structure divergence has no pair to detail: the card shows the structure panel
    expect(panel).to_be_in_viewport(timeout=TIMEOUT)
    link.click()  # the first divergence among the compared steps opens as usual
    detail = frame.locator("[data-testid=detail]")
    expect(detail.locator("[data-testid=detail-tensor]")).to_have_text(f"{later.kind}/{later.tensor}", timeout=TIMEOUT)


@one_server
def test_agreement_on_statistics_is_shown_as_weaker(page, server: str, demo_logdir: str) -> None:
    report = engine(demo_logdir, "stats_clean")
    assert report.verdict == "agree within statistics" and not report.problems
    frame, card = amber_card(page, server, "stats_clean", report, "agree within statistics")
    evidence = card.locator("[data-testid=evidence]").inner_text()
    assert f"{report.evidence['statistics']} by statistics" in evidence
    assert f"{report.evidence['values']} element-wise" in evidence
    # the tensors the weaker evidence covers and the remedy, as the CLI and the report say them
    line = report.to_dict()["statistics_only_text"]
    assert line and report.statistics_only[0] in line and "full_values_limit" in line
    assert card.locator("[data-testid=statistics-only]").inner_text() == line
    assert frame.locator("[data-testid=problems-alert]").count() == 0


@one_server
def test_read_problems_make_no_agreement_and_are_shown_beside_the_verdict(page, server: str, demo_logdir: str) -> None:
    report = engine(demo_logdir, "stats")
    assert report.verdict == "incomplete" and report.problems and not report.agree
    frame, _ = amber_card(page, server, "stats", report, "not an agreement")
    alert = frame.locator("[data-testid=problems-alert]")
    assert f"{len(report.problems)} read problem" in alert.inner_text()
    for p in report.problems:
        assert p["path"] in alert.inner_text() and p["message"] in alert.inner_text()
    assert frame.locator("[data-testid=structure]").get_attribute("data-agree") == "true"


@one_server
def test_a_port_that_stopped_early_is_no_agreement_in_the_tab(page, server: str, demo_logdir: str) -> None:
    """A new user's port trained fewer steps and every front end said AGREE: the tab says which
    run ended where, in amber, as the CLI and the report do."""
    report = engine(demo_logdir, "short")
    assert report.verdict == "incomplete" and not report.problems
    assert report.ended_early == {"short/tf2": {"last": 5, "other_last": 8, "steps": 3}}
    frame, _ = amber_card(page, server, "short", report, "'short/tf2' ended early: not an agreement")
    assert frame.locator("[data-testid=problems-alert]").count() == 0


@one_server
def test_a_divergence_after_tensors_only_statistics_compared_says_it_may_start_upstream(
    page, server: str, demo_logdir: str
) -> None:
    report = engine(demo_logdir, "upstream")
    assert report.unproven_before_first == ["weight/emb"] and report.unproven_text
    frame = open_tab(page, server, "upstream")
    alert = frame.locator("[data-testid=unproven-alert]")
    alert.wait_for(timeout=TIMEOUT)
    assert report.unproven_text in alert.inner_text()
    frame.locator("[data-testid=pair]").select_option(label="clean")
    frame.locator("[data-testid=card][data-verdict=agree]").wait_for(timeout=TIMEOUT)
    assert frame.locator("[data-testid=unproven-alert]").count() == 0


@one_server
def test_a_value_divergence_shows_its_evidence_and_a_plain_agree_stays_plain(
    page, server: str, demo_logdir: str
) -> None:
    first = engine(demo_logdir, "lr_offbyone").first_divergence
    assert first is not None and first.evidence == "values"
    frame = open_tab(page, server, "lr_offbyone")
    card = frame.locator("[data-testid=card]")
    assert card.locator("[data-testid=divergence-evidence]").inner_text() == "by values"
    assert (first.note or "") in card.locator("[data-testid=divergence-note]").inner_text()
    assert frame.locator("[data-testid=problems-alert]").count() == 0
    frame.locator("[data-testid=pair]").select_option(label="clean")
    frame.locator("[data-testid=card][data-verdict=agree]").wait_for(timeout=TIMEOUT)
    assert frame.locator("[data-testid=evidence]").count() == 0
    assert frame.locator("[data-testid=statistics-only]").count() == 0
    assert "stats" not in card.get_attribute("class")
    assert fx.HTML_NAME not in card.inner_text()


@one_server
def test_the_detail_shows_one_replica_or_the_one_device_value(page, server: str, demo_logdir: str) -> None:
    report = engine(demo_logdir, "replicas")
    assert report.agree and report.replicas["replicas/tf2"]["count"] == 2
    frame = open_tab(page, server, "replicas")
    frame.locator("[data-testid=heatmap]").click(position={"x": 5, "y": 5})
    detail = frame.locator("[data-testid=detail]")
    detail.locator("[data-testid=detail-step]").wait_for(timeout=TIMEOUT)
    picker = detail.locator("[data-testid=replica]")
    assert picker.locator("option").count() == 3  # the one-device value and two replicas
    step = int(detail.locator("[data-testid=detail-step]").inner_text().split()[1])
    comparison = report.comparison
    assert comparison is not None
    for k in (1, 0):
        expected = comparison.detail("grad/dense/kernel:0", step, replica=k).cand_values
        picker.select_option(str(k))
        cell = detail.locator("[data-testid=values] tbody tr").first.locator("td").nth(2)
        expect(cell).to_have_text(f"{float(expected.reshape(-1)[0]):.4g}", timeout=TIMEOUT)


@one_server
def test_the_detail_names_the_shapes_a_none_batch_ran_with(page, server: str, demo_logdir: str) -> None:
    """The demo's shape-agnostic pair: placeholders [None, 3], a partial last batch of 5."""
    report = engine(demo_logdir, "none_batch")
    assert report.verdict == "agree"
    last = report.steps_compared - 1
    tag = quote("activation/dense", safe="")
    frame = open_tab(page, server, "none_batch", f"&p.tb_parity.tensor={tag}&p.tb_parity.step={last}")
    shapes = frame.locator("[data-testid=detail-runtime-shape]")
    expect(shapes).to_have_text("ran as [5, 2] | [5, 2]", timeout=TIMEOUT)
    # the graph's shape names the unknown batch dimension (it read "[, 2]" to a new user)
    assert frame.locator("[data-testid=detail-shape]").inner_text() == "float32 [?, 2]"
    assert frame.locator("[data-testid=values] tbody tr").count() == 10  # the step's own 5 x 2 values


@one_server
def test_the_values_table_holds_a_slot_to_the_atol_its_verdict_used(page, server: str, demo_logdir: str) -> None:
    """A slot's atol includes 1e-4 of its largest element: the table must not mark an element out
    of tolerance on a pair the verdict calls agree (it used the policy's bare atol)."""
    report = engine(demo_logdir, "slot")
    assert report.agree
    base = np.array([1.0, -0.5, 0.25, 0.001], np.float32).astype(np.float64)  # the fixture's slot
    atol = 1e-5 * tolerance.SLOT_ATOL_SCALE + tolerance.SLOT_ATOL_OF_MAX * np.abs(base).max()
    assert 5e-5 > 1e-5 * tolerance.SLOT_ATOL_SCALE + tolerance.SLOT_RTOL * 0.001  # numpy: past the bare rule
    tag = quote("slot/dense/kernel/Momentum:0", safe="")
    frame = open_tab(page, server, "slot", f"&p.tb_parity.tensor={tag}&p.tb_parity.step=2")
    rows = frame.locator("[data-testid=values] tbody tr")
    expect(rows).to_have_count(4, timeout=TIMEOUT)
    assert frame.locator("[data-testid=values] td.out").count() == 0
    shown = [float(rows.nth(i).locator("td").nth(4).inner_text()) for i in range(4)]
    np.testing.assert_allclose(shown, atol + tolerance.SLOT_RTOL * np.abs(base), rtol=1e-2)  # 3 digits shown
    hint = frame.locator("[data-testid=step-atol]").inner_text()
    assert float(re.search(r"atol at step 2: (\S+)", hint).group(1)) == pytest.approx(atol, rel=1e-2), hint


@one_server
def test_a_statistics_only_cell_is_drawn_apart_from_an_agreement(page, server: str, demo_logdir: str) -> None:
    """A new user's embedding cell, compared by statistics alone, was pale green and "4.6e-9 ok"
    while numpy had 25 of its elements 42x out of tolerance: such cells get their own colour, and
    the tooltip and the detail say the elements were not compared."""
    from tb_parity_plugin.engine import colour_scale

    report = engine(demo_logdir, "upstream")
    m = report.matrix()
    col = m.tensors.index("weight/emb")
    step = 1  # the fixture's element off by 1e-3 from here on, which no statistic can prove
    row = int(np.flatnonzero(m.step_start == step)[0])
    assert m.evidence[col] == "statistics" and m.reason[row, col] == 0  # the engine: "ok" by statistics
    frame = open_tab(page, server, "upstream")
    canvas = frame.locator("[data-testid=heatmap]")
    n_steps, n_tensors = m.error_ratio.shape
    row_h = max(2, min(16, 480 // n_tensors))  # heatmap.ts's row height
    box = canvas.bounding_box()
    x, y = (row + 0.5) * box["width"] / n_steps, (col + 0.5) * row_h
    pixel = canvas.evaluate(
        "(c, [x, y]) => { const d = window.devicePixelRatio || 1;"
        " return Array.from(c.getContext('2d').getImageData(Math.floor(x * d), Math.floor(y * d), 1, 1).data).slice(0, 3); }",
        [x, y],
    )
    assert tuple(pixel) == colour_scale.PALETTES["light"]["unproven"], pixel
    assert frame.locator("[data-swatch=unproven]").count() == 1
    canvas.hover(position={"x": x, "y": y})
    tip = frame.locator("[data-testid=heat-tooltip]")
    expect(tip).to_contain_text("weight/emb", timeout=TIMEOUT)
    assert "ok by statistics only" in tip.inner_text() and "elements were not compared" in tip.inner_text()
    canvas.click(position={"x": x, "y": y})
    detail = frame.locator("[data-testid=detail]")
    expect(detail.locator("[data-testid=detail-tensor]")).to_have_text("weight/emb", timeout=TIMEOUT)
    cells = detail.locator(f"[data-testid=detail-steps] tr[data-step='{step}'] td")
    expect(cells.last).to_have_text("ok (statistics)", timeout=TIMEOUT)


@one_server
def test_a_long_note_wraps_instead_of_widening_the_page(page, server: str, demo_logdir: str) -> None:
    """A new user's tab was 1987 px wide in a 1400 px window: a note in a cell that did not wrap."""
    report = engine(demo_logdir, "scaled")
    first = report.first_divergence
    assert first is not None and len(first.note or "") > 250 and len(report.divergences_at_first_step) == 2, first
    frame = open_tab(page, server, "scaled")
    assert (first.note or "") in frame.locator("[data-testid=divergence-note]").inner_text()
    note_cell = frame.locator("[data-testid=divergence] td").last
    assert (report.divergences_at_first_step[1].note or "") == note_cell.inner_text()
    widths = frame.locator("body").evaluate("b => [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], widths
    assert note_cell.bounding_box()["height"] > 40  # several lines


@one_server
def test_the_flags_field_gives_the_verdict_the_cli_gives_with_them(page, server: str, demo_logdir: str) -> None:
    """A run pair that needs ``--map`` and ``--allow-unmatched`` (the structure pair: a layer renamed
    and reshaped, tensors one run alone records) showed a structure divergence in the tab whatever
    the CLI said with those flags: the tab took only atol, rtol and the warm-up. The flags field
    takes them as the CLI's words, quoted as a shell quotes them, and the URL keeps them."""
    mapping = ["re:^enc/attn/=mha/attn/"]
    allowed = ["weight/lm/out/*", "*dense_3*"]
    flagged = api.compare(demo_logdir, "structure/tf1", "structure/tf2", mapping=mapping, allow_unmatched=allowed)
    plain = engine(demo_logdir, "structure")
    assert flagged.to_dict()["structure"] != plain.to_dict()["structure"]  # the flags change the report
    frame = open_tab(page, server, "structure")
    flags = frame.locator("[data-testid=flags]")
    flags.fill("--map 're:^enc/attn/=mha/attn/' --allow-unmatched='weight/lm/out/*' --allow-unmatched \"*dense_3*\"")
    card = frame.locator("[data-testid=card]")
    expect(card.locator("[data-testid=verdict-text]")).to_have_text(flagged.verdict_text, timeout=TIMEOUT)
    assert verdict(frame) == flagged.verdict
    panel = frame.locator("[data-testid=structure]")
    for run, entries in flagged.structure["only_in"].items():
        shown = panel.locator(f"[data-testid=unmatched][data-run='{run}'] [data-testid=only-in]")
        expect(shown).to_have_count(len(entries), timeout=TIMEOUT)
    assert "flags=" in frame.locator("body").evaluate("() => window.location.hash")
    # a flag the CLI does not take is an error shown in the tab, as a route's would be
    flags.fill("--bogus 1")
    expect(frame.locator("[data-testid=error]")).to_contain_text("unknown flag", timeout=TIMEOUT)


@one_server
def test_a_suggested_map_is_applied_from_the_structure_panel(page, server: str, demo_logdir: str) -> None:
    """The structure panel's suggested ``--map`` had to be copied into the flags field by hand. Its
    button puts it there, quoted as the shell would take it, beside what the user already typed, and
    the tab then shows the verdict and structure the CLI gives with that map (and suggests nothing)."""
    plain = engine(demo_logdir, "structure")
    (suggested,) = plain.structure["suggested_maps"]
    allowed = ["*dense_3*"]
    mapped = api.compare(demo_logdir, "structure/tf1", "structure/tf2", mapping=[suggested], allow_unmatched=allowed)
    assert mapped.structure["suggested_maps"] == [] and mapped.verdict_text != plain.verdict_text
    frame = open_tab(page, server, "structure")
    flags = frame.locator("[data-testid=flags]")
    flags.fill("--allow-unmatched '*dense_3*'")
    panel = frame.locator("[data-testid=structure]")
    button = panel.locator("[data-testid=apply-map]")
    expect(button).to_have_count(1, timeout=TIMEOUT)
    expect(button).to_have_text(f"Apply --map '{suggested}'")
    button.click()
    expect(flags).to_have_value(f"--allow-unmatched '*dense_3*' --map '{suggested}'", timeout=TIMEOUT)
    card = frame.locator("[data-testid=card]")
    expect(card.locator("[data-testid=verdict-text]")).to_have_text(mapped.verdict_text, timeout=TIMEOUT)
    expect(panel.locator("[data-testid=suggested-maps]")).to_have_count(0, timeout=TIMEOUT)
    for run, entries in mapped.structure["only_in"].items():
        shown = panel.locator(f"[data-testid=unmatched][data-run='{run}'] [data-testid=only-in]")
        expect(shown).to_have_count(len(entries), timeout=TIMEOUT)
    assert "flags=" in frame.locator("body").evaluate("() => window.location.hash")


@one_server
@pytest.mark.parametrize(
    ("pair", "flags"),
    [
        ("short", {"--accept-fewer-steps": "accept_fewer_steps"}),
        # its corrupt last record also ends the port a step early: both flags
        ("stats", {"--accept-read-problems": "accept_read_problems", "--accept-fewer-steps": "accept_fewer_steps"}),
    ],
)
def test_the_flags_an_incomplete_verdict_names_are_taken_by_the_flags_field(
    page, server: str, demo_logdir: str, pair: str, flags: dict
) -> None:
    """An INCOMPLETE card ends "Accept it with --accept-fewer-steps" (or --accept-read-problems), as
    the CLI's line does; typed into the tab's flags field, that flag was refused ("unknown flag ...:
    the tab takes --map, --allow-unmatched, --override and --equal-nan"), and the tab could not show
    the verdict the CLI gives with it, though its routes take the parameter."""
    plain = engine(demo_logdir, pair)
    accepted = api.compare(demo_logdir, f"{pair}/tf1", f"{pair}/tf2", **{key: True for key in flags.values()})
    assert plain.verdict == "incomplete" and any(flag in plain.verdict_text for flag in flags)
    assert accepted.verdict != "incomplete" and accepted.first_divergence is None
    frame = open_tab(page, server, pair)
    field = frame.locator("[data-testid=flags]")
    field.fill(" ".join(flags))
    card = frame.locator("[data-testid=card]")
    expect(card).to_have_attribute("data-verdict", accepted.verdict, timeout=TIMEOUT)
    expect(card.locator("[data-testid=verdict-text]")).to_contain_text(accepted.verdict_text, timeout=TIMEOUT)
    expect(frame.locator("[data-testid=error]")).not_to_contain_text("unknown flag")
    assert "flags=" in frame.locator("body").evaluate("() => window.location.hash")


def test_a_shape_divergence_shows_no_nan_for_figures_it_has_none_of(page, tmp_path) -> None:
    """A TF1 original fed ids padded to a fixed width 2 wider than any row, against a ragged Keras
    ``fit`` port (recorded padded to each batch's longest row): the lookup differs in shape, and has
    no element-wise figures (null in the summary; the CLI says n/a, the report "–"). The card said
    "max |Δ| NaN, max rel NaN, error / tolerance NaN×" and the values table "NaN" in every |Δ| cell,
    which reads as NaNs in the runs, where numpy has every element finite."""
    import test_ragged_outputs as ragged  # TensorFlow: imported by this test only
    from tensorboard_process import tensorboard

    root = tmp_path / "logs"
    ragged._tf1(str(root / "pad" / "tf1"), width=ragged.L + 2)
    ragged._ragged_fit(str(root / "pad" / "tf2"))
    batch = ragged.IDS[: ragged.B]
    assert ragged.L + 2 > int((batch > 0).sum(1).max())  # numpy: the widths differ: a shape divergence
    assert np.isfinite(ragged.E0).all()  # and no element of either lookup is NaN
    first = api.compare(str(root / "pad")).first_divergence
    assert first is not None and first.reason == "shape" and first.max_abs_diff is None
    with tensorboard(str(root), reload_interval=2) as server:
        frame = open_tab(page, server, "pad")
        card = frame.locator("[data-testid=card]")
        assert (
            verdict(frame) == "diverge" and card.locator("[data-testid=divergence-tensor]").inner_text() == "embedding"
        )
        figures = card.locator(".tbp-figures").inner_text()
        assert "NaN" not in figures and "max |Δ| –" in figures, figures
        frame.locator("[data-testid=verdict]").click()
        values = frame.locator("[data-testid=values]")
        expect(values.locator("tbody tr").first).to_be_visible(timeout=TIMEOUT)
        assert "NaN" not in values.inner_text()
