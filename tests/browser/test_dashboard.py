"""The tb_parity tab in a real TensorBoard and a real chromium, on the demo logs.

Expected verdicts come from the engine (``tb_parity_plugin.engine``), so the test
checks that the tab shows the engine's answer; the demo's planted facts (lr first
in lr_offbyone, NaN at the nan pair's loss) are asserted too.
"""

from __future__ import annotations

import os
import sys
from urllib.parse import quote

from tb_parity_plugin import api

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import plugin_fixtures as fx

TIMEOUT = 60_000


def open_tab(page, server: str, pair: str, extra: str = ""):
    """Open TensorBoard on the tb_parity tab with ``pair/{tf1,tf2}`` selected via the hash."""
    hash_ = f"#tb_parity&p.tb_parity.baseline={quote(pair + '/tf1', safe='')}&p.tb_parity.candidate={quote(pair + '/tf2', safe='')}{extra}"
    page.goto(server + hash_)
    frame = page.frame_locator("iframe")
    frame.locator("[data-testid=card][data-verdict]").wait_for(timeout=TIMEOUT)
    return frame


def verdict(frame) -> str:
    return frame.locator("[data-testid=card]").get_attribute("data-verdict")


def test_card_names_the_planted_divergence_and_opens_it(page, server: str, demo_logdir: str) -> None:
    expected = api.compare(os.path.join(demo_logdir, "lr_offbyone")).first_divergence
    assert expected is not None and expected.kind == "lr"  # the planted bug: lr diverges first
    frame = open_tab(page, server, "lr_offbyone")
    assert verdict(frame) == "diverge"
    card = frame.locator("[data-testid=card]")
    assert f"step {expected.step}" in card.locator("[data-testid=verdict]").inner_text()
    assert card.locator("[data-testid=divergence-tensor]").inner_text() == expected.tensor
    card.click()
    detail = frame.locator("[data-testid=detail]")
    detail.locator("[data-testid=detail-step]").wait_for(timeout=TIMEOUT)
    assert detail.locator("[data-testid=detail-tensor]").inner_text() == f"{expected.kind}/{expected.tensor}"
    assert detail.locator("[data-testid=detail-step]").inner_text() == f"step {expected.step}"
    assert detail.locator("[data-testid=detail-steps] tr.sel td").first.inner_text() == str(expected.step)
    # the heat map answers hover with the cell's tensor
    canvas = frame.locator("[data-testid=heatmap]")
    box = canvas.bounding_box()
    canvas.hover(position={"x": 3, "y": 3})
    tip = frame.locator("[data-testid=heat-tooltip]")
    assert tip.is_visible() and "lr/" in tip.inner_text()
    assert box["width"] > 100


def test_raising_the_tolerance_turns_the_verdict_to_agree(page, server: str, demo_logdir: str) -> None:
    # the tolerance fields govern training tensors; lr keeps its strict hyper-parameter policy
    strict = api.compare(os.path.join(demo_logdir, "lr_offbyone"), atol=1.0, rtol=1.0).first_divergence
    assert strict is not None and strict.kind == "lr"
    assert api.compare(os.path.join(demo_logdir, "drift"), atol=1.0, rtol=1.0).agree
    expected = api.compare(os.path.join(demo_logdir, "drift")).first_divergence
    assert expected is not None and (expected.kind, expected.step) == ("weight", 3)
    frame = open_tab(page, server, "drift")
    assert verdict(frame) == "diverge"
    frame.locator("[data-testid=tol-atol]").fill("1")
    frame.locator("[data-testid=tol-rtol]").fill("1")
    frame.locator("[data-testid=card][data-verdict=agree]").wait_for(timeout=TIMEOUT)
    assert "agree within tolerance" in frame.locator("[data-testid=verdict]").inner_text()


def test_clean_pair_agrees(page, server: str, demo_logdir: str) -> None:
    report = api.compare(os.path.join(demo_logdir, "clean"))
    assert report.agree
    frame = open_tab(page, server, "clean")
    assert verdict(frame) == "agree"
    text = frame.locator("[data-testid=verdict]").inner_text()
    assert f"across {report.steps_compared} steps and {report.tensors_compared} tensors" in text
    assert frame.locator("[data-testid=nan-alert]").count() == 0


def test_nan_pair_shows_the_nan_alert(page, server: str, demo_logdir: str) -> None:
    report = api.compare(os.path.join(demo_logdir, "nan"))
    nf = report.first_nonfinite["tf2"]
    assert nf is not None and report.first_nonfinite["tf1"] is None
    frame = open_tab(page, server, "nan")
    alert = frame.locator("[data-testid=nan-alert]")
    assert alert.count() == 1 and alert.get_attribute("data-run") == "nan/tf2"
    assert f"first NaN/Inf at step {nf['step']}" in alert.inner_text()
    assert f"{nf['kind']}/{nf['tensor']}" in alert.inner_text()
    alert.click()
    detail = frame.locator("[data-testid=detail]")
    detail.locator("[data-testid=health] td.nonfinite").first.wait_for(timeout=TIMEOUT)


def test_html_name_renders_as_text_and_runs_nothing(page, server: str) -> None:
    frame = open_tab(page, server, "html")
    assert frame.locator("[data-testid=divergence-tensor]").inner_text() == fx.HTML_NAME
    assert frame.locator("img").count() == 0
    for f in page.frames:  # TensorBoard's page and the tab's iframe
        assert f.evaluate("() => window.__xss === undefined"), f.url


def test_pair_and_tensor_survive_a_reload(page, server: str) -> None:
    frame = open_tab(page, server, "lr_offbyone")
    frame.locator("[data-testid=card]").click()
    frame.locator("[data-testid=detail-step]").wait_for(timeout=TIMEOUT)
    tensor = frame.locator("[data-testid=detail-tensor]").inner_text()
    frame.locator("[data-testid=pair]").select_option(label="clean")
    frame.locator("[data-testid=card][data-verdict=agree]").wait_for(timeout=TIMEOUT)
    frame.locator("[data-testid=heatmap]").click(position={"x": 5, "y": 5})
    frame.locator("[data-testid=detail-step]").wait_for(timeout=TIMEOUT)
    tensor = frame.locator("[data-testid=detail-tensor]").inner_text()
    page.reload()
    frame = page.frame_locator("iframe")
    frame.locator("[data-testid=detail-step]").wait_for(timeout=TIMEOUT)
    assert frame.locator("[data-testid=baseline]").input_value() == "clean/tf1"
    assert frame.locator("[data-testid=detail-tensor]").inner_text() == tensor


def test_malformed_hash_escapes_are_ignored(page, server: str) -> None:
    """A stray ``%zz`` in the hash must not stop the tab: that key falls back to its default."""
    page.route("**/favicon.ico", lambda route: route.fulfill(status=204))  # the bare entry page has none
    page.goto(
        server + "data/plugin_entry.html?name=tb_parity#baseline=clean%2Ftf1&candidate=clean%2Ftf2&tensor=%zz&%zz=1"
    )
    page.locator("[data-testid=card][data-verdict]").wait_for(timeout=TIMEOUT)
    assert page.locator("[data-testid=candidate]").input_value() == "clean/tf2"  # the well-formed keys hold
