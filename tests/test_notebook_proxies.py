"""show() and %tb_parity in a real kernel under Jupyter (with and without TENSORBOARD_PROXY_URL),
Colab (only the ``google.colab`` module is a stand-in: it cannot be installed here) and a terminal.

One real TensorBoard is started here; the kernels reuse it through tensorboard.manager because
they ask with the same arguments from the same directory, which is also what %tensorboard does.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import time

import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS
from nbkernel import http_get, outputs, run_cells, stop_server

from tb_parity_plugin.report import notebook

PAIR = ("pair/tf1", "pair/tf2 <b>&+")  # a name that needs quoting in the hash
FRAGMENT = "#baseline=pair/tf1&candidate=pair/tf2%20%3Cb%3E%26%2B"


class _Iframes(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "iframe":
            self.srcs.append(dict(attrs).get("src") or "")


def iframe_srcs(markup: str) -> list[str]:
    parser = _Iframes()
    parser.feed(markup)
    return parser.srcs


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real TensorBoard on an empty logdir, started from ``cwd`` the way show() starts it."""
    cwd = tmp_path_factory.mktemp("nb")
    (cwd / "logs").mkdir()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        info = notebook.start_server("logs", port=0)
    finally:
        os.chdir(old)
    yield cwd, info
    stop_server(info.pid)


SHOW = f"from tb_parity_plugin import notebook\nnotebook.show('logs', *{PAIR!r}, port=0, height=321)"


@pytest.fixture(scope="module")
def jupyter_cells(server):
    cwd, _ = server
    return run_cells(
        [
            SHOW,
            "import os\nos.environ['TENSORBOARD_PROXY_URL'] = '/proxy/%PORT%/'\n" + SHOW,
            "del os.environ['TENSORBOARD_PROXY_URL']\n%load_ext tb_parity_plugin\n"
            f"%tb_parity logs --baseline {PAIR[0]} --port 0",
            "%tb_parity",  # usage error: printed, kernel survives
            "%load_ext tensorboard\n%tensorboard --logdir logs --port 0",
        ],
        cwd,
    )


def test_jupyter_frames_only_our_entry_page_on_the_server_port(server, jupyter_cells):
    _, info = server
    markup = outputs(jupyter_cells[0], "text/html")
    assert len(markup) == 1
    (src,) = iframe_srcs(markup[0])
    assert src == f"http://localhost:{info.port}/data/plugin_entry.html?name=tb_parity{FRAGMENT}"
    assert 'height="321"' in markup[0]
    # the script retargets to the notebook page's host on the same port and path
    assert f"u.port={info.port}" in markup[0]
    status, body = http_get(src)
    assert status == 200 and 'href="plugin/tb_parity/"' in body


def test_jupyter_honours_tensorboard_proxy_url(server, jupyter_cells):
    _, info = server
    (markup,) = outputs(jupyter_cells[1], "text/html")
    (src,) = iframe_srcs(markup)
    assert src == f"/proxy/{info.port}/data/plugin_entry.html?name=tb_parity{FRAGMENT}"
    assert "<script" not in markup  # a proxy path is relative to the notebook page already


def test_magic_shows_the_view_and_reports_usage_errors(server, jupyter_cells):
    _, info = server
    (markup,) = outputs(jupyter_cells[2], "text/html")
    assert iframe_srcs(markup) == [
        f"http://localhost:{info.port}/data/plugin_entry.html?name=tb_parity#baseline=pair/tf1"
    ]
    usage = "".join(o.get("text", "") for o in jupyter_cells[3].outputs)
    assert "usage: %tb_parity" in usage


def test_tensorboard_magic_still_shows_the_whole_app_on_the_same_server(server, jupyter_cells):
    _, info = server
    text = "".join(outputs(jupyter_cells[4], "text/plain"))
    assert f"Reusing TensorBoard on port {info.port}" in text
    (markup,) = outputs(jupyter_cells[4], "text/html")
    assert "tensorboard-frame" in markup and "plugin_entry" not in markup


COLAB_STANDIN = """
import json, sys, types
calls = []
colab = types.ModuleType("google.colab")
colab.output = types.ModuleType("google.colab.output")
colab.output.serve_kernel_port_as_iframe = lambda port, **kw: calls.append(dict(port=port, **kw))
sys.modules["google.colab"] = colab
sys.modules["google.colab.output"] = colab.output
"""


