"""Notes on a state tensor that diverges first (moving statistics, a moving average)."""

from __future__ import annotations

import itertools
import re
from typing import Optional

import numpy as np

from tb_parity_plugin.engine import align
from tb_parity_plugin.engine.matrix import OK
from tb_parity_plugin.engine.notes.context import (
    _OUTPUTS,
    NoteContext,
    _layer_of,
)
from tb_parity_plugin.engine.pair import Pair, take_rows


class StateNotes(NoteContext):
    """Notes on a state tensor (moving statistics, a moving average) that diverges first."""

    def _state_note(self, first: Pair, k: int, past_noise: bool = True) -> Optional[str]:
        """What a state tensor (moving statistics, a moving average) diverging first at step ``k``
        means, from its own values at the last step it agreed: one run did not update it, its
        first update differs (the rule), or, after updates that agreed, one run updated it once
        more in between. A new user's Keras validation pass run with ``training=True`` moved the
        moving statistics, and the divergence said nothing of why. Unless ``past_noise`` (its
        error ratio past what rounding reaches), only the notes exact evidence proves."""
        seen = np.flatnonzero((first.ib[:k] >= 0) & (first.ic[:k] >= 0))
        if not len(seen):
            return self._average_start(first, k)
        j = int(seen[-1])
        now, before = first.step_values(k), first.step_values(j)
        if now is None or before is None:
            # too large for full values (a batch norm over 5000 features): a run whose statistics
            # (min, max, mean, std, norm and counts) are the very same at both steps did not update
            # it; a helper's forgotten UPDATE_OPS there got no note
            rows = ((first.base, first.ib), (first.cand, first.ic))
            held = [take_rows(series.stats, np.array([at[j], at[k]])) for series, at in rows]
            still, by_statistics = [bool(np.array_equal(h[0], h[1], equal_nan=True)) for h in held], True
        elif len(before[0]) != len(now[0]):
            return None
        else:
            still, by_statistics = [bool(np.array_equal(a, b, equal_nan=True)) for a, b in zip(before, now)], False
        s_j, s_k = int(self.steps[j]), int(self.steps[k])
        bn = _MOVING_STATS.search(f"{first.base.name} {first.cand.name}") is not None
        average = any(align.variable_of("state", n) is not None for n in (first.base.name, first.cand.name))
        rule_seen = self._average_update(first, j, k) if average and not bn and past_noise else None
        if rule_seen is not None:
            return rule_seen
        if still[0] != still[1]:
            who = (self.base.name, self.cand.name)[still.index(True)]
            held_text = (
                f"its statistics are its step-{s_j} ones" if by_statistics else f"it still holds its step-{s_j} value"
            )
            return (
                f"'{who}' did not update it between steps {s_j} and {s_k} ({held_text}) "
                "and the other did: an update left out of one training step ("
                + (
                    "TF1: the train op not run with tf.compat.v1.get_collection(UPDATE_OPS); Keras: the layer "
                    "called with training=False"
                    if bn
                    else "TF1: the op that updates it not run with the train op; Keras: the layer or callback "
                    "that updates it not called"
                )
                + ")"
            )
        # what it holds at step k was averaged from the weights read before k: at step j, and at any
        # step not logged between j and k (a weight apart at k may have parted there). One apart first
        # at k fed it nothing: a new user's Keras 3 momentum 0.9 moved the moving mean at step 1, where
        # the conv bias (loosened, rounding noise under Adam) first parted, and was told to loosen it
        fed = [j] + ([k] if s_k - s_j > 1 else [])
        loosened = [(*t, at) for at in fed for t in self._apart_under_override(self._weights_before(first, at), at)]
        if loosened:  # a helper's moving mean, fed by a bias loosened as its note said, was told "momentum"
            tag, gap, at = loosened[0]
            when = "this step" if at == k else f"step {int(self.steps[at])}"
            return (
                f"{tag} agrees here only under your override ({gap:.3g} apart at {when}): that difference "
                + ("may reach the batch means it averages" if bn else "may reach what it averages")
                + f"; loosen it as well (--override '{first.base.kind}/{first.base.name}:atol=...'), or drop the "
                "variable on both sides (README: What counts as a divergence)"
            )
        # nothing loosened feeds it: judge rounding by the default tolerance, not by its own override
        past_noise = past_noise or self._past_noise_without_overrides(first, k)
        if bn and (past_noise or _one_signed(now)) and self._moving_mean_agrees(first, k):
            return (
                "its moving mean agrees at this step (the same momentum, the same batch means): the batch variance "
                "it averages differs: TF1's fused batch norm (tf.compat.v1.layers.batch_normalization's default on "
                "4-D inputs) averages the unbiased variance (x n / (n - 1) of the n values per channel); Keras 3's "
                "BatchNormalization (every one: tf.keras in TF 2.16+ without TF_USE_LEGACY_KERAS) and tf_keras's "
                "BatchNormalization(synchronized=True) or SyncBatchNormalization average the biased one (TF1: "
                "fused=False averages the biased one too); or the two layers normalize over other axes"
            )
        if not past_noise:
            return None
        rule = (
            " (batch normalization's momentum: Keras and tf.compat.v1.layers default 0.99)"
            if bn
            else " (an average's decay: TF1 ExponentialMovingAverage with num_updates caps it at "
            "(1 + step) / (10 + step); Keras use_ema's ema_momentum)"
            if average
            else " (an accumulator or counter reset, scaled or written otherwise)"
        )
        twice = _updated_twice(before, now) if bn and not by_statistics else None
        if twice is not None:
            # what a second forward pass in training mode per step leaves (a new user's
            # track_tf1_style_variables port computed its accuracy from one): told "momentum" before
            ran_twice, m = twice
            who, other = (self.cand.name, self.base.name) if ran_twice == "cand" else (self.base.name, self.cand.name)
            return (
                f"it agreed at step {s_j}; to step {s_k} '{who}' moved it {1 + m:.4g} times as far as '{other}' at "
                f"every element: two updates of momentum {m:.4g} where '{other}' made one (1 - {m:.4g}² = "
                f"{1 + m:.4g} × (1 - {m:.4g})): the layer ran twice in training mode in one training step in "
                f"'{who}' (a second forward pass with training=True, for a metric or another loss; TF1: UPDATE_OPS "
                f"run again beside the train op), or one update of a momentum whose 1 - momentum is {1 + m:.4g} "
                f"times the other's ({m * m:.4g} against {m:.4g})"
            )
        factor = _moved_by_one_factor(before, now) if bn and not by_statistics else None
        if factor is not None:
            # a helper's keras.applications MobileNetV2 port (momentum 0.999) of TF1's 0.997 was told of
            # the default 0.99, which neither run had: the first update's ratio gives the ratio of 1 - momentum
            fits = [
                f"{mb:g} against {mc:g}"
                for mb, mc in _COMMON_MOMENTA_PAIRS
                if abs((1 - mc) / (1 - mb) / factor - 1) < 1e-3
            ]
            rule = (
                f" (batch normalization's momentum: from the same values '{self.cand.name}' moved it {factor:.4g} times "
                f"as far as '{self.base.name}' at every element, so its 1 - momentum is {factor:.4g} times the other's"
                + (f": {' or '.join(fits)}" if fits else "")
                + "; Keras and tf.compat.v1.layers default 0.99, keras.applications' models 0.999)"
            )
        shares = self._batch_shares(first, j, k) if bn and not by_statistics and s_k == s_j + 1 else None
        if shares is not None:
            return shares
        if len(seen) == 1:
            return (
                f"it agreed at step {s_j}{' (by statistics)' if by_statistics else ''}, the only step compared before: "
                f"its update rule differs{rule}, or the two runs "
                "updated it from inputs no recorded tensor shows"
            )
        if before is None:  # how far apart it already was needs its values
            return None
        b_j, c_j = (np.asarray(x, np.float64) for x in before)
        with np.errstate(invalid="ignore"):
            gap = float(np.nanmax(np.abs(c_j - b_j), initial=0.0))
            scale = float(np.nanmax(np.abs(b_j), initial=0.0))
        # apart already, within tolerance, past rounding and past 1% of atol: its rule, grown past
        # tolerance (a review's momentum 0.999 against 0.99, 6e-6 apart at step 1, was told "its
        # updates agreed ... once more, by an evaluation pass"); a faithful port's 6e-8 of float32
        # noise before an extra update is no such sign (the next review's)
        if not gap <= max(2.0**-20 * scale, 0.01 * first.atol_at(j)):
            return (
                f"it was within tolerance at the {len(seen)} steps compared before but already apart ({gap:.3g} at "
                f"step {s_j}): its update rule differs{rule} and the difference grew past tolerance, or the two runs "
                "updated it from inputs no recorded tensor shows"
            )
        return (
            f"it agreed element-wise at the {len(seen)} steps compared before (last at step {s_j}, to float32 "
            f"rounding), so its updates agreed until then: between steps {s_j} and {s_k} one run updated it otherwise: "
            + (
                "once more, by an evaluation or validation pass in training mode (Keras: the model or layer "
                "called with training=True; TF1: a sess.run of UPDATE_OPS beside the evaluation)"
                if bn
                else "once more, outside the training step"
            )
            + ", or from an input no recorded tensor shows"
        )

    def _weight_averaged(self, average: Pair) -> Optional[Pair]:
        """The weights' pair whose variable ``average`` (a moving average of a weight) is named after, on
        either side (a custom loop's own ``ema/dense/kernel`` pairs with TF1's shadow by order; its
        weight is the one paired with the shadow's); None for any other state, or when that pair is not
        recorded. Each run's values then show whether it is that weight's average at all."""
        names = (align.variable_of("state", average.base.name), align.variable_of("state", average.cand.name))
        if names[0] is None and names[1] is None:
            return None
        return next(
            (
                p
                for p in self._pairs
                if p.base.kind == "weight"
                and (names[0] is None or align.variable_of("weight", p.base.name) == (names[0][0], ""))
                and (names[1] is None or align.variable_of("weight", p.cand.name) == (names[1][0], ""))
            ),
            None,
        )

    def _average_start(self, average: Pair, k: int) -> Optional[str]:
        """For a moving average of a weight diverging at the first step compared, ``k``: one run holds 0
        at every element and the other the weight itself, element for element. A trial's Keras 3
        ``use_ema`` port (its averages built as zeros, the first update taking the weight whole) of
        TF1's ``ExponentialMovingAverage`` (started at the weight) diverged at step 0 with no note."""
        weight = self._weight_averaged(average)
        values, weights = average.step_values(k), None if weight is None else weight.step_values(k)
        if values is None or weights is None or len(values[0]) != len(weights[0]):
            return None
        zero = [not np.any(a) for a in values]
        own = [bool(np.array_equal(a, w)) and bool(np.any(w)) for a, w in zip(values, weights)]
        if not ((zero[0] and own[1]) or (zero[1] and own[0])):
            return None
        runs = (self.base.name, self.cand.name)
        zeros, started = (runs[0], runs[1]) if zero[0] else (runs[1], runs[0])
        return (
            f"'{zeros}' holds 0 at every element and '{started}' the weight's own value: the two start the average "
            f"otherwise (Keras 3's use_ema builds its averages as zeros and takes the weight whole at its first "
            "update, its ema_momentum 0 at iteration 0; TF1's ExponentialMovingAverage and tf_keras's use_ema start "
            "it at the weight and average from the first update on)"
        )

    def _average_update(self, average: Pair, j: int, k: int) -> Optional[str]:
        """For a moving average of a weight (an EMA shadow, ``use_ema``'s ``average``) that agreed at
        step ``j`` and parts at the next step ``k``: each run's update, read off its own average and
        weight, ``a_k = d a_j + (1 - d) w``. Averaged from the weight read at ``k`` (the updated one),
        the two decays ``d`` (one of them ExponentialMovingAverage's num_updates cap, ``(1 + n) / (10 +
        n)``); from the weight read at ``j`` (before that step's update) in one run, that run updates
        its average before the optimizer. A trial's port that did so was told of the decays, which
        were the same, and of "inputs no recorded tensor shows", which were the recorded weights.
        None when either run fits neither, or both the same way with one decay."""
        s_j, s_k = int(self.steps[j]), int(self.steps[k])
        weight = self._weight_averaged(average)
        if s_k != s_j + 1 or weight is None:
            return None
        nxt = k + 1 if k + 1 < len(self.steps) and int(self.steps[k + 1]) == s_k + 1 else None
        b_found, c_found = (_ema_update(average, weight, side, j, k, nxt) for side in (0, 1))
        if b_found is None or c_found is None:
            return None
        (how_b, d_b), (how_c, d_c) = b_found, c_found
        runs = (self.base.name, self.cand.name)
        if how_b != how_c:
            who, other = (runs[0], runs[1]) if how_b == "before" else (runs[1], runs[0])
            return (
                f"'{who}' averaged the weight read at step {s_j}, before that step's update, and '{other}' the updated "
                f"weight read at step {s_k}: '{who}' updates its moving average before the optimizer's update (TF1: "
                "ema.apply under tf.control_dependencies([train_op]); a custom loop: after optimizer.apply_gradients)"
            )
        if how_b != "after" or d_b is None or d_c is None or abs(d_b - d_c) <= 1e-3:
            return None
        # the n whose cap (1 + n) / (10 + n) each decay is, within half the gap to the next n's
        capped = {
            run: n
            for run, d in zip(runs, (d_b, d_c))
            for n in (s_j, s_k)
            if abs(d - (1 + n) / (10 + n)) <= min(1e-3, 4.5 / ((10 + n) * (11 + n)))
        }
        said = " and ".join(
            f"in '{run}' {d:.4g} is (1 + {capped[run]}) / (10 + {capped[run]})"
            for run, d in zip(runs, (d_b, d_c))
            if run in capped
        )
        cap = (
            "the cap ExponentialMovingAverage(decay, num_updates=n) puts on its decay while under it (TF1's "
            f"num_updates=global_step, read after the update, is step {s_k} here)"
        )
        if len(capped) == 2:
            why = (
                f"; {said}: both cap it so, from step counts one apart ({cap}; a count read before the "
                "optimizer's update, such as optimizer.iterations before apply_gradients, is one short)"
            )
        elif capped:
            why = (
                f"; {said}, {cap}: the other run has no such warm-up (Keras use_ema's ema_momentum has none: "
                "pass the step as num_updates, or cap the decay so by hand)"
            )
        else:
            why = " (ExponentialMovingAverage's decay; Keras use_ema's ema_momentum)"
        return (
            f"each run averaged the updated weight it read at step {s_k}, keeping {d_b:.4g} ('{runs[0]}') and "
            f"{d_c:.4g} ('{runs[1]}') of its step-{s_j} value: their decays differ" + why
        )

    def _batch_shares(self, mean: Pair, j: int, k: int) -> Optional[str]:
        """For a batch normalization's moving mean that agreed at step ``j`` and parts at ``k`` (the
        next step): which rows of its layer's input, as recorded at ``j``, each run averaged it from,
        when both fit one momentum and one share of the rows (or one update per share) and they differ. A TF1 multi-tower
        original (``cifar10_multi_gpu_train``'s pattern) that runs only the first tower's
        ``UPDATE_OPS`` updates it from that tower's share of the batch, and its ``MirroredStrategy``
        port's moving mean (the replicas' copies, read as their mean) from the whole batch: a trial's
        port, which trained as the original did at every step, was told of batch normalization's
        momentum, the same 0.99 in both runs, or of "inputs no recorded tensor shows" though its
        input was recorded. None otherwise."""
        if "moving_mean" not in f"{mean.base.name} {mean.cand.name}":
            return None
        before, now = mean.step_values(j), mean.step_values(k)
        if before is None or now is None or len(before[0]) != len(now[0]):
            return None
        width = len(before[0])
        own = {
            p.base.order for p in self._pairs if p.base.kind in _OUTPUTS and p.base.name == _layer_of(mean.base.name)
        }
        fits = []
        for p in self._pairs:  # the layer's input: an output recorded before the layer's own, of its width
            if p.base.kind not in _OUTPUTS or (own and p.base.order >= min(own)):
                continue
            values = p.step_values(j)
            shape = p.known_shape("base", int(p.ib[j])) if values is not None else None
            if values is None or not shape or shape[-1] != width or len(shape) < 2:
                continue
            fb = _share_of(values[0], shape[0], width, before[0], now[0])
            fc = _share_of(values[1], shape[0], width, before[1], now[1])
            if fb is not None and fc is not None and fb[1:] != fc[1:]:
                fits.append((p.base.name, shape[0], (fb, fc)))
        if len(fits) != 1:
            return None
        name, rows, found = fits[0]
        said = []
        for run, (m, count, at) in zip((self.base.name, self.cand.name), found):
            if at < 0:
                said.append(f"'{run}' (momentum {m:g}) {count} times, once from the mean of each {rows // count} rows")
                continue
            where = (
                f"all {rows} rows"
                if count == 1
                else f"rows {at * rows // count}-{(at + 1) * rows // count - 1} alone (share {at + 1} of {count})"
            )
            said.append(f"'{run}' (momentum {m:g}) from the mean of {where}")
        # a slim-style two-tower original (0.997) against a keras.applications port (0.999) fits other shares and
        # other momenta: it was told "not by another rule"
        (mb, *_), (mc, *_) = found
        rule = (
            "not by another rule"
            if mb == mc
            else f"and with other momenta ({mb:g} against {mc:g}: Keras and tf.compat.v1.layers default 0.99, "
            "slim's MobileNet 0.997, keras.applications' models 0.999)"
        )
        return (
            f"it agreed at step {int(self.steps[j])}; to step {int(self.steps[k])} {said[0]} of {name} as recorded "
            f"at step {int(self.steps[j])}, and {said[1]} of it: the runs update it from other rows of the batch, "
            f"{rule}. TF1 multi-tower code that runs only the first tower's UPDATE_OPS (the "
            "cifar10_multi_gpu_train pattern) updates it from that tower's share of the batch, and code that runs "
            "every tower's UPDATE_OPS once per tower, in no set order (one after the other either way, or each from "
            "the same read: such an original is itself not deterministic); a strategy's per-replica moving "
            "statistics, read as their mean, from the whole batch (README: Distributed training)"
        )

    def _weights_before(self, state: Pair, k: int) -> list[Pair]:
        """The weights compared at step ``k`` that may feed ``state``: all but those of layers whose
        output is recorded after the output of ``state``'s own layer; when that is not recorded, the
        weights recorded before it (variables are recorded in creation order)."""
        layer = _layer_of(state.base.name)
        outputs = {p.base.name: p.base.order for p in self._pairs if p.base.kind in _OUTPUTS}
        own = outputs.get(layer)
        return [
            p
            for p in self._pairs
            if p.base.kind == "weight"
            and p.ib[k] >= 0
            and p.ic[k] >= 0
            and (
                p.base.order < state.base.order  # no output recorded: the weights created before it
                if own is None
                else outputs.get(_layer_of(p.base.name), -1) <= own
            )
        ]

    def _moving_mean_agrees(self, variance: Pair, k: int) -> bool:
        """Whether ``variance`` is a batch normalization's moving variance whose moving mean (the same
        scope) was compared element-wise at step ``k`` and agrees there. A new user's TF1 fused batch
        norm against Keras's synchronized one (moving variances n/(n-1) apart, means within 1e-8) was
        told "batch normalization's momentum", which the agreeing mean rules out."""
        names = [variance.base.name.replace("moving_variance", "moving_mean")]
        if names[0] == variance.base.name:
            return False
        for p in self._pairs:
            if p.base.kind == "state" and p.base.name in names and p.by_values_at(k):
                p.ensure(k + 1, self.policy.equal_nan)
                return bool(p.reason[k] == OK)
        return False


