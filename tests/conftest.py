"""Shared pytest setup: TF1-style layers need legacy Keras, set before TF is imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def demo_logs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo's three pairs written once per session by ``python -m demo.write_logs``."""
    root = str(tmp_path_factory.mktemp("demo_logs"))
    subprocess.run([sys.executable, "-m", "demo.write_logs", root], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return root
