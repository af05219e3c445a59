"""Keeps a ``LogdirReader`` current on a daemon thread.

TensorBoard's data provider samples tensor series (100 or 10 steps per tag), which a
parity check cannot use, so the plugin reads every step itself. Reading happens off
the request path (the reader is thread-safe and hands out consistent snapshots), so
requests never wait for a reload, except for the very first load (so the tab does not
flash "no runs").
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

from tb_parity_plugin.logdir.reader import LogdirReader, RunData

logger = logging.getLogger(__name__)


class BackgroundReader:
    """Owns the reader and its reload thread; thread-safe accessors for the routes."""

    def __init__(self, logdir: str, interval: float = 5.0) -> None:
        self._logdir = logdir
        self._interval = max(0.2, float(interval))
        self._reader: Optional[LogdirReader] = None
        self._lock = threading.Lock()  # guards reader creation and thread start
        self._first_load = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[str] = None

    def start(self) -> None:
        """Start the thread once (cheap; safe to call from ``is_active``)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._loop, name="tb_parity-reader", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def wait_first_load(self, timeout: float = 120.0) -> None:
        self.start()
        self._first_load.wait(timeout)

    @property
    def loaded(self) -> bool:
        return self._first_load.is_set()

    def reload_once(self) -> bool:
        """One incremental read; creates the reader when the logdir appears."""
        try:
            with self._lock:
                if self._reader is None:
                    self._reader = LogdirReader(self._logdir)
            changed = self._reader.reload()
            self.error = None
            return changed
        except FileNotFoundError as exc:
            self.error = str(exc)
            return False
        except Exception as exc:  # keep serving what was read; say why in /runs
            logger.exception("tb_parity: reading %s failed", self._logdir)
            self.error = f"{type(exc).__name__}: {exc}"
            return False

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.reload_once()
            self._first_load.set()
            self._stop.wait(self._interval)

    def run_names(self) -> list[str]:
        reader = self._reader
        return list(reader.run_names()) if reader is not None and self.loaded else []

    def run(self, name: str) -> RunData:
        """The run's current data; ``KeyError`` if it is not a run of this logdir."""
        if name not in self.run_names():
            raise KeyError(name)
        return self._reader.run(name)  # type: ignore[union-attr]
