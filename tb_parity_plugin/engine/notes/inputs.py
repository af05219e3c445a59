"""Notes on an output that diverges first while what feeds it agrees: another input, another
batch or masking (and real positions apart with padding recorded as 0), replicas normalizing apart,
dropout on one side, random draws, variables never compared."""

from __future__ import annotations

import math
import re
import warnings
from typing import Callable, Optional

import numpy as np

from tb_parity_plugin.engine import replicas
from tb_parity_plugin.engine.matrix import OK, SHAPE
from tb_parity_plugin.engine.notes.context import (
    _BATCH_NORM,
    _OUTPUTS,
    NoteContext,
    _decay_factor,
    _layer_of,
)
from tb_parity_plugin.engine.notes.state import _MOVING_STATS
from tb_parity_plugin.engine.pair import Pair
from tb_parity_plugin.engine.tolerance import GRAD_NOISE_OF_MAX, OUTPUT_ATOL_OF_MAX

#: The most element comparisons :meth:`InputNotes._rows_in_another_order` makes (every row of an
#: output against every row: a batch of 1000 rows of 1000 would be 1e9), and how many it holds at once.
_REORDER_BUDGET = 50_000_000
_REORDER_BLOCK = 4_000_000


class InputNotes(NoteContext):
    """Notes on an output that diverges first while what feeds it agrees."""

    def _input_note(self, first: Pair, k: int) -> Optional[str]:
        """What an output diverging first at step ``k`` (nothing before it in execution order
        does) means when every weight recorded at ``k`` agrees there: its input differs, or the
        layer computes another function of it. A new user's faithful port under Keras ``fit``'s
        default ``shuffle=True`` diverged on its first layer's output at step 0, with nothing to
        say that the batches differed."""
        alignment = self._alignment
        # a weight one run alone has (a bias the port dropped, an LSTM cell declared with
        # --allow-unmatched) is not known to agree: the note says so and names them instead
        unpaired = (
            []
            if alignment is None
            else [
                (side, name)
                for side, keys in enumerate((alignment.unmatched_base, alignment.unmatched_cand))
                for kind, name in keys
                if kind in ("weight", "state")
            ]
        )
        # a weight of a layer whose output is recorded after this one cannot move it: a new user's
        # 1024x1024 dense after the batch norm, compared by statistics, took the note away
        later = {p.base.name for p in self._pairs if p.base.kind in _OUTPUTS and p.base.order > first.base.order}
        logged = [p for p in self._pairs if p.base.kind == "weight" and p.ib[k] >= 0 and p.ic[k] >= 0]
        weights = [p for p in logged if p.by_values_at(k) or _layer_of(p.base.name) not in later]
        if not weights:
            return None if logged else self._dropout_in_forward_pass(first, k)
        for p in weights:
            if p.by_values_at(k):
                p.ensure(k + 1, self.policy.equal_nan)
        if any(p.by_values_at(k) and p.reason[k] != OK for p in weights):
            return None
        loose = [p for p in weights if not p.by_values_at(k)]
        if loose:
            # statistics cannot prove a weight agrees: a faithful Adam port's embedding, compared by
            # statistics, held one element 2.7e-5 apart, and this note sent its user to the data; but
            # a batch norm whose replicas' moving statistics parted normalized each replica's share
            # whatever its weights (a ResNet's synchronized=False port, its 3x3x16x32 kernels kept as
            # statistics, got no note)
            return self._per_replica_batch_norm_note(first, k, self._earlier_by_statistics(first, k) + loose)
        loosened = self._apart_under_override(weights, k)
        if (
            loosened
        ):  # a helper loosened a noise-fed bias as its note said, and its output was told "every weight agrees"
            tag, gap = loosened[0]
            return (
                f"{tag} agrees here only under your override ({gap:.3g} apart at this step): that difference reaches "
                "this output; loosen what it feeds as well (the layer's output, a normalization's moving mean), or drop "
                "the variable on both sides (README: What counts as a divergence)"
            )
        earlier = [
            p
            for p in self._pairs
            if p.base.kind in _RECORDED_BEFORE and p.base.order < first.base.order and p.ib[k] >= 0 and p.ic[k] >= 0
        ]
        if not all(p.by_values_at(k) for p in earlier):
            # an output compared by statistics only is no proof that it agrees; but a batch norm
            # whose replicas' moving statistics parted normalized each replica's share, whatever
            # came before it
            return self._per_replica_batch_norm_note(first, k, self._earlier_by_statistics(first, k))
        agree = (
            ("every weight both runs recorded" if unpaired else "every recorded weight")
            + (
                " (but those of layers recorded after it, which statistics alone compare)"
                if len(weights) < len(logged)
                else ""
            )
            + (" and the outputs recorded before it agree" if earlier else " agrees")
        )
        note = self._what_is_left(agree, first, k, bool(earlier))
        upstream = self._maybe_upstream(first, unpaired)
        return note + self._unpaired_clause(first, upstream) if upstream else note

    def _what_is_left(self, agree: str, first: Pair, k: int, earlier: bool) -> str:
        """:meth:`_input_note`'s reading of the output's own values and of what was recorded before
        it, after ``agree`` (what agrees): padded steps, zeros in one run, replicas, this layer's
        function or its input, and at which sequence positions it differs."""
        padded = self._repeats_last_step(first, k)
        if padded:
            return f"{agree} at this step; {padded}"
        dropout = self._dropout_note(agree, first, k)
        if dropout:
            return dropout
        samples = self._zero_samples(first, k)
        if samples:
            return f"{agree} at this step, and {samples}"
        moved = self._value_moved_in_its_row(first, k)
        if moved:
            return f"{agree} at this step, and {moved}" + self._positions_note(first, k)
        masked = self._zero_in_one_run(first, k)
        if masked:
            axes = self._mask_axes(first, k)
            if axes:
                return f"{agree} at this step, and {axes}" + self._positions_note(first, k)
            return (
                f"{agree} at this step, and each of its {masked} elements out of tolerance is exactly 0 in one run "
                "only: a different random mask (dropout: its seed, or another random op drawn before it; README: "
                "Porting a real model, step 1), padding one run masks, or units a ReLU switched off in one run"
            ) + self._positions_note(first, k)
        loss = first.base.kind == "loss"
        random = self._random_draws(first)
        if random:
            return f"{agree} at this step, and {random}" + self._positions_note(first, k)
        counts = self._replica_counts_of_batch_norm(first)
        if counts and not self._batch_norm_in_sync():
            # a new user's port under MirroredStrategy normalized each replica's half of the batch
            # (numpy: 1.8e-7 from per-half batch norm) and was told of activations and padding
            return f"{agree} at this step, and the runs ran {counts[0]} and {counts[1]} replicas: {_PER_REPLICA_BN}"
        reordered = self._rows_in_another_order(first, k)
        if reordered:
            return f"{agree} at this step, and {reordered}" + self._positions_note(first, k)
        features = self._features_in_another_order(first, k)
        if features:
            return f"{agree} at this step, and {features}"
        squashed = None if loss else self._squashed(first, k)
        if squashed:
            return f"{agree} at this step, and {squashed}"
        crossed = None if loss else self._values_of_another_output(first, k)
        if crossed:
            return f"{agree} at this step, and {crossed}"
        frozen = None if loss else self._frozen_moving_stats(first, k)
        if frozen:
            return f"{agree} at this step, and {frozen}" + self._positions_note(first, k)
        grads = self._gradients_agree(k) if loss else 0
        scaled = self._loss_scale(first, k, grads) if loss else None
        if scaled:
            return f"{agree} at this step, and {scaled}"
        if grads:
            # a new user's TF1 original trained on its loss plus get_regularization_loss() but recorded the
            # loss alone; its faithful fit port was told "the loss is computed differently (... regularization
            # terms ...)" and searched the port for a bug it did not have
            return (
                f"{agree} at this step, and so does every gradient both runs recorded ({grads}) to float32 "
                "rounding, element-wise: what the optimizer is given is the same, so the runs likely record different losses (TF1: the loss without "
                "get_regularization_loss() or without its weights=, where fit records the total it minimises, sample "
                "and class weights applied and regularization included), or the losses differ by a term whose "
                "gradient is below float32 rounding (a constant)"
            )
        if earlier:
            if loss:
                return (
                    f"{agree} at this step: the loss is computed differently (reduction, from_logits, label "
                    "smoothing, a loss's own parameter such as Huber's delta, regularization terms, per-example "
                    "weights: fit's class_weight= or sample_weight= against TF1's weights=; a multi-output model's "
                    "per-head weights: compile's loss_weights= against TF1's weighted sum), its labels differ, or a "
                    "layer after the last recorded output does"
                ) + self._broadcast_labels(first, k)
            return (
                f"{agree} at this step: this layer computes another function of its input (activation, padding, "
                "epsilon, a training flag: dropout or batch normalization in training mode in one run only), or "
                "reads an input not recorded" + self._positions_note(first, k)
            )
        # both, neither first: a new user's attention scaled by 1/d_model in a custom loop was told of
        # fit's shuffling first; record the layer's input (rec.activation) to tell the two apart
        step = int(self.steps[k])
        resumed = [run.name for run in (self.base, self.cand) if step in getattr(run, "resumed_at", ())]
        if resumed and not loss:
            # a helper's TF1 run resumed from a checkpoint at step 6, its one-shot iterator back at its
            # first batch, diverged there on its first layer's output and was told of fit's shuffling
            return (
                f"{agree} at this step and no output is recorded before it, and '{resumed[0]}' was resumed at this "
                "step (an event file of it begins here): an input pipeline no checkpoint holds (a one-shot "
                "iterator, a generator, a dataset without its iterator in the checkpoint) starts again from its "
                "first batch on a resume; or the layer computes another function of its input; recording the "
                "input too tells the two apart" + self._positions_note(first, k)
            )
        return (
            f"{agree} at this step and no output is recorded before it: "
            f"{'the model or the loss' if loss else 'the layer'} computes another function of its input"
            + ("" if loss else " (activation, a scale, epsilon, padding, data format)")
            + ", or its input differs (another batch: Keras fit shuffles unless shuffle=False, and over a finite "
            "shuffled dataset starts at its second order; a tf.data shuffle or batching on one side; or the input "
            "preprocessed otherwise: its scaling, a mean subtracted, an "
            "augmentation on one side; another input of a model of several: a dict's keys crossed); recording the "
            "input too, as kind input (rec.tensor('input', name, x) in TF1 "
            "or a custom loop), tells the two apart" + self._positions_note(first, k)
        )

    def _recorded_input_note(self, first: Pair, k: int) -> str:
        """What a recorded input (kind ``input``) diverging at step ``k`` means: the runs were fed
        other data there, before any layer ran; then whether its rows are the baseline's in another
        order, the baseline's scaled and shifted per channel, or other rows. A trial of ``tf.data``
        ports (``x / 127.5 - 1`` for ``x / 255``, a shuffle without its seed, ``repeat()`` before
        ``shuffle()``, an augmentation on one side) diverged first on the recorded input, and every
        one got no note at all."""
        head = "the recorded input itself differs at this step: the runs were fed other data, before any layer ran"
        reordered = self._rows_in_another_order(first, k)
        if reordered:
            return f"{head}; {reordered}"
        both = first.step_values(k)
        shape = [d for d in first.runtime_shape("base", int(first.ib[k])) if d is not None]
        if both is None or not shape or math.prod(shape) != len(both[0]):
            return head
        b, c = (np.asarray(v, dtype=np.float64) for v in both)
        if not (np.isfinite(b).all() and np.isfinite(c).all()):
            return head
        affine = self._affine_of(first, k, b, c, shape[-1] if len(shape) > 1 else 1)
        if affine:
            return f"{head}; {affine}"
        rows = shape[0] if len(shape) > 1 else 0
        seen = ""
        if rows > 1 and rows * len(b) <= _REORDER_BUDGET:
            br, cr = b.reshape(rows, -1), c.reshape(rows, -1)
            bound = first.atol_at(k) + first.rtol_at(k) * np.abs(br)
            found = sum(bool((np.abs(row[None] - br) <= bound).all(axis=1).any()) for row in cr)
            seen = (
                f" ({found} of its {rows} rows in '{self.cand.name}' {'is a row' if found == 1 else 'are rows'} of "
                f"the batch of '{self.base.name}')"
                if found
                else f" (none of its {rows} rows in '{self.cand.name}' is a row of the batch of '{self.base.name}')"
            )
        return (
            f"{head}: other examples{seen} or the same in another order (a shuffle without its seed or with "
            "another; repeat() before shuffle(), so batches mix epochs; a TF1 iterator initialized again each epoch, "
            "which repeats its first order, where a TF2 dataset iterated again reshuffles; Keras fit over a finite "
            "shuffled dataset, which starts at its second order; fit's default shuffle=True; a shuffle or batching "
            "on one side), or the same examples preprocessed otherwise (an augmentation such as a random crop or "
            "flip on one side only or drawn otherwise: a map with num_parallel_calls deals a stateful random op's "
            "draws to the elements in any order)"
        )

    def _batch_axis_note(self, pair: Pair, k: int) -> Optional[str]:
        """For an input or output whose shapes at ``k`` differ in the first axis alone: batches of
        other sizes (a partial batch one run dropped). A trial's port with ``batch(drop_remainder=True)``
        was told only "shape [4, 5, 5, 3] in baseline vs [8, 5, 5, 3] in candidate". None otherwise."""
        rb, rc = int(pair.ib[k]), int(pair.ic[k])
        if rb < 0 or rc < 0:
            return None
        sb, sc = pair.known_shape("base", rb), pair.known_shape("cand", rc)
        if sb is None or sc is None or len(sb) < 2 or len(sb) != len(sc) or sb[0] == sc[0] or sb[1:] != sc[1:]:
            return None
        return (
            f"only the first (batch) axis differs ({sb[0]} examples in '{self.base.name}' against {sc[0]} in "
            f"'{self.cand.name}'): the runs were fed batches of other sizes at this step (a partial last batch in one "
            "run only: batch(drop_remainder=True) on one side, or repeat() before batch() on one side so its batches "
            "run across epochs; another batch size)"
        )

    def _affine_of(self, first: Pair, k: int, b: np.ndarray, c: np.ndarray, channels: int) -> Optional[str]:
        """When every element of the candidate is ``a * baseline + o`` within the tolerance, ``a`` and
        ``o`` fitted per channel of the last axis (not the identity): the same data scaled or shifted
        otherwise, said with the figures; None otherwise."""
        if channels < 1 or len(b) % channels or len(b) // channels < 2:
            return None
        bb, cc = b.reshape(-1, channels), c.reshape(-1, channels)
        # a line goes through any two points: a channel of fewer than three distinct values proves no map
        # (two rows of other examples of a [2, n] input would each fit one exactly)
        if ((np.diff(np.sort(bb, axis=0), axis=0) > 0).sum(axis=0) < 2).any():
            return None
        mb, mc = bb.mean(axis=0), cc.mean(axis=0)
        var = ((bb - mb) ** 2).sum(axis=0)
        if not (var > 0).all():
            return None
        a = ((bb - mb) * (cc - mc)).sum(axis=0) / var
        o = mc - a * mb
        if not (np.abs(cc - (a * bb + o)) <= first.atol_at(k) + first.rtol_at(k) * np.abs(cc)).all():
            return None
        one_a = bool(np.allclose(a, a[0], rtol=1e-4, atol=0.0))
        one_o = bool(np.allclose(o, o[0], rtol=1e-4, atol=1e-6))
        scale = f"{a[0]:.4g}" if one_a else "[" + ", ".join(f"{v:.4g}" for v in a) + "]"
        shift = f"{o[0]:+.4g}" if one_o else "+ [" + ", ".join(f"{v:.4g}" for v in o) + "]"
        per = "" if one_a and one_o else " (per channel of the last axis)"
        return (
            f"each of its elements in '{self.cand.name}' is {scale} times its value in '{self.base.name}' "
            f"{shift}{per}: the same data scaled or shifted otherwise (another preprocessing: x / 127.5 "
            "- 1 against x / 255, a mean subtracted or a standard deviation divided on one side or with other "
            "values)"
        )

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
        tokens = self._token_count(k, near)
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

    def _token_count(self, k: int, near: Callable[[float], bool]) -> str:
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
        one-element bias gradient, when both runs recorded it, agrees there: labels of shape ``[n]`` against it
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
            if bias
            else ""
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

    def _rows_in_another_order(self, first: Pair, k: int) -> Optional[str]:
        """When each row (first axis: the batch) of ``first``'s candidate at ``k`` is within its
        tolerance of exactly one row of the baseline's, one to one, and the rows in place are not: the same
        examples in another order. A new user's MirroredStrategy port dealt each global batch's rows
        to the replicas alternately (a dataset sharded by element), and its outputs, recorded as the
        replicas' parts concatenated, were told "another batch" though its loss and gradients agreed
        at every step (float64 replay: the same training). None otherwise."""
        both = first.step_values(k)
        if both is None:
            return None
        shape = first.known_shape("base", int(first.ib[k]))
        if (
            shape is None
            or len(shape) < 2
            or len(shape) != len(first.base.shape)
            or shape[0] < 2
            or math.prod(shape) != len(both[0])
        ):
            return None
        rows = shape[0]
        b, c = (np.asarray(v, dtype=np.float64).reshape(rows, -1) for v in both)
        if b.shape[1] < 2 or not (np.isfinite(b).all() and np.isfinite(c).all()):
            return None
        if rows * rows * b.shape[1] > _REORDER_BUDGET:  # every row against every row: bounded work
            return None
        atol, rtol = first.atol_at(k), first.rtol_at(k)
        # close[i, j]: candidate row i within tolerance of baseline row j, element by element; a block
        # of candidate rows at a time, so memory stays near _REORDER_BLOCK elements
        bound = atol + rtol * np.abs(b)
        block = max(1, _REORDER_BLOCK // (rows * b.shape[1]))
        close = np.concatenate(
            [(np.abs(c[i : i + block, None, :] - b[None]) <= bound[None]).all(axis=2) for i in range(0, rows, block)]
        )
        if close.diagonal().all():
            return None
        # a row within tolerance of several rows of the other run is no proof that an example moved:
        # a helper's port looked a binary category up in another vocabulary order, and its batch of
        # four of each held TF1's rows in another order, every example's row changed
        if (close.sum(axis=1) != 1).any():
            return None
        if len(np.unique(close.argmax(axis=1))) != rows:  # each its own row: one to one
            return None
        moved = int((~close.diagonal()).sum())
        same = self._trains_the_same(k)
        # the replicas' dealing can only be the cause where a run had replicas: a single-device fit port fed
        # each batch's rows in another order was sent to experimental_distribute_dataset first
        split = any(self._replicas[r.name].count > 1 for r in (self.base, self.cand) if r.name in self._replicas)
        causes = (
            " A per-replica output is recorded as the replicas' parts concatenated "
            "in replica order, so a global batch dealt to the replicas otherwise than "
            "experimental_distribute_dataset deals it (in order, one contiguous share each: a dataset sharded "
            "by element, experimental_distribute_values_from_function) gives this; so does a shuffle within "
            "the batch on one side"
            if split
            else " Neither run had replicas: one run's input pipeline orders each batch's examples otherwise (a "
            "shuffle within the batch, rows sorted or grouped on one side)"
        )
        return (
            f"its {rows} rows are the same rows in another order ({moved} of them moved: each row of "
            f"'{self.cand.name}' is within tolerance of its own row of '{self.base.name}'): the same examples in "
            "another order in the batch."
            + causes
            + (
                "; the loss and every gradient recorded at this step agree: the step trains the same, and only "
                "this output's row order differs"
                if same
                else ""
            )
        )

    def _trains_the_same(self, k: int) -> bool:
        """Whether the loss and every gradient both runs recorded at compared step ``k`` agree there,
        compared by values (at least one of them recorded)."""
        trained = [p for p in self._pairs if p.base.kind in ("loss", "grad") and p.ib[k] >= 0 and p.ic[k] >= 0]
        for p in trained:
            p.ensure(k + 1, self.policy.equal_nan)
        return bool(trained) and all(p.by_values_at(k) and p.reason[k] == OK for p in trained)

    def _metric_note(self, pair: Pair, k: int) -> Optional[str]:
        """For a metric diverging at compared step ``k`` while the loss and every gradient recorded there
        agree element-wise (:meth:`_trains_the_same`) and no weight recorded there diverges: the runs
        train alike and compute the metric from other quantities. A helper's own-``train_step`` port fed
        its loss tracker the loss before its regulariser, where TF1 logged the total, and its metric
        divergence had no note. None otherwise."""
        if not self._trains_the_same(k):
            return None
        weights = [p for p in self._pairs if p.base.kind == "weight" and p.ib[k] >= 0 and p.ic[k] >= 0]
        for p in weights:
            p.ensure(k + 1, self.policy.equal_nan)
        if any(p.reason[k] != OK for p in weights):
            return None
        return (
            "the loss and every gradient recorded at this step agree element-wise"
            + (", and every weight agrees" if weights else "")
            + ": the runs train alike here and compute this metric from other quantities (a loss tracker fed "
            "the loss before or after its regularisation terms, a running mean over the epoch against the "
            "step's own value, a metric reset at other steps, sample or class weights in one run's metric only)"
        )

    def _values_of_another_output(self, first: Pair, k: int) -> Optional[str]:
        """When the candidate's ``first`` at ``k`` is, within its tolerance, the baseline's value of another
        recorded output of its shape at that step: inputs (or branches) fed crosswise. A helper's two-input
        fit port built its input dict with the keys of two inputs of one shape crossed; with the inputs
        recorded (an ``Identity`` layer each), the first was told that "recording the input too tells the
        two apart", which it did, and nothing said it held the other input. None otherwise."""
        both = first.step_values(k)
        if both is None:
            return None
        c = np.asarray(both[1], dtype=np.float64)
        atol, rtol = first.atol_at(k), first.rtol_at(k)
        for other in self._pairs:
            if other is first or other.base.kind not in _OUTPUTS or other.ib[k] < 0 or other.ic[k] < 0:
                continue
            theirs = other.step_values(k)
            if theirs is None or len(theirs[0]) != len(c):
                continue
            b = np.asarray(theirs[0], dtype=np.float64)
            # a constant output (all 0: a dead ReLU, a zero-initialised layer) matches any other constant
            # one: no evidence that inputs were crossed (the review's case)
            if not (np.isfinite(b).all() and np.isfinite(c).all()) or np.array_equal(b, both[0]) or np.ptp(b) == 0:
                continue
            if (np.abs(c - b) <= atol + rtol * np.abs(b)).all():
                back = np.asarray(theirs[1], dtype=np.float64)
                swapped = bool((np.abs(back - both[0]) <= atol + rtol * np.abs(np.asarray(both[0]))).all())
                return (
                    f"its values in '{self.cand.name}' are those of {other.base.name} in '{self.base.name}'"
                    + (
                        f", and {other.base.name}'s in '{self.cand.name}' are this one's in '{self.base.name}'"
                        if swapped
                        else ""
                    )
                    + ": inputs or branches fed crosswise (a model of several inputs given a dict with the keys of "
                    "two inputs of one shape crossed, or its inputs passed in another order; a concatenation or a "
                    "layer call given the other tensor), or a layer between the two skipped in one run"
                )
        return None

    def _squashed(self, first: Pair, k: int) -> Optional[str]:
        """When one run's output at ``k`` is, within its tolerance, the softmax (over its last axis) or the
        sigmoid of the other's: an activation left on an output head in one run only. A helper's two-head
        port with ``Dense(3, activation="softmax")`` where TF1 output logits was told that the layer
        "computes another function of its input (activation, padding, epsilon, a training flag)"; under
        ``fit`` its loss and gradients agreed (tf_keras's crossentropy takes a softmax output's logits back,
        from_logits=True or not), in its custom loop TF1's loss on logits applied the softmax twice. None
        otherwise."""
        both = first.step_values(k)
        if both is None:
            return None
        shape = first.known_shape("base", int(first.ib[k]))
        if not shape or math.prod(shape) != len(both[0]):
            return None
        b, c = (np.asarray(v, dtype=np.float64).reshape(shape) for v in both)
        if not (np.isfinite(b).all() and np.isfinite(c).all()):
            return None
        atol, rtol = first.atol_at(k), first.rtol_at(k)
        for out, raw, on, off in ((c, b, self.cand.name, self.base.name), (b, c, self.base.name, self.cand.name)):
            for name in ("softmax", "sigmoid"):
                if name == "softmax":
                    if shape[-1] < 2:
                        continue
                    e = np.exp(raw - raw.max(axis=-1, keepdims=True))
                    squashed = e / e.sum(axis=-1, keepdims=True)
                else:
                    squashed = 0.5 * (1.0 + np.tanh(0.5 * raw))
                bound = atol + rtol * np.abs(squashed)
                # values the tolerance cannot tell from one constant (a sigmoid of inputs far below 0
                # against an output of 0s, a ReLU on one side: the review's case) prove nothing
                if np.ptp(squashed) <= 2 * float(bound.max()):
                    continue
                if (np.abs(out - squashed) <= bound).all():
                    return (
                        f"its values in '{on}' are the {name} of those in '{off}'"
                        + (" over the last axis" if name == "softmax" else "")
                        + f": an activation on in '{on}' only (an output head's Dense(..., activation='{name}') where "
                        f"'{off}' outputs logits); a loss that takes logits then applies it twice (TF1's "
                        "softmax_cross_entropy or a tf.nn ..._with_logits on it), except tf_keras's compiled "
                        f"crossentropy, which takes a {name} output's logits back (the loss and gradients then agree "
                        "and only this output differs)"
                    )
        return None

    def _features_in_another_order(self, first: Pair, k: int) -> Optional[str]:
        """When each row (first axis: the batch) of ``first``'s candidate at ``k`` holds, within its
        tolerance, the values of the baseline's same row in another order, and the rows in place
        differ: the same features laid out otherwise (a TF1 flatten after a transpose to channels-first
        against a Keras ``Flatten`` of channels-last maps). A new user's port, its every weight copied
        from TF1, diverged at step 0 on the flattened features and was told that the layer "computes
        another function of its input (activation, padding, epsilon, a training flag)". When one axis
        of a row read as two and swapped gives the candidate's row in every row, the two are named.
        None otherwise."""
        both = first.step_values(k)
        if both is None:
            return None
        shape = first.known_shape("base", int(first.ib[k]))
        if shape is None or len(shape) < 2 or len(shape) != len(first.base.shape) or math.prod(shape) != len(both[0]):
            return None
        rows = shape[0]
        b, c = (np.asarray(v, dtype=np.float64).reshape(rows, -1) for v in both)
        n = b.shape[1]
        if n < 2 or not (np.isfinite(b).all() and np.isfinite(c).all()):
            return None
        atol, rtol = first.atol_at(k), first.rtol_at(k)
        sb, sc = np.sort(b, axis=1), np.sort(c, axis=1)
        if not (np.abs(sc - sb) <= atol + rtol * np.abs(sb)).all():
            return None
        if (np.abs(c - b) <= atol + rtol * np.abs(b)).all():
            return None
        if len(shape) >= 3 and _positions_shifted(
            b.reshape(rows, shape[1], -1), c.reshape(rows, shape[1], -1), atol, rtol
        ):
            # a sequence padded at the other end (or reversed) holds the same values too: a helper's port
            # fed pad_sequences' default padding="pre" where TF1 padded "post" was told to Permute before Flatten
            return (
                f"each of its {rows} rows holds the same {n} values as the same row of '{self.base.name}' in another "
                f"order, and each row's {shape[1]} positions (axis 1) are the other run's shifted or reversed: the "
                "sequences sit elsewhere along their padding (padding at the other end: Keras pad_sequences pads and "
                "truncates 'pre' by default, a TF1 pipeline or padded_batch pads 'post'), or are reversed on one side "
                "(go_backwards, tf.reverse_sequence)"
            )
        note = (
            f"each of its {rows} rows holds the same {n} values as the same row of '{self.base.name}' in another "
            "order: the same features laid out otherwise"
        )
        for p in range(2, n):
            q = n // p
            if (
                n % p == 0
                and (
                    np.abs(b.reshape(rows, p, q).transpose(0, 2, 1).reshape(rows, n) - c) <= atol + rtol * np.abs(c)
                ).all()
            ):
                note += (
                    f": each row of '{self.base.name}' read as [{p}, {q}] and transposed to [{q}, {p}] gives the row "
                    f"of '{self.cand.name}', channels-first against channels-last maps (tf.transpose(x, [0, 3, 1, 2]) "
                    "before tf.reshape on one side, a Keras Flatten of channels-last maps on the other)"
                )
                break
        else:
            note += " (channels-first against channels-last maps, a transpose or a permutation on one side)"
        if self._trains_the_same(k):
            return note + (
                "; the loss and every gradient recorded at this step agree: the step trains the same, and only the "
                "layout this output was recorded in differs"
            )
        return note + (
            "; the layer reading them (its kernel copied from the other run) meets each feature at another row of its "
            "kernel: a Permute((3, 1, 2)) before Keras Flatten flattens as TF1's transpose to channels-first then "
            "reshape does"
        )

    def _input_width_upstream(self, pair: Pair, k: int) -> Optional[str]:
        """For a kernel (or its gradient or slot) whose shapes differ at ``k`` in the input axis alone
        (the second to last: ``[in, out]``, ``[h, w, in, out]``), the first output recorded with
        another shape at that step: the layer is the same, its input is not. A new user's Keras port
        whose ``Conv2D`` kept its default ``padding="valid"`` (or whose ``MaxPool2D`` kept its default
        strides, the pool size) diverged first on the dense kernel after the flatten, "shape [24, 16]
        vs [6, 16]", a layer ported faithfully, with no word of the conv whose output shrank. None
        otherwise."""
        rb, rc = int(pair.ib[k]), int(pair.ic[k])
        if rb < 0 or rc < 0:
            return None
        sb, sc = pair.known_shape("base", rb), pair.known_shape("cand", rc)
        if sb is None or sc is None or len(sb) < 2 or len(sb) != len(sc):
            return None
        apart = [axis for axis, (db, dc) in enumerate(zip(sb, sc)) if db != dc]
        if apart != [len(sb) - 2]:
            return None
        outputs = [p for p in self._pairs if p.base.kind in _OUTPUTS]
        for p in outputs:
            p.ensure(k + 1, self.policy.equal_nan)
        shaped = sorted((p for p in outputs if p.reason[k] == SHAPE), key=lambda p: p.base.order)
        if not shaped:
            return None
        first = shaped[0]
        shapes = [first.runtime_shape(side, int(row)) for side, row in (("base", first.ib[k]), ("cand", first.ic[k]))]
        return (
            f"only its input axis differs ({sb[-2]} against {sc[-2]}): the layer reads an input of another width; "
            f"the first output of another shape at this step, in execution order, is {first.base.kind}/"
            f"{first.base.name} ({shapes[0]} in baseline vs {shapes[1]} in candidate): a shape change at or before "
            "that layer reaches this one (Keras Conv2D's default padding='valid' where TF1 had 'SAME', a pooling's "
            "strides, which Keras defaults to the pool size, a layer dropped or added)"
        )

    def _random_draws(self, first: Pair) -> Optional[str]:
        """What the random ops ``first`` is computed from say (the shims record their types for a
        forward tensor of a graph), else None. A helper's faithful VAE port, its noise drawn with
        ``tf.random.normal`` on each side, diverged at step 0 on the reparameterized ``z`` and was told
        "this layer computes another function of its input", as a real bug there was."""
        ops = {run.name: s.random for run, s in ((self.base, first.base), (self.cand, first.cand)) if s.random}
        if not ops:
            return None
        listed = "; ".join(f"'{name}': {', '.join(types)}" for name, types in ops.items())
        if len(ops) == 1:
            (name,) = ops
            other = self.cand.name if name == self.base.name else self.base.name
            # an op in the graph is not a draw that counts: a new user's TF1 dropout switched off for the
            # check (training flag False, keep_prob fed 1.0) still held its op, and the port's real bug after
            # it (ELU for ReLU) was told only "'tf1' draws random numbers here", sent looking for a dropout
            return (
                f"in '{name}' only it is computed from a random op that no recorded output feeds ({listed}): "
                f"either '{name}' draws random numbers here and '{other}' does not (noise, dropout or a random "
                f"augmentation on in one run only), or that op is switched off in '{name}' (a dropout whose training "
                "flag is False or whose keep_prob is fed 1.0 keeps its op and draws nothing that counts) and this "
                "layer computes another function of its input (activation, padding, epsilon), or reads an input "
                "not recorded"
            )
        return (
            f"both runs compute it from a random op that no recorded output feeds ({listed}): unless both draw "
            "the same numbers (the same noise fed to both, or both run under DeterministicRandomTestTool in its "
            "default 'constant' mode: README Porting a real model, step 1) the draws differ, and so does this "
            "output in a faithful port; make them equal to tell a bug here from the draws. When they are equal or "
            "switched off in both (a dropout whose training flag is False or whose keep_prob is fed 1.0 keeps its "
            "op and draws nothing that counts), this layer computes another function of its input (activation, "
            "padding, epsilon), or reads an input not recorded"
        )

    def _earlier_by_statistics(self, first: Pair, k: int) -> list[Pair]:
        """The outputs recorded before ``first`` that both runs logged at ``k`` and compare by
        statistics only there."""
        return [
            p
            for p in self._pairs
            if p.base.kind in _RECORDED_BEFORE
            and p.base.order < first.base.order
            and p.ib[k] >= 0
            and p.ic[k] >= 0
            and not p.by_values_at(k)
        ]

    def _per_replica_batch_norm_note(self, first: Pair, k: int, loose: list[Pair]) -> Optional[str]:
        """:meth:`_input_note`'s replicas clause where a weight or an output recorded before
        ``first`` (``loose``) was compared by statistics only at ``k``, so that nothing proves it
        agrees: given only when the runs ran different replica counts, ``first`` is a batch
        normalization's and a run's recorded moving statistics show its replicas apart
        (:func:`replicas.kept_in_sync` False), which an unsynchronized batch norm does whatever its
        input. A new user's U-Net under MirroredStrategy, its first conv's output (8192 elements)
        kept as statistics, diverged at step 0 on the batch norm after it with no note, beside a
        replicas line saying its moving statistics were out of sync; so did a ResNet whose larger
        conv kernels were kept as statistics. None otherwise."""
        counts = self._replica_counts_of_batch_norm(first)
        if counts is None or False not in self._batch_norm_sync():
            return None
        outputs = [p.base.name for p in loose if p.base.kind != "weight"]
        weights = [p.base.name for p in loose if p.base.kind == "weight"]
        named = " and ".join(
            part for part in (", ".join(outputs) + " before it" if outputs else "", ", ".join(weights)) if part
        )
        return (
            f"the runs ran {counts[0]} and {counts[1]} replicas, and the replicas' copies of the batch "
            f"normalization's moving statistics parted: {_PER_REPLICA_BN}; every "
            + ("weight compared by values" if weights else "recorded weight")
            + f" agrees at this step, but {named} {'was' if len(loose) == 1 else 'were'} compared by "
            "statistics only, so a difference upstream is not ruled out"
        )

    def _replica_counts_of_batch_norm(self, first: Pair) -> Optional[tuple[int, int]]:
        """(fewer, more) replicas when the runs ran different counts and ``first`` is a batch
        normalization's (either run's name); None otherwise."""
        counts = [self._replicas[run.name].count for run in (self.base, self.cand) if run.name in self._replicas]
        if len(set(counts)) < 2 or not any(_BATCH_NORM.search(name) for name in (first.base.name, first.cand.name)):
            return None
        return min(counts), max(counts)

    def _batch_norm_sync(self) -> list[Optional[bool]]:
        """:func:`replicas.kept_in_sync` of each run's batch-norm moving statistics, for the runs
        that recorded replica copies of any."""
        found = []
        for run in (self.base, self.cand):
            copies = self._replicas[run.name].copies if run.name in self._replicas else {}
            keys = [key for key in copies if key[0] == "state" and _BATCH_NORM.search(key[1]) and "moving" in key[1]]
            if keys:
                found.append(replicas.kept_in_sync(run, self._replicas[run.name], keys))
        return found

    def _batch_norm_in_sync(self) -> bool:
        """Whether the multi-replica run's batch-norm moving statistics stayed in sync across its
        replicas at every step it logged past the first: a synchronized batch norm. A helper's
        ``BatchNormalization(synchronized=True, epsilon=1e-5)`` was told its replicas normalize each
        share of the batch alone, beside a replicas line saying every copy agrees."""
        synced = self._batch_norm_sync()
        return bool(synced) and all(s is True for s in synced)

    def _positions_note(self, pair: Pair, k: int) -> str:
        """For a sequence output (rank 3: ``[batch, time, features]``) whose elements out of
        tolerance at ``k`` lie at some (batch, time) positions only, every element at the others
        agreeing: which share, and when each sample's are a run at its start or end (padding), a
        mask on one side. A helper's ``Embedding(mask_zero=True)`` on one side moved only the padded
        query rows of its attention and the note spoke of activations and epsilon. "" otherwise."""
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None:
            return ""
        shape = pair.known_shape("base", int(pair.ib[k]))
        if shape is None or len(shape) != 3:
            return ""
        n, t, f = shape
        if n * t * f != len(both[0]):
            return ""
        apart = np.zeros((n, t), bool)
        apart.flat[np.unique(out // f)] = True
        if apart.all():
            return ""
        rows = apart.any(axis=1)
        share = f"; its elements out of tolerance lie at {int(apart.sum())} of its {n * t} (batch, time) positions"
        # a mask or another sample moves most features of a position: a trial's single element 2.2x
        # past tolerance at a sample's last position was told "the runs mask them differently"
        per_position = np.bincount(out // f, minlength=n * t).reshape(n, t)[apart]
        if not (2 * per_position >= f).all():
            return (
                share
                + f" ({len(out)} element(s) of their {int(apart.sum()) * f}), every element at the others agreeing"
            )
        if (apart[rows].all(axis=1)).all():  # whole rows of the first axis: not a mask
            return share + (
                f", every position of {int(rows.sum())} entries of the first axis and none of the others (whole "
                "samples, or whole time steps if the output is time-major)"
            )
        runs = True
        for row in apart[rows]:
            at = np.flatnonzero(row)
            runs &= bool(at[-1] - at[0] + 1 == len(at) and (at[0] == 0 or at[-1] == t - 1))
        if not runs:
            return share + ", every element at the others agreeing"
        # the others all 0 in both runs: padding both recorded as 0 (``mask=``, ``zero_masked``), so
        # the positions apart are the real ones. A port with LayerNormalization's default epsilon,
        # padding masked on both sides, was told its runs mask padding differently.
        others = ~apart & apart.any(axis=1, keepdims=True)  # the agreeing positions of the samples apart
        base, cand = (v.reshape(n, t, f) for v in both)
        if others.any() and not (base[others] != 0).any() and not (cand[others] != 0).any():
            return share + (
                ", every element at the others agreeing, and those others 0 in both runs in each sample apart "
                "(padding both runs recorded as 0): its real positions differ, so padding masked differently does "
                "not explain it; a mask over the real positions can (an attention's causal mask shifted by one, a "
                "token attending to itself in one run only; an attention mask of the other convention, True = "
                "padding in one run where Keras's attention_mask means True = attend)"
            )
        masking = (
            ", in each sample a run at its start or end, every element at the others agreeing: when those "
            "are padded positions, the runs mask them differently (Keras Embedding(mask_zero=True) or Masking "
            "on one side only, an attention or padding mask, a sequence_length)"
        )
        # a port that reads its padding (Embedding without mask_zero=True) records the same values here as
        # a faithful port recorded whole: only what follows tells them apart. A new user's such port was
        # told to record the real positions alone, which it did already (instrument(zero_masked=True) has
        # no mask to apply), while its pooled output and its loss differed at this step
        if self._loss_apart(k):
            zero = [run.name for run, v in ((self.base, base), (self.cand, cand)) if not (v[apart] != 0).any()]
            reads = [run.name for run in (self.base, self.cand) if run.name not in zero]
            who = f"'{reads[0]}', which records them nonzero, " if len(zero) == 1 and len(reads) == 1 else "one run "
            # a port that masks its padding everywhere but divides its token loss by every position (fit's
            # sample_weight=mask with no Keras mask to record by) was told it may read its padding: a read
            # padding moves the gradients otherwise than the loss, not every one of them by the loss's factor
            scaled = self._whole_loss_scaled_at(k)
            if scaled:
                return (
                    share
                    + masking
                    + (
                        f", and the loss differs at this step too, but {scaled}; reading padding would not scale "
                        f"the loss and every gradient by one factor, so {who}likely reads its padding nowhere that "
                        "trains and records it only because it has no mask to record by (README: padded positions)"
                    )
                )
            return (
                share
                + masking
                + (
                    f", but the loss differs at this step too, which padding that nothing downstream reads would leave "
                    f"alone: {who}may read its padding where the other masks it, and recording the real positions alone "
                    "would not make the runs agree (README: padded positions)"
                )
            )
        return (
            share
            + masking
            + (
                ", and only the real positions need agree: record those alone on both sides, rec.activation(name, t, "
                "mask=real_positions) in TF1 and instrument(..., zero_masked=True) for a Keras mask (README: padded "
                "positions)"
            )
        )

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

    def _frozen_moving_stats(self, first: Pair, k: int) -> Optional[str]:
        """Whether one run left a batch normalization's moving statistic unchanged from compared step
        ``k`` to the next while the other moved it: that run's layer normalized in inference mode, with
        its moving statistics, not the batch's. A new user's ``train_step`` called its encoder with
        ``training=False``; its first output diverged at step 0 and was told of shuffling and padding."""
        if k + 1 >= len(self.steps):
            return None
        # a layer whose own output is recorded is no cause here: before ``first`` it agrees (TF1 without the
        # UPDATE_OPS dependency keeps its moving statistics put and normalizes with the batch's, as the port
        # does), after it, it runs downstream of ``first``
        outputs = {
            n.rpartition("/")[2]
            for o in self._pairs
            if o is not first and o.base.kind in _OUTPUTS
            for n in (o.base.name, o.cand.name)
        }
        for p in self._pairs:
            if p.base.kind != "state" or not _MOVING_STATS.search(f"{p.base.name} {p.cand.name}"):
                continue
            if {_layer_of(p.base.name), _layer_of(p.cand.name)} & outputs:
                continue
            now, after = p.step_values(k), p.step_values(k + 1)
            if now is None or after is None or len(now[0]) != len(after[0]):
                continue
            still = [bool(np.array_equal(a, b, equal_nan=True)) for a, b in zip(now, after)]
            if still[0] != still[1]:
                who, other = (self.base.name, self.cand.name) if still[0] else (self.cand.name, self.base.name)
                return (
                    f"'{who}' left {p.base.name} unchanged from step {int(self.steps[k])} to step "
                    f"{int(self.steps[k + 1])} where '{other}' updated it: a batch normalization likely ran in "
                    f"inference mode in '{who}', normalizing with its moving statistics instead of the batch's "
                    "(Keras: the layer frozen with trainable = False, which since Keras 2 runs it in inference mode "
                    "even under fit, where TF1 code leaving it out of var_list still normalizes with the batch; or "
                    "the layer or model called with training=False, or without training=True in a custom "
                    "train_step or loop; TF1: training=False)"
                )
        return None

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
        (:meth:`_dropout_in_one_run`, :meth:`_dropout_in_both`), else None."""
        dropout = self._dropout_in_one_run(first, k)
        if dropout is None:
            return None
        on, out, scale = dropout
        off = self.cand.name if on == self.base.name else self.base.name
        both_on = self._dropout_in_both(first, k, on, out, scale)
        if both_on:
            return f"{agree} at this step, and {both_on}" + self._positions_note(first, k)
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
        ) + self._positions_note(first, k)

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

    def _zero_samples(self, pair: Pair, k: int) -> Optional[str]:
        """When every element out of tolerance at step ``k`` lies in a sample (an entry of the first
        axis) that one run holds 0 at every element and the other does not, and no random op is recorded
        for it: whole samples zeroed, which is that layer's input, not a mask drawn on its elements. A
        helper's port fed its dense layer ``seq[:, -1]`` of a masked LSTM under
        ``zero_output_for_mask=True`` (0 for every padded sample) where TF1 read ``dynamic_rnn``'s final
        state, and was told of a dropout mask drawn otherwise, which neither run had. None otherwise."""
        if pair.base.random or pair.cand.random:
            return None
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None:
            return None
        shape = pair.known_shape("base", int(pair.ib[k]))
        if shape is None or len(shape) < 2 or math.prod(shape) != len(both[0]):
            return None
        n = shape[0]
        per = len(both[0]) // n
        if per < 2:
            return None
        apart = np.unique(out // per)
        z_run = None
        for zero, other, run in ((both[0], both[1], self.base), (both[1], both[0], self.cand)):
            z, o = zero.reshape(n, per), other.reshape(n, per)
            if (z[apart] == 0).all() and (o[apart] != 0).any(axis=1).all():
                z_run = run
                break
        if z_run is None:
            return None
        said = (
            f"each of its {len(out)} elements out of tolerance lies in a sample 0 at every element in one run "
            f"only: in '{z_run.name}' every element of {len(apart)} of its {n} samples is 0, so that run's layer "
            "reads an input that is 0 for those samples (with its bias 0 at this step), an input not recorded"
        )
        padded = self._padded_last_step(pair, k, n, apart)
        if padded:
            return (
                f"{said}: those are the samples whose last time step of {padded} is 0 in both runs (padding): "
                f"'{z_run.name}' likely reads that padded last step (a masked Keras LSTM/GRU's output[:, -1] under "
                "zero_output_for_mask=True) where the other reads each sample's last real step (TF1's dynamic_rnn "
                "final state at sequence_length; Keras: return_state=True, or return_sequences=False)"
            )
        return f"{said} (padding or a mask applied in one run only, a padded time step read as the last one)"

    def _padded_last_step(self, first: Pair, k: int, n: int, samples: np.ndarray) -> Optional[str]:
        """The name of a sequence output (``[n, time, ...]``) recorded before ``first`` whose last time
        step is 0 at every element in both runs for exactly ``samples`` among its ``n``, else None."""
        for p in self._pairs:
            if p.base.kind not in _RECORDED_BEFORE or p.base.order >= first.base.order:
                continue
            if p.ib[k] < 0 or p.ic[k] < 0:
                continue
            both = p.step_values(k)
            shape = p.known_shape("base", int(p.ib[k]))
            if both is None or shape is None or len(shape) < 3 or shape[0] != n or math.prod(shape) != len(both[0]):
                continue
            t = shape[1]
            last = [v.reshape(n, t, -1)[:, -1] for v in both]
            zero = np.flatnonzero((last[0] == 0).all(axis=1) & (last[1] == 0).all(axis=1))
            if np.array_equal(zero, samples):
                return str(p.base.name)
        return None

    def _value_moved_in_its_row(self, pair: Pair, k: int) -> Optional[str]:
        """When every element out of tolerance at ``k`` is exactly 0 in one run only, and in each row
        (first axis) the values one run holds at its elements out of tolerance are the values the other
        holds at others (a one-hot's 1 in another column): each example's category landed elsewhere, no
        random mask. A helper's Discretization port whose boundaries sat one year above TF1's
        bucketized_column moved the ages on a boundary to the bucket below, and was told of dropout,
        padding or a ReLU, none of which its model had. None otherwise."""
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None or pair.base.random or pair.cand.random:
            return None  # drawn masks: the random notes say what they can
        shape = pair.known_shape("base", int(pair.ib[k]))
        if shape is None or len(shape) != 2 or math.prod(shape) != len(both[0]):
            return None
        b, c = (np.asarray(v, dtype=np.float64) for v in both)
        if not ((b[out] == 0) != (c[out] == 0)).all():
            return None
        rows = out // shape[1]
        # each row's non-zero values of one run against the other's, sorted by (row, value) at once: a loop
        # over the rows took 5 s for a one-hot of 100k rows. Equal row lists also give every row as many of
        # the one as of the other, so none holds only the other's (a value that appeared, none that moved)
        gone, came = b[out] != 0, c[out] != 0
        if gone.sum() != came.sum():
            return None
        sides = [(rows[m], v[out][m]) for m, v in ((gone, b), (came, c))]
        (rg, vg), (rc, vc) = ((r[np.lexsort((v, r))], v[np.lexsort((v, r))]) for r, v in sides)
        if not np.array_equal(rg, rc) or not np.allclose(vg, vc, rtol=1e-6, atol=0):
            return None
        n = len(np.unique(rows))
        return (
            f"in each of its {n} row(s) that differ, the values one run holds at the elements out of tolerance "
            "the other holds at others of the row, 0 where the first has them: an example's category lands in "
            "another column (a one-hot or indicator: bucket boundaries moved, a Discretization's against "
            "bucketized_column's, both of which put a value equal to a boundary in the bucket above it; a "
            "vocabulary in another order or its OOV index elsewhere, StringLookup's 0 against vocabulary_list's "
            "last), not a random mask"
        )

    def _zero_in_one_run(self, pair: Pair, k: int) -> int:
        """How many elements are out of tolerance at step ``k`` when each of them is exactly 0 in
        one run and not in the other (a dropout mask drawn differently), else 0. A new user's
        dropout seeded otherwise was told "this layer computes another function (... training
        flag)" though both ran in training mode."""
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None:
            return 0
        b, c = both
        return len(out) if ((b[out] == 0) != (c[out] == 0)).all() else 0

    def _maybe_upstream(self, first: Pair, unpaired: list[tuple[int, str]]) -> list[str]:
        """The variables of ``unpaired`` ((side, name): 0 baseline, 1 candidate) that may feed
        ``first``: not those whose scope is a layer whose output that run records after ``first``'s
        (a review's dense layer before a declared LSTM was told of the LSTM's cells), matched per
        run and by whole scope (the next review's: a port's renumbered ``dense_1`` and a scoped
        ``encoder/dense`` lost their own unpaired bias to the other run's or scope's later output);
        never those of ``first``'s own layer."""
        later: list[set[str]] = [set(), set()]
        for p in self._pairs:
            if p.base.kind in _OUTPUTS:
                if p.base.order > first.base.order:
                    later[0].add(p.base.name)
                if p.cand.order > first.cand.order:
                    later[1].add(p.cand.name)
        own = (first.base.name, first.cand.name)

        def under(scope: str, layer: str) -> bool:  # the layer's name as whole components of the scope
            return f"/{layer}/" in f"/{scope}/"

        kept = []
        for side, name in unpaired:
            scope = name.removesuffix(":0").rpartition("/")[0]
            if under(scope, own[side]) or not any(under(scope, layer) for layer in later[side]):
                kept.append(name)
        return kept

    def _unpaired_clause(self, first: Pair, unpaired: list[str]) -> str:
        """What :meth:`_input_note` adds when some weight or state that may feed ``first`` was
        recorded by one run only (declared with ``--allow-unmatched`` or not): those were never
        compared, so it names them, and what a recurrent cell's port must convert when the recurrent
        layer itself diverges. A new user's TF1 ``LSTMCell`` against Keras ``LSTM`` (the cells
        declared, as the warning says) diverged on the LSTM's output at step 0 with a wrong gate
        order or forget bias, and got no note; a helper's GRU port fed padded steps through its GRU
        was told only of the cells (what the output's values show now comes first)."""
        shown = ", ".join(unpaired[:3]) + (f" and {len(unpaired) - 3} more" if len(unpaired) > 3 else "")
        note = (
            f"; {len(unpaired)} variable(s) recorded by one run only were never compared ({shown}): a difference "
            "in them reaches this output if they feed it"
        )
        # the recurrent layer itself diverges: its output's name says so, or the variables under its
        # own scope do (a Keras Bidirectional wraps forward_gru/gru_cell/...; a helper's bi-GRU port
        # with the gate order copied as it was, its output named `bidirectional`, got no conversion hint)
        own = [
            tail
            for name in unpaired
            for layer in {first.base.name, first.cand.name}
            for _, sep, tail in [f"/{name.removesuffix(':0')}".partition(f"/{layer}/")]
            if sep
        ]
        names = " ".join([first.base.name, first.cand.name, *own])
        if _LSTM.search(names):
            note += (
                "; an LSTM converted from TF1 (LSTMCell, LSTMBlockCell) to Keras LSTM: the gate order (TF1 i, j, f, "
                "o; Keras i, f, c, o), the forget bias (TF1 adds forget_bias=1.0 at run time, Keras holds it in the "
                "bias: add 1 to TF1's forget block), TF1's kernel [input + units, 4 units] split into Keras's kernel "
                "(its first input rows) and recurrent kernel (the last units rows)"
            ) + self._peepholes()
        elif _GRU.search(names):
            note += (
                "; a GRU converted from TF1 GRUCell to Keras GRU: Keras's default reset_after=True (TF1 resets "
                "before the candidate's matmul: reset_after=False), the gate order (TF1 gates r, u; Keras z, r, h), "
                "and the kernels split into input and recurrent rows"
            )
        if (_LSTM.search(names) or _GRU.search(names)) and re.search(r"(^|/)(forward|backward)_", " /".join(own)):
            note += (
                "; a Bidirectional layer: each direction's cell converted into its own (TF1's fw cell into "
                "forward_layer, bw into backward_layer)"
            )
        return note

    def _peepholes(self) -> str:
        """What the LSTM hint adds when one run's unpaired weights hold a TF1 ``LSTMCell``'s peephole
        weights (``use_peepholes=True``: ``w_i_diag``, ``w_f_diag``, ``w_o_diag``) and the other run's
        none: Keras ``LSTM`` has no peephole connections, so a port converted by the gate order, the
        forget bias and the kernel split alone still computes another function (a helper's such port
        was told only those three, each of them right). "" otherwise."""
        alignment = self._alignment
        if alignment is None:
            return ""
        peep = [
            sorted(name for kind, name in keys if kind == "weight" and _PEEPHOLE.search(name))
            for keys in (alignment.unmatched_base, alignment.unmatched_cand)
        ]
        if bool(peep[0]) == bool(peep[1]):
            return ""
        run, other = (self.base, self.cand) if peep[0] else (self.cand, self.base)
        return (
            f"; '{run.name}''s cell has peephole connections (TF1 LSTMCell(use_peepholes=True): "
            f"{', '.join(peep[0] or peep[1])}) and '{other.name}' holds no such weights: Keras LSTM has none, so "
            "its port needs a cell that adds them (w_i_diag and w_f_diag times the previous cell state to the i "
            "and f gates, w_o_diag times the new cell state to the o gate)"
        )

    def _repeats_last_step(self, pair: Pair, k: int) -> Optional[str]:
        """For a sequence output (``[batch, time, ...]``) whose every element out of tolerance at
        ``k`` is exactly 0 in one run and, in the other, the same element one time step earlier:
        padded time steps, which TF1's ``dynamic_rnn`` zeroes and a masked Keras RNN with
        ``return_sequences`` fills with the last state (None otherwise)."""
        out = self._elements_out(pair, k)
        both = pair.step_values(k)
        if out is None or not len(out) or both is None:
            return None
        known = pair.runtime_shape("base", int(pair.ib[k]))
        shape = [d for d in known if d is not None]
        if len(shape) < 3 or len(shape) < len(known) or math.prod(shape) != len(both[0]):
            return None
        inner = math.prod(shape[2:])  # elements per time step
        if (out // inner % shape[1] == 0).any():
            return None  # the first time step has no earlier one to repeat
        for zero, side, other in ((both[0], "candidate", both[1]), (both[1], "baseline", both[0])):
            if (zero[out] == 0).all() and (other[out] != 0).all() and (other[out] == other[out - inner]).all():
                return (
                    f"each of its {len(out)} elements out of tolerance is 0 in one run and, in the {side}, the same "
                    "element one time step earlier: padded time steps, which TF1's dynamic_rnn(sequence_length=...) "
                    "fills with zeros and a masked Keras LSTM/GRU with return_sequences=True with the last state "
                    "(zero_output_for_mask); compare the real steps only, or zero the padded ones by the mask"
                )
        return None


#: Kinds that, recorded before an output, are its input or what led to it (an agreeing one rules
#: out another batch).
_RECORDED_BEFORE = frozenset({"input", "activation", "output"})


#: A recurrent cell's tensors by name (TF1 ``lstm_cell``, ``LSTMBlockCell``, Keras ``lstm``; ``gru_cell``, ``gru``).
_LSTM = re.compile(r"lstm", re.IGNORECASE)


_GRU = re.compile(r"gru", re.IGNORECASE)


#: A TF1 ``LSTMCell(use_peepholes=True)``'s peephole weights.
_PEEPHOLE = re.compile(r"(^|/)w_[ifo]_diag(:\d+)?$")


#: Why a batch normalization's output differs across replica counts, said by every note that names it.
_PER_REPLICA_BN = (
    "a batch normalization under a strategy normalizes each replica's share of the batch with that share's "
    "statistics unless it is synchronized (Keras SyncBatchNormalization, or BatchNormalization(synchronized=True))"
)


def _positions_shifted(b: np.ndarray, c: np.ndarray, atol: float, rtol: float) -> bool:
    """Whether each row of ``c`` (``[rows, positions, features]``) is the same row of ``b`` with its
    positions rolled (a sequence padded at the other end) or reversed, within ``atol + rtol |c|``."""
    for row_b, row_c in zip(b, c):
        bound = atol + rtol * np.abs(row_c)
        if (np.abs(row_b[::-1] - row_c) <= bound).all():
            continue
        # the shifts that carry some position of b onto c's first, each then checked whole
        starts = np.flatnonzero((np.abs(row_b - row_c[0]) <= bound[0]).all(axis=1))
        if not any((np.abs(np.roll(row_b, -int(r), axis=0) - row_c) <= bound).all() for r in starts):
            return False
    return True


def _noise_floor(values: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The rounding noise of a step's gradients (:data:`GRAD_NOISE_OF_MAX` of their largest element): a
    gradient that is 0 in exact arithmetic (an attention's key bias) holds no more than this in either run."""
    return GRAD_NOISE_OF_MAX * max((float(np.abs(v).max(initial=0.0)) for pair in values for v in pair), default=0.0)
