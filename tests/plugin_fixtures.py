"""Synthetic logdirs for the dashboard tests, written with the pure-numpy BlockWriter.

A pair diverges where the test says; names can be anything (including HTML).
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from tb_parity_plugin.records.writer import BlockWriter

HTML_NAME = '<img src=x onerror="window.__xss=1">'


def step_tensors(
    step: int,
    diverge_at: Optional[int],
    side: str,
    nan_at: Optional[int] = None,
    extra_name: str = "dense/kernel",
    lr_name: str = "learning_rate",
    drift: Optional[float] = None,
) -> list:
    """lr, a weight, an activation, loss and a grad for one step.

    From ``diverge_at`` on, the candidate's lr is off by one schedule step, or, with ``drift``, its lr
    is right and its weight is off by ``drift`` (a training tensor, which the tolerance fields govern;
    lr is held to the strict hyper-parameter policy).
    """
    rng = np.random.default_rng(step)
    lr = 0.1 * (0.99**step)
    off = side == "tf2" and diverge_at is not None and step >= diverge_at
    if off and drift is None:
        lr = 0.1 * (0.99 ** (step + 1))
    w = rng.standard_normal((3, 4)).astype(np.float32)
    if off and drift is not None:
        w = (w + np.float32(drift)).astype(np.float32)
    act = np.tanh(w).astype(np.float32)
    if nan_at is not None and step >= nan_at and side == "tf2":
        act = act.copy()
        act[0, 0] = np.nan
        act[1, 1] = np.inf
    loss = np.float32(1.0 / (step + 1))
    return [
        ("lr", lr_name, np.float32(lr)),
        ("weight", extra_name, w),
        ("activation", "dense/Relu", act),
        ("loss", "loss", loss),
        ("grad", "dense/kernel_grad", (w * 0.5).astype(np.float32)),
    ]


def write_pair(
    root: str,
    folder: str,
    steps: int,
    diverge_at: Optional[int] = None,
    nan_at: Optional[int] = None,
    extra_name: str = "dense/kernel",
    lr_name: str = "learning_rate",
    drift: Optional[float] = None,
) -> None:
    """Write ``root/folder/{tf1,tf2}`` with ``steps`` steps each."""
    for side in ("tf1", "tf2"):
        writer = BlockWriter(os.path.join(root, folder, side), side=side, mode="graph" if side == "tf1" else "function")
        for step in range(steps):
            writer.write_arrays(step, step_tensors(step, diverge_at, side, nan_at, extra_name, lr_name, drift))
        writer.close()


def append_steps(run_dir: str, side: str, start: int, stop: int, diverge_at: Optional[int] = None) -> None:
    """Append steps to a run with a new event file (a run still training)."""
    writer = BlockWriter(run_dir, side=side)
    for step in range(start, stop):
        writer.write_arrays(step, step_tensors(step, diverge_at, side))
    writer.close()
