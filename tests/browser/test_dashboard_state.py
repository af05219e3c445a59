"""The tab's request and chart state in a real browser: late answers, refreshes, zoom.

A slow answer to a superseded request must not replace the newer one (the requests are
aborted), and a refresh, by re-query or by auto-refresh, updates the charts in place so a
user's zoom survives. Run against one server flavour: the behaviour is the page's own.
Waits are on events, never on time: ``SETTLE_JS`` records, in the tab's frame, when each
fetch of the tab has been fully handled by the app (see its comment).
"""

from __future__ import annotations

import os
import sys
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import expect

from tb_parity_plugin import api

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import plugin_fixtures as fx

from browser.test_dashboard import TIMEOUT, open_tab

one_server = pytest.mark.parametrize("server", ["load_fast_false"], indirect=True)

# window.__settled gets a route's URL once the app is done with that answer: a fetch that
# fails (aborted) right away; an answer once its JSON is parsed and every microtask the app
# chained on it (render included) has run, which the setTimeout waits out. The hook on
# Response.json is registered before the app's own await, so it runs first.
SETTLE_JS = """
(() => {
  window.__settled = [];
  const mark = (url) => () => setTimeout(() => window.__settled.push(url), 0);
  const fetch0 = window.fetch;
  window.fetch = function (input, init) {
    const url = new URL(String(input), location.href).href;
    const p = fetch0.call(this, input, init);
    p.catch(mark(url));
    return p;
  };
  const json0 = Response.prototype.json;
  Response.prototype.json = function () {
    const p = json0.call(this);
    p.then(mark(this.url), mark(this.url));
    return p;
  };
})();
"""


def tab_frame(page):
    """The tab's own Frame (for evaluate / wait_for_function)."""
    return next(f for f in page.frames if "plugin_entry" in f.url or "tb_parity" in f.url.split("#")[0])


def wait_settled(frame, route: str, count: int) -> None:
    frame.wait_for_function(
        "([r, n]) => window.__settled.filter(u => u.includes('/' + r + '?')).length >= n",
        arg=[route, count],
        timeout=TIMEOUT,
    )


