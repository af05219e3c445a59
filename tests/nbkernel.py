"""Helpers for the notebook tests: run cells in a real IPython kernel, stop servers we started."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Iterable, Iterator

import nbformat
from nbclient import NotebookClient


def _client(nb: nbformat.NotebookNode, cwd: Path) -> NotebookClient:
    """A client for a ``python3`` kernel (this interpreter) running in ``cwd``."""
    return NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})


def execute(nb: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    """Executes ``nb`` in a fresh kernel, which is shut down afterwards."""
    _client(nb, cwd).execute()
    return nb


@contextlib.contextmanager
def live_kernel(nb: nbformat.NotebookNode, cwd: Path) -> Iterator[nbformat.NotebookNode]:
    """Executes ``nb`` and keeps its kernel alive inside the block.

    Shutting a kernel down ends its process group, so a TensorBoard the notebook started
    answers only while the kernel lives (as in Jupyter).
    """
    client = _client(nb, cwd)
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        yield nb


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


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def stop_server(pid: int) -> None:
    """SIGTERMs a TensorBoard we started; it removes its own manager info file on exit."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:  # our own child: reap it so it does not linger as a zombie
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not _alive(pid):
            return
        time.sleep(0.1)
