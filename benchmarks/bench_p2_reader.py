"""P2: reader throughput against raw TFRecord framing of the same files, with and without TF.

Builds two logdirs in a temp dir (statistics only; full values for most tensors),
then measures with warm page cache, ``--repeat`` interleaved rounds (raw, ours, ...
in each round, so load on the shared machine hits all alike), reporting medians:

* raw framing: the reader's own way of reading (a buffer from ``event_scan.new_buffer``,
  ``readinto`` in the reader's chunks), length + data CRC checks (google_crc32c), payload views;
* the floor of a reader that keeps what it reads: raw framing plus a copy of every payload
  into fresh memory (raw framing keeps nothing);
* the floor of a reader that would copy nothing after the kernel: each file read whole into
  fresh memory of its size, kept, with small pages and with huge pages (arrays would be views);
* the reader and raw framing as they were before session 8 (16 MiB chunks), side by side;
* our ``LogdirReader``: cold ``reload()`` plus materialising every run's arrays;
* TensorBoard's ``EventFileLoader`` (TF installed: TF's record reader; proto parse);
* in a subprocess with ``import tensorflow`` blocked: our reader again, and
  ``EventFileLoader`` on its pure-Python CRC path (on a prefix of the files,
  ``--notf-tb-mb``, since it runs at a few MB/s).

Targets: our reader >= 50% of raw framing throughput, with and without TF (issue #2, P2);
issue 13 asks >= 70% on statistics only and >= 50% on full values.

    .venv/bin/python benchmarks/bench_p2_reader.py            # ~1/4 scale, about 1 minute
    .venv/bin/python benchmarks/bench_p2_reader.py --full     # 2 runs x 2000 steps x 200 tensors
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

BLOCK_TF = """
import importlib.abc, sys
class _NoTF(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("tensorflow blocked by bench_p2_reader")
sys.meta_path.insert(0, _NoTF())
"""

if __name__ == "__main__" and "--child-no-tf" in sys.argv:
    exec(BLOCK_TF)  # before anything can import TensorFlow

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tb_parity_plugin.logdir import event_scan  # noqa: E402
from tb_parity_plugin.logdir import reader as reader_module  # noqa: E402
from tb_parity_plugin.logdir.reader import CHUNK_SIZE, LogdirReader  # noqa: E402
from tb_parity_plugin.records import event_file, health  # noqa: E402
from tb_parity_plugin.records.metadata import N_STATS  # noqa: E402
from tb_parity_plugin.records.writer import BlockWriter, build_layout  # noqa: E402

VERSUS = "_versus"  # rows key of the side-by-side ratios (not a way of reading)
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def build_logdir(root: str, runs: int, steps: int, tensors: int, valued: int, size: int, keep_values: bool) -> str:
    """``runs`` runs of ``steps`` steps; ``valued`` tensors of ``size`` float32, the rest scalars."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(size).astype(np.float32) for _ in range(valued)]
    arrays += [np.float32(rng.standard_normal()) for _ in range(tensors - valued)]
    entries = [
        ("weight" if i % 2 else "activation", f"layer_{i}/t:0", "float32", np.shape(a)) for i, a in enumerate(arrays)
    ]
    layout = build_layout(entries, full_values_limit=size if keep_values else 0)
    stats = np.stack([health.health_numpy(a) for a in arrays])
    flat = np.concatenate([np.ravel(a) for a in arrays]) if keep_values else None
    for r in range(runs):
        writer = BlockWriter(os.path.join(root, f"run{r}"), side="tf1" if r == 0 else "tf2")
        for step in range(steps):
            blocks = {"float32": flat + np.float32(step)} if keep_values else {}
            writer.write_step(step, layout, stats, blocks, {"lr": 0.01, "loss": 1.0 / (step + 1)})
        writer.close()
    return root


def event_files(logdir: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(logdir) for f in fs if "tfevents" in f)


def kept_buffer(size: int, huge: bool) -> mmap.mmap:
    """Fresh anonymous memory for a whole file, small pages (``event_scan.new_buffer``'s kind) or
    transparent huge pages (``MADV_HUGEPAGE``: one fault per 2 MiB instead of per 4 KiB)."""
    buf = event_scan.new_buffer(size)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


def raw_framing(
    files: list[str],
    chunk: int = CHUNK_SIZE,
    keep: bool = False,
    into: np.ndarray | None = None,
    in_place: bool | None = None,
) -> int:
    """Frame every record (length CRC, data CRC, payload view) like a minimal reader; returns records.

    Reads the way LogdirReader does: one buffer per call, ``readinto`` in ``chunk``-byte chunks.
    ``keep``: also copy every payload into one fresh array, the least a reader that keeps what it
    reads must add to framing (the floor for LogdirReader: raw framing keeps nothing). ``into``:
    copy them into this array instead, memory already paged in (what the copy costs without the
    fresh pages: their first-touch faults and the kernel's zeroing are the rest of the floor).
    ``in_place``: no copy after the kernel's: each file is read whole, chunk by chunk, into fresh
    memory of its size that is kept (False: small pages, True: huge pages), the floor of a reader
    whose arrays would be views of the bytes where they were read.
    """
    crc, records = event_file.masked_crc32c, 0
    buf: Any = event_scan.new_buffer(chunk)
    kept = into if into is not None else np.empty(sum(map(os.path.getsize, files)), np.uint8) if keep else None
    at = 0
    held = []  # in_place: the files' buffers, kept to the end as a reader's arrays would keep them
    for path in files:
        with open(path, "rb") as f:
            offset, want = 0, chunk
            if in_place is not None:
                whole = kept_buffer(os.path.getsize(path), in_place)
                held.append(whole)
            while True:
                if in_place is not None:  # frame at the file's own offsets in its kept buffer
                    buf = memoryview(whole)[offset : offset + want]
                elif len(buf) < want:
                    buf = event_scan.new_buffer(want)
                f.seek(offset)
                end = f.readinto(memoryview(buf)[:want])
                view, u8, pos = memoryview(buf), np.frombuffer(buf, np.uint8), 0
                while pos + 12 <= end:
                    length = _U64.unpack_from(buf, pos)[0]
                    if crc(u8[pos : pos + 8]) != _U32.unpack_from(buf, pos + 8)[0]:
                        raise ValueError(f"{path}: bad length CRC at {offset + pos}")
                    if pos + 16 + length > end:
                        break
                    payload = view[pos + 12 : pos + 12 + length]
                    if crc(u8[pos + 12 : pos + 12 + length]) != _U32.unpack_from(buf, pos + 12 + length)[0]:
                        raise ValueError(f"{path}: bad data CRC at {offset + pos}")
                    if kept is not None:
                        kept[at : at + length] = u8[pos + 12 : pos + 12 + length]
                        at += length
                    del payload
                    records += 1
                    pos += 16 + length
                del view, u8
                offset += pos
                if end < want:
                    break
                want = max(chunk, 16 + _U64.unpack_from(buf, pos)[0] if pos + 8 <= end else chunk)
    return records


def our_reader(logdir: str, chunk: int = CHUNK_SIZE) -> int:
    """Cold read of the logdir and every run's arrays; returns tensor-records (steps x tensors).

    ``chunk``: the reader's chunk size (16 MiB was the reader's before session 8).
    """
    saved, reader_module.CHUNK_SIZE = reader_module.CHUNK_SIZE, chunk
    try:
        return _read_all(logdir)
    finally:
        reader_module.CHUNK_SIZE = saved


def _read_all(logdir: str) -> int:
    reader = LogdirReader(logdir)
    reader.reload()
    count = 0
    for name in reader.run_names():
        run = reader.run(name)
        for series in run.tensors.values():
            count += len(series.steps)
            assert series.stats.shape == (len(series.steps), N_STATS)
            series.stats[-1].sum()  # touch one row: summing all of them is the consumer's work, not reading
    reader.close()
    if reader.problems:
        raise RuntimeError(reader.problems)
    return count


def tb_loader(files: list[str]) -> int:
    """TensorBoard's EventFileLoader (framing + CRC + Event parse); returns events."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return sum(1 for path in files for _ in EventFileLoader(path).Load())


def interleaved(repeat: int, fns: dict[str, Callable[[], int]]) -> dict[str, tuple[list[float], int]]:
    """Name -> (seconds of each round, result); each round runs every function once, in turn."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, int] = {}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (times[name], results[name]) for name in fns}


def prefix_copy(files: list[str], limit: int, out_dir: str) -> list[str]:
    """Copies of ``files`` cut at a record boundary so that they total at most ``limit`` bytes."""
    copies, budget = [], limit
    for i, path in enumerate(files):
        data, pos = open(path, "rb").read(), 0
        while pos + 12 <= len(data) and pos + 16 + _U64.unpack_from(data, pos)[0] <= budget:
            pos += 16 + _U64.unpack_from(data, pos)[0]
        if pos == 0:
            break
        copy = os.path.join(out_dir, f"events.out.tfevents.{i}.prefix")
        with open(copy, "wb") as f:
            f.write(data[:pos])
        copies.append(copy)
        budget -= pos
    return copies


def measure(logdir: str, repeat: int, with_tf_loader: bool, notf_tb_bytes: int) -> dict:
    """Rows name -> (median seconds, bytes, count, unit, median per-round ratio to raw) for one logdir."""
    files = event_files(logdir)
    size = sum(os.path.getsize(p) for p in files)
    raw_framing(files)  # warm the page cache
    our_reader(logdir)
    old = 16 << 20  # the chunk size before session 8, for the side-by-side rows
    fns = {
        "raw TFRecord framing": (lambda: raw_framing(files), "records"),
        "LogdirReader cold + arrays": (lambda: our_reader(logdir), "tensor-records"),
        "floor: framing + keeping each payload": (lambda: raw_framing(files, keep=True), "records"),
        "zero-copy floor: in place, small pages": (lambda: raw_framing(files, in_place=False), "records"),
        "zero-copy floor: in place, huge pages": (lambda: raw_framing(files, in_place=True), "records"),
        "old: raw framing, 16 MiB chunks": (lambda: raw_framing(files, old), "records"),
        "old: LogdirReader, 16 MiB chunks": (lambda: our_reader(logdir, old), "tensor-records"),
    }
    if with_tf_loader:
        fns["TB EventFileLoader"] = (lambda: tb_loader(files), "events")
    timed = interleaved(repeat, {name: fn for name, (fn, _) in fns.items()})
    raw_times = timed["raw TFRecord framing"][0]
    rows: dict = {}
    for name, (times, n) in timed.items():
        ratio = statistics.median(r / t for r, t in zip(raw_times, times))
        rows[name] = (statistics.median(times), size, n, fns[name][1], ratio)

    def versus(a: str, b: str) -> float:
        """Median over rounds of time(a) / time(b): the throughput of b as a fraction of a's."""
        return statistics.median(x / y for x, y in zip(timed[a][0], timed[b][0]))

    rows[VERSUS] = {
        "reader / raw framing (target)": versus("raw TFRecord framing", "LogdirReader cold + arrays"),
        "old reader / old raw framing": versus("old: raw framing, 16 MiB chunks", "old: LogdirReader, 16 MiB chunks"),
        "reader / its floor (framing + keeping)": versus(
            "floor: framing + keeping each payload", "LogdirReader cold + arrays"
        ),
        "reader speed-up over the old reader": versus("old: LogdirReader, 16 MiB chunks", "LogdirReader cold + arrays"),
        "floor / raw framing": versus("raw TFRecord framing", "floor: framing + keeping each payload"),
        "zero-copy floor (huge pages) / raw framing": versus(
            "raw TFRecord framing", "zero-copy floor: in place, huge pages"
        ),
    }
    # What the floor's fresh pages cost: the same copy into memory paged in once, in a phase of its
    # own (623 MB held resident beside the rounds above made the reader 2-4x slower with TensorFlow
    # imported), interleaved with the floor again; small pages, the reader's buffer's kind of memory
    warm = np.frombuffer(event_scan.new_buffer(size), np.uint8)
    warm[:] = 1
    split = interleaved(
        repeat,
        {"fresh": lambda: raw_framing(files, keep=True), "warm": lambda into=warm: raw_framing(files, into=into)},
    )
    del warm
    warm_times, records = split["warm"]
    rows["  the same into paged-in memory (apart)"] = (
        statistics.median(warm_times),
        size,
        records,
        "records",
        statistics.median(raw_times) / statistics.median(warm_times),
    )
    rows[VERSUS]["fresh pages' share of the floor"] = 1 - statistics.median(
        w / f for w, f in zip(warm_times, split["fresh"][0])
    )
    if notf_tb_bytes:
        with tempfile.TemporaryDirectory() as tmp:
            prefix = prefix_copy(files, notf_tb_bytes, tmp)
            t, n = interleaved(1, {"tb": lambda: tb_loader(prefix)})["tb"]
            prefix_mbs = sum(os.path.getsize(p) for p in prefix) / t[0]
            rows["TB EventFileLoader (prefix)"] = (
                t[0],
                sum(os.path.getsize(p) for p in prefix),
                n,
                "events",
                prefix_mbs / (size / statistics.median(raw_times)),
            )
    return rows


def print_table(title: str, rows: dict) -> None:
    print(f"\n{title}")
    print(f"  {'way of reading':38} {'median s':>8} {'MB':>8} {'MB/s':>8} {'k/s':>9}  {'unit':15} {'vs raw':>7}")
    for name, (t, size, n, unit, ratio) in ((k, v) for k, v in rows.items() if k != VERSUS):
        print(
            f"  {name:38} {t:8.3f} {size / 1e6:8.1f} {size / t / 1e6:8.0f} {n / t / 1e3:9.1f}  {unit:15} {ratio:7.0%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--valued", type=int, default=150, help="tensors with ~size values (the rest are scalars)")
    parser.add_argument("--size", type=int, default=1000, help="elements of each valued tensor")
    parser.add_argument("--full", action="store_true", help="2 runs x 2000 steps x 200 tensors (2.4 GB)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds (medians reported)")
    parser.add_argument("--notf-tb-mb", type=float, default=20, help="bytes fed to TF-free EventFileLoader")
    parser.add_argument("--child-no-tf", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_no_tf:
        job = json.loads(args.child_no_tf)
        out = {label: measure(path, args.repeat, False, int(args.notf_tb_mb * 1e6)) for label, path in job.items()}
        assert not [m for m in sys.modules if m.split(".")[0] == "tensorflow"]
        print(json.dumps(out))
        return
    if args.full:
        args.steps = 2000
    tmp = tempfile.mkdtemp(prefix="bench_p2_")
    try:
        shape = (args.runs, args.steps, args.tensors, args.valued, args.size)
        start = time.perf_counter()
        logdirs = {
            "statistics only": build_logdir(os.path.join(tmp, "stats"), *shape, keep_values=False),
            "full values": build_logdir(os.path.join(tmp, "values"), *shape, keep_values=True),
        }
        print(
            f"P2 reader: {args.runs} runs x {args.steps} steps x {args.tensors} tensors "
            f"({args.valued} of {args.size} float32); built in {time.perf_counter() - start:.0f} s"
        )
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child-no-tf",
                json.dumps(logdirs),
                "--repeat",
                str(args.repeat),
                "--notf-tb-mb",
                str(args.notf_tb_mb),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        no_tf = json.loads(child.stdout)
        import tensorflow  # noqa: F401  (the "TF installed" side: EventFileLoader uses TF's reader)

        summary = []
        for label, path in logdirs.items():
            rows = measure(path, args.repeat, True, 0)
            blocked = {k: v if k == VERSUS else tuple(v) for k, v in no_tf[label].items()}
            print_table(f"{label}, TensorFlow installed (imported)", rows)
            print_table(f"{label}, TensorFlow blocked (subprocess)", blocked)
            for side, table in (("TF installed", rows), ("TF blocked", blocked)):
                figures = "  ".join(
                    f"{what} {value:.2f}x" if "speed-up" in what else f"{what} {value:.0%}"
                    for what, value in table[VERSUS].items()
                )
                summary.append(f"  {label:16} {side:13} {figures}")
        print(
            f"\nP2 targets: reader / raw framing >= 70% on statistics, >= 50% on full values "
            f"(median over {args.repeat} interleaved rounds):"
        )
        print("\n".join(summary))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