def test_colab_goes_through_the_kernel_port_proxy(server):
    cwd, info = server
    cells = run_cells([COLAB_STANDIN, SHOW, "print(json.dumps(calls))"], cwd)
    assert outputs(cells[1], "text/html") == []  # no direct iframe: Colab cannot reach the VM's ports
    (call,) = json.loads(outputs(cells[2], "text/plain")[0])
    assert call == {
        "port": info.port,
        "path": f"/data/plugin_entry.html?name=tb_parity{FRAGMENT}",
        "height": "321",
    }
    status, _ = http_get(f"http://localhost:{call['port']}{call['path']}")
    assert status == 200


def test_terminal_prints_the_url(server, capsys, monkeypatch):
    cwd, info = server
    monkeypatch.chdir(cwd)
    url = notebook.show("logs", *PAIR, port=0)
    assert url == f"http://localhost:{info.port}/data/plugin_entry.html?name=tb_parity{FRAGMENT}"
    assert url in capsys.readouterr().out


def test_a_dead_servers_record_is_not_reused(tmp_path, monkeypatch):
    """A TensorBoard killed with its kernel can leave its manager record behind."""
    import subprocess
    import sys

    from tensorboard import manager

    (tmp_path / "logs").mkdir()
    monkeypatch.chdir(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = manager.TensorBoardInfo(
        version="2.21.0",
        start_time=1,
        pid=gone.pid,
        port=1,
        path_prefix="",
        logdir="logs",
        db="",
        cache_key=manager.cache_key(
            working_directory=str(tmp_path), arguments=["--logdir", "logs", "--port", "0"], configure_kwargs={}
        ),
    )
    record = os.path.join(manager._get_info_dir(), f"pid-{gone.pid}.info")
    with open(record, "w") as f:
        f.write(manager._info_to_string(stale) + "\n")
    info = notebook.start_server("logs", port=0)
    try:
        assert info.pid != gone.pid and info.port != 1
        assert not os.path.exists(record)
        assert http_get(f"http://localhost:{info.port}/data/plugin_entry.html?name=tb_parity")[0] == 200
    finally:
        stop_server(info.pid)


def test_jupyter_markup_in_a_browser_frames_the_server_on_the_notebook_pages_host(
    server, jupyter_cells, tmp_path, browser
):
    """The cell's HTML, served like a notebook page from 127.0.0.1: its script points the
    frame at that host on TensorBoard's port, and the frame loads our view."""
    import functools
    import http.server
    import threading

    _, info = server
    (tmp_path / "nb.html").write_text("<!DOCTYPE html><body>" + outputs(jupyter_cells[0], "text/html")[0])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    pages = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=pages.serve_forever, daemon=True).start()
    # The frame first loads localhost, another site than the page's 127.0.0.1: Chromium puts it in
    # another process, and the script's move to 127.0.0.1 swaps it back; Playwright lost the frame in
    # that swap about one run in five (window.frames had it, page.frames did not, for minutes). The
    # test is of the markup's script, not of Chromium's process model: this browser keeps frames in
    # the page's process.
    one_process = browser.browser_type.launch(
        executable_path=CHROMIUM,
        args=[*CHROMIUM_ARGS, "--disable-site-isolation-trials", "--disable-features=IsolateOrigins,site-per-process"],
    )
    page = one_process.new_page()
    try:
        page.goto(f"http://127.0.0.1:{pages.server_address[1]}/nb.html")
        src = page.locator("iframe.tb-parity-view").get_attribute("src")
        view = f"http://127.0.0.1:{info.port}/data/plugin_entry.html?name=tb_parity"
        assert src == view + FRAGMENT
        view_frame = page.frame_locator("iframe.tb-parity-view")
        want = re.compile(rf"http://127\.0\.0\.1:{info.port}/data/")
        href, deadline = "", time.monotonic() + 120
        while not want.match(href) and time.monotonic() < deadline:
            try:
                href = view_frame.locator("html").evaluate("() => location.href", timeout=5_000)
            except Exception:  # the frame is still loading: ask again
                page.wait_for_timeout(100)
        assert want.match(href), href
        base = view_frame.locator("base")
        assert base.get_attribute("href") == "plugin/tb_parity/"  # the entry page
    finally:
        page.close()
        one_process.close()
        pages.shutdown()
