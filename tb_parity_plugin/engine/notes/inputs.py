"""Notes on an output that diverges first while what feeds it agrees: another input, another
batch or masking (and real positions apart with padding recorded as 0), replicas normalizing apart,
random draws, variables never compared. A loss scaled as a whole and dropout have modules of their
own (``loss_scale``, ``dropout``)."""

from __future__ import annotations

import math
import re
from typing import Optional

import numpy as np

from tb_parity_plugin.engine import align, replicas
from tb_parity_plugin.engine.matrix import OK, SHAPE
from tb_parity_plugin.engine.notes.context import (
    _BATCH_NORM,
    _OUTPUTS,
    _RECORDED_BEFORE,
    _layer_of,
    _one_value,
)
from tb_parity_plugin.engine.notes.dropout import DropoutNotes
from tb_parity_plugin.engine.notes.loss_scale import LossScaleNotes
from tb_parity_plugin.engine.notes.spatial import SpatialNotes
from tb_parity_plugin.engine.notes.state import _MOVING_STATS
from tb_parity_plugin.engine.pair import Pair
from tb_parity_plugin.records import metadata

#: The most element comparisons :meth:`InputNotes._rows_in_another_order` makes (every row of an
#: output against every row: a batch of 1000 rows of 1000 would be 1e9), and how many it holds at once.
_REORDER_BUDGET = 50_000_000
_REORDER_BLOCK = 4_000_000
#: :meth:`InputNotes._positions_note`'s clause for positions apart at each sample's start or end
_MASKING = (
    ", in each sample a run at its start or end, every element at the others agreeing: when those "
    "are padded positions, the runs mask them differently (Keras Embedding(mask_zero=True) or Masking "
    "on one side only, an attention or padding mask, a sequence_length)"
)


