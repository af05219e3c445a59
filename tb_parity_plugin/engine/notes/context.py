"""What every note reads of the comparison it explains, and the helpers several notes share.

A note says *why* a tensor diverges, from what both runs recorded only. The notes are methods of
:class:`~tb_parity_plugin.engine.comparison.Comparison` (it inherits them from
:class:`~tb_parity_plugin.engine.notes.Notes`), one module per family, so that each reads the
comparison's pairs and policy directly; :class:`NoteContext` declares what they read.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Optional, Sequence

import numpy as np

from tb_parity_plugin.engine import align, allclose, replicas
from tb_parity_plugin.engine.matrix import ABSENT, OK
from tb_parity_plugin.engine.pair import Pair, take_rows
from tb_parity_plugin.engine.tolerance import (
    GRAD_NOISE_OF_MAX,
    MARGINAL_RATIO,
    TolerancePolicy,
)
from tb_parity_plugin.records import metadata

#: A batch normalization's output, by the names both frameworks give it.
_BATCH_NORM = re.compile(r"batch_?norm|(^|/)bn\d*(/|$)", re.IGNORECASE)

#: Kinds of a layer's output, named after the layer (``rec.activation(layer.name, ...)``, instrument).
_OUTPUTS = ("activation", "output")

#: Kinds that, recorded before an output, are its input or what led to it (an agreeing one rules
#: out another batch).
_RECORDED_BEFORE = frozenset({"input", "activation", "output"})


def _layer_of(variable: str) -> str:
    """The layer a variable belongs to: its scope's last part (``dense_1`` of ``model/dense_1/kernel:0``)."""
    return variable.rpartition("/")[0].rpartition("/")[2]


#: A momentum slot's name on either side (TF1 ``Momentum``, tf_keras ``momentum``, Keras 3 ``velocity``).
_MOMENTUM = re.compile(r"momentum|velocity", re.IGNORECASE)


#: The statistics columns the one-value rule reads.
_SIZE, _MIN, _MAX = (metadata.STAT_INDEX[f] for f in ("size", "min", "max"))
_NONFINITE = [metadata.STAT_INDEX[f] for f in metadata.NONFINITE_FIELDS]


def holds_one_value(rows: np.ndarray, fewest: int = 2) -> np.ndarray:
    """bool per statistics row (``[n, N_STATS]``): every element of the recorded tensor holds one and
    the same value, by its exact min and max, with at least ``fewest`` elements, none non-finite. Past
    2**53 the float64 min and max of an int64 tensor can be equal for unequal elements: False there."""
    low = rows[:, _MIN]
    finite = ~(rows[:, _NONFINITE] != 0).any(axis=1)
    one: np.ndarray = (rows[:, _SIZE] >= fewest) & finite & (low == rows[:, _MAX]) & (np.abs(low) < 2.0**53)
    return one


def _one_value(stats: np.ndarray, fewest: int = 2) -> Optional[float]:
    """The one value every element of a recorded tensor holds, from its statistics row
    (:func:`holds_one_value`), or None."""
    return float(stats[_MIN]) if holds_one_value(stats[None], fewest)[0] else None


def _looser(held: float) -> float:
    """The power of ten at or above twice ``held``: an atol that at least halves an error ratio."""
    return float(10.0 ** math.ceil(math.log10(max(2.0 * held, 1e-300))))


def _scalar_at(series: Any, rows: np.ndarray, j: int) -> float:
    """A scalar series' value (an lr) at compared step ``j``, which its ``rows`` must hold."""
    return float(np.ravel(series.values[int(rows[j])])[0])


def _decay_factor(b: np.ndarray, c: np.ndarray, w: np.ndarray, slack: float = 1e-3) -> Optional[float]:
    """The one factor, not 0, by which gradient ``c`` minus gradient ``b`` is weight ``w`` at every element
    up to rounding and ``slack`` of the term (an L2 term on one side only, or of another size), else None;
    a weight of one value (a bias at 0.1, a gamma of ones) gives None, an offset explaining it as well."""
    b, c, w = (np.asarray(a, np.float64) for a in (b, c, w))
    if not (np.isfinite(b).all() and np.isfinite(c).all() and np.isfinite(w).all()):
        return None
    d, used = c - b, np.abs(w) > 0
    if used.sum() < 2 or not np.any(d):
        return None
    if np.ptp(w[used]) <= 1e-3 * float(np.abs(w).max()):
        return None
    factor = float(d @ w / (w @ w))
    rounding = GRAD_NOISE_OF_MAX * max(float(np.abs(b).max()), float(np.abs(c).max()))
    if factor == 0 or not np.all(np.abs(d - factor * w) <= rounding + slack * np.abs(factor * w)):
        return None
    return factor


