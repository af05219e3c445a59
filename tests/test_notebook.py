"""demo/parity_walkthrough.ipynb, executed by nbclient in a real IPython kernel.

It writes the demo logs (real TensorFlow), renders the report inline and starts the inline
view on a real TensorBoard; we check what a reader of the notebook would see.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import nbformat
import pytest
from nbkernel import http_get, live_kernel, outputs, stop_server
from tensorboard import manager

from tb_parity_plugin import api

DEMO = Path(__file__).resolve().parents[1] / "demo"
PAIR = ("lr_offbyone/tf1", "lr_offbyone/tf2")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("walkthrough") / "logs")
    mp = pytest.MonkeyPatch()
    mp.setenv("TB_PARITY_DEMO_LOGDIR", logdir)
    try:
        with live_kernel(nbformat.read(DEMO / "parity_walkthrough.ipynb", as_version=4), DEMO) as nb:
            try:
                yield logdir, [c for c in nb.cells if c.cell_type == "code"]
            finally:
                for info in manager.get_all():
                    if info.logdir == logdir:  # the server the notebook's %tb_parity started
                        stop_server(info.pid)
    finally:
        mp.undo()


def _cell(cells, needle: str):
    return next(c for c in cells if needle in c.source)


def test_report_cell_shows_the_engines_verdict_with_the_planted_step_and_tensor(executed):
    logdir, cells = executed
    expected = api.compare(logdir, *PAIR)
    first = expected.first_divergence
    assert first is not None and first.kind == "lr"  # the planted bug: the schedule is one step off
    (markup,) = outputs(_cell(cells, "report = compare("), "text/html")
    verdict = re.search(r'<div class="verdict diverge">(.*?)</div>', markup).group(1)
    assert f"First divergence at step {first.step}:" in verdict
    assert f"<code>{html.escape(first.tensor)}</code> (lr, {first.reason})" in verdict
    assert 'class="divergences"' in markup and "<svg" in markup and "data:image/png;base64," in markup
    printed = "".join(outputs(_cell(cells, "first = report.first_divergence"), "text/plain"))
    assert f"first divergence: step {first.step}, lr/{first.tensor}" in printed


def test_nan_pair_names_the_first_nonfinite_tensor(executed):
    logdir, cells = executed
    expected = api.compare(logdir, "nan/tf1", "nan/tf2").first_nonfinite["nan/tf2"]
    assert expected is not None
    (markup,) = outputs(_cell(cells, 'baseline="nan/tf1"'), "text/html")
    assert f"step {expected['step']}: <code>{html.escape(expected['tensor'])}</code>" in markup


def test_inline_view_frames_our_entry_page_with_the_pair_and_it_answers(executed):
    _, cells = executed
    (markup,) = outputs(_cell(cells, "%tb_parity"), "text/html")
    src = html.unescape(re.search(r'<iframe[^>]* src="([^"]+)"', markup).group(1))
    assert re.fullmatch(
        r"http://localhost:\d+/data/plugin_entry\.html\?name=tb_parity"
        r"#baseline=lr_offbyone/tf1&candidate=lr_offbyone/tf2",
        src,
    )
    status, body = http_get(src)
    assert status == 200 and '<base href="plugin/tb_parity/"' in body
