"""P2 floor: where a reader that keeps what it reads must spend, on this machine (no tb-parity code).

The reader reads 16 MiB chunks into one reused buffer, checks CRCs there and copies each
record's payload into the run's columns (fresh memory, kept). Issue 13 asked whether reading
the payloads straight into the columns (``os.preadv`` scattered into each record's slot) or
pre-faulted column memory would save that copy. This measures the candidates on one file
in the page cache, each the same bytes:

* ``buffer``: ``preadv`` into a reused 16 MiB private mmap (what raw framing pays);
* ``buffer + copy``: the same, plus a copy of every chunk into fresh numpy memory (the reader);
* ``straight into fresh numpy``: ``preadv`` of 16 MiB pieces directly into fresh numpy memory
  (a scattered read's best case: one piece per chunk instead of one per record);
* ``straight into fresh 4K pages``: the same into a private mmap without huge pages;
* ``populate + copy``: fresh numpy memory pre-faulted with ``MADV_POPULATE_WRITE``, then the copy.

    .venv/bin/python benchmarks/bench_p2_memory.py [--mb 256] [--repeat 5]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import tempfile
import time
from typing import Callable

import numpy as np

CHUNK = 16 << 20
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14


def _private(size: int) -> mmap.mmap:
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _read_chunks(fd: int, size: int, into: Callable[[int], memoryview]) -> None:
    offset = 0
    while offset < size:
        offset += os.preadv(fd, [into(offset)], offset)


def candidates(fd: int, size: int) -> dict[str, Callable[[], None]]:
    buffer = _private(CHUNK)
    view = memoryview(buffer)
    chunk = np.frombuffer(buffer, np.uint8)

    def buffered() -> None:
        _read_chunks(fd, size, lambda _: view[: min(CHUNK, size)])

    def buffered_copy() -> None:
        out = np.empty(size, np.uint8)
        offset = 0
        while offset < size:
            n = os.preadv(fd, [view], offset)
            out[offset : offset + n] = chunk[:n]
            offset += n

    def straight_numpy() -> None:
        out = memoryview(np.empty(size, np.uint8))
        _read_chunks(fd, size, lambda at: out[at : at + CHUNK])

    def straight_4k() -> None:
        memory = _private(size)
        out = memoryview(memory)
        _read_chunks(fd, size, lambda at: out[at : at + CHUNK])
        out.release()
        memory.close()

    def populate_copy() -> None:
        out = np.empty(size, np.uint8)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        start = out.ctypes.data & ~(mmap.PAGESIZE - 1)
        libc.madvise(start, out.ctypes.data + size - start, _MADV_POPULATE_WRITE)
        offset = 0
        while offset < size:
            n = os.preadv(fd, [view], offset)
            out[offset : offset + n] = chunk[:n]
            offset += n

    return {
        "buffer (raw framing's read)": buffered,
        "buffer + copy into fresh numpy (reader)": buffered_copy,
        "straight into fresh numpy (scattered)": straight_numpy,
        "straight into fresh 4K pages": straight_4k,
        "populate (MADV_POPULATE_WRITE) + copy": populate_copy,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    size = args.mb << 20
    with tempfile.NamedTemporaryFile(prefix="bench_p2_memory_") as f:
        f.write(np.random.default_rng(0).integers(0, 255, size, np.uint8).tobytes())
        f.flush()
        fd = os.open(f.name, os.O_RDONLY)
        try:
            fns = candidates(fd, size)
            times: dict[str, list[float]] = {name: [] for name in fns}
            for fn in fns.values():
                fn()  # page cache and code warm
            for _ in range(args.repeat):  # interleaved rounds: load on the shared machine hits all alike
                for name, fn in fns.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
        finally:
            os.close(fd)
    base = statistics.median(times["buffer (raw framing's read)"])
    print(f"{args.mb} MB from the page cache, median of {args.repeat} interleaved rounds")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"  {name:42} {t * 1e3:8.1f} ms  {size / t / 1e9:5.1f} GB/s  {t / base:5.2f}x the buffered read")


if __name__ == "__main__":
    main()