class NoteContext:
    """What the notes read of the comparison they explain (set by ``Comparison``)."""

    policy: TolerancePolicy
    steps: np.ndarray
    base: Any
    cand: Any
    _pairs: list[Pair]
    _alignment: Optional[align.Alignment]
    _average_of: Optional[dict[tuple[str, str], Pair]]
    _grad_of: Optional[dict[int, Pair]]
    _weight_grads: dict[int, int]
    _replicas: dict[str, replicas.Replicas]

    def _gradient_of(self, weight: Pair) -> Optional[Pair]:
        """The pair of ``weight``'s gradient (``Comparison._weight_grads``), or None; the map is built
        once per set of pairs, when first asked."""
        if self._grad_of is None:
            self._grad_of = {id(self._pairs[i]): self._pairs[j] for i, j in self._weight_grads.items()}
        return self._grad_of.get(id(weight))

    def _weights_of(self, grad: Optional[Pair]) -> list[Pair]:
        """The pairs of the weights whose gradient is ``grad`` (one, where names pair them)."""
        return [self._pairs[i] for i, j in self._weight_grads.items() if self._pairs[j] is grad]

    def _apart_under_override(self, pairs: list[Pair], k: int) -> list[tuple[str, float]]:
        """(tag, largest |c - b|) at compared step ``k`` of the ``pairs`` (compared by values) that an
        ``--override`` matches and whose values differ there: they agree by the user's word, not by
        the policy's, so what they feed is no proof of anything else."""
        found = []
        plain_policy = dataclasses.replace(self.policy, overrides=())
        for p in pairs:
            tag = f"{p.base.kind}/{p.base.name}"
            if not any(o.matches(tag) for o in self.policy.overrides):
                continue
            both = p.step_values(k)
            if both is None:
                continue
            # apart past what it would be held to at this step without the overrides: a broad
            # override on a weight 3e-9 apart is no cause (a review's), nor one 1e-4 apart past the
            # warm-up, where the default rtol is 5% (the next review's)
            plain = plain_policy.for_tag(tag)
            rtol = plain.rtol_at(int(p.clock.since(k)))
            if allclose.isclose(both[1], both[0], rtol, plain.atol, self.policy.equal_nan).all():
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                gap = float(
                    np.nan_to_num(np.abs(both[1].astype(np.float64) - both[0].astype(np.float64))).max(initial=0.0)
                )
            found.append((tag, gap))
        return sorted(found, key=lambda t: -t[1])

    def _past_noise_without_overrides(self, pair: Pair, k: int) -> bool:
        """Whether ``pair`` (compared by values), which an ``--override`` matches, is apart at compared
        step ``k`` by at least :data:`MARGINAL_RATIO` times the tolerance it would be held to without
        the overrides. An override loosens what counts as a divergence, not what float32 rounding
        reaches: a new user's moving mean, loosened as a note said and then apart by its momentum
        (0.144 against atol 0.1: 1.44, but thousands of times the default tolerance), was taken for
        noise and got no note."""
        tag = f"{pair.base.kind}/{pair.base.name}"
        if not any(o.matches(tag) for o in self.policy.overrides):
            return False
        both = pair.step_values(k)
        if both is None:
            return False
        b, c = (np.asarray(v, dtype=np.float64).reshape(1, -1) for v in both)
        if b.shape != c.shape:
            return False
        plain = dataclasses.replace(self.policy, overrides=()).for_tag(tag)
        with np.errstate(invalid="ignore"):
            largest = np.nanmax(np.where(np.isfinite(b), np.abs(b), np.nan), initial=0.0)
        atol = float(plain.atols_of_largest(np.array(largest)))
        rtol = np.array([plain.rtol_at(int(pair.clock.since(k)))])
        return bool(allclose.rows_error_ratio(c, b, rtol, atol)[0] >= MARGINAL_RATIO)

    def _elements_out(self, pair: Pair, k: int) -> Optional[np.ndarray]:
        """Flat indices of a pair's elements out of tolerance at compared step ``k`` (None
        without full values on both sides there)."""
        both = pair.step_values(k)
        if both is None:
            return None
        b, c = both
        close = allclose.isclose(c, b, pair.rtol_at(k), pair.atol_at(k), self.policy.equal_nan)
        found: np.ndarray = np.flatnonzero(~close)
        return found

    def _all_agree_at(self, pairs: Sequence[Pair], k: int) -> bool:
        """Whether each of ``pairs`` was logged by both runs at compared step ``k`` and agrees there."""
        for p in pairs:
            p.ensure(k + 1, self.policy.equal_nan)
            if p.ib[k] < 0 or p.ic[k] < 0 or p.reason[k] != OK:
                return False
        return True

    def _slots_fed_by(self, g: Pair) -> list[Pair]:
        """The slot pairs gradient pair ``g`` feeds (``Pair.feeder``)."""
        return [p for p in self._pairs if p.base.kind == "slot" and p.feeder is g]

    def _earlier_gradients(
        self, pair: Pair, g: Pair, k: int
    ) -> Optional[tuple[list[np.ndarray], Optional[np.ndarray]]]:
        """The values of ``pair``'s gradient ``g`` (compared by values) at the compared steps before
        ``k`` both runs logged, ``[baseline, candidate]`` in float64, only at ``pair``'s elements out
        of tolerance at ``k`` when they are known (returned with them, else None); None unless the
        gradient agreed at every one of those steps (its verdicts settled here). What a weight's
        update note and a slot's noise note both read."""
        g.ensure(k, self.policy.equal_nan)
        seen = (g.ib[:k] >= 0) & (g.ic[:k] >= 0)
        if not seen.any() or ((g.reason[:k] != OK) & (g.reason[:k] != ABSENT)).any():
            return None
        out = self._elements_out(pair, k)
        width = min(g.base.values.shape[1], g.cand.values.shape[1])
        known = out if out is not None and len(out) and out.max() < width else None
        cols = slice(None) if known is None else known
        grads = [
            take_rows(side.values, r)[:, cols].astype(np.float64)
            for side, r in ((g.base, g.ib[:k][seen]), (g.cand, g.ic[:k][seen]))
        ]
        return grads, known
