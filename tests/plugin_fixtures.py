"""Synthetic logdirs for the dashboard tests, written with the pure-numpy BlockWriter.

A pair diverges where the test says; names can be anything (including HTML).
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

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
    full_values_limit: Optional[int] = None,
    extra: Optional[dict[str, list]] = None,
) -> None:
    """Write ``root/folder/{tf1,tf2}`` with ``steps`` steps each.

    ``full_values_limit`` below the tensors' sizes keeps statistics only (a pair that can at
    best "agree within statistics"); ``extra`` maps a side to more ``(kind, name, array)``
    it records at every step (tensors of one run only, for structure divergences).
    """
    limit = {} if full_values_limit is None else {"full_values_limit": full_values_limit}
    for side in ("tf1", "tf2"):
        writer = BlockWriter(os.path.join(root, folder, side), side=side, mode="graph" if side == "tf1" else "function")
        for step in range(steps):
            tensors = step_tensors(step, diverge_at, side, nan_at, extra_name, lr_name, drift)
            writer.write_arrays(step, tensors + list((extra or {}).get(side, [])), **limit)
        writer.close()


def write_upstream_pair(root: str, folder: str, steps: int) -> None:
    """A pair whose first divergent tensor (``weight/k`` from step 1) comes after a tensor compared by
    statistics only (``weight/emb``, 6400 elements, one element off by 1e-3 from step 1: no
    statistic can prove it), so the divergence may start upstream of the one named."""
    rng = np.random.default_rng(3)
    emb = [rng.standard_normal((100, 64)).astype(np.float32) for _ in range(steps)]
    kernel = [rng.standard_normal((8, 4)).astype(np.float32) for _ in range(steps)]
    for side in ("tf1", "tf2"):
        writer = BlockWriter(os.path.join(root, folder, side), side=side)
        for step in range(steps):
            e, k = emb[step].copy(), kernel[step].copy()
            if side == "tf2" and step >= 1:
                e[5, 5] += 1e-3
                k += 1e-2
            writer.write_arrays(step, [("weight", "emb", e), ("weight", "k", k)])
        writer.close()


def write_structure_pair(root: str, folder: str, steps: int) -> None:
    """A port with the usual structure bugs: a variable it lacks (batch norm ``scale=False``:
    no gamma; named with HTML, which must stay text), a layer built twice (``dense_3`` beside
    ``dense``) and a bias of another shape; and a layer renamed and reshaped (``enc/attn`` as
    ``mha/attn``, ``[2, 6]`` as ``[2, 2, 3]``), for which the report suggests a ``--map``; and a tied
    embedding's output projection ported as a layer of its own, its kernel the table transposed
    (a structure hint the panel shows under the entry)."""
    table = (np.arange(30, dtype=np.float32).reshape(5, 6) - 14.5) / 10
    write_pair(
        root,
        folder,
        steps,
        extra={
            "tf1": [
                ("weight", "bn/gamma" + HTML_NAME, np.ones(4, np.float32)),
                ("weight", "dense/bias", np.zeros(4, np.float32)),
                ("weight", "enc/attn/kernel", np.arange(12, dtype=np.float32).reshape(2, 6)),
                ("weight", "lm/embedding", table),
            ],
            "tf2": [
                ("weight", "dense_3/kernel", np.ones((3, 4), np.float32)),
                ("weight", "dense/bias", np.zeros(5, np.float32)),
                ("weight", "mha/attn/kernel", np.arange(12, dtype=np.float32).reshape(2, 2, 3)),
                ("weight", "lm/embedding", table),
                ("weight", "lm/out/kernel", np.ascontiguousarray(table.T)),
            ],
        },
    )


def write_replica_pair(root: str, folder: str, steps: int) -> None:
    """A one-device ``tf1`` and a two-replica ``tf2`` whose gradient is the sum of its replicas' copies."""
    rng = np.random.default_rng(5)
    local = [[rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)] for _ in range(steps)]
    for side in ("tf1", "tf2"):
        writer = BlockWriter(os.path.join(root, folder, side), side=side)
        for step, (a, b) in enumerate(local):
            arrays = [("grad", "dense/kernel:0", (a + b).astype(np.float32))]
            if side == "tf2":
                arrays += [("grad", f"dense/kernel:0@replica{k}", part) for k, part in enumerate((a, b))]
            writer.write_arrays(step, arrays)
        writer.close()


