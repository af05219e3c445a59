"""Shared pytest setup: TF1-style layers need legacy Keras, set before TF is imported.

Playwright's sync API owns an event loop while it runs, so a second ``sync_playwright()``
fails while the first is open: every test that drives chromium shares the one session
``browser`` below.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def demo_logs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo's three pairs written once per session by ``python -m demo.write_logs``."""
    root = str(tmp_path_factory.mktemp("demo_logs"))
    subprocess.run(
        [sys.executable, "-m", "demo.write_logs", root],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=600,
    )
    return root


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Debian's chromium through Playwright; missing chromium fails under CI, skips elsewhere."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):  # `make test` installs it: missing means the setup is broken
            pytest.fail(f"{CHROMIUM} is missing; `make chromium` installs it")
        pytest.skip("Debian chromium is not installed (make chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
