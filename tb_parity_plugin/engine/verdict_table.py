"""Every pair's verdicts as one ``[steps, pairs]`` table (reason codes and error ratios).

Why: a refresh grows every pair by the same new steps, and the matrix shows all of them. Held
per pair, a refresh allocated and copied two arrays per pair and the matrix stacked two arrays
per pair: most of what a refresh of 200 tensors cost beyond its new rows. Here each
:class:`~tb_parity_plugin.engine.pair.Pair`'s ``reason`` and ``ratio`` are column views of one
table whose rows keep a quarter of slack, so a growing run appends in place and the matrix is
one slice.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from tb_parity_plugin.engine.pair import Pair


class VerdictTable:
    """The reason codes (uint8) and error ratios (float32) of ``pairs``, one column each.

    Rows past a pair's ``done`` (``ratio_done``) are never read before they are computed; rows
    past the rows in use are 0 and NaN, what a fresh pair starts with.
    """

    def __init__(self) -> None:
        self.reason = np.zeros((0, 0), dtype=np.uint8)
        self.ratio = np.zeros((0, 0), dtype=np.float32)
        self._pairs: list[Pair] = []  # whose columns these are, in order (kept alive: ids stay theirs)
        self._index: dict[int, int] = {}  # id(pair) -> its column
        self._rows = 0

    def bind(self, pairs: Sequence[Pair], n: int) -> None:
        """Make each pair's ``reason`` and ``ratio`` its column (at least ``n`` rows: read them up to
        ``done``), keeping the verdicts each pair holds (its own arrays, or its column of the table
        it had). A refresh that only adds rows within the slack touches no pair."""
        same = len(pairs) == len(self._pairs) and all(p is q for p, q in zip(pairs, self._pairs))
        if not same or n > len(self.reason) or n < self._rows:
            capacity = n + n // 4 + 16
            reason = np.zeros((capacity, len(pairs)), dtype=np.uint8)
            ratio = np.full((capacity, len(pairs)), np.nan, dtype=np.float32)
            if same and n >= self._rows:  # only outgrown: one copy of the rows in use
                reason[: self._rows] = self.reason[: self._rows]
                ratio[: self._rows] = self.ratio[: self._rows]
            else:
                for j, p in enumerate(pairs):
                    reason[: p.done, j] = p.reason[: p.done]
                    ratio[: p.ratio_done, j] = p.ratio[: p.ratio_done]
            self.reason, self.ratio, self._pairs = reason, ratio, list(pairs)
            self._index = {id(p): j for j, p in enumerate(self._pairs)}
            for j, p in enumerate(pairs):  # the whole column: the slack rows are the next refresh's
                p.reason, p.ratio = self.reason[:, j], self.ratio[:, j]
        self._rows = n

    def columns(self, pairs: Sequence[Pair]) -> Optional[np.ndarray]:
        """The columns of ``pairs`` when each of them is bound to this table, else None."""
        index, mine, cols = self._index, self._pairs, []
        for p in pairs:
            j = index.get(id(p), -1)
            if j < 0 or mine[j] is not p:
                return None
            cols.append(j)
        return np.array(cols, dtype=np.intp)

    def matrix(self, pairs: Sequence[Pair], n: int) -> tuple[np.ndarray, np.ndarray]:
        """``([n, pairs] reasons, [n, pairs] ratios)``: read-only views when the table holds
        ``pairs``, else each pair's own arrays stacked (the engine before the table). A view stays
        true: rows below every pair's ``done`` are final, and a refresh that rebuilds pairs makes a
        new table."""
        if len(pairs) == len(self._pairs) and all(p is q for p, q in zip(pairs, self._pairs)) and n == self._rows:
            if any(p.done < n or p.ratio_done < n for p in pairs):
                raise ValueError("the matrix needs every verdict: fill() first")
            reason, ratio = self.reason[:n].view(), self.ratio[:n].view()
            reason.flags.writeable = ratio.flags.writeable = False
            return reason, ratio
        if not pairs:
            return np.zeros((n, 0), dtype=np.uint8), np.zeros((n, 0), dtype=np.float32)
        return np.stack([p.reason for p in pairs], axis=1), np.stack([p.ratio for p in pairs], axis=1)