def write_slot_pair(root: str, folder: str, steps: int) -> None:
    """A momentum slot whose elements span three decades; the candidate's smallest element is 5e-5
    off at every step: within the slot's atol (1e-8 + 1e-4 x its largest |element|, 1.0), far past
    1e-4 of that element itself."""
    slot = np.array([1.0, -0.5, 0.25, 0.001], np.float32)
    for side in ("tf1", "tf2"):
        writer = BlockWriter(os.path.join(root, folder, side), side=side)
        for step in range(steps):
            value = slot.copy()
            if side == "tf2":
                value[3] += np.float32(5e-5)
            writer.write_arrays(step, [("slot", "dense/kernel/Momentum:0", value)])
        writer.close()


def write_scaled_grad_pair(root: str, folder: str, steps: int) -> None:
    """Two gradients the candidate has 4x from step 1 (accumulation not divided by its micro-batches):
    their notes run to a few hundred characters, in the card and in its table of the step's
    divergences, and must wrap in the tab, not widen the page."""
    rng = np.random.default_rng(5)
    grads = [(rng.standard_normal((6, 5)), rng.standard_normal(5)) for _ in range(steps)]
    for side in ("tf1", "tf2"):
        writer = BlockWriter(os.path.join(root, folder, side), side=side)
        for step in range(steps):
            scale = 4.0 if side == "tf2" and step >= 1 else 1.0
            kernel, bias = (np.float32(scale) * g.astype(np.float32) for g in grads[step])
            writer.write_arrays(step, [("grad", "dense/kernel:0", kernel), ("grad", "dense/bias:0", bias)])
        writer.close()


def append_steps(run_dir: str, side: str, start: int, stop: int, diverge_at: Optional[int] = None) -> None:
    """Append steps to a run with a new event file (a run still training)."""
    writer = BlockWriter(run_dir, side=side)
    for step in range(start, stop):
        writer.write_arrays(step, step_tensors(step, diverge_at, side))
    writer.close()


def corrupt_last_record(run_dir: str) -> None:
    """Flip a byte inside the last record of the run's event file: its CRC no longer matches,
    so the reader reports a read problem (file and offset) and keeps what came before."""
    (name,) = [n for n in os.listdir(run_dir) if "tfevents" in n]
    path = os.path.join(run_dir, name)
    with open(path, "r+b") as f:
        f.seek(-6, os.SEEK_END)  # inside the payload, before its 4-byte masked CRC
        byte = f.read(1)
        f.seek(-6, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))


def write_live(folder_dir: str, observe: Callable[[], Optional[int]], pause: float = 0.0) -> list[int]:
    """Write a pair of 60 steps into ``folder_dir/tf1`` and ``tf2`` the way a busy writer does
    (flushed mid-record now and then), calling ``observe`` every 10 steps while it writes; the
    steps compared it reported (None: not served yet), in order, once the writers are closed."""
    writers = {side: BlockWriter(os.path.join(folder_dir, side), side=side) for side in ("tf1", "tf2")}
    served: list[int] = []
    for step in range(60):
        for side, w in writers.items():
            w.write_arrays(step, step_tensors(step, 45, side))
            if step % 7 == 0:
                w._file._file.flush()  # type: ignore[union-attr]  # a partial flush, as a busy writer does
        if step % 10 == 9:
            seen = observe()
            if seen is not None:
                served.append(seen)
            time.sleep(pause)
    for w in writers.values():
        w.close()
    return served
