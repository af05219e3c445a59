"""Pairs the baseline's tensors with the candidate's, within the same kind.

TF1 and its Keras port name the same variable differently (``dense_1/kernel:0`` vs
``simple_model/dense_4/kernel:0``), so exact names are only the first try. In order,
each stage pairing only what earlier stages left:

1. ``map``: the user's mappings, ``OLD=NEW`` (exact) or ``re:PATTERN=REPL`` (regex
   substitution on baseline names); ``OLD`` may be a name or a ``kind/name`` tag;
2. ``exact``: identical names;
3. ``canonical``: names with ``:0`` and the run-wide shared scope prefix stripped, then
   additionally with Keras ``_N`` suffixes renumbered by first appearance;
4. ``fallback``: what is left, by execution order and shape.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Hashable, Iterable, Optional, Protocol, Sequence

from tb_parity_plugin.records import metadata

Key = tuple[str, str]  # (kind, name)


class SeriesLike(Protocol):
    kind: str
    name: str
    order: int
    shape: tuple[Optional[int], ...]


@dataclasses.dataclass(frozen=True)
class Match:
    base: Key
    cand: Key
    how: str  # exact | canonical | map | fallback


@dataclasses.dataclass
class Alignment:
    matches: list[Match]  # in baseline execution order
    unmatched_base: list[Key]  # in execution order
    unmatched_cand: list[Key]
    warnings: list[str]  # e.g. a mapping that matched nothing


def execution_key(series: SeriesLike) -> tuple[int, int, str, str]:
    """Sort key for execution order within a step (ties broken by phase, then tag)."""
    return (series.order, metadata.kind_phase(series.kind), series.kind, series.name)


_SUFFIX = re.compile(r"^(.*?)_(\d+)$")


def _strip_output_index(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name


def _strip_shared_prefix(names: Sequence[str]) -> list[str]:
    """Drop the leading scope components shared by every scoped name (keeping the last)."""
    scoped = [n.split("/") for n in names if "/" in n]
    depth = 0
    if scoped:
        shortest = min(len(parts) for parts in scoped) - 1
        while depth < shortest and len({parts[depth] for parts in scoped}) == 1:
            depth += 1
    if depth == 0:
        return list(names)
    return ["/".join(n.split("/")[depth:]) if "/" in n else n for n in names]


def _renumber(names: Sequence[str]) -> list[str]:
    """Renumber ``layer_N`` scope components per layer-type base by first appearance.

    ``dense, dense_1`` and ``dense_3, dense_4`` both become ``dense#0, dense#1``. The
    last component (the variable's own name) is kept as is. ``names`` must be in
    execution order.
    """
    seen: dict[str, dict[str, int]] = {}

    def token(component: str) -> str:
        m = _SUFFIX.match(component)
        base = m.group(1) if m else component
        ids = seen.setdefault(base, {})
        return f"{base}#{ids.setdefault(component, len(ids))}"

    out = []
    for name in names:
        parts = name.split("/")
        out.append("/".join([token(p) for p in parts[:-1]] + parts[-1:]))
    return out


def _canonical_names(series: Sequence[SeriesLike], renumber: bool) -> list[str]:
    names = _strip_shared_prefix([_strip_output_index(s.name) for s in series])
    return _renumber(names) if renumber else names


def parse_mapping(item: str) -> tuple[Optional[re.Pattern[str]], str, str]:
    """``OLD=NEW`` or ``re:PATTERN=REPL`` (the first ``=`` separates); ``ValueError`` if malformed."""
    text = item[3:] if item.startswith("re:") else item
    old, sep, new = text.partition("=")
    if not sep or not old:
        raise ValueError(f"mapping {item!r} is not OLD=NEW or re:PATTERN=REPL")
    if item.startswith("re:"):
        try:
            regex = re.compile(old)
            regex.sub(new, "")  # compiles REPL too: a bad group reference fails here, not mid-scan
        except re.error as exc:
            raise ValueError(f"mapping {item!r}: bad regex: {exc}") from None
        return regex, old, new
    return None, old, new


class _Pairing:
    """Mutable state of one alignment: what is still free on each side."""

    def __init__(self, base: Sequence[SeriesLike], cand: Sequence[SeriesLike]) -> None:
        self.base = sorted(base, key=execution_key)
        self.cand = sorted(cand, key=execution_key)
        self.free_base = {(s.kind, s.name) for s in self.base}
        self.free_cand = {(s.kind, s.name) for s in self.cand}
        self.matches: list[Match] = []

    def pair(self, b: Key, c: Key, how: str) -> None:
        self.free_base.discard(b)
        self.free_cand.discard(c)
        self.matches.append(Match(b, c, how))

    def by_key(self, key_of: Callable[[Sequence[SeriesLike]], Sequence[Hashable]], how: str) -> None:
        """Pair free tensors whose (kind, key) is unique among the free ones on both sides."""

        def index(series: list[SeriesLike]) -> dict[Hashable, Optional[Key]]:
            free = self.free_base if series is self.base else self.free_cand
            table: dict[Hashable, Optional[Key]] = {}
            for s, key in zip(series, key_of(series)):
                if (s.kind, s.name) in free:
                    k = (s.kind, key)
                    table[k] = None if k in table else (s.kind, s.name)  # None: ambiguous
            return table

        cand_index = index(self.cand)
        for k, b in index(self.base).items():
            c = cand_index.get(k)
            if b is not None and c is not None:
                self.pair(b, c, how)

    def by_mapping(self, items: Iterable[str]) -> list[str]:
        warnings = []
        cand_names = {(s.kind, s.name) for s in self.cand}
        for item in items:
            regex, old, new = parse_mapping(item)
            used = False
            for s in self.base:
                b = (s.kind, s.name)
                if b not in self.free_base:
                    continue
                if regex is None:
                    if old == s.name:
                        target = new
                    elif old == f"{s.kind}/{s.name}":
                        target = new[len(s.kind) + 1 :] if new.startswith(s.kind + "/") else new
                    else:
                        continue
                else:
                    if regex.search(s.name) is None:
                        continue
                    target = regex.sub(new, s.name)
                c = (s.kind, target)
                if c in cand_names and c in self.free_cand:
                    self.pair(b, c, "map")
                    used = True
            if not used:
                warnings.append(f"mapping {item!r} paired no tensors")
        return warnings

    def by_order_and_shape(self) -> None:
        """Per kind, walk both sides in execution order pairing equal shapes (order-preserving)."""
        kinds = {s.kind for s in self.base}
        for kind in sorted(kinds):
            bs = [s for s in self.base if s.kind == kind and (s.kind, s.name) in self.free_base]
            cs = [s for s in self.cand if s.kind == kind and (s.kind, s.name) in self.free_cand]
            j = 0
            for b in bs:
                for k in range(j, len(cs)):
                    if tuple(cs[k].shape) == tuple(b.shape):
                        self.pair((b.kind, b.name), (cs[k].kind, cs[k].name), "fallback")
                        j = k + 1
                        break


def align(
    base: Sequence[SeriesLike],
    cand: Sequence[SeriesLike],
    mapping: Sequence[str] = (),
) -> Alignment:
    """Pair ``base`` and ``cand`` tensors; see the module docstring for the stages."""
    state = _Pairing(base, cand)
    warnings = state.by_mapping(mapping)
    state.by_key(lambda series: [s.name for s in series], "exact")
    state.by_key(lambda series: _canonical_names(series, renumber=False), "canonical")
    state.by_key(lambda series: _canonical_names(series, renumber=True), "canonical")
    state.by_order_and_shape()
    base_rank = {(s.kind, s.name): i for i, s in enumerate(state.base)}
    matches = sorted(state.matches, key=lambda m: base_rank[m.base])
    return Alignment(
        matches=matches,
        unmatched_base=[(s.kind, s.name) for s in state.base if (s.kind, s.name) in state.free_base],
        unmatched_cand=[(s.kind, s.name) for s in state.cand if (s.kind, s.name) in state.free_cand],
        warnings=warnings,
    )
