"""Keeps one engine ``Comparison`` per (pair, policy, mapping), refreshed by generation.

The summary, matrix and tensor routes of one pair all need the same comparison, and
the dashboard asks for them together and again on every auto-refresh. Each entry
remembers the runs' ``generation`` it last saw: unchanged runs are answered from
memory; runs that grew go through ``Comparison.update`` (which keeps the verdicts of
steps already compared). ``Comparison`` is not thread-safe, so each entry has a lock
and concurrent requests for one pair wait for a single computation.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Callable, Hashable, Optional, TypeVar

from tb_parity_plugin.engine import Comparison, ParityReport

T = TypeVar("T")


@dataclasses.dataclass
class Entry:
    """One cached comparison; use only inside :meth:`ComparisonCache.use`."""

    comparison: Comparison
    generations: tuple[int, int]
    report: ParityReport
    derived: dict[Hashable, Any] = dataclasses.field(default_factory=dict)  # e.g. ("matrix", width) -> payload

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """A value derived from this comparison, recomputed after the runs changed."""
        if key not in self.derived:
            self.derived[key] = compute()
        value: T = self.derived[key]  # stored by compute() for this key
        return value


class ComparisonCache:
    """Thread-safe LRU of :class:`Entry` keyed by the query (pair, policy, mapping)."""

    def __init__(self, capacity: int = 8) -> None:
        self._capacity = capacity
        self._entries: collections.OrderedDict[Hashable, Entry] = collections.OrderedDict()
        self._locks: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()
        self.computed = 0  # full comparisons built (tests and benchmarks read this)
        self.updated = 0  # incremental refreshes after runs grew

    def use(
        self, key: Hashable, base: Any, cand: Any, policy: Any, mapping: tuple[str, ...], fn: Callable[[Entry], T]
    ) -> T:
        """Run ``fn`` on the up-to-date entry for ``key`` while holding its lock."""
        with self._lock:
            key_lock = self._locks.setdefault(key, threading.Lock())
        with key_lock:
            try:
                return self._use_locked(key, base, cand, policy, mapping, fn)
            finally:
                with self._lock:  # a query that failed stores nothing: drop its lock too
                    if key not in self._entries:
                        self._locks.pop(key, None)

    def _use_locked(
        self, key: Hashable, base: Any, cand: Any, policy: Any, mapping: tuple[str, ...], fn: Callable[[Entry], T]
    ) -> T:
        generations = (base.generation, cand.generation)
        with self._lock:
            entry: Optional[Entry] = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None:
            comparison = Comparison(base, cand, policy, mapping)
            entry = Entry(comparison, generations, comparison.report())
            self.computed += 1
        elif entry.generations != generations:
            entry.comparison.update(base, cand)
            entry.generations, entry.report, entry.derived = generations, entry.comparison.report(), {}
            self.updated += 1
        with self._lock:  # stored before fn runs: a 404 for one tensor keeps the comparison
            self._entries[key] = entry
            while len(self._entries) > self._capacity:
                old, _ = self._entries.popitem(last=False)
                self._locks.pop(old, None)
        return fn(entry)
