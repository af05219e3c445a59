"""P3: time to the first divergence on 2 runs x STEPS x 200 tensors, cold, warm and incremental.

Builds synthetic logdirs (150 tensors of ~1k float32 values + 50 scalars per step) in a
temp dir, in a statistics-only and a full-values variant, each with a divergence planted
late (step = 3/4 of the run) and with runs that agree everywhere (byte-identical, and
"noisy": every value 1e-7 relative off, so no byte-equality shortcut applies). Measures:

* cold: LogdirReader + reload + Comparison(...).report()
* warm: Comparison(...).report() on runs already read
* incremental: append 100 steps, reader.reload() + Comparison.update() + report()/matrix()
  vs the same from scratch, ``--increments`` times (5), summarised by the medians
* each engine figure twice, side by side in one run: the per-pair method (``engine.batch``
  off: every tensor pair settled by its own numpy calls, the method before issue 13) and the
  current one (a layout's identical pairs settled as one array)
* naive: parse each event and np.testing.assert_allclose per (step, tensor), on a subset
  of steps, scaled to all steps.

Default is scaled down (400 steps) to finish in about two minutes; --full is the real
size (2000 steps; the full-values logdir is 2.5 GB: check ``df -h /tmp`` first).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from typing import Callable

import numpy as np

from tb_parity_plugin.engine import Comparison, batch
from tb_parity_plugin.logdir.reader import LogdirReader
from tb_parity_plugin.logdir.rundata import RunData
from tb_parity_plugin.records import event_file, metadata
from tb_parity_plugin.records.writer import BlockWriter, build_layout

N_VEC, VEC_SIZE, N_SCALAR = 150, 1000, 50
POOL = 16  # distinct value blocks cycled over the steps (keeps generation fast)


def block_stats(values: np.ndarray, dtype_enum: int, rank: int) -> np.ndarray:
    """health_numpy for each row of ``values`` [n, size] at once (all finite here)."""
    v = values.astype(np.float64)
    n, size = v.shape
    out = np.zeros((n, metadata.N_STATS))
    idx = metadata.STAT_INDEX
    out[:, idx["dtype"]] = dtype_enum
    out[:, idx["rank"]] = rank
    out[:, idx["size"]] = size
    out[:, idx["neg_finite"]] = (v < 0).sum(1)
    out[:, idx["zero"]] = (v == 0).sum(1)
    out[:, idx["pos_finite"]] = (v > 0).sum(1)
    out[:, idx["min"]], out[:, idx["max"]] = v.min(1), v.max(1)
    out[:, idx["mean"]], out[:, idx["std"]] = v.mean(1), v.std(1)
    out[:, idx["l2"]] = np.sqrt((v * v).sum(1))
    return out


class Synth:
    """Step blocks for one run: vectors [150, 1000] + scalars [50], cycled from a pool."""

    def __init__(self, seed: int, full_values: bool, rel_noise: float = 0.0, bad_from: int = -1) -> None:
        rng = np.random.default_rng(seed)
        entries = [
            ("weight" if i < 50 else "activation" if i < 100 else "grad", f"layer_{i}/t:0", "float32", (VEC_SIZE,))
            for i in range(N_VEC)
        ]
        entries += [("loss" if i == 0 else "metric", f"scalar_{i}", "float32", ()) for i in range(N_SCALAR)]
        self.layout = build_layout(entries, full_values_limit=VEC_SIZE if full_values else 0)
        self.pool_vec = [rng.standard_normal((N_VEC, VEC_SIZE)).astype(np.float32) for _ in range(POOL)]
        self.pool_sca = [rng.standard_normal(N_SCALAR).astype(np.float32) for _ in range(POOL)]
        if rel_noise:
            self.pool_vec = [(v * np.float32(1 + rel_noise)).astype(np.float32) for v in self.pool_vec]
        self.stats = [self._stats(v, s) for v, s in zip(self.pool_vec, self.pool_sca)]
        self.bad_from = bad_from
        self.full_values = full_values

    @staticmethod
    def _stats(vec: np.ndarray, sca: np.ndarray) -> np.ndarray:
        return np.concatenate([block_stats(vec, 1, 1), block_stats(sca[:, None], 1, 0)])

    def step(self, step: int) -> tuple[np.ndarray, dict]:
        vec, sca, stats = self.pool_vec[step % POOL], self.pool_sca[step % POOL], self.stats[step % POOL]
        if 0 <= self.bad_from <= step:  # planted divergence: tensor 120 (a grad) off by 50%
            vec = vec.copy()
            vec[120] *= np.float32(1.5)
            stats = self._stats(vec, sca)
        values = {"float32": np.concatenate([vec.reshape(-1), sca])} if self.full_values else {}
        return stats, values

    def write(self, run_dir: str, steps: range, side: str) -> None:
        writer = BlockWriter(run_dir, side=side)
        for s in steps:
            stats, values = self.step(s)
            writer.write_step(s, self.layout, stats, values)
        writer.close()


def timed(fn: Callable) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def per_pair(fn: Callable) -> Callable:
    """``fn`` run with the per-pair method (the engine before pairs of a layout were batched)."""

    def old() -> object:
        batch.ENABLED = False
        try:
            return fn()
        finally:
            batch.ENABLED = True

    return old


def as_new(*runs: RunData) -> list[RunData]:
    """The snapshots as the reader first hands them out: nothing derived from them cached yet."""
    return [dataclasses.replace(run, derived={}) for run in runs]


def best_of(n: int, fn: Callable) -> tuple[float, object]:
    runs = [timed(fn) for _ in range(n)]
    return min(r[0] for r in runs), runs[-1][1]


def naive_seconds(logdir: str, steps_subset: int, total_steps: int) -> float:
    """Parse every event, then np.testing.assert_allclose per (step, tensor); scaled up."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    def parse(run: str) -> dict:
        out: dict = {}
        path = next(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(logdir, run)) for f in fs)
        with open(path, "rb") as f:
            data = f.read()
        pos, header = 0, event_file.HEADER_SIZE
        while pos + header <= len(data) and len(out) < steps_subset:
            (length,) = np.frombuffer(data, "<u8", 1, pos)
            event = event_pb2.Event.FromString(data[pos + header : pos + header + int(length)])
            pos += header + int(length) + event_file.FOOTER_SIZE
            for v in event.summary.value:
                if v.tag.startswith(metadata.STATS_PREFIX) or v.tag.startswith(metadata.VALUES_PREFIX):
                    out.setdefault(event.step, {})[v.tag.split("/")[1]] = tensor_util.make_ndarray(v.tensor)
        return out

    t0 = time.perf_counter()
    base, cand = parse("tf1"), parse("tf2")
    specs = Synth(0, True).layout.tensors
    for step in sorted(base)[:steps_subset]:
        b, c = base[step], cand[step]
        for i, spec in enumerate(specs):
            if spec.values is not None and "values" in b and "values" in c:
                _, start, length = spec.values
                pair = (c["values"][start : start + length], b["values"][start : start + length])
            else:
                pair = (c["stats"][i, -5:], b["stats"][i, -5:])
            try:
                np.testing.assert_allclose(*pair, rtol=0.05, atol=1e-5)
            except AssertionError:
                pass
    return (time.perf_counter() - t0) * total_steps / steps_subset


