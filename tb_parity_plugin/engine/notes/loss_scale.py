"""Notes on a loss that differs by a factor while the model's outputs agree: a sum against a mean,
a batch divided otherwise (by the non-zero weights, by the real tokens), labels broadcast against an
output of another shape, the gradients scaled with it."""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from tb_parity_plugin.engine.matrix import OK
from tb_parity_plugin.engine.notes.context import (
    _OUTPUTS,
    _RECORDED_BEFORE,
    NoteContext,
    _decay_factor,
    _layer_of,
)
from tb_parity_plugin.engine.pair import Pair
from tb_parity_plugin.engine.tolerance import GRAD_NOISE_OF_MAX, OUTPUT_ATOL_OF_MAX


class LossScaleNotes(NoteContext):
    """Loss-scale notes, for :class:`~tb_parity_plugin.engine.notes.Notes`."""

    def _gradients_agree(self, k: int) -> int:
        """How many gradients both runs recorded at compared step ``k``, when there are some and every
        one of them is as close as float32 rounding leaves it there, element-wise (32 ulps of its largest
        element); else 0. Within tolerance is not enough: a port's L2 of 1e-5 twice TF1's moved every
        gradient by 1e-5 * w, under atol, and the loss by far more (a statistic proves nothing either).
        A gradient that is 0 in exact arithmetic holds rounding noise in both runs, which 32 ulps of its own
        largest element cannot hold: below :data:`GRAD_NOISE_OF_MAX` of the step's largest gradient element in
        both runs, it says nothing (as in :meth:`_gradients_scaled`), and at least one gradient must say something.
        An attention's key bias (1e-9 against gradients of 1e-1) kept a TF1 original recording its loss without
        its L2 term from this note, and it was told "the loss is computed differently"."""
        values = self._gradient_values(k)
        if values is None:
            return 0
        floor = _noise_floor(values)
        telling = 0
        for b, c in values:
            scale = max(float(np.abs(b).max(initial=0.0)), float(np.abs(c).max(initial=0.0)))
            if 0.0 < scale <= floor:
                continue
            if float(np.abs(c - b).max(initial=0.0)) > OUTPUT_ATOL_OF_MAX * scale:
                return 0
            telling += 1
        return len(values) if telling else 0

    def _loss_scale(self, first: Pair, k: int, grads: int = 0) -> Optional[str]:
        """For a scalar loss that is the baseline's times the replica count of one run (or its
        inverse), or times this step's batch over the largest earlier one: the loss divided by
        another batch size, said with the figures (None otherwise). New users' MirroredStrategy
        ports dividing each replica's loss by its own batch (twice TF1's loss), and dividing a
        partial last batch by the full one (half TF1's), were told only "the loss is computed
        differently (reduction, from_logits, label smoothing, ...)". ``grads``: how many gradients
        agree to rounding (:meth:`_gradients_agree`); then only the recorded loss is scaled, and the
        note says so instead of the gradient the scaled loss would give (a port that trained on
        compute_average_loss over the global batch but recorded each replica's mean summed was told
        "2 times the one-device gradient", its gradients equal to TF1's)."""
        both = first.step_values(k)
        if both is None or len(both[0]) != 1:
            return None
        b, c = float(both[0][0]), float(both[1][0])
        if not (math.isfinite(b) and math.isfinite(c)) or b == 0.0:
            return None
        scale = c / b
        if not scale > 0 or abs(scale - 1.0) <= 1e-3:
            return None

        def near(target: float) -> bool:
            return abs(scale - target) <= 1e-4 * target

        for run, other in ((self.cand, self.base), (self.base, self.cand)):
            n = self._replicas[run.name].count if run.name in self._replicas else 1
            if n > 1 and near(n if run is self.cand else 1.0 / n):
                if grads:
                    return (
                        f"'{run.name}' ran {n} replicas and its loss is {n} times that of '{other.name}', while every "
                        f"gradient both runs recorded ({grads}) agrees to float32 rounding, element-wise: only the "
                        "recorded loss is scaled, not what trains (a per-replica mean, such as tf.reduce_mean, "
                        'recorded with reduction="sum", beside a loss trained with compute_average_loss over the '
                        "global batch)"
                    )
                return (
                    f"'{run.name}' ran {n} replicas and its loss is {n} times that of '{other.name}': each replica's loss "
                    "is divided by its own batch, not the global batch (tf.nn.compute_average_loss given "
                    "global_batch_size= the per-replica batch, or a per-replica mean such as tf.reduce_mean "
                    'recorded with reduction="sum"), and the all-reduce sums the replicas\' gradients: '
                    f"{n} times the one-device gradient"
                )
        batches = self._batch_sizes(k)
        if batches is not None:
            now, full = batches
            if near(now / full) or near(full / now):
                if grads:
                    return (
                        f"its value is the baseline's times {scale:.4g}, and this step's batch holds {now} examples "
                        f"against {full} at earlier steps, while every gradient both runs recorded ({grads}) agrees "
                        "to float32 rounding, element-wise: only the recorded loss divides this partial batch by "
                        "another size (a sum over a BATCH_SIZE constant recorded beside a mean that trains), not "
                        "what trains"
                    )
                return (
                    f"its value is the baseline's times {scale:.4g}, and this step's batch holds {now} examples "
                    f"against {full} at earlier steps: one run divides this partial batch's loss by the full batch "
                    "size (tf.nn.compute_average_loss(global_batch_size=...) fixed, or a sum over a BATCH_SIZE "
                    "constant), the other by the batch it has (a mean; compute_average_loss without "
                    "global_batch_size); drop_remainder=True leaves the partial batch out on both sides"
                )
        return None if grads else self._whole_loss_scaled(k, scale, near)

    def _whole_loss_scaled(
        self, k: int, scale: float, near: Callable[[float], bool], subject: str = "its value"
    ) -> Optional[str]:
        """For a loss ``scale`` times the baseline's at ``k`` whose every recorded gradient is the baseline's
        times that factor too, element-wise up to rounding: the loss as a whole divided by another count
        (the batch: a sum against a mean; the non-zero weights: TF1's SUM_BY_NONZERO_WEIGHTS against Keras's
        sample_weight) or multiplied by a constant, said with the figures, of ``subject`` (None otherwise). A helper's fit
        port of a TF1 ``mean_squared_error(weights=...)`` whose second batch held 3 zero weights of 8 (loss
        and gradients 0.625 = 5/8 of TF1's), and a port summing where TF1 averaged (8 times), were told only
        "the loss is computed differently (reduction, from_logits, ...)", and their gradients "a scale
        between the loss and this gradient"."""
        grads = self._gradients_scaled(k, scale)
        if not grads:
            return None
        head = (
            f"{subject} is the baseline's times {scale:.4g}, and so is every gradient both runs recorded ({grads}), "
            "element-wise: the loss as a whole is scaled, "
        )
        big, small = (self.cand.name, self.base.name) if scale > 1 else (self.base.name, self.cand.name)
        n = self._batch_at(k)
        if n is not None and n > 1 and (near(n) or near(1.0 / n)):
            return head + (
                f"by {n}, this step's batch: '{big}' sums the per-example losses over the batch where "
                f"'{small}' averages them (reduction='sum' or tf.reduce_sum against a mean: Keras's default "
                "SUM_OVER_BATCH_SIZE, TF1's losses' SUM_BY_NONZERO_WEIGHTS, tf.reduce_mean)"
            )
        tokens = self._token_count(k, near, scale)
        if tokens:
            return head + tokens
        # some m/n lies within near's window (2e-4 of the scale wide) by chance about 2e-4 n max(s, 1/s) of the
        # time: a review's factor 0.3137 at a batch of 10000 was told 3137 non-zero weights. Named only where
        # a chance match is rare (a batch of up to about 250 at a factor near 1)
        chance = 2e-4 * (n or 0) * max(scale, 1.0 / scale)
        count = (
            next((m for m in range(1, n) if near(m / n) or near(n / m)), None)
            if n and n > 1 and chance < 0.05
            else None
        )
        if count is not None:
            weights = (
                f"'{big}' dividing the weighted sum by the count of its non-zero weights ({count}) where '{small}' "
                f"divides it by the batch ({n}): TF1's tf.compat.v1.losses given weights= divide by the non-zero "
                "weights (the default reduction SUM_BY_NONZERO_WEIGHTS), Keras's sample_weight= and class_weight= "
                "(fit, or a loss called with sample_weight=) by the batch size, so the two agree while no weight of a "
                "batch is 0 (scale each batch's sample weights by its size over its non-zero count, or divide by "
                "tf.math.count_nonzero(weights) in a custom loop)"
            )
            if k > 0:
                return head + (
                    f"by {count}/{n} ({n} examples in this step's batch), and the loss agreed at the earlier steps, so "
                    f"the factor comes with the batch: likely {weights}"
                )
            return head + (
                f"by {count}/{n} ({n} examples in this step's batch): a constant factor of the loss (tf.nn.l2_loss's "
                f"1/2, a loss weight), or {weights}"
            )
        return head + (
            "by a constant or a count: a factor of the loss (tf.nn.l2_loss's 1/2, a loss weight), a sum over "
            "an axis the other run averages (the outputs' last axis, the time steps), or a division by another "
            "count"
        )

    def _gradient_values(self, k: int) -> Optional[list[tuple[np.ndarray, np.ndarray]]]:
        """Each gradient both runs recorded at compared step ``k``, as (baseline, candidate) float64
        values; None when one of them is not compared by values there, or has another shape in each run,
        or holds a NaN/Inf (then no element-wise claim about the gradients can be made)."""
        values = []
        for p in self._pairs:
            if p.base.kind != "grad" or p.ib[k] < 0 or p.ic[k] < 0:
                continue
            both = p.step_values(k) if p.by_values_at(k) else None
            if both is None:
                return None
            b, c = (np.asarray(v, dtype=np.float64) for v in both)
            if b.shape != c.shape or not (np.isfinite(b).all() and np.isfinite(c).all()):
                return None
            values.append((b, c))
        return values

    def _gradients_scaled(self, k: int, scale: float) -> int:
        """How many gradients both runs recorded at compared step ``k``, when there are some and every
        one of them is the baseline's times ``scale`` there, element-wise up to each side's rounding
        (:data:`GRAD_NOISE_OF_MAX` of its largest element); else 0. A one-element gradient counts too."""
        values = self._gradient_values(k)
        if values is None:
            return 0
        # a gradient that is 0 in exact arithmetic holds rounding noise in both runs, which no factor relates:
        # an attention's key bias (softmax is blind to a shift shared by every key) kept a port dividing its
        # token loss by every position from the note (1e-10 against gradients of 1e-1). Noise of the step's
        # largest gradient element says nothing of the scale; at least one gradient must say something.
        floor = _noise_floor(values)
        telling = 0
        for b, c in values:
            if float(np.abs(b).max(initial=0.0)) <= floor and float(np.abs(c).max(initial=0.0)) <= floor:
                continue
            rb, rc = (GRAD_NOISE_OF_MAX * float(np.abs(v).max(initial=0.0)) for v in (b, c))
            if (np.abs(c - scale * b) > 1e-4 * np.abs(scale * b) + scale * rb + rc).any():
                return 0
            telling += 1
        return len(values) if telling else 0

    def _token_count(self, k: int, near: Callable[[float], bool], scale: float) -> str:
        """For a loss scaled as a whole by ``m / (n * t)`` (or its inverse), where the first sequence output
        recorded before it (``[n, t, ...]`` in both runs at compared step ``k``) holds exactly ``m`` positions
        nonzero in one run (its real tokens, padding recorded as 0): a token-level loss divided by its real
        tokens in one run and by every position, padding included, in the other, said as a clause; "" otherwise.
        A helper's port of TF1's ``sparse_softmax_cross_entropy(weights=mask)`` that divided by every token
        (fit's ``sample_weight=mask``, a ``reduce_mean``), 15 real tokens of 21 at step 0, was told "a
        constant or a count" (the batch, 3, names no such fraction)."""
        for p in self._pairs:
            if p.base.kind not in _RECORDED_BEFORE or p.ib[k] < 0 or p.ic[k] < 0:
                continue
            sb, sc = p.known_shape("base", int(p.ib[k])), p.known_shape("cand", int(p.ic[k]))
            if sb is None or sc is None or len(sb) != 3 or len(sc) != 3 or sb[:2] != sc[:2]:
                continue
            n, t = sb[:2]
            both = p.step_values(k) if p.by_values_at(k) else None
            if both is None or n * t < 2:
                return ""
            real = [
                int((np.asarray(v).reshape(n, t, -1) != 0).any(axis=2).sum())
                for v, shape in zip(both, (sb, sc))
                if len(v) == n * t * shape[2]
            ]
            total = n * t
            if real and all(r == total for r in real):  # no padding recorded as 0: only the shape says anything
                return _token_count_by_shape(p, n, t, near, scale, self.base.name, self.cand.name)
            m = next((r for r in sorted(set(real)) if 0 < r < total and (near(r / total) or near(total / r))), None)
            if m is None:
                return ""
            scale_up = near(total / m)  # the candidate divides by the real tokens, the baseline by every position
            fewer, every = (self.cand.name, self.base.name) if scale_up else (self.base.name, self.cand.name)
            return (
                f"by {m}/{total}: {m} of the {total} (batch, time) positions of {p.base.kind}/{p.base.name} "
                f"({n} x {t}) are real (recorded nonzero, the rest padding recorded as 0), and '{fewer}' divides the "
                f"token losses' weighted sum by its real tokens ({m}) where '{every}' divides it by every position, "
                f"padding included ({total}): TF1's tf.compat.v1.losses given weights=mask (SUM_BY_NONZERO_WEIGHTS), "
                "tf.reduce_sum(ce * mask) / tf.reduce_sum(mask) and a Keras mask that reaches the loss "
                "(Embedding(mask_zero=True) under fit) divide by the real tokens; Keras's sample_weight=mask (fit, or "
                "a loss called with sample_weight=) and a mean over every token by all of them"
            )
        return ""

    def _batch_at(self, k: int) -> Optional[int]:
        """This step's batch: the first dimension both runs recorded at compared step ``k`` for the first
        output or input of at least two dimensions; None when none has one."""
        for p in self._pairs:
            if p.base.kind not in _RECORDED_BEFORE or p.ib[k] < 0 or p.ic[k] < 0:
                continue
            sb, sc = p.known_shape("base", int(p.ib[k])), p.known_shape("cand", int(p.ic[k]))
            if sb is not None and sc is not None and len(sb) > 1 and len(sc) > 1 and sb[0] == sc[0]:
                return sb[0]
        return None

    def _broadcast_labels(self, loss: Pair, k: int) -> str:
        """When the last output recorded before ``loss`` is ``[n, 1]`` in both runs at ``k``, and that layer's
        one-element bias gradient, which both runs must have recorded, agrees there: labels of shape ``[n]`` against it
        broadcast to ``[n, n]`` in a hand-written loss, said as a clause; "" otherwise. A
        helper's custom-loop port fed its regression labels flat, ``tf.reduce_mean(tf.square(y - pred))``
        averaged every label against every prediction, and the note named no broadcast."""
        before = [
            p
            for p in self._pairs
            if p.base.kind in _OUTPUTS and p.base.order < loss.base.order and p.ib[k] >= 0 and p.ic[k] >= 0
        ]
        if not before:
            return ""
        last = max(before, key=lambda p: p.base.order)
        sb, sc = last.known_shape("base", int(last.ib[k])), last.known_shape("cand", int(last.ic[k]))
        if sb is None or sb != sc or len(sb) != 2 or sb[1] != 1 or sb[0] < 2:
            return ""
        # averaged over every label, a squared error's or a logits cross-entropy's gradient in each prediction
        # is affine in the label with a constant slope, so their sum, the output layer's bias gradient, is kept
        bias = [
            g
            for g in self._pairs
            if g.base.kind == "grad"
            and _layer_of(g.base.name) == last.base.name
            and g.ib[k] >= 0
            and g.ic[k] >= 0
            and g.by_values_at(k)
            and g.known_shape("base", int(g.ib[k])) == (1,)
        ]
        if not bias:
            # nothing to check it against: a GAN's discriminator logits called twice (d_logits/call_1) and a
            # siamese distance, both [n, 1] with labels of that shape, were told of a broadcast by two trials
            return ""
        for g in bias:
            g.ensure(k + 1, self.policy.equal_nan)
        if any(g.reason[k] != OK for g in bias):
            # a port's from_logits=False on a [n, 1] output (its bias gradient apart) was sent to the labels' shape
            return ""
        if self._gradient_decayed(k):
            # an L2 term on one side only leaves the bias's gradient too, and moves a kernel's by a factor of
            # itself: a TF1 kernel_regularizer the port left out was sent to the labels' shape
            return ""
        kept = (
            f", and grad/{bias[0].base.name}, its one-element bias's gradient, agrees, as such a broadcast leaves it "
            "for a squared error or a cross-entropy on logits"
        )
        return (
            f"; {last.base.kind}/{last.base.name}, the last output recorded before it, is [{sb[0]}, 1]: labels of "
            f"shape [{sb[0]}] against it broadcast to [{sb[0]}, {sb[0]}] in a hand-written loss "
            "(tf.reduce_mean(tf.square(y - pred)) then averages every label against every prediction; Keras's "
            f"losses expand such labels first){kept}, so check the labels' shape on both sides"
        )

    def _gradient_decayed(self, k: int) -> bool:
        """Whether some gradient both runs recorded at compared step ``k`` differs by a factor of its weight
        there at every element (:func:`_decay_factor`: an L2 term on one side only, or of another size)."""
        for i, j in self._weight_grads.items():
            w, g = self._pairs[i], self._pairs[j]
            if min(w.ib[k], w.ic[k], g.ib[k], g.ic[k]) < 0:
                continue
            grads, weights = g.step_values(k), w.step_values(k)
            if grads is None or weights is None or len(weights[0]) != len(grads[0]):
                continue
            if _decay_factor(grads[0], grads[1], weights[0]) is not None:
                return True
        return False

    def _batch_sizes(self, k: int) -> Optional[tuple[int, int]]:
        """(this step's batch, the largest batch of the steps up to it) from a recorded output's
        first dimension, when both runs ran each of those steps at one batch and this one is
        smaller; None otherwise."""
        for p in self._pairs:
            if p.base.kind not in _RECORDED_BEFORE or p.ib[k] < 0 or p.ic[k] < 0:
                continue
            sizes = []
            for j in range(k + 1):
                if p.ib[j] < 0 or p.ic[j] < 0:
                    continue
                shapes = [p.runtime_shape(side, int(row)) for side, row in (("base", p.ib[j]), ("cand", p.ic[j]))]
                lead = {shape[0] if shape else None for shape in shapes}  # a scalar has no batch
                size = lead.pop() if len(lead) == 1 else None
                if size is None:
                    break
                sizes.append(size)
            else:
                if sizes and sizes[-1] < max(sizes):
                    return sizes[-1], max(sizes)
                return None
        return None

    def _whole_loss_scaled_at(self, k: int) -> str:
        """:meth:`_whole_loss_scaled`'s clause for the scalar loss both runs logged at step ``k``, naming
        it, when it and every gradient are the baseline's times one factor there; "" otherwise."""
        loss = next((p for p in self._pairs if p.base.kind == "loss" and p.ib[k] >= 0 and p.ic[k] >= 0), None)
        both = None if loss is None else loss.step_values(k)
        if loss is None or both is None or len(both[0]) != 1 or len(both[1]) != 1:
            return ""
        b, c = float(both[0][0]), float(both[1][0])
        if not (math.isfinite(b) and math.isfinite(c)) or b == 0.0 or not c / b > 0:
            return ""
        scale = c / b
        if abs(scale - 1.0) <= 1e-3:
            return ""
        tag = f"{loss.base.kind}/{loss.base.name}"
        return self._whole_loss_scaled(k, scale, lambda target: abs(scale - target) <= 1e-4 * target, tag) or ""

    def _loss_apart(self, k: int) -> bool:
        """Whether a loss both runs logged at step ``k`` is out of tolerance there."""
        for p in self._pairs:
            if p.base.kind == "loss" and p.ib[k] >= 0 and p.ic[k] >= 0:
                p.ensure(k + 1, self.policy.equal_nan)
                if p.reason[k] != OK:
                    return True
        return False


