"""Progress for long logdir reads: a tqdm bar in a terminal, a widget in notebooks.

The reader stays free of UI: it only counts ``bytes_read``. We run its ``reload()`` on a
worker thread and move a bar to that count against the event files' total size.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import TYPE_CHECKING, Any, Optional

from tb_parity_plugin.logdir import storage

if TYPE_CHECKING:
    from tb_parity_plugin.engine import ParityReport
    from tb_parity_plugin.logdir.reader import LogdirReader

#: Reads smaller than this finish too fast for a bar to help.
AUTO_THRESHOLD_BYTES = 64 << 20


def event_bytes(logdir: str) -> int:
    """Total size of the event files under ``logdir`` (what a cold read has to get through)."""
    try:
        store = storage.open_storage(logdir)
        total = 0
        for paths in store.discover().values():
            for path in paths:
                try:
                    total += store.info(path).size
                except OSError:
                    pass
        return total
    except OSError:  # the reader reports it; the bar is only a convenience
        return 0


def _bar_class() -> Optional[Any]:
    """tqdm's notebook widget inside a kernel with ipywidgets, else the terminal bar; None without tqdm."""
    try:
        if "ipykernel" in sys.modules and importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.notebook import tqdm
        else:
            from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def reload_with_progress(reader: LogdirReader, *, show: Optional[bool] = None) -> bool:
    """``reader.reload()`` with a progress bar; ``show=None`` shows one only for big logdirs.

    Returns what ``reload()`` returned; re-raises what it raised.
    """
    total = event_bytes(reader.logdir) if show is not False else 0
    bar_cls = _bar_class() if (show or (show is None and total >= AUTO_THRESHOLD_BYTES)) else None
    if bar_cls is None:
        return reader.reload()
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["value"] = reader.reload()
        except BaseException as exc:  # handed to the caller's thread below
            result["error"] = exc

    start = reader.bytes_read
    worker = threading.Thread(target=work, name="tb-parity-read", daemon=True)
    with bar_cls(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="reading logdir", leave=False) as bar:
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            bar.update(min(reader.bytes_read - start, total) - bar.n)
        bar.update(total - bar.n)
    if "error" in result:
        raise result["error"]
    value: bool = result["value"]
    return value


def compare_with_progress(
    logdir: str,
    baseline: Optional[str] = None,
    candidate: Optional[str] = None,
    *,
    progress: Optional[bool] = None,
    **policy: Any,
) -> ParityReport:
    """``api.compare`` whose logdir read shows progress (``progress=None``: big logdirs only)."""
    from tb_parity_plugin import api

    return api.compare(logdir, baseline, candidate, reload=lambda r: reload_with_progress(r, show=progress), **policy)
