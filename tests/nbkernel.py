"""Helpers for the notebook tests: run cells in a real IPython kernel, stop servers we started."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Iterable

import nbformat
from nbclient import NotebookClient


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 600) -> nbformat.NotebookNode:
    """Executes ``nb`` in a fresh ``python3`` kernel (this interpreter) with ``cwd`` as its directory."""
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def run_cells(sources: Iterable[str], cwd: Path) -> list:
    """Executes code cells in one kernel; returns the executed cells."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    return execute(nb, cwd).cells


def outputs(cell: nbformat.NotebookNode, mime: str) -> list[str]:
    """The ``mime`` payloads a cell displayed (``text/plain`` also covers its stdout)."""
    found = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and mime == "text/plain":
            found.append(out.text)
        elif "data" in out and mime in out.data:
            found.append(out.data[mime])
    return found


def http_get(url: str) -> tuple[int, str]:
    """GETs ``url`` (its hash is never sent)."""
    with urllib.request.urlopen(url.split("#", 1)[0], timeout=30) as resp:
        return resp.status, resp.read().decode("utf-8", "replace")


def stop_server(pid: int) -> None:
    """SIGTERMs a TensorBoard we started; it removes its own manager info file on exit."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # our own child: reap it so it does not linger as a zombie
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            pass
        time.sleep(0.1)