class InputNotes(LossScaleNotes, DropoutNotes, SpatialNotes):
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
            forward = None if logged else self._dropout_in_forward_pass(first, k)
            return None if forward is None else forward + self._positions_note(first, k)
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
            return (
                self._per_replica_batch_norm_note(first, k, self._earlier_by_statistics(first, k) + loose)
                or self._padding_masked_in_one_run(first, k)
                or self._loss_after_agreeing_output(first, k, loose)
            )
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
            # came before it, and a resize is read from its own input alone (which agrees element-wise)
            resized = self._resize_note(first, k)
            if resized:
                return f"the output recorded just before it agrees element-wise at this step, and {resized}"
            return self._per_replica_batch_norm_note(
                first, k, self._earlier_by_statistics(first, k)
            ) or self._loss_after_agreeing_output(first, k, [])
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

    def _loss_after_agreeing_output(self, first: Pair, k: int, weights: list[Pair]) -> Optional[str]:
        """For a loss diverging first at ``k`` while outputs before it are compared by statistics only:
        when the output recorded just before it (the model's output, in a model recording it) agrees
        element-wise, what :meth:`_what_is_left` says of a loss, with the outputs statistics alone
        compared. A new user's U-Net port that left out TF1's class weights (``weights=`` of
        ``sparse_softmax_cross_entropy``) diverged on its loss at step 0, its logits agreeing
        element-wise, and got no note because larger layer outputs before them (and a larger kernel,
        ``weights``) were kept as statistics. None otherwise."""
        if first.base.kind != "loss":
            return None
        before = self._input_before(first, k)
        if before is None or before.base.kind not in _OUTPUTS or not before.by_values_at(k):
            return None
        before.ensure(k + 1, self.policy.equal_nan)
        if before.reason[k] != OK:
            return None
        loose = ", ".join(f"{p.base.kind}/{p.base.name}" for p in self._earlier_by_statistics(first, k) + weights)
        agree = f"{before.base.kind}/{before.base.name}, the output recorded just before it, agrees element-wise"
        return self._what_is_left(agree, first, k, True) + (
            f" (compared by statistics only before it: {loose}; a loss that also reads one of those may differ there)"
            if loose
            else ""
        )

    def _what_is_left(self, agree: str, first: Pair, k: int, earlier: bool) -> str:
        """:meth:`_input_note`'s reading of the output's own values and of what was recorded before
        it, after ``agree`` (what agrees): padded steps, zeros in one run, replicas, this layer's
        function or its input, and at which sequence positions it differs."""
        padded = self._repeats_last_step(first, k)
        if padded:
            return f"{agree} at this step; {padded}"
        dropout = self._dropout_note(agree, first, k)
        if dropout:
            return dropout + self._positions_note(first, k)
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
            shape = first.known_shape("base", int(first.ib[k]))
            if first.base.kind == "loss" and shape is not None and int(np.prod(shape)) == 1:
                # a trial's triplet port wrote its hinge max(0, d_ap - d_an - m) for TF1's max(0, d_ap - d_an + m):
                # its loss 0 at step 0, told of units a ReLU switched off and of padding; a loss whose weights are
                # all 0 (a port's padding mask inverted) is 0 too, and was then told only of a hinge
                return (
                    f"{agree} at this step, and it is exactly 0 in one run only: a hinge or margin loss (max(0, ...)) "
                    "whose margin or sign differs (max(0, d - m) against max(0, m - d), a margin added in one run and "
                    "subtracted in the other), which no example passes in that run; every example weighted by 0 in "
                    "that run (a padding mask inverted, tokens == 0 for != 0, on a batch without padding; a "
                    "sample_weight or class_weight of zeros); or a loss clamped otherwise"
                ) + self._positions_note(first, k)
            if self._drawn_from_no_random_op(first):
                # a port's ReLU before its batch norm (TF1's after it) was sent to a dropout seed first, where
                # neither graph has a random op
                return (
                    f"{agree} at this step, and each of its {masked} elements out of tolerance is exactly 0 in one "
                    "run only, which no random op computes in either run (no dropout mask): units a ReLU switched "
                    "off in one run (an activation applied in one run only, or before this output in one run and "
                    "after it in the other), or padding one run masks"
                ) + self._positions_note(first, k)
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
        shares = self._normalized_shares(first, k)
        if shares:
            return f"{agree} at this step, and {shares}"
        reordered = self._rows_in_another_order(first, k)
        if reordered:
            return f"{agree} at this step, and {reordered}" + self._positions_note(first, k)
        features = self._features_in_another_order(first, k)
        if features:
            return f"{agree} at this step, and {features}"
        resized = None if loss else self._resize_note(first, k)
        if resized:
            return f"{agree} at this step, and {resized}"
        squashed = None if loss else self._squashed(first, k)
        if squashed:
            return f"{agree} at this step, and {squashed}"
        crossed = None if loss else self._values_of_another_output(first, k)
        if crossed:
            return f"{agree} at this step, and {crossed}"
        frozen = None if loss else self._frozen_moving_stats(first, k)
        if frozen:
            return f"{agree} at this step, and {frozen}" + self._positions_note(first, k)
        own = None if loss else self._own_state_read_in_the_step(first, k, earlier)
        if own:
            return f"{agree} at this step, and {own}"
        rescaled = None if loss else self._input_scaled_otherwise(first, k)
        if rescaled:
            return f"{agree} at this step, and {rescaled}" + self._positions_note(first, k)
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
                    (
                        f"{agree} at this step: the loss is computed differently (reduction, from_logits, label "
                        "smoothing, a loss's own parameter such as Huber's delta, regularization terms, per-example "
                        "weights: fit's class_weight= or sample_weight= against TF1's weights=; a multi-output model's "
                        "per-head weights: compile's loss_weights= against TF1's weighted sum), its labels differ, or a "
                        "layer after the last recorded output does"
                    )
                    + self._broadcast_labels(first, k)
                    + self._after_a_phase_before()
                )
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
            + (
                ""
                if loss
                # a trial's GAN port called its generator without training=True in a custom loop (Keras then
                # runs batch norm on its moving statistics) and was told of activations and data formats
                # (worded without naming batch norm: an LSTM port with none was told of it, tests/test_alignment_on_ports.py)
                else " (activation, a scale, epsilon, padding, data format, a training flag: a layer that normalizes "
                "by its batch or drops units in training run in inference mode in one run only, such as a Keras "
                "model called without training=True in a custom loop)"
            )
            + ", or its input differs (another batch: Keras fit shuffles unless shuffle=False, and over a finite "
            "shuffled dataset starts at its second order; a tf.data shuffle or batching on one side; or the input "
            "preprocessed otherwise: its scaling, a mean subtracted, an "
            "augmentation on one side; another input of a model of several: a dict's keys crossed); recording the "
            "input too, as kind input (rec.tensor('input', name, x) in TF1 "
            "or a custom loop), tells the two apart" + self._positions_note(first, k)
        ) + (self._after_a_phase_before() if loss else "")

    def _after_a_phase_before(self) -> str:
        """For a loss diverging while every recorded weight agrees: when both runs' first logged step
        is 0 and a slot already holds an update there in both, this logdir records a phase that follows
        another's update in the same iteration (a GAN's generator after its discriminator), and a loss
        computed before that update saw weights other than those recorded. A trial's GAN port took its
        generator's loss from the one forward pass of the TF2 DCGAN tutorial's ``train_step``, before the
        discriminator's update, and was told only that the loss is computed differently."""
        for q in self._pairs:
            if q.base.kind != "slot" or int(q.base.steps[0]) != 0 or int(q.cand.steps[0]) != 0:
                continue
            if q.feeder is not None:
                # its gradient is recorded here: this phase's own slot, carried over (a port resumed from a
                # checkpoint with its optimizer, numbered from 0), no sign of a phase before this one
                continue
            if _one_value(q.base.stats[0], 1) != 0.0 and _one_value(q.cand.stats[0], 1) != 0.0:
                return (
                    f"; at step 0 both runs' {q.base.name} already holds an update, so this logdir records a phase "
                    "that follows another's update in each iteration (a GAN's generator after its discriminator): "
                    "a loss computed from a forward pass run before that update (one forward pass for both tapes, as "
                    "in the TF2 DCGAN tutorial's train_step, where TF1's second sess.run computes it again) uses the "
                    "weights from before it, not those recorded here"
                )
        return ""

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

    def _padded_width_note(self, pair: Pair, k: int) -> Optional[str]:
        """For an output whose shapes at ``k`` differ in the second axis alone (``[batch, time, ...]``)
        when the wider run's positions past the other's width are all exactly 0 (padding recorded as 0)
        and its first positions agree with the other run's element-wise: the runs pad their sequences to
        other widths. A trial's faithful port fed ragged ids (its lookup recorded padded to each batch's
        longest row) against a TF1 original padded to a fixed width was told only "shape [8, 8, 8] in
        baseline vs [8, 6, 8] in candidate". None otherwise."""
        rb, rc = int(pair.ib[k]), int(pair.ic[k])
        if rb < 0 or rc < 0:
            return None
        sb, sc = pair.known_shape("base", rb), pair.known_shape("cand", rc)
        if sb is None or sc is None or len(sb) < 3 or len(sb) != len(sc):
            return None
        if sb[1] == sc[1] or sb[0] != sc[0] or sb[2:] != sc[2:]:
            return None
        both = []
        for side, row, shape in (("base", rb, sb), ("cand", rc, sc)):
            flat = pair.row_values(side, row)  # full values at every step or at this one
            if flat is None or len(flat) != math.prod(shape):
                return None
            both.append(np.asarray(flat, np.float64).reshape(shape))
        wide = 0 if sb[1] > sc[1] else 1
        width = min(sb[1], sc[1])
        if both[wide][:, width:].any():
            return None
        b, c = both[0][:, :width], both[1][:, :width]
        if not (np.abs(c - b) <= pair.atol_at(k) + pair.rtol_at(k) * np.abs(c)).all():
            return None
        runs = (self.base.name, self.cand.name)
        return (
            f"only the second axis differs ({sb[1]} positions in '{runs[0]}' against {sc[1]} in '{runs[1]}'), "
            f"'{runs[wide]}' holds 0 at every position past {width} and the first {width} agree element-wise: "
            "the runs pad their sequences to other widths (a fixed length against each batch's longest row, as a "
            "RaggedTensor or padded_batch gives); record both cut to the batch's longest row to compare them "
            "(README: tf.RaggedTensor)" + self._apart_after(pair, k)
        )

    def _apart_after(self, pair: Pair, k: int) -> str:
        """For :meth:`_padded_width_note`: the outputs and losses recorded after ``pair`` that differ in value at
        step ``k``, which padding widths do not make (a ragged port that sums its lookup where the fixed-width
        original averages it was told of widths alone, in the words a faithful port is told), or that none do."""
        later = [
            p
            for p in self._pairs
            if p.base.kind in (*_OUTPUTS, "loss")
            and p.base.order > pair.base.order
            and p.ib[k] >= 0
            and p.ic[k] >= 0
            and not metadata.is_sample(p.base.name)  # a sample of a tensor is not one more tensor apart
        ]
        for p in later:
            p.ensure(k + 1, self.policy.equal_nan)
        apart = [p for p in later if p.reason[k] not in (OK, SHAPE)]
        if not apart:
            return f"; all {len(later)} outputs and losses recorded after it agree at this step" if later else ""
        first = min(apart, key=lambda p: p.base.order)
        return (
            f"; but {len(apart)} of the {len(later)} outputs and losses recorded after it differ in value at this "
            f"step, {first.base.kind}/{first.base.name} first, which padding to other widths does not explain: "
            "compare from there"
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

    def _input_scaled_otherwise(self, first: Pair, k: int) -> Optional[str]:
        """When ``first``'s candidate minus its baseline at ``k`` is one factor ``a`` times the output recorded
        just before it (of its shape, agreeing there), element-wise within ``first``'s tolerance: the layer
        scales that input by factors ``a`` apart in the two runs, the rest of it alike (a term added, as
        positions are, cancels). A trial's Transformer port that lost the embedding's ``sqrt(d_model)``
        (``x * sqrt(d) + positions`` in TF1, ``x + positions`` in the port) was told the layer "computes
        another function of its input (activation, padding, epsilon, a training flag)". None otherwise."""
        both = first.step_values(k)
        shape = first.known_shape("base", int(first.ib[k]))
        if both is None or not shape or math.prod(shape) != len(both[0]) or len(both[0]) < 2:
            return None
        before = [
            p
            for p in self._pairs
            if p.base.kind in _OUTPUTS and p.base.order < first.base.order and p.ib[k] >= 0 and p.ic[k] >= 0
        ]
        if not before:
            return None
        prev = max(before, key=lambda p: p.base.order)
        if not prev.by_values_at(k) or prev.known_shape("base", int(prev.ib[k])) != shape:
            return None
        inputs = prev.step_values(k)
        if inputs is None or len(inputs[0]) != len(both[0]):
            return None
        b, c, x = (np.asarray(v, dtype=np.float64) for v in (both[0], both[1], inputs[0]))
        if not (np.isfinite(b).all() and np.isfinite(c).all() and np.isfinite(x).all()):
            return None
        xx = float(x @ x)
        if xx == 0.0:
            return None
        d = c - b
        a = float(d @ x) / xx
        bound = first.atol_at(k) + first.rtol_at(k) * np.abs(b)
        # the factor must explain what the tolerance cannot: elements apart by more than it, and none left apart
        if not (np.abs(d) > bound).any() or (np.abs(d - a * x) > 0.5 * bound).any():
            return None
        # the output itself times one factor has its own note (its input being its own value, less what it adds)
        if np.allclose(x, b, rtol=1e-6, atol=0.0):
            return None
        name = f"{prev.base.kind}/{prev.base.name}"
        root = math.sqrt(shape[-1])
        which = ""
        if abs(abs(a) - 1.0) <= 1e-3:
            # a factor of 1 is the input itself added in one run only, whatever the width: a dropped residual
            # of a last axis of 4 (1 - a = 2 = sqrt(4)) was told of an embedding's sqrt(d_model) (a review's)
            more = self.base.name if a < 0 else self.cand.name
            which = f": a factor of {a:.4g}, the input itself added in '{more}' only (a residual or skip connection)"
        elif abs((1.0 - a) - root) <= 1e-3 * root:
            which = (
                f": {1 - a:.4g} = sqrt({shape[-1]}), sqrt(d_model) of its last axis, so '{self.base.name}' likely "
                f"scales its input by sqrt(d_model) (an embedding's, before positions are added) and "
                f"'{self.cand.name}' does not"
            )
        elif abs((1.0 + a) - root) <= 1e-3 * root:
            which = (
                f": {1 + a:.4g} = sqrt({shape[-1]}), sqrt(d_model) of its last axis, so '{self.cand.name}' likely "
                f"scales its input by sqrt(d_model) (an embedding's, before positions are added) and "
                f"'{self.base.name}' does not"
            )
        return (
            f"its candidate minus its baseline is {a:.4g} times {name}, the output recorded just before it, at every "
            f"element (within this tensor's tolerance): the two runs scale that input by factors {abs(a):.4g} apart "
            f"and the rest of the layer alike (what it adds, such as positions, cancels){which}; or a scale or "
            "multiplier of that input set otherwise on one side"
        )

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

    def _drawn_from_no_random_op(self, first: Pair) -> bool:
        """Whether both runs were recorded in a graph (TF1, ``tf.function``, ``fit``: the shims record the
        random ops a forward tensor is computed from there, not eagerly) and ``first`` is computed from
        none in either."""
        graphs = all(r.info.get("mode") in ("graph", "function") for r in (self.base, self.cand))
        return graphs and not first.base.random and not first.cand.random

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
            other_run = self.cand if name == self.base.name else self.base
            other = other_run.name
            if other_run.info.get("mode") == "eager":
                # an eager tensor has no graph to walk: a helper's eager port drawing its VAE noise with
                # tf.random.normal was told it draws none here, or that the layer computes another function
                return (
                    f"in '{name}' it is computed from a random op that no recorded output feeds ({listed}), and "
                    f"'{other}' was recorded eagerly, where the shim sees no random op, so it may draw here too: "
                    "unless both draw the same numbers (the same noise fed to both) the draws differ, and so does "
                    "this output in a faithful port; make them equal to tell a bug here from the draws. When they are "
                    "equal, or the op draws nothing that counts (a dropout whose training flag is False or whose "
                    "keep_prob is fed 1.0), this layer computes another function of its input (activation, padding, "
                    "epsilon), or reads an input not recorded"
                )
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
        # the tool seeds stateful ops only: a stateless op (tf.random.stateless_*, Keras 3's keras.random with its
        # SeedGenerator) takes its seed as an input, and a helper's Keras 3 VAE port sent to the tool drew other noise
        seeded = [name for name, types in ops.items() if any(t.startswith("Stateless") for t in types)]
        if seeded:
            how = (
                "the same noise fed to both: DeterministicRandomTestTool seeds stateful ops only, and "
                + " and ".join(f"'{name}'" for name in seeded)
                + " draws with a stateless op, seeded explicitly (tf.random.stateless_*, Keras 3's keras.random "
                "with its SeedGenerator), which no such tool reaches"
            )
        else:
            how = (
                "the same noise fed to both, or both run under DeterministicRandomTestTool in its default "
                "'constant' mode: README Porting a real model, step 1"
            )
        return (
            f"both runs compute it from a random op that no recorded output feeds ({listed}): unless both draw "
            f"the same numbers ({how}) the draws differ, and so does this "
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
                "not explain it; what the layer reads there can (another input at those positions: ids shifted by "
                "one, as a vocabulary that reserves index 0 or 1 for padding or out-of-vocabulary gives, or taken "
                "from another vocabulary), or, after an attention, a mask over the real positions (its causal mask "
                "shifted by one, a token attending to itself in one run only; an attention mask of the other "
                "convention, True = padding in one run where Keras's attention_mask means True = attend)"
            )
        masking = _MASKING
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

    def _padding_masked_in_one_run(self, first: Pair, k: int) -> Optional[str]:
        """:meth:`_positions_note` alone, for an output diverging first while a weight before it is
        compared by statistics only (which proves nothing of it, so no other input note is given),
        when what it says is read off this output alone: its elements out of tolerance lie at each
        sample's start or end, every element at the others agreeing, and all of them are exactly 0
        in one run, which recorded those positions as padding. A new user's port of a 100000-row
        embedding whose Embedding lost mask_zero=True (its pooling averaged the padding) got no note
        and was sent to record the table with full values; with a small table the same port was told
        it may read its padding. None otherwise (positions apart that both runs hold nonzero may come
        from a weight that statistics cannot show apart)."""
        out = self._elements_out(first, k)
        both = first.step_values(k)
        if out is None or not len(out) or both is None or not any((v[out] == 0).all() for v in both):
            return None
        positions = self._positions_note(first, k)
        return positions.removeprefix("; ") if _MASKING in positions else None

    def _normalized_shares(self, first: Pair, k: int) -> Optional[str]:
        """For a batch normalization's output at step ``k``: when, per channel, each run's output is
        an affine function of the output recorded just before it (its input, the same shape) within
        each of some equal contiguous shares of the batch, the coarsest such count differing between
        the runs: each normalized its own shares of the rows. A TF1 multi-tower original normalizes
        each tower's half of the batch; its port's ``BatchNormalization(synchronized=True)`` under
        ``MirroredStrategy`` the whole batch: a trial's port was told of an activation, padding,
        epsilon or a training flag, though its replica count (1 against 2) alone says nothing of the
        original's towers. None otherwise."""
        if (
            first.ib[k] < 0
            or first.ic[k] < 0
            or not any(_BATCH_NORM.search(n) for n in (first.base.name, first.cand.name))
        ):
            return None
        out = first.step_values(k)
        shape = first.known_shape("base", int(first.ib[k]))
        if out is None or shape is None or len(shape) < 2 or math.prod(shape) != len(out[0]):
            return None
        inputs = [
            p
            for p in self._pairs
            if p.base.kind in _OUTPUTS
            and p.base.order < first.base.order
            and p.ib[k] >= 0
            and p.ic[k] >= 0
            and p.known_shape("base", int(p.ib[k])) == shape
            and p.step_values(k) is not None
        ]
        if not inputs:
            return None
        source = max(inputs, key=lambda p: p.base.order)
        values = source.step_values(k)
        assert values is not None  # filtered above
        found = [_normalized_over(x, y, shape) for x, y in zip(values, out)]
        counts = [c for c in found if c is not None]
        if len(counts) != 2 or counts[0] == counts[1]:
            return None
        # a share normalized by its own statistics averages to beta at every channel, whatever its count, and
        # beta agrees here: a layer in inference mode is affine over the whole batch too but averages elsewhere
        # (a port of a two-tower original, its loop calling the model without training=True, was told it
        # normalizes the whole batch at once, and not that its moving statistics stayed put)
        centres = np.concatenate([_share_means(y, shape, c) for y, c in zip(out, counts)])
        scale = max(float(np.abs(np.asarray(y, np.float64)).max(initial=0.0)) for y in out)
        if np.abs(centres - centres[0]).max() > 1e-4 * scale:
            return None
        rows = shape[0]
        said = [
            f"'{run}' normalizes "
            + (
                f"the whole batch of {rows} rows at once"
                if count == 1
                else f"each of {count} shares of {rows // count} rows alone"
            )
            for run, count in zip((self.base.name, self.cand.name), counts)
        ]
        return (
            f"{said[0]} and {said[1]} (per channel its output is an affine function of {source.base.name} within each "
            "such share, not across them): the runs take the batch statistics over other rows. TF1 multi-tower code "
            "normalizes each tower's share of the batch; a batch normalization under a strategy each replica's share "
            "unless it is synchronized (Keras SyncBatchNormalization, or BatchNormalization(synchronized=True), "
            "normalizes the global batch)"
        )

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

    def _own_state_read_in_the_step(self, first: Pair, k: int, earlier: bool) -> Optional[str]:
        """For an output diverging at step ``k`` whose own layer holds recorded state (a running mean and
        variance a normaliser of inputs or targets keeps, not batch normalization's, whose output in
        training reads the batch's) that agrees as read at ``k``'s start: how it stands at the next step.
        Parted there, the two runs update it otherwise within the step, and this output reads it after
        that update; agreeing there too, its update agrees and one run reads it before the update, the
        other after. A trial's hand-ported running-mean layer diverged at step 0 and was sent to the
        data, an activation and epsilon, with its own statistics unnamed. Parted with no output recorded
        before it (``earlier`` False), its input is unproven, and another input moves the statistics it
        averages apart too: a port fed other batches (fit's default shuffle=True) was told only of the
        state's momentum. None otherwise."""
        if k + 1 >= len(self.steps) or int(self.steps[k + 1]) != int(self.steps[k]) + 1:
            return None
        layers = {first.base.name.rpartition("/")[2], first.cand.name.rpartition("/")[2]}
        states = [
            p
            for p in self._pairs
            if p.base.kind == "state"
            and not _MOVING_STATS.search(f"{p.base.name} {p.cand.name}")
            and align.variable_of("state", p.base.name) is None  # a weight's moving average feeds no output
            and {_layer_of(p.base.name), _layer_of(p.cand.name)} & layers
        ]
        if not states or not all(p.by_values_at(k) and p.by_values_at(k + 1) for p in states):
            return None
        for p in states:
            p.ensure(k + 2, self.policy.equal_nan)
        if any(p.reason[k] != OK for p in states):
            return None
        # state no run moves in the step (an adapted Normalization's mean) is no running statistic
        moved = [p for p in states if _moved_in_step(p.step_values(k), p.step_values(k + 1))]
        if not moved:
            return None
        names = ", ".join(p.base.name for p in states)
        parted = [p.base.name for p in states if p.reason[k + 1] != OK]
        s_k, s_n = int(self.steps[k]), int(self.steps[k + 1])
        if parted:
            updated = (
                "the two runs update the layer's state otherwise within the step (its momentum, or the statistic it "
                "averages: a biased or an unbiased variance), and this output reads the state after that update"
            )
            if not earlier:
                updated = (
                    "its input differs, which the state averages too (another batch: Keras fit shuffles unless "
                    "shuffle=False; a tf.data shuffle or batching on one side; or the input preprocessed otherwise), "
                    f"or {updated}; no output is recorded before it: recording the input too, as kind input "
                    "(rec.tensor('input', name, x)), tells the two apart"
                )
            return (
                f"its layer's state ({names}) agrees as read at this step's start, and at step {s_n} "
                f"{', '.join(parted)} {'parts' if len(parted) == 1 else 'part'}: {updated}"
            )
        return (
            f"its layer's state ({names}) agrees as read at step {s_k}'s start and at step {s_n}'s, so the two "
            "runs update it alike: one run computes this output from the state before the step's update and the "
            "other from the state after it (the read ordered before the assign in one run only), or the layer "
            "computes another function of its input"
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


#: A recurrent cell's tensors by name (TF1 ``lstm_cell``, ``LSTMBlockCell``, Keras ``lstm``; ``gru_cell``, ``gru``).
_LSTM = re.compile(r"lstm", re.IGNORECASE)


_GRU = re.compile(r"gru", re.IGNORECASE)


#: A TF1 ``LSTMCell(use_peepholes=True)``'s peephole weights.
_PEEPHOLE = re.compile(r"(^|/)w_[ifo]_diag(:\d+)?$")


#: The most towers or replicas :func:`_normalized_over` tries (a pass over the batch each).
_MOST_SHARES = 16


def _normalized_over(inputs: np.ndarray, outputs: np.ndarray, shape: tuple[int, ...]) -> Optional[int]:
    """The fewest equal contiguous shares of the batch (``shape[0]`` rows, channels last) within each
    of which every channel of ``outputs`` is an affine function of ``inputs`` (to 1e-4 of the
    outputs' scale), shares of at least 3 rows (any 2 points fit a line); None when none."""
    rows, width = shape[0], shape[-1]
    x = np.asarray(inputs, np.float64).reshape(rows, -1, width)
    y = np.asarray(outputs, np.float64).reshape(rows, -1, width)
    scale = float(np.abs(y).max(initial=0.0))
    if not (np.isfinite(x).all() and np.isfinite(y).all() and scale > 0):
        return None
    for count in range(1, min(rows // 3, _MOST_SHARES) + 1):  # a pass over the batch per count: bounded
        if rows % count:
            continue
        size = rows // count
        fits = True
        for at in range(count):
            xs = x[at * size : (at + 1) * size].reshape(-1, width)
            ys = y[at * size : (at + 1) * size].reshape(-1, width)
            xc, yc = xs - xs.mean(0), ys - ys.mean(0)
            norm = (xc * xc).sum(0)
            slope = np.divide((xc * yc).sum(0), norm, out=np.zeros(width), where=norm > 0)
            if np.abs(yc - slope * xc).max() > 1e-4 * scale:
                fits = False
                break
        if fits:
            return count
    return None


def _share_means(outputs: np.ndarray, shape: tuple[int, ...], count: int) -> np.ndarray:
    """Each of ``count`` equal contiguous shares' per-channel mean of ``outputs`` (``shape[0]`` rows, channels
    last): ``[count, channels]``."""
    y = np.asarray(outputs, np.float64).reshape(count, -1, shape[-1])
    means: np.ndarray = y.mean(axis=1)
    return means


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


def _moved_in_step(
    now: Optional[tuple[np.ndarray, np.ndarray]], after: Optional[tuple[np.ndarray, np.ndarray]]
) -> bool:
    """Whether either run's values of a state differ between two reads (both read; NaN equal to NaN)."""
    if now is None or after is None:
        return False
    return any(not np.array_equal(a, b, equal_nan=True) for a, b in zip(now, after))
