"""A real ``tensorboard`` process on the demo logs, and Debian's chromium via Playwright.

The server fixture is parametrized over ``--load_fast=true``, ``--load_fast=false``
and ``--path_prefix`` (the tab must fetch relatively to work under a prefix).
Screenshots go to ``artifacts/browser/`` (gitignored) for a human to look at.
"""

from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import plugin_fixtures as fx
from tensorboard_process import tensorboard

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.path.join(REPO, "artifacts", "browser")
SERVERS = {
    "load_fast_true": ["--load_fast=true"],
    "load_fast_false": ["--load_fast=false"],
    "path_prefix": ["--load_fast=false", "--path_prefix=/proxy/tb"],
}

pytest.importorskip("playwright.sync_api")
# A missing /usr/bin/chromium is handled once, by the session `browser` fixture in
# tests/conftest.py (fail under CI, skip elsewhere); `page` requests it before `server`.


@pytest.fixture(scope="session")
def demo_logdir(demo_logs: str) -> str:
    """The demo's three pairs, plus a pair whose first-diverging tensor is named with HTML,
    a port with structure bugs, a statistics-only pair with a corrupt record, a pair that a test
    grows while the tab shows it, a divergence after a tensor only statistics compared, and one
    with a long note, and a port that stopped 3 steps before its baseline."""
    fx.write_pair(demo_logs, "html", 8, diverge_at=2, lr_name=fx.HTML_NAME)
    fx.write_pair(demo_logs, "drift", 8, diverge_at=3, drift=0.01)
    fx.write_structure_pair(demo_logs, "structure", 6)
    fx.write_replica_pair(demo_logs, "replicas", 4)
    fx.write_pair(demo_logs, "stats", 6, full_values_limit=1)
    fx.corrupt_last_record(os.path.join(demo_logs, "stats", "tf2"))
    fx.write_pair(demo_logs, "stats_clean", 6, full_values_limit=1)
    fx.write_pair(demo_logs, "grow", 20)
    fx.write_upstream_pair(demo_logs, "upstream", 4)
    fx.write_slot_pair(demo_logs, "slot", 3)
    fx.write_scaled_grad_pair(demo_logs, "scaled", 3)
    fx.write_pair(demo_logs, "short", 6)
    fx.append_steps(os.path.join(demo_logs, "short", "tf1"), "tf1", 6, 9)  # the port stopped 3 steps early
    return demo_logs


@pytest.fixture(scope="session", params=list(SERVERS))
def server(request: pytest.FixtureRequest, demo_logdir: str) -> Iterator[str]:
    """Base URL (ending in ``/``) of a tensorboard serving the demo logs."""
    log_path = os.path.join(demo_logdir, f"tensorboard-{request.param}.log")
    with tensorboard(demo_logdir, reload_interval=2, flags=tuple(SERVERS[request.param]), log_path=log_path) as base:
        yield base


@pytest.fixture
def page(browser: object, request: pytest.FixtureRequest) -> Iterator[object]:
    """A fresh page; fails the test on any console error or uncaught exception."""
    context = browser.new_context(viewport={"width": 1400, "height": 1900})  # type: ignore[attr-defined]
    pg = context.new_page()
    problems: list[str] = []
    pg.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    pg.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    yield pg
    os.makedirs(ARTIFACTS, exist_ok=True)
    name = request.node.name.replace("[", "-").replace("]", "").replace("/", "_")
    try:
        pg.screenshot(path=os.path.join(ARTIFACTS, name + ".png"))
    finally:
        context.close()
    # TensorBoard's own stylesheet loads /font-roboto/ from the server root, ignoring
    # --path_prefix; those 404s (and their console lines) are TensorBoard's, not the tab's.
    fonts = [p for p in problems if p.startswith("HTTP 404") and "/font-roboto/" in p]
    rest = [p for p in problems if p not in fonts]
    resource = [p for p in rest if "Failed to load resource" in p]
    if fonts and len(resource) <= len(fonts):
        rest = [p for p in rest if p not in resource]
    assert not rest, rest
