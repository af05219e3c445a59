"""Dashboard route latency at 2 runs x 2000 steps x 200 tensors, cold and warm.

Cold = first request after the reader has read the logdir (the comparison is built);
warm = the same request again (answered from the comparison cache). The target is the
verdict on screen within 1 s after the data is read: /summary, /scalars and /matrix
(at a 1200-pixel-wide heat map) are what the tab needs for its first paint.

Run: ``python benchmarks/bench_routes.py [--steps 2000 --tensors 200]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from tensorboard.backend import application
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

from tb_parity_plugin.dashboard.plugin import ParityPlugin
from tb_parity_plugin.records.writer import BlockWriter


def write_logdir(root: str, steps: int, tensors: int, diverge_at: int) -> None:
    """Two runs; 150 tensors of ~1k float32 values (statistics only) and the rest scalars."""
    rng = np.random.default_rng(0)
    big = [rng.standard_normal((32, 32)).astype(np.float32) for _ in range(tensors * 3 // 4)]
    for side in ("tf1", "tf2"):
        writer = BlockWriter(os.path.join(root, "pair", side), side=side)
        for step in range(steps):
            scale = np.float32(1.0 + (0.1 if side == "tf2" and step >= diverge_at else 0.0))
            items = [("lr", "lr", np.float32(0.1 / (1 + step)) * scale), ("loss", "loss", np.float32(1.0 / (1 + step)))]
            items += [("weight", f"w{i}", a * np.float32(1 + step * 1e-4)) for i, a in enumerate(big)]
            items += [("activation", f"a{i}", np.float32(i + step)) for i in range(tensors - len(items))]
            writer.write_arrays(step, items, full_values_limit=16)
        writer.close()


def timed(client: werkzeug_test.Client, url: str) -> float:
    start = time.perf_counter()
    response = client.get(url)
    elapsed = time.perf_counter() - start
    assert response.status_code == 200, response.data[:200]
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--width", type=int, default=1200)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench_routes_")
    try:
        t0 = time.perf_counter()
        write_logdir(root, args.steps, args.tensors, diverge_at=args.steps // 2)
        print(f"wrote 2 runs x {args.steps} steps x {args.tensors} tensors in {time.perf_counter() - t0:.1f} s")
        plugin = ParityPlugin(base_plugin.TBContext(logdir=root), reload_interval=3600)
        client = werkzeug_test.Client(application.TensorBoardWSGI([plugin]), wrappers.Response)
        t0 = time.perf_counter()
        plugin._reader.wait_first_load()
        print(f"reader: first load {time.perf_counter() - t0:.2f} s")
        pair = "baseline=pair%2Ftf1&candidate=pair%2Ftf2"
        base = "/data/plugin/tb_parity/"
        routes = [
            ("summary", f"{base}summary?{pair}"),
            ("scalars", f"{base}scalars?{pair}"),
            (f"matrix width={args.width}", f"{base}matrix?{pair}&width={args.width}"),
            ("matrix full", f"{base}matrix?{pair}"),
            ("tensor + values", f"{base}tensor?{pair}&tensor=lr%2Flr&values_at={args.steps // 2}"),
        ]
        print(f"{'route':<22}{'cold ms':>10}{'warm ms':>10}{'cold/warm':>11}")
        cold_total = 0.0
        for name, url in routes:
            cold = timed(client, url)
            warm = min(timed(client, url) for _ in range(3))
            if name in ("summary", "scalars", f"matrix width={args.width}"):
                cold_total += cold
            print(f"{name:<22}{cold * 1e3:>10.1f}{warm * 1e3:>10.1f}{cold / warm:>10.1f}x")
        # A new policy is a new comparison: the cost of moving a tolerance control.
        cold = timed(client, f"{base}summary?{pair}&atol=0.5")
        print(f"{'summary, new atol':<22}{cold * 1e3:>10.1f}")
        verdict = "within" if cold_total < 1.0 else "OVER"
        print(
            f"first paint (summary + scalars + matrix, cold, sequential): {cold_total * 1e3:.0f} ms -> {verdict} the 1 s target"
        )
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