def click_cell(frame, bucket: int, tensor: int, shape: tuple[int, int]) -> None:
    """Click heat-map cell (bucket, tensor) of a ``shape`` = (buckets, tensors) matrix."""
    canvas = frame.locator("[data-testid=heatmap]")
    box = canvas.bounding_box()
    n_buckets, n_tensors = shape
    row = max(2, min(16, 480 // n_tensors))  # heatmap.ts's row height
    canvas.click(position={"x": (bucket + 0.5) * box["width"] / n_buckets, "y": (tensor + 0.5) * row})


class Held:
    """A page.route handler that holds the requests ``wanted(query)`` picks until release()."""

    def __init__(self, wanted) -> None:
        self.routes: list = []
        self.wanted = wanted

    def __call__(self, route) -> None:
        if self.wanted(parse_qs(urlparse(route.request.url).query)):
            self.routes.append(route)
        else:
            route.continue_()

    def release(self) -> None:
        for route in self.routes:
            try:
                route.continue_()
            except Exception:  # the page aborted it: nothing left to answer
                pass


@one_server
def test_a_late_tensor_answer_does_not_replace_the_newer_one(page, server: str, demo_logdir: str) -> None:
    report = api.compare(os.path.join(demo_logdir, "lr_offbyone"))
    m = report.matrix()
    first, second = m.tensors[1], m.tensors[2]
    page.add_init_script(SETTLE_JS)
    frame = open_tab(page, server, "lr_offbyone")
    held = Held(lambda q: q.get("tensor") == [first])
    page.route("**/tb_parity/tensor?*", held)
    own = tab_frame(page)
    shape = (len(m.step_start), len(m.tensors))
    click_cell(frame, 5, 1, shape)  # the first tensor's answer is held back ...
    click_cell(frame, 5, 2, shape)  # ... while the second is asked for and shown
    detail = frame.locator("[data-testid=detail-tensor]")
    expect(detail).to_have_text(second, timeout=TIMEOUT)
    held.release()  # the first answer now arrives late (unless it was aborted)
    wait_settled(own, "tensor", 2)
    assert detail.inner_text() == second, f"the late answer for {first} replaced {second}"
    assert frame.locator("[data-testid=detail-step]").inner_text() == "step 5"
    assert f"tensor={second}" in own.evaluate("() => decodeURIComponent(location.hash)")


@one_server
def test_a_superseded_refresh_is_aborted_on_every_route(page, server: str) -> None:
    """Summary, scalars and matrix of the first pair are held; choosing another pair aborts them."""
    page.add_init_script(SETTLE_JS)
    held = Held(lambda q: q.get("baseline") == ["lr_offbyone/tf1"])
    page.route("**/tb_parity/summary?*", held)
    page.route("**/tb_parity/scalars?*", held)
    page.route("**/tb_parity/matrix?*", held)
    open_hash = "#tb_parity&p.tb_parity.baseline=lr_offbyone%2Ftf1&p.tb_parity.candidate=lr_offbyone%2Ftf2"
    page.goto(server + open_hash)
    frame = page.frame_locator("iframe")
    pair = frame.locator("[data-testid=pair]")
    expect(pair).to_have_value('["lr_offbyone/tf1","lr_offbyone/tf2"]', timeout=TIMEOUT)
    own = tab_frame(page)
    pair.select_option(label="clean")
    frame.locator("[data-testid=card][data-verdict=agree]").wait_for(timeout=TIMEOUT)
    for route in ("summary", "scalars", "matrix"):
        wait_settled(own, route, 2)  # the clean pair's answer and the aborted lr_offbyone request
    held.release()
    assert frame.locator("[data-testid=card]").get_attribute("data-verdict") == "agree"
    assert frame.locator("[data-testid=baseline]").input_value() == "clean/tf1"


def chart_state(frame, testid: str) -> dict:
    """The overlay chart's x window (mirrored on its host) and its canvas pixels."""
    host = frame.locator(f"[data-testid={testid}] > div").first
    return host.evaluate(
        """h => ({xmin: h.dataset.xMin, xmax: h.dataset.xMax,
                 image: h.querySelector('canvas').toDataURL(), same: h.querySelector('.uplot').__mark === 1})"""
    )


@one_server
def test_a_refresh_keeps_the_users_zoom(page, server: str, demo_logdir: str) -> None:
    frame = open_tab(page, server, "grow")
    over = frame.locator("[data-testid=chart-lr] .u-over").first
    over.wait_for(timeout=TIMEOUT)
    unzoomed = chart_state(frame, "chart-lr")
    box = over.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.3, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=8)
    page.mouse.up()
    zoomed = chart_state(frame, "chart-lr")
    assert zoomed["image"] != unzoomed["image"], "the drag did not zoom the chart"
    frame.locator("[data-testid=chart-lr] .uplot").first.evaluate("u => { u.__mark = 1; }")

    # a re-query (another atol) refreshes summary, scalars and matrix; lr's data is unchanged
    frame.locator("[data-testid=tol-atol]").fill("0.5")
    expect(frame.locator("[data-testid=tol-atol]")).to_have_attribute("placeholder", "0.5", timeout=TIMEOUT)
    after = chart_state(frame, "chart-lr")
    assert after["image"] == zoomed["image"], "the re-query reset the zoom"
    assert (after["xmin"], after["xmax"]) == (zoomed["xmin"], zoomed["xmax"]) and after["xmin"] is not None
    assert after["same"], "the chart was recreated instead of updated in place"

    # auto-refresh: both runs grow by 10 steps; the zoomed window stays, an unzoomed chart follows
    for side in ("tf1", "tf2"):
        fx.append_steps(os.path.join(demo_logdir, "grow", side), side, 20, 30)
    expect(frame.locator("[data-testid=status]")).to_contain_text("30 steps compared", timeout=TIMEOUT)
    grown = chart_state(frame, "chart-lr")
    assert (grown["xmin"], grown["xmax"]) == (zoomed["xmin"], zoomed["xmax"])
    assert grown["same"]
    assert float(chart_state(frame, "chart-loss")["xmax"]) == 29


@one_server
def test_a_link_to_a_pair_not_listed_says_why_instead_of_showing_another_pair(browser, server: str) -> None:
    """A link whose candidate /runs does not list (a port whose event file holds nothing of ours,
    or no such run): the tab put the suggested pair in its place and showed that pair's verdict
    under the link (h102: a link to h97's empty port read "Runs agree within tolerance", another
    pair's). It keeps the linked pair and shows the route's answer, in the CLI's words."""
    context = browser.new_context(viewport={"width": 1400, "height": 1900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(server + "#tb_parity&p.tb_parity.baseline=clean%2Ftf1&p.tb_parity.candidate=clean%2Fnope")
        frame = page.frame_locator("iframe")
        bar = frame.locator("[data-testid=error]")
        expect(bar).to_contain_text("no run 'clean/nope'", timeout=TIMEOUT)
        assert frame.locator("[data-testid=card][data-verdict]").count() == 0  # no other pair's verdict
        assert "candidate=clean%2Fnope" in page.url  # the link still names what it asked for
        frame.locator("[data-testid=pair]").select_option(label="clean")  # a listed pair is one pick away
        frame.locator("[data-testid=card][data-verdict]").wait_for(timeout=TIMEOUT)
        assert frame.locator("[data-testid=candidate]").input_value() == "clean/tf2"
        assert not errors, errors
    finally:
        context.close()
