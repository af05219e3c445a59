"""A real ``tensorboard`` process for the reliability tests, and a JSON client for its routes.

Why a process, not the WSGI test client: a request that blocks the interpreter (a
backtracking pattern) or a reload that raises only shows in the real server, whose
routes, reload thread and other users share one process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator, Optional

PLUGIN = "data/plugin/tb_parity/"
#: A request slower than this means the server is stuck (no test asserts a duration).
STUCK = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tensorboard(
    logdir: str, reload_interval: int = 1, flags: tuple[str, ...] = (), log_path: Optional[str] = None
) -> Iterator[str]:
    """Base URL (ending in ``/``, under any ``--path_prefix`` in ``flags``) of a tensorboard
    serving ``logdir``; stopped on exit, killed if stuck in a request."""
    port = _free_port()
    exe = shutil.which("tensorboard", path=os.path.dirname(sys.executable)) or "tensorboard"
    prefix = next((f.split("=", 1)[1] for f in flags if f.startswith("--path_prefix=")), "")
    log_path = log_path or os.path.join(os.path.dirname(logdir.rstrip("/")), f"tensorboard-{port}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                exe,
                "--logdir",
                logdir,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                f"--reload_interval={reload_interval}",
                *flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}{prefix}/"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(base + PLUGIN + "runs", timeout=30).read()
                    break
                except Exception as exc:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"tensorboard did not start; see {log_path}") from exc
                    time.sleep(0.3)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # stuck in a request (what these tests catch): not left running
                proc.kill()
                proc.wait(timeout=30)


def get(base: str, route: str, **params: Any) -> tuple[int, Any]:
    """(HTTP status, decoded JSON body) of ``route`` with ``params`` (lists repeat the key)."""
    query = urllib.parse.urlencode(params, doseq=True)
    url = base + PLUGIN + route + ("?" + query if query else "")
    try:
        with urllib.request.urlopen(url, timeout=STUCK) as response:
            status, body, kind = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, body, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    assert kind.startswith("application/json"), (route, status, body[:200])
    return status, json.loads(body)


def wait_for(check: Callable[[], Optional[Any]], what: str, timeout: float = 60.0) -> Any:
    """Poll ``check`` until it returns something truthy (the server reloads on its own time)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)