def _noise_floor(values: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The rounding noise of a step's gradients (:data:`GRAD_NOISE_OF_MAX` of their largest element): a
    gradient that is 0 in exact arithmetic (an attention's key bias) holds no more than this in either run."""
    return GRAD_NOISE_OF_MAX * max((float(np.abs(v).max(initial=0.0)) for pair in values for v in pair), default=0.0)


#: What divides a token loss by the real tokens, said by :func:`_token_count_by_shape`'s readings.
_REAL_TOKENS = (
    "TF1's tf.compat.v1.losses given weights=mask (SUM_BY_NONZERO_WEIGHTS) and tf.reduce_sum(ce * mask) / "
    "tf.reduce_sum(mask) divide by the real tokens"
)


def _token_count_by_shape(
    p: Pair, n: int, t: int, near: Callable[[float], bool], scale: float, base: str, cand: str
) -> str:
    """:meth:`LossScaleNotes._token_count` for a sequence output ``[n, t, ...]`` whose padding is recorded whole
    (no Keras mask to record by, or no ``mask=``), so the real tokens cannot be counted: a factor ``m / (n t)``
    (or its inverse) reads as one run dividing the token losses by every position and the other by ``m``
    of them, and ``m / n`` (or its inverse, ``n < m <= n t``) as one dividing by the batch's ``n`` sequences
    and the other by ``m`` tokens, said as a clause with the count unchecked; "" when neither fits, both do,
    an example count ``m' / n`` fits too, or a chance match is not rare. A trial's Transformer LM ports (TF1's
    ``softmax_cross_entropy(weights=mask)``; a ``fit`` with ``sample_weight=mask``, 18 of 28 positions real,
    and a loop dividing by the batch's 4 sequences) were told only "a constant or a count"."""
    total = n * t
    # near's window is 2e-4 of the scale wide: some m of up to total lies in it by chance about 2e-4 total x
    # max(s, 1/s) of the time (as for the example count)
    if t < 2 or 2e-4 * total * max(scale, 1.0 / scale) >= 0.05:
        return ""
    if any(near(m / n) or near(n / m) for m in range(1, n)):  # as well some examples of zero weight
        return ""
    every = [m for m in range(1, total) if near(m / total) or near(total / m)]
    per_sequence = [m for m in range(n + 1, total + 1) if near(m / n) or near(n / m)]
    if len(every) + len(per_sequence) != 1:
        return ""
    unchecked = (
        f"{p.base.kind}/{p.base.name} ({n} x {t}) is recorded with its padding, so the real tokens are not counted "
        "here (record it with rec.activation(..., mask=real) in TF1 and zero_masked=True or mask= in TF2 to check)"
    )
    if every:
        m = every[0]
        fewer, all_of = (cand, base) if near(total / m) else (base, cand)
        return (
            f"by {m}/{total}: '{all_of}' likely divides the token losses' sum by every (batch, time) position, padding "
            f"included ({n} x {t} = {total}), and '{fewer}' by {m} of them, its real tokens if {m} are real; {unchecked}. "
            + _REAL_TOKENS
            + "; Keras's sample_weight=mask (fit, or a loss called with sample_weight=) and a mean over every token by "
            "all of them"
        )
    m = per_sequence[0]
    fewer, tokens = (cand, base) if near(m / n) else (base, cand)
    return (
        f"by {m}/{n}: '{fewer}' likely divides the token losses' sum by this step's {n} sequences (the batch) and "
        f"'{tokens}' by {m} tokens of its {n} x {t} = {total} positions, its real tokens if {m} are real; {unchecked}. "
        + _REAL_TOKENS
        + "; a sum over the tokens divided by the batch size (tf.reduce_sum over time, then a mean over the batch, or "
        "compute_average_loss) by the sequences"
    )
