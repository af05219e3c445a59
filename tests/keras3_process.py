"""Running a port under Keras 3 in a process of its own: this suite imports tf_keras
(``TF_USE_LEGACY_KERAS=1``), and which Keras ``tf.keras`` is gets fixed at TensorFlow's first import."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence


def run_keras3(args: Sequence[str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """``python *args`` without ``TF_USE_LEGACY_KERAS``; fails the test with the process's stderr
    unless it exits 0, and returns it (its stdout for what the port prints)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done
