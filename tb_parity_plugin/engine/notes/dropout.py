"""Notes on dropout ported otherwise: on in one run only, its rate given as a keep probability, its
mask of another shape (``noise_shape``), or on in a forward pass's inference mode."""

from __future__ import annotations

import math
import warnings
from typing import Optional

import numpy as np

from tb_parity_plugin.engine.matrix import OK
from tb_parity_plugin.engine.notes.context import (
    _RECORDED_BEFORE,
    NoteContext,
)
from tb_parity_plugin.engine.pair import Pair


class DropoutNotes(NoteContext):
    """Dropout notes, for :class:`~tb_parity_plugin.engine.notes.Notes`."""

    def _dropout_in_one_run(self, pair: Pair, k: int) -> Optional[tuple[str, int, float]]:
        """(the run, elements out of tolerance, the scale) when at step ``k`` each element out of
        tolerance is, in one run, 0 or the other run's value times one scale above 1, some of each:
        inverted dropout on in that run only. The classic porting bug: TF1's
        ``tf.compat.v1.layers.dropout(h, rate)`` is off unless given ``training=True``, and a
        trial's port with dropout on was told "another function (... training flag)"."""
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None:
            return None
        width = pair.base.shape[-1] if len(pair.base.shape) > 1 else None
        for name, one, other in ((self.base.name, *both), (self.cand.name, *both[::-1])):
            a, b = one[out].astype(np.float64), other[out].astype(np.float64)
            dropped = (a == 0) & (b != 0)
            kept = ~dropped
            if not dropped.any() or not kept.any() or (b[kept] == 0).any():
                continue
            ratio = a[kept] / b[kept]
            scale = float(np.median(ratio))
            # float32 rounding of x * (1 / (1 - rate)): a few ulps; 1e-5 is a hundred of them
            if not (scale > 1 and bool(np.all(np.abs(ratio - scale) <= 1e-5 * scale))):
                continue
            # a mask drawn at the rate: its zeros, among the elements the other run holds nonzero, within
            # 4 standard deviations of the binomial's mean; and not whole rows of the last axis, which
            # is padding (a review's embedding scaled by sqrt(d) with padded rows zeroed, 30% zeros,
            # was told "dropout of rate 0.75")
            live = other != 0
            n, zeros, rate = int(live.sum()), int((live & (one == 0)).sum()), 1.0 - 1.0 / scale
            if abs(zeros - n * rate) > 4.0 * math.sqrt(n * rate * (1.0 - rate)) + 1.0:
                continue
            if isinstance(width, int) and width > 1 and len(one) % width == 0:
                rows = (one.reshape(-1, width) == 0) & (other.reshape(-1, width) != 0)
                if rows.any() and bool((rows.all(axis=1) | ~rows.any(axis=1)).all()):
                    continue
            return name, len(out), scale
        return None

    def _dropout_note(self, agree: str, first: Pair, k: int) -> Optional[str]:
        """The note, after ``agree``, on a dropout on in one run only or at other rates in the two
        (:meth:`_dropout_in_one_run`, :meth:`_dropout_in_both`), else None; the caller adds what the
        padded positions say (``InputNotes._positions_note``)."""
        dropout = self._dropout_in_one_run(first, k)
        if dropout is None:
            return None
        on, out, scale = dropout
        off = self.cand.name if on == self.base.name else self.base.name
        both_on = self._dropout_in_both(first, k, on, out, scale)
        if both_on:
            return f"{agree} at this step, and {both_on}"
        return (
            f"{agree} at this step, and in '{on}' each of its {out} elements out of tolerance is 0 or "
            f"{scale:.6g} times its value in '{off}': dropout of rate {1 - 1 / scale:.3g} is on in '{on}' only (inverted "
            "dropout keeps x / (1 - rate)). tf.compat.v1.layers.dropout and a Keras layer called without "
            "training=True leave it off, and so does a keep_prob of 1 or a rate of 0 fed at this step"
            + (
                f"; this is the inference-mode pass, where dropout is off: '{on}' runs it there (called with "
                "training=True, or a layer that ignores training)"
                if first.base.name.startswith("inference/")
                else ""
            )
        )

    def _dropout_in_forward_pass(self, first: Pair, k: int) -> Optional[str]:
        """:meth:`_dropout_note` where neither run records a weight (a forward pass, the migration
        guides' first check) and the outputs recorded before it agree: a dropout holds no weight, so
        its input agreeing is enough. From a trial: a port's dropout left on in inference mode
        diverged there with no note."""
        earlier = [
            p
            for p in self._pairs
            if p.base.kind in _RECORDED_BEFORE and p.base.order < first.base.order and p.ib[k] >= 0 and p.ic[k] >= 0
        ]
        if not earlier or not all(p.by_values_at(k) for p in earlier):
            return None
        for p in earlier:
            p.ensure(k + 1, self.policy.equal_nan)
        if any(p.reason[k] != OK for p in earlier):
            return None
        return self._dropout_note(
            "no weight is recorded (a forward pass), and the outputs recorded before it agree", first, k
        )

    def _dropout_in_both(self, pair: Pair, k: int, on: str, out: int, scale: float) -> Optional[str]:
        """When :meth:`_dropout_in_one_run` found ``on`` holding 0 or ``scale`` times the other run's
        value, but the other run computes this output from a random op too: what that run's own
        recorded input says (the latest output recorded before it, of its size, that its nonzero
        elements are one factor of): its dropout off (factor 1: None, the one-run note stands) or on
        at another rate, else both readings. From a trial: TF1's ``nn.dropout(h, keep_prob=0.8)``
        ported as ``Dropout(0.8)``, both under DeterministicRandomTestTool, was told "dropout of
        rate 0.75 is on in the port only"."""
        off_side, off_index = (pair.cand, 1) if on == self.base.name else (pair.base, 0)
        if not off_side.random:
            return None
        off = self.cand.name if off_index else self.base.name
        both = pair.step_values(k)
        if both is None:
            return None
        found = self._scaled_input(pair, k, off_index)
        keep = None if found is None else 1.0 / found[1]
        listed = "; ".join(
            f"'{name}': {', '.join(types)}"
            for name, types in ((self.base.name, pair.base.random), (self.cand.name, pair.cand.random))
            if types
        )
        said = (
            f"in '{on}' each of its {out} elements out of tolerance is 0 or {scale:.6g} times its value in '{off}', "
            f"and both runs compute it from a random op ({listed})"
        )
        if keep is not None and abs(keep - 1.0) <= 1e-5:
            return None
        if keep is None:
            return (
                f"{said}: either dropout is off in '{off}' (a training flag False or a keep_prob of 1 keeps its op "
                f"and draws nothing that counts) and of rate {1 - 1 / scale:.3g} in '{on}', or both run dropout on the "
                f"same draws and '{off}' keeps {scale:.6g} times the fraction '{on}' keeps (inverted dropout keeps "
                "x / (1 - rate)): a keep_prob taken for the rate (Keras Dropout(0.8) for TF1's keep_prob=0.8 keeps "
                "4 times fewer); record the dropout's input to tell which"
            )
        rate_off, rate_on = 1.0 - keep, 1.0 - keep / scale
        swapped = (
            f": the rate and the keep probability swapped (a rate of {rate_on:.3g} where the other keeps "
            f"{keep:.3g}: Keras Dropout(rate) for TF1's keep_prob)"
            if abs(rate_on - keep) <= 1e-3
            else ""
        )
        return (
            f"{said}: both run dropout, and against its input recorded before it '{off}' keeps x / {keep:.3g} "
            f"(rate {rate_off:.3g}), '{on}' x / {keep / scale:.3g} (rate {rate_on:.3g}){swapped}"
        )

    def _scaled_input(self, pair: Pair, k: int, index: int) -> Optional[tuple[np.ndarray, float]]:
        """(the input, the factor) when, in run ``index`` (0 the baseline) at step ``k``, the latest
        output recorded before ``pair`` (element-wise, of its size) is what each nonzero element of
        ``pair`` is, times one factor of at least 1: a dropout's recorded input and 1 / (1 - rate)
        (1 when nothing was dropped that counts). None when no recorded output is so."""
        both = pair.step_values(k)
        if both is None:
            return None
        mine = both[index].astype(np.float64)
        live = mine != 0
        if not live.any():
            return None
        earlier = sorted(
            (
                p
                for p in self._pairs
                if p.base.kind in _RECORDED_BEFORE and p.base.order < pair.base.order and p.by_values_at(k)
            ),
            key=lambda p: -p.base.order,
        )
        for p in earlier:
            values = p.step_values(k)
            if values is None or len(values[index]) != len(mine):
                continue
            x = values[index].astype(np.float64)
            if (x[live] == 0).any():
                continue
            ratio = mine[live] / x[live]
            factor = float(np.median(ratio))
            if factor >= 1 - 1e-5 and bool(np.all(np.abs(ratio - factor) <= 1e-5 * factor)):
                return x, factor
        return None

    def _mask_axes(self, pair: Pair, k: int) -> Optional[str]:
        """When each run's dropout mask, read against its input recorded before it, is shared along
        other axes (a ``noise_shape`` of 1 there: TF1's ``nn.dropout(h, rate, noise_shape=[batch, 1,
        channels])``, Keras ``SpatialDropout1D/2D``, against an element-wise ``Dropout``): which, else
        None. From a trial: a port that lost the ``noise_shape``, both runs under
        DeterministicRandomTestTool, was told of a mask drawn with another seed."""
        shape = pair.known_shape("base", int(pair.ib[k]))
        both = pair.step_values(k)
        if shape is None or len(shape) < 2 or both is None or math.prod(shape) != len(both[0]):
            return None
        shared = []
        for index in (0, 1):
            found = self._scaled_input(pair, k, index)
            if found is None or found[1] <= 1 + 1e-5:
                return None
            x = found[0].reshape(shape)
            kept = np.where(x != 0, (both[index].reshape(shape) != 0).astype(np.float64), np.nan)
            axes = []
            for axis in range(1, len(shape)):
                if shape[axis] < 2:
                    continue
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    low, high = np.nanmin(kept, axis=axis), np.nanmax(kept, axis=axis)
                    count = np.sum(~np.isnan(kept), axis=axis)
                # lines of 2 or more elements with a drop in them: enough that sharing is no chance
                lines = (count >= 2) & (low == 0)
                if int(lines.sum()) < 4:
                    return None
                if bool((low[lines] == high[lines]).all()):
                    axes.append(axis)
            shared.append(tuple(axes))
        if shared[0] == shared[1]:
            return None

        def told(axes: tuple[int, ...]) -> str:
            if not axes:
                return "draws each element on its own (noise_shape None: Keras Dropout)"
            noise = [1 if axis in axes else ("batch" if axis == 0 else str(shape[axis])) for axis in range(len(shape))]
            return (
                f"draws one value for all elements along axis {', '.join(map(str, axes))} (noise_shape "
                f"[{', '.join(map(str, noise))}]: per channel, Keras SpatialDropout1D/2D)"
            )

        return (
            f"its dropout masks, read against the input recorded before it, have other shapes: '{self.base.name}' "
            f"{told(shared[0])}, '{self.cand.name}' {told(shared[1])}: a noise_shape lost or added in the port"
        )
