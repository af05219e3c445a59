"""Remote logdirs: first divergence on the P3 statistics pair, local against S3 on loopback.

The same logdir is read from a local directory and from a real S3-compatible server (moto's
server mode on 127.0.0.1), side by side in one run; it prints the cold times, their ratio,
and the bytes fetched against the bytes stored (ranged reads of new bytes only: after the
first read, a reload of an unchanged logdir fetches nothing, and one after +100 steps fetches
about their size).

    python benchmarks/bench_remote.py [--steps 400] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_p3_first_divergence import Synth

from tb_parity_plugin.engine import Comparison
from tb_parity_plugin.logdir.reader import LogdirReader


def first_divergence(logdir: str) -> tuple[float, LogdirReader, str]:
    t0 = time.perf_counter()
    reader = LogdirReader(logdir)
    reader.reload()
    report = Comparison(reader.run("tf1"), reader.run("tf2")).report()
    elapsed = time.perf_counter() - t0
    first = report.first_divergence
    return elapsed, reader, "agree" if first is None else f"step {first.step} {first.kind}/{first.tensor}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_DEFAULT_REGION="us-east-1",
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir("bench")
    with tempfile.TemporaryDirectory() as root:
        steps = args.steps
        base, cand = Synth(0, False), Synth(0, False, bad_from=(steps * 3) // 4)
        local = os.path.join(root, "p3")
        base.write(os.path.join(local, "tf1"), range(steps), "tf1")
        cand.write(os.path.join(local, "tf2"), range(steps), "tf2")
        stored = 0
        for side in ("tf1", "tf2"):
            for name in os.listdir(os.path.join(local, side)):
                data = open(os.path.join(local, side, name), "rb").read()
                stored += len(data)
                fs.pipe(f"bench/p3/{side}/{name}", data)
        url = "s3://bench/p3"
        times: dict[str, list[float]] = {"local": [], "s3": []}
        found = set()
        fetched = 0
        for _ in range(args.reps):  # interleaved, so both see the same machine load
            for label, logdir in (("local", local), ("s3", url)):
                t, reader, verdict = first_divergence(logdir)
                times[label].append(t)
                found.add(verdict)
                if label == "s3":
                    fetched = reader._storage.bytes_fetched  # type: ignore[attr-defined]
                    t0 = time.perf_counter()
                    reader.reload()  # nothing new: a listing, no ranged read
                    t_idle = time.perf_counter() - t0
                    idle_fetch = reader._storage.bytes_fetched - fetched  # type: ignore[attr-defined]
                reader.close()
        assert len(found) == 1, found
        loc, rem = statistics.median(times["local"]), statistics.median(times["s3"])
        print(
            f"P3 statistics pair, 2 x {steps} steps x 200 tensors, {stored / 1e6:.1f} MB stored; verdict {found.pop()}"
        )
        print(f"  cold first divergence, median of {args.reps}: local {loc:.3f} s, S3 on loopback {rem:.3f} s")
        print(f"  ratio S3/local: x{rem / loc:.2f}")
        print(f"  bytes fetched / stored on the first read: {fetched / stored:.3f}")
        print(f"  idle reload: {t_idle:.3f} s, {idle_fetch} bytes fetched")
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