def refresh_summary(times: list[tuple[float, float, float, float]]) -> str:
    """Over the increments: the median of each increment's ratio (recompute / refresh, each pair
    timed side by side on the same snapshots), for both engines, and the median times."""
    engine, scratch, engine_old, scratch_old = (float(np.median(column)) for column in zip(*times))
    ratio = float(np.median([s / max(e, 1e-9) for e, s, _, _ in times]))
    ratio_old = float(np.median([s / max(e, 1e-9) for _, _, e, s in times]))
    return (
        f"median of {len(times)}: refresh x{ratio:.1f} cheaper than recomputing ({1e3 * engine:.1f} ms vs"
        f" {1e3 * scratch:.1f} ms) | per-pair (old): x{ratio_old:.1f} ({1e3 * engine_old:.1f} ms vs"
        f" {1e3 * scratch_old:.1f} ms); new refresh x{engine_old / max(engine, 1e-9):.1f} cheaper than the old"
        f" refresh, x{scratch_old / max(engine, 1e-9):.1f} than the old recompute"
    )


def scenario(root: str, label: str, steps: int, full_values: bool, kind: str, naive: bool, increments: int = 5) -> None:
    logdir = os.path.join(root, label)
    bad_from = (steps * 3) // 4 if kind == "diverge" else -1
    noise = 1e-7 if kind == "agree-noisy" else 0.0
    base, cand = Synth(0, full_values), Synth(0, full_values, rel_noise=noise, bad_from=bad_from)
    t_gen, _ = timed(
        lambda: (
            base.write(os.path.join(logdir, "tf1"), range(steps), "tf1"),
            cand.write(os.path.join(logdir, "tf2"), range(steps), "tf2"),
        )
    )
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(logdir) for f in fs)

    def cold() -> object:
        reader = LogdirReader(logdir)
        reader.reload()
        report = Comparison(reader.run("tf1"), reader.run("tf2")).report()
        reader.close()
        return report

    t_cold, report = timed(cold)
    reader = LogdirReader(logdir)
    reader.reload()
    b, c = reader.run("tf1"), reader.run("tf2")
    t_warm, report = best_of(3, lambda: Comparison(b, c).report())
    t_warm_old, report_old = best_of(3, per_pair(lambda: Comparison(b, c).report()))
    assert report_old.to_dict() == report.to_dict()  # type: ignore[attr-defined]
    first = report.first_divergence
    found = "agree" if first is None else f"step {first.step} {first.kind}/{first.tensor}"
    expect = "agree" if bad_from < 0 else f"step {bad_from} grad/layer_120/t:0"
    assert found == expect, (found, expect)
    cmp = Comparison(b, c)
    cmp.report()
    t_matrix, _ = timed(cmp.matrix)
    cmp_old = per_pair(lambda: Comparison(b, c))()
    per_pair(cmp_old.report)()  # type: ignore[attr-defined]
    per_pair(cmp_old.matrix)()  # type: ignore[attr-defined]
    if bad_from >= 0:  # the scan stopped at the divergence; the matrix filled the rest
        assert cmp.matrix().first_divergence[0] == bad_from
    t_naive = naive_seconds(logdir, steps_subset=min(steps, 50), total_steps=steps) if naive else None
    # incremental: append 100 steps ``increments`` times (the first may also grow the reader's
    # buffers); each is timed once (a refresh cannot be repeated on the same state), so the summary
    # is the median of them, with every increment's ratio printed beside it.
    lines, times = [], []
    for extra in range(increments):
        lo = steps + 100 * extra
        base.write(os.path.join(logdir, "tf1"), range(lo, lo + 100), "tf1")
        cand.write(os.path.join(logdir, "tf2"), range(lo, lo + 100), "tf2")
        t_read, (b2, c2) = timed(lambda: (reader.reload(), (reader.run("tf1"), reader.run("tf2")))[1])
        # Each gets the new snapshots as the reader hands them out, nothing derived from them yet
        # (a snapshot keeps its first NaN/Inf once found: whoever ran second would get it free).
        t_engine, _ = timed(lambda b2=b2, c2=c2: (cmp.update(*as_new(b2, c2)), cmp.report(), cmp.matrix()))
        t_scratch, _ = timed(lambda b2=b2, c2=c2: (lambda x: (x.report(), x.matrix()))(Comparison(*as_new(b2, c2))))
        t_engine_old, _ = timed(
            per_pair(lambda b2=b2, c2=c2: (cmp_old.update(*as_new(b2, c2)), cmp_old.report(), cmp_old.matrix()))
        )
        t_scratch_old, _ = timed(
            per_pair(lambda b2=b2, c2=c2: (lambda x: (x.report(), x.matrix()))(Comparison(*as_new(b2, c2))))
        )
        times.append((t_engine, t_scratch, t_engine_old, t_scratch_old))
        lines.append(
            f"read {t_read:.3f}s + engine {t_engine:.3f}s vs from scratch {t_scratch:.3f}s (x{t_scratch / max(t_engine, 1e-9):.1f})"
            f" | per-pair (old): engine {t_engine_old:.3f}s vs from scratch {t_scratch_old:.3f}s"
            f" (x{t_scratch_old / max(t_engine_old, 1e-9):.1f}); refresh new/old x{t_engine_old / max(t_engine, 1e-9):.1f} faster"
        )
    reader.close()
    naive_text = (
        ""
        if t_naive is None
        else f"\n{'':<18} naive parse + assert_allclose per record (scaled from 50 steps): {t_naive:7.2f}s = x{t_naive / t_warm:.0f} warm, x{t_naive / t_cold:.0f} cold"
    )
    print(
        f"{label:<18} {size / 1e6:6.0f} MB gen {t_gen:5.1f}s | cold {t_cold:6.3f}s  warm {t_warm:6.3f}s "
        f"(per-pair, old: {t_warm_old:6.3f}s, x{t_warm_old / max(t_warm, 1e-9):.1f})  "
        f"matrix {t_matrix:6.3f}s | {found}\n{'':<18} +100 steps: "
        + f"\n{'':<18} +100 more:  ".join(lines)
        + f"\n{'':<18} {refresh_summary(times)}"
        + naive_text
    )
    shutil.rmtree(logdir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="2000 steps (the real P3 size; 2.5 GB on disk)")
    parser.add_argument("--steps", type=int, help="override the number of steps")
    parser.add_argument("--dir", default=None, help="where to build the logdirs (default: a temp dir)")
    parser.add_argument("--only", choices=["stats", "values"], help="run one variant")
    parser.add_argument("--increments", type=int, default=5, help="refreshes of +100 steps to time (default 5)")
    args = parser.parse_args()
    steps = args.steps or (2000 if args.full else 400)
    root = tempfile.mkdtemp(prefix="tbp_p3_", dir=args.dir)
    free = shutil.disk_usage(root).free
    need = 2 * 2 * (steps + 100) * (N_VEC * VEC_SIZE + N_SCALAR) * 4 * 1.05
    if args.only != "stats" and free < need:
        print(f"need ~{need / 1e9:.1f} GB free in {root}, have {free / 1e9:.1f} GB", file=sys.stderr)
        return 2
    print(
        f"P3: 2 runs x {steps} steps x {N_VEC + N_SCALAR} tensors ({N_VEC} x {VEC_SIZE} float32 + {N_SCALAR} scalars); targets at 2000 steps: stats cold < 1 s, warm < 0.5 s; values warm <= 3 s"
    )
    try:
        for full_values in (False, True):
            if args.only and args.only != ("values" if full_values else "stats"):
                continue
            for kind in ("diverge", "agree", "agree-noisy"):
                label = f"{'values' if full_values else 'stats'}/{kind}"
                scenario(root, label, steps, full_values, kind, naive=(kind == "diverge"), increments=args.increments)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
