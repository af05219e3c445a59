"""The tab in a real chromium at 2 runs x 2000 steps x 200 tensors, against a tiny pair.

Issue 3 asks that the heat map "stays interactive at 2000 steps x 200 tensors". This
measures what a user feels, side by side on the same machine in one run: a small pair
(40 steps x 20 tensors) and the large one, each served by its own real ``tensorboard``
and opened in Debian's chromium through Playwright:

* verdict on screen: from navigation to the first-divergence card showing a verdict;
* main-thread long tasks (> 50 ms, PerformanceObserver) inside the tab during that load;
* hover: mean time for the heat map's ``mousemove`` handler (tooltip rebuilt), over 400
  synthetic moves across the canvas, timed in the page;
* click to detail: from a click on a heat-map cell to the tensor detail showing its step.

Run: ``python benchmarks/bench_dashboard_browser.py [--steps 2000 --tensors 200]``.
Needs /usr/bin/chromium (``make chromium``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_routes import write_logdir

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
HASH = "#tb_parity&p.tb_parity.baseline=pair%2Ftf1&p.tb_parity.candidate=pair%2Ftf2"
LONG_TASKS = """
window.__longTasks = [];
try {
  new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__longTasks.push(e.duration); })
    .observe({ type: "longtask", buffered: true });
} catch (e) {}
"""
HOVER = """
(canvas) => {
  const r = canvas.getBoundingClientRect();
  const n = 400;
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    const x = r.left + ((i * 37) % 100) / 100 * r.width;
    const y = r.top + ((i * 61) % 100) / 100 * r.height;
    canvas.dispatchEvent(new MouseEvent("mousemove", { clientX: x, clientY: y, bubbles: true }));
  }
  return (performance.now() - t0) / n;
}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(logdir: str) -> Iterator[str]:
    """A real tensorboard on ``logdir``; yields its base URL once the pair's runs are listed."""
    port = free_port()
    tensorboard = shutil.which("tensorboard", path=os.path.dirname(sys.executable)) or "tensorboard"
    proc = subprocess.Popen(
        [tensorboard, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if b"pair/tf2" in urllib.request.urlopen(base + "data/plugin/tb_parity/runs", timeout=30).read():
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("tensorboard did not start")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def measure(browser, base: str) -> dict:
    """One fresh page: verdict time, long tasks, hover and click-to-detail times."""
    context = browser.new_context(viewport={"width": 1400, "height": 1900})
    context.add_init_script(LONG_TASKS)
    page = context.new_page()
    start = time.perf_counter()
    page.goto(base + HASH)
    frame = page.frame_locator("iframe")
    frame.locator("[data-testid=card][data-verdict]").wait_for(timeout=300_000)
    verdict_s = time.perf_counter() - start
    canvas = frame.locator("[data-testid=heatmap]")
    canvas.wait_for(timeout=60_000)
    tab = next(f for f in page.frames if f != page.main_frame and "tb_parity" in f.url)
    long_tasks = tab.evaluate("window.__longTasks || []")
    hover_ms = canvas.evaluate(HOVER)
    box = canvas.bounding_box()
    start = time.perf_counter()
    canvas.click(position={"x": box["width"] * 0.6, "y": 2})
    frame.locator("[data-testid=detail] [data-testid=detail-step]").wait_for(timeout=60_000)
    click_s = time.perf_counter() - start
    context.close()
    return {
        "verdict": verdict_s,
        "long_n": len(long_tasks),
        "long_max": max(long_tasks, default=0.0),
        "hover": hover_ms,
        "click": click_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not os.path.exists(CHROMIUM):
        print(f"needs {CHROMIUM} (make chromium)")
        return 1
    from playwright.sync_api import sync_playwright

    root = tempfile.mkdtemp(prefix="bench_dashboard_")
    try:
        sizes = {"small": (40, 20), "large": (args.steps, args.tensors)}
        start = time.perf_counter()
        for name, (steps, tensors) in sizes.items():
            write_logdir(os.path.join(root, name), steps, tensors, diverge_at=steps // 2)
        print(
            f"wrote 2 runs x {args.steps} steps x {args.tensors} tensors (+ a 40 x 20 pair) in {time.perf_counter() - start:.0f} s"
        )
        servers = {name: serve(os.path.join(root, name)) for name in sizes}
        bases = {name: next(gen) for name, gen in servers.items()}
        results: dict[str, list[dict]] = {name: [] for name in sizes}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            for _ in range(args.rounds):  # interleaved, so both sizes see the same machine load
                for name in sizes:
                    results[name].append(measure(browser, bases[name]))
            browser.close()
        for gen in servers.values():
            gen.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def median(name: str, key: str) -> float:
        values = sorted(r[key] for r in results[name])
        return values[len(values) // 2]

    print(f"{'medians of ' + str(args.rounds) + ' rounds':28}{'small':>12}{'large':>12}{'large/small':>13}")
    rows = [
        ("verdict on screen (s)", "verdict", "{:.2f}"),
        ("hover handler (ms/move)", "hover", "{:.3f}"),
        ("click to detail (s)", "click", "{:.2f}"),
        ("long tasks during load", "long_n", "{:.0f}"),
        ("longest task (ms)", "long_max", "{:.0f}"),
    ]
    for label, key, fmt in rows:
        s, lg = median("small", key), median("large", key)
        ratio = f"{lg / s:.1f}x" if s > 0 else "-"
        print(f"{label:28}{fmt.format(s):>12}{fmt.format(lg):>12}{ratio:>13}")
    hover = median("large", "hover")
    print(
        f"heat map hover at {args.steps} x {args.tensors}: {hover:.3f} ms per move "
        f"({'within' if hover < 16 else 'over'} one 60 Hz frame)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
