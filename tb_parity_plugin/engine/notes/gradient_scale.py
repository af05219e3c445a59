"""Notes on a gradient scaled as a whole: by the loss's factor (a sum against a mean, a batch divided
otherwise), by clipping (each variable against the global norm), by a loss scale left in."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from tb_parity_plugin.engine.notes.context import (
    NoteContext,
)
from tb_parity_plugin.engine.pair import Pair
from tb_parity_plugin.engine.tolerance import (
    GRAD_NOISE_OF_MAX,
)


class GradientScaleNotes(NoteContext):
    """Gradient-scale notes, for :class:`~tb_parity_plugin.engine.notes.Notes`."""

    def _grad_scale(self, pair: Pair, k: int) -> Optional[str]:
        """A gradient that is the baseline's times one factor at every element (compared by
        values): a new user's gradient accumulation not divided by its 4 micro-batches showed every
        gradient with max_rel_diff=3 and cosine 1, and nothing said "times 4". Each element may be
        off the factor by a gradient's rounding (:data:`GRAD_NOISE_OF_MAX` of each side's largest
        element): a helper's embedding gradient, its repeated rows summed in float32, had one small
        element 1e-4 of itself off the factor and lost the note every other gradient had."""
        both = pair.step_values(k)
        if both is None:
            return None
        scale = self._exact_grad_scale(pair, k)
        if scale is None:
            return self._loss_scale_kept(pair, k, both)
        heads = self._other_grad_scale(pair, k, scale)
        if heads and heads[1]:
            return (
                f"every element is the baseline's times {scale:.4g} (the same direction, another size), while "
                f"{heads[0]}, and in '{heads[1]}' both have one norm: gradients recorded after clipping by one run "
                "and before it by the other, each variable clipped by its own norm (clipnorm=, tf.clip_by_norm per "
                "gradient), so each clipped gradient has its own factor, its norm over the clip norm"
            )
        if heads:
            # a helper's two-head fit port with compile's loss_weights= swapped had its classification head's
            # gradients at 0.5x and its regression head's at 2x, each told of a sum against a mean, a global
            # batch size, micro-batches or a loss scale: none of which scales the gradients by two factors
            return (
                f"every element is the baseline's times {scale:.4g} (the same direction, another size), while "
                f"{heads[0]}: the loss's terms are weighted otherwise, one factor per term (a multi-output model's "
                "per-head loss weights: compile's loss_weights= against TF1's weighted sum, the heads' weights "
                "swapped, or one head's loss reduced otherwise: a sum against a mean), and the layers both "
                "terms reach mix the factors"
            )
        loss = self._loss_times(k, scale)
        if loss:
            # a helper's fit port with zero sample weights (0.625 = 5/8 of TF1's loss and gradients) and a port
            # summing where TF1 averaged had their gradients told of a scale between the loss and the gradient,
            # of micro-batches, a loss scale or clipping: the loss itself carried the factor
            return (
                f"every element is the baseline's times {scale:.4g} (the same direction, another size), and so is "
                f"{loss} at this step: the loss as a whole is scaled (its reduction: a sum against a mean, a division "
                "by the non-zero weights against the batch size, a global batch size under a strategy; a constant "
                "factor), nothing between it and this gradient; the loss's note says more"
            )
        uses = self._calls_of_scale(k, scale)
        if uses:
            # a trial's triplet port averaged its tower's per-use gradients by hand (TF1 sums them): every
            # gradient 1/3 of TF1's, and it was told of the loss's reduction, micro-batches or a loss scale
            return (
                f"every element is the baseline's times {scale:.4g} (the same direction, another size), and "
                f"{uses}: a weight used that many times whose gradient one run averages over its uses where the "
                "other sums them (a hand-written loop dividing the shared weights' gradients by the number of "
                "calls; the sum is what TF1 and Keras give), or a scale between the loss and this gradient (the "
                "loss's reduction, accumulated gradients not divided by their micro-batches, a loss scale not undone)"
            )
        return (
            f"every element is the baseline's times {scale:.4g} (the same direction, another size): a scale between "
            "the loss and this gradient (the loss's reduction: a sum against a mean, a global batch size under a "
            "strategy; accumulated gradients not divided by their micro-batches; a loss scale not undone), or "
            "gradients recorded after clipping by one run and before it by the other (every gradient then has one "
            "factor, the global norm over the clip norm, and the weights agree)"
        )

    def _calls_of_scale(self, k: int, scale: float) -> str:
        """When ``scale`` is ``1/n`` or ``n`` (within 1e-3) and some layer's output is recorded by both runs at
        compared step ``k`` exactly ``n`` times a step (``<layer>``, ``<layer>/call_1`` ... ``/call_<n-1>``:
        one layer called ``n`` times), those records in words; "" otherwise."""
        n = round(1.0 / scale) if scale < 1.0 else round(scale)
        if n < 2 or abs((scale if scale > 1.0 else 1.0 / scale) / n - 1.0) > 1e-3:
            return ""
        calls: dict[str, set[int]] = {}
        for p in self._pairs:
            if p.base.kind != "activation" or p.ib[k] < 0 or p.ic[k] < 0:
                continue
            layer, _, call = p.base.name.rpartition("/call_")
            if layer and call.isdigit():
                calls.setdefault(layer, set()).add(int(call))
            else:
                calls.setdefault(p.base.name, set()).add(0)
        for layer, seen in sorted(calls.items()):
            if seen == set(range(n)):
                return (
                    f"activation/{layer} is recorded {n} times a step ({layer}, "
                    + ", ".join(f"{layer}/call_{i}" for i in range(1, n))
                    + ": one layer called on "
                    + f"{n} inputs)"
                )
        return ""

    def _grad_scale_within_tolerance(self, pair: Pair, k: int) -> Optional[str]:
        """A gradient that is the baseline's times one factor at every element up to the tolerance it is
        held to (the factor times it), when another gradient of the step is the baseline's times that
        factor exactly (:meth:`_grad_scale`): gradients recorded after ``tf.clip_by_global_norm`` by one
        run and before it by the other all differ by the global norm over the clip norm, and each also by
        what the two runs' own gradients differ by, which the tolerance admits and one side's rounding of
        its largest element need not. A helper's faithful Adam port (an outlier batch of inputs 6x larger,
        clipped at step 5) had its raw kernel gradient 6.7e-6 apart there, 28 float32 ulps of its largest
        element: the three other gradients got the factor note, and the first, which the verdict named,
        was told of a loss term left out or a stop_gradient. Tried after the weight-decay note."""
        both = pair.step_values(k)
        if both is None:
            return None
        tol = pair.atol_at(k) + pair.rtol_at(k) * np.abs(np.asarray(both[0], np.float64))
        scale = _uniform_scale(both[0], both[1], pair.tol.atol, (tol, 0.0))
        if scale is None:
            return None
        for other in self._pairs:
            if other is pair or other.base.kind != "grad":
                continue
            exact = self._exact_grad_scale(other, k)
            if exact is not None and abs(exact / scale - 1.0) <= 1e-3:
                return (
                    f"every element is the baseline's times {scale:.4g} within this gradient's tolerance, the "
                    f"factor {other.base.name}'s gradient has at every element (the same direction, another size): "
                    "gradients recorded after clipping by one run and before it by the other (every gradient then "
                    "has one factor, the global norm over the clip norm, and the weights agree), or a scale between "
                    "the loss and the gradients (the loss's reduction: a sum against a mean, a global batch size "
                    "under a strategy; accumulated gradients not divided by their micro-batches)"
                )
        return None

    def _other_grad_scale(self, pair: Pair, k: int, scale: float) -> Optional[tuple[str, str]]:
        """Another gradient of step ``k`` that is the baseline's times one other factor at every element
        (:meth:`_exact_grad_scale`), in words ("cls/kernel:0's is its times 2"), else None. One factor
        on every gradient is a scale of the whole loss; two factors at one step cannot be: the loss is a
        sum of terms weighted otherwise, each reaching its own layers alone (a model's output heads)."""
        for other in self._pairs:
            if other is pair or other.base.kind != "grad" or other.ib[k] < 0 or other.ic[k] < 0:
                continue
            exact = self._exact_grad_scale(other, k)
            if exact is not None and abs(exact / scale - 1.0) > 1e-3:
                return f"{other.base.name}'s is its baseline's times {exact:.4g}", self._clipped_each(
                    pair, other, k, scale, exact
                )
        return None

    def _clipped_each(self, pair: Pair, other: Pair, k: int, scale: float, exact: float) -> str:
        """The run whose gradients of ``pair`` and ``other`` (the baseline's times ``scale`` and ``exact``
        at step ``k``) are both the smaller and of one norm (within 1e-3): each clipped by its own norm to
        one clip norm in that run and recorded after it (``clipnorm=`` against a run recording before
        clipping), not terms of the loss weighted otherwise; "" otherwise."""
        if (scale > 1.0) != (exact > 1.0):
            return ""
        side = 0 if scale > 1.0 else 1  # the smaller gradients: the clipped ones
        norms = []
        for p in (pair, other):
            both = p.step_values(k)
            if both is None:
                return ""
            norms.append(float(np.linalg.norm(np.asarray(both[side], np.float64))))
        if not norms[0] > 0.0 or abs(norms[1] / norms[0] - 1.0) > 1e-3:
            return ""
        return str((self.base.name, self.cand.name)[side])

    def _loss_times(self, k: int, scale: float) -> Optional[str]:
        """The tag of a scalar loss both runs recorded at compared step ``k`` that is the baseline's times
        ``scale`` (within 1e-4 of it), else None."""
        for p in self._pairs:
            if p.base.kind != "loss" or p.ib[k] < 0 or p.ic[k] < 0:
                continue
            both = p.step_values(k)
            if both is None or len(both[0]) != 1 or len(both[1]) != 1:
                continue
            b, c = float(both[0][0]), float(both[1][0])
            if math.isfinite(b) and math.isfinite(c) and b != 0.0 and abs(c / b - scale) <= 1e-4 * abs(scale):
                return f"{p.base.kind}/{p.base.name}"
        return None

    def _exact_grad_scale(self, pair: Pair, k: int) -> Optional[float]:
        """The one factor, not 1, by which ``pair``'s gradient at step ``k`` is the baseline's at every
        element up to each side's rounding (:data:`GRAD_NOISE_OF_MAX` of its largest element)."""
        both = pair.step_values(k)
        if both is None:
            return None
        rounding = tuple(GRAD_NOISE_OF_MAX * float(np.abs(side).max(initial=0.0)) for side in both)
        return _uniform_scale(both[0], both[1], pair.tol.atol, (rounding[0], rounding[1]))

    def _loss_scale_kept(self, pair: Pair, k: int, both: tuple[np.ndarray, np.ndarray]) -> Optional[str]:
        """A gradient that is the baseline's times a power of two of at least 2**4 at every element up
        to the tolerance it is held to (the factor times it), which float16 compute needs: a loss scale
        not undone. A new user's mixed_float16 custom step that applied and recorded the gradients of
        ``get_scaled_loss`` without ``get_unscaled_gradients`` had every gradient 32768 times TF1's, each
        element off the factor by float16 rounding (1e-3 of itself), and was told of a stop_gradient
        or a shared weight."""
        b = np.asarray(both[0], np.float64)
        tol = pair.atol_at(k) + pair.rtol_at(k) * np.abs(b)
        scale = _uniform_scale(both[0], both[1], pair.tol.atol, (tol, 0.0))
        if scale is None or scale < 16.0:
            return None
        power = round(math.log2(scale))
        if abs(scale / 2.0**power - 1.0) > 1e-3:
            return None
        return (
            f"every element is the baseline's times {scale:.6g}, 2**{power}, within this gradient's tolerance "
            "(the same direction, another size): a loss scale not undone (mixed precision: the gradients of "
            "LossScaleOptimizer.get_scaled_loss taken without get_unscaled_gradients, or recorded before it; "
            "the dynamic scale starts at 2**15), or another scale between the loss and this gradient"
        )


def _uniform_scale(
    b: np.ndarray, c: np.ndarray, floor: float, rounding: tuple[Any, Any] = (0.0, 0.0)
) -> Optional[float]:
    """The one factor ``c / b`` takes at every element where ``|b|`` is above ``floor`` (``c``
    within 1e-4 of ``scale x b``, plus ``rounding``: each side's rounding error per element; at
    least 2 such elements, none where ``b`` is below ``floor`` but ``c`` is not), when it is not 1:
    the same direction, another size (None otherwise)."""
    b, c = np.asarray(b, np.float64).ravel(), np.asarray(c, np.float64).ravel()
    if not (np.isfinite(b).all() and np.isfinite(c).all()):
        return None
    large = np.abs(b) > floor
    if large.sum() < 2:
        return None
    scale = float(np.median(c[large] / b[large]))
    if not scale > 0:  # a sign flipped, or nothing moved: not "the same direction" (a review's)
        return None
    round_b, round_c = (np.broadcast_to(np.asarray(r, np.float64).ravel(), b.shape)[large] for r in rounding)
    allowed = 1e-4 * np.abs(scale * b[large]) + abs(scale) * round_b + round_c
    if not np.all(np.abs(c[large] - scale * b[large]) <= allowed) or abs(scale - 1) <= 1e-3:
        return None
    if np.any(np.abs(c[~large]) > abs(scale) * floor * 2):  # what b left small, c did not
        return None
    return scale
