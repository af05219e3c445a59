"""Per run: the first step and tensor (in execution order) holding NaN or Inf.

Debugger V2's alert, from the recorded FULL_HEALTH counts, for one run on its own.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from tb_parity_plugin.engine import align, batch
from tb_parity_plugin.engine.pair import NONFINITE_COLS, same_memory


class FirstNonfinite:
    """One run's earliest (step, tensor in execution order) holding NaN/Inf, from the counts.

    Remembers per tensor the stats array it scanned and the first hit. A refresh whose
    stats start with the very same memory (an appending reload) scans only the new rows;
    anything else, such as a step rewritten later (last write wins), is rescanned whole.
    """

    def __init__(self) -> None:
        #: Per tensor: (stats scanned, first NaN/Inf step, the layout block they came from or None,
        #: the tensor's column in it).
        self._seen: dict[align.Key, tuple[np.ndarray, Optional[int], Optional[np.ndarray], int]] = {}

    def find(self, run: Any) -> Optional[dict[str, Any]]:
        best: Optional[tuple[tuple[int, tuple[int, int, str, str]], Any]] = None  # ((step, execution key), series)
        flagged: dict[tuple[int, int], np.ndarray] = {}  # (layout block, first row) -> columns with NaN/Inf
        kept: dict[tuple[int, int], bool] = {}  # (old block, new block) -> the same memory
        for key, series in run.tensors.items():
            stats = series.stats
            block = getattr(series, "block", None) if batch.ENABLED else None
            old, hit, old_block, old_column = self._seen.get(key, (None, None, None, -1))
            if old is None:
                unchanged = False
            elif block is not None and old_block is not None and old_column == series.column:  # once per layout
                pair = (id(old_block), id(block))
                if pair not in kept:
                    kept[pair] = same_memory(old_block, block)
                unchanged = kept[pair]
            else:
                unchanged = same_memory(old, stats)
            if unchanged:
                assert old is not None
                start = len(old) if hit is None else len(stats)  # an earlier hit cannot move
            else:
                start, hit = 0, None
            if block is not None and start < len(stats):  # one test for a layout's tensors, not one each
                at = (id(block), start)
                if at not in flagged:
                    flagged[at] = block[start:, :, NONFINITE_COLS].any(axis=0).any(axis=1)  # axis 0 first: 3x faster
                if not flagged[at][series.column]:
                    start = len(stats)
            if start < len(stats):
                counts = stats[start:, NONFINITE_COLS]  # a view: most runs have none, found without a copy
                if counts.any():
                    hit = int(series.steps[start + int(np.flatnonzero(counts.any(axis=1))[0])])
            self._seen[key] = (stats, hit, block, series.column)
            if hit is not None:
                rank = (hit, align.execution_key(series))
                if best is None or rank < best[0]:
                    best = (rank, series)
        if best is None:
            return None
        return {"step": best[0][0], "tensor": best[1].name, "kind": best[1].kind}