#: Batch normalization's moving statistics, by name on either side (TF1 and Keras alike).
_MOVING_STATS = re.compile(r"moving_(mean|variance)", re.IGNORECASE)


def _one_signed(values: Optional[tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether the candidate's values are above the baseline's at every element, or below at every
    one: what the n / (n - 1) between a biased and an unbiased batch variance leaves on a moving
    variance. Rounding noise leaves both signs: a review's faithful run 1.11x past tolerance was
    sent to the batch variance by an agreeing moving mean alone."""
    if values is None or not len(values[0]):
        return False
    d = np.asarray(values[1], np.float64) - np.asarray(values[0], np.float64)
    return bool((d > 0).all() or (d < 0).all())


#: Batch normalization momenta that code sets (Keras and TF1 layers 0.99, slim 0.997 and 0.999, keras.applications
#: 0.999), as (baseline, candidate) pairs: a ratio of 1 - momentum is named by those it fits.
_COMMON_MOMENTA = (0.9, 0.95, 0.97, 0.99, 0.995, 0.997, 0.999, 0.9997)
_COMMON_MOMENTA_PAIRS = tuple((a, b) for a in _COMMON_MOMENTA for b in _COMMON_MOMENTA if a != b)


def _share_of(
    inputs: np.ndarray, examples: int, width: int, at_j: np.ndarray, at_k: np.ndarray
) -> Optional[tuple[float, int, int]]:
    """``(momentum, shares, which)``: the one common momentum and the one share of ``examples``
    split into equal contiguous shares (the whole batch first) whose rows' mean, averaged into
    ``at_j``, gives ``at_k`` at every channel well within what separates the shares; else ``which``
    -1 when one update per share gives it (in any order, or each from ``at_j``); None when none or
    more than one fits. ``inputs`` flat, ``[examples, ..., width]``."""
    x = np.asarray(inputs, np.float64).reshape(examples, -1, width)
    s_j, s_k = np.asarray(at_j, np.float64), np.asarray(at_k, np.float64)
    scale = float(np.abs(x).max(initial=0.0))
    if not (np.isfinite(x).all() and np.isfinite(s_k).all() and scale > 0):
        return None
    # each share's mean, once: [count][at] (read by every momentum below; a pass over the input each)
    counts = [c for c in range(1, min(examples, 8) + 1) if examples % c == 0]
    share_means = {
        c: [x[at * (examples // c) : (at + 1) * (examples // c)].reshape(-1, width).mean(0) for at in range(c)]
        for c in counts
    }
    hits = []
    for m in _COMMON_MOMENTA:
        for count in counts:
            for at, mean in enumerate(share_means[count]):
                if np.allclose(m * s_j + (1 - m) * mean, s_k, rtol=0.0, atol=1e-4 * (1 - m) * scale):
                    hits.append((m, count, at))
    if not hits:
        # one update per share in the step (TF1 towers that each run their UPDATE_OPS, which TF1 leaves
        # unordered): one after the other in some order, or each from the same read of ``at_j``
        for m in _COMMON_MOMENTA:
            for count in (c for c in counts if 2 <= c <= 4):
                means = share_means[count]
                ends = [s_j + (1 - m) * sum(mu - s_j for mu in means)]
                for order in itertools.permutations(means):
                    end = s_j
                    for mu in order:
                        end = m * end + (1 - m) * mu
                    ends.append(end)
                if any(np.allclose(end, s_k, rtol=0.0, atol=1e-4 * (1 - m) * scale) for end in ends):
                    hits.append((m, count, -1))
        # from a first update of 0, n updates of momentum m each from one read match 2n of m' with
        # 1 - m' = (1 - m) / 2: the fewest shares (towers) that fit
        hits = [h for h in hits if h[1] == min(h[1] for h in hits)]
    # the whole batch's mean is also every share's when the shares' means are alike: take the
    # coarsest share that fits, and only if no other momentum fits too
    if not hits or len({h[0] for h in hits}) > 1:
        return None
    coarsest = min(h[1] for h in hits)
    ats = [h for h in hits if h[1] == coarsest]
    return ats[0] if len(ats) == 1 else None


def _ema_update(
    average: Pair, weight: Pair, side: int, j: int, k: int, nxt: Optional[int]
) -> Optional[tuple[str, Optional[float]]]:
    """How one run (``side`` 0: baseline, 1: candidate) moved its moving average from compared step ``j``
    to the next, ``k``: ``("after", d)`` when ``a_k = d a_j + (1 - d) w_k`` (the weight read at ``k``,
    updated), ``("before", d)`` when so with ``w_j`` (read before step ``j``'s update) and not with
    ``w_k``; ``d`` None where the values fix the order but not the decay (an average that starts at the
    weight holds ``w_j`` at ``k`` whatever its decay: then the step after ``k``, ``nxt``, decides).
    None when neither fits to float32 rounding, or both do."""
    read = [average.step_values(t) for t in (j, k)] + [weight.step_values(t) for t in (j, k)]
    vals = [v[side] for v in read if v is not None]
    if len(vals) != 4 or len({len(v) for v in vals}) != 1:
        return None
    a_j, a_k, w_j, w_k = (np.asarray(v, np.float64) for v in vals)
    if not all(np.isfinite(x).all() for x in (a_j, a_k, w_j, w_k)):
        return None
    tol = 2.0**-18 * max(float(np.abs(x).max()) for x in (a_j, a_k, w_j, w_k)) + 1e-30

    def decay(x: np.ndarray) -> Optional[float]:
        u = a_j - x  # a_k - x = d (a_j - x): informative only where the average is away from x
        if float(np.abs(u).max()) <= 64 * tol:
            return None
        d = float((a_k - x) @ u / (u @ u))
        return d if float(np.abs(a_k - x - d * u).max()) <= tol else -1.0

    after, before = decay(w_k), decay(w_j)
    if before is None and float(np.abs(a_k - w_j).max()) <= tol and float(np.abs(w_k - w_j).max()) > 64 * tol:
        # it started at the weight: a_k is w_j whatever the decay, which reads as decay 1 after the update
        if nxt is None:
            return None
        later = _ema_update(average, weight, side, k, nxt, None)
        return ("before", None) if later is not None and later[0] == "before" else None
    fits = [(how, d) for how, d in (("after", after), ("before", before)) if d is not None and 0.0 <= d <= 1.0]
    return fits[0] if len(fits) == 1 else None


def _moved_apart(
    before: Optional[tuple[np.ndarray, np.ndarray]], now: Optional[tuple[np.ndarray, np.ndarray]]
) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """How far each run moved a moving statistic from step values that agreed before (``before``) to
    ``now``, ``(baseline's, candidate's)`` at the elements both moved well past float32 rounding, when
    most did; None otherwise (what :func:`_moved_by_one_factor` and :func:`_updated_twice` read)."""
    if before is None or now is None or len(before[0]) != len(now[0]):
        return None
    b_j, c_j = (np.asarray(x, np.float64) for x in before)
    b_k, c_k = (np.asarray(x, np.float64) for x in now)
    scale = max(float(np.nanmax(np.abs(b_j), initial=0.0)), float(np.nanmax(np.abs(b_k), initial=0.0)))
    if not (np.isfinite(b_k).all() and np.isfinite(c_k).all()) or not np.allclose(
        b_j, c_j, rtol=1e-6, atol=1e-6 * scale
    ):
        return None
    moved_b, moved_c = b_k - b_j, c_k - c_j
    big = (np.abs(moved_b) > 1e-4 * scale) & (np.abs(moved_c) > 1e-4 * scale)
    if big.sum() < max(2, len(b_j) // 2):
        return None
    return moved_b[big], moved_c[big]


def _moved_by_one_factor(
    before: Optional[tuple[np.ndarray, np.ndarray]], now: Optional[tuple[np.ndarray, np.ndarray]]
) -> Optional[float]:
    """How many times as far the candidate moved a moving statistic as the baseline, when that is one
    factor at every element moved well past rounding, from step values that agreed before: another
    momentum moves ``s`` by ``(1 - m')(x - s)`` where the other moves it by ``(1 - m)(x - s)``, so the
    factor is ``(1 - m') / (1 - m)``; None otherwise, or when it is 1."""
    moved = _moved_apart(before, now)
    if moved is None:
        return None
    ratio = moved[1] / moved[0]
    r = float(np.median(ratio))
    if r <= 0 or abs(r - 1.0) < 1e-3 or not np.allclose(ratio, r, rtol=1e-3, atol=0.0):
        return None
    return r


def _updated_twice(
    before: Optional[tuple[np.ndarray, np.ndarray]], now: Optional[tuple[np.ndarray, np.ndarray]]
) -> Optional[tuple[str, float]]:
    """Whether one run's moving statistics took two updates of momentum ``m`` from the same batch
    where the other took one, from step values that agreed before (``before``) and parted now:
    one update moves ``s`` by ``(1 - m)(x - s)``, two by ``(1 - m²)(x - s)``, so that run moved
    every element ``1 + m`` times as far. Returns ``("cand" | "base", m)`` when every element's
    ratio is the one ``1 + m`` with ``0.9 <= m < 1`` (batch normalization's momenta: another
    momentum moves it ``(1 - m') / (1 - m)`` times as far, 10 for 0.9 against 0.99), else None."""
    moved = _moved_apart(before, now)
    if moved is None:
        return None
    moved_b, moved_c = moved
    for who, num, den in (("cand", moved_c, moved_b), ("base", moved_b, moved_c)):
        ratio = num / den
        r = float(np.median(ratio))
        if 1.9 <= r < 1.9999 and np.allclose(ratio, r, rtol=1e-3, atol=0.0):
            return who, r - 1.0
    return None
