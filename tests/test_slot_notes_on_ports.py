"""A slot that diverges first says what reaches it, on ports written the way users write them.

A new user's transformer port trained with a warm-up from lr 0, so an optimizer slot, not a weight,
was the first tensor to differ: Keras ``Adam(clipnorm=...)`` in place of TF1's ``clip_by_global_norm``
(the first moment 1.0348x TF1's: TF1's global norm) and ``beta_2=0.98`` (the second moment 20x)
both diverged on a slot at step 1 with no note. Adam's first update is ``lr * g / |g|`` whatever the
gradient's scale, so the weights agree there and the slots are the evidence. Another's Keras SGD
port of ``MomentumOptimizer`` under a staircase schedule got the "rules part at an lr change" note
on six slots but not on the first, whose small elements carried float32 rounding of its scale.

Expectations come from numpy: the gradients of a mean squared error written out, clipped as each
framework documents.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from engine_helpers import run, series
from tf1_recipes import dense_regression

from tb_parity_plugin import compare, summary_v2
from tb_parity_plugin.engine import Comparison

RNG = np.random.default_rng(5)
STEPS, CLIP = 3, 3.5
X = RNG.normal(size=(STEPS, 8, 4)).astype(np.float32)
Y = (RNG.normal(size=(STEPS, 8, 1)) + 1.5).astype(np.float32)  # a bias gradient as large as the kernel's
K = (RNG.normal(size=(4, 1)) * 0.5).astype(np.float32)


def _tf1(run_dir: str, beta2: float = 0.999) -> None:
    """TF1 Adam on a dense regression, gradients clipped by their global norm."""
    dense_regression(
        run_dir,
        K,
        X,
        Y,
        lambda gs, rec: tf.compat.v1.train.AdamOptimizer(rec.lr(tf.constant(0.01)), beta2=beta2, epsilon=1e-8),
        lambda opt, variables: {},
        clip=CLIP,
    )


def _port(run_dir: str, **adam: Any) -> None:
    """The Keras port under ``fit``, instrumented: ``Adam(**adam)``."""
    model = tf.keras.Sequential(
        [tf.keras.Input((4,)), tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(K), name="dense")]
    )
    model.compile(tf.keras.optimizers.Adam(0.01, epsilon=1e-8, **adam), "mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    model.fit(X.reshape(-1, 4), Y.reshape(-1, 1), batch_size=8, shuffle=False, verbose=0)
    rec.close()


def _step0_grads() -> dict[str, np.ndarray]:
    """numpy: the mean squared error's gradients at step 0 (bias 0)."""
    x, y = X[0].astype(np.float64), Y[0].astype(np.float64)
    residual = 2.0 * (x @ K.astype(np.float64) - y) / len(x)
    return {"kernel": x.T @ residual, "bias": residual.sum(0)}


def _slot_divergence(report: Any, role: str, variable: str) -> Any:
    found = [
        d
        for d in report.divergences_at_first_step
        if d.kind == "slot" and d.candidate_tensor == f"{role}/dense/{variable}"
    ]
    assert found, [(d.kind, d.tensor, d.candidate_tensor) for d in report.divergences_at_first_step]
    return found[0]


def test_clipnorm_in_place_of_global_clipping_is_named_on_the_first_moment(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "tf2"), clipnorm=CLIP)
    g = _step0_grads()
    total = np.sqrt(sum((v**2).sum() for v in g.values()))
    assert total > CLIP  # TF1 clips every gradient by one factor
    # numpy: m after the first update is 0.1 x the clipped gradient; Keras clips each variable alone
    want = min(1.0, CLIP / np.linalg.norm(g["kernel"])) / (CLIP / total)
    assert want > 1.2  # the kernel alone is under the clip norm, all of them together over it
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (1, "slot"), first
    m = _slot_divergence(report, "m", "kernel")
    assert f"every element is the baseline's times {want:.4g}" in m.note, (want, m.note)
    assert "agreed element-wise at every earlier step" in m.note and "clipnorm clips each variable" in m.note


def test_another_beta2_is_named_on_the_second_moment(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "tf2"), beta_2=0.98, global_clipnorm=CLIP)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (1, "slot"), first
    v = _slot_divergence(report, "v", "kernel")
    # numpy: v after the first update is (1 - beta_2) g^2: (1 - 0.98) / (1 - 0.999) = 20
    assert "every element is the baseline's times 20:" in v.note, v.note
    assert "the candidate's is 0.98" in v.note


def test_a_faithful_port_has_no_slot_note_to_give(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "tf2"), global_clipnorm=CLIP)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence


def test_the_lr_change_note_allows_rounding_at_the_slots_scale() -> None:
    """The new user's conv kernel slot: 2x TF1's within 2.3e-9 at a scale of 6e-3, 2e-4 of its
    smallest elements (5e-6). A factor 0.1% off is still not called the lr's."""
    lrs = [np.float32(0.05), np.float32(0.05), np.float32(0.025)]
    rng = np.random.default_rng(0)
    slot = [np.zeros(64, np.float32)] + [
        (rng.choice([6e-3, 5e-6], 64) * rng.choice([-1, 1], 64)).astype(np.float32)
    ] * 2
    noise = (rng.choice([-1, 1], 64) * 2.3e-9).astype(np.float32)
    for factor, noted in ((2.0, True), (2.0 * 1.001, False)):
        moved = [slot[0], slot[1], (slot[2].astype(np.float64) * factor + noise).astype(np.float32)]
        base = run("tf1", [series("lr", "lr", lrs), series("slot", "conv2d/kernel/Momentum:0", slot, order=1)])
        cand = run("tf2", [series("lr", "lr", lrs), series("slot", "m/conv2d/kernel", moved, order=1)])
        found = Comparison(base, cand).report().first_divergence
        assert found is not None and (found.step, found.kind) == (2, "slot"), found
        assert ("times lr/lr at step 1 / at step 2 = 2:" in (found.note or "")) == noted, found.note


def test_the_lr_change_note_allows_rounding_at_the_slots_largest_value_so_far() -> None:
    """A new user's bias slot after ten momentum steps, at the halving of a staircase lr: 2x TF1's,
    but its elements that cancelled to 0.006 carried 3.1e-6 of rounding from the terms they summed
    (the slot reached 0.53 two steps before), 5e-4 of themselves: it alone got the clipping note."""
    lrs = [np.float32(0.1), np.float32(0.1), np.float32(0.05)]
    slot = [
        np.zeros(3, np.float32),
        np.array([0.53, -0.2, 0.1], np.float32),
        np.array([0.178, 0.0063, -0.05], np.float32),
    ]
    for factor, noted in ((2.0, True), (2.0 * 1.001, False)):
        moved = [slot[0], slot[1], (slot[2].astype(np.float64) * factor + [0, 3.1e-6, 0]).astype(np.float32)]
        base = run("tf1", [series("lr", "lr", lrs), series("slot", "conv2d_1/bias/Momentum:0", slot, order=1)])
        cand = run("tf2", [series("lr", "lr", lrs), series("slot", "m/conv2d_1/bias", moved, order=1)])
        found = Comparison(base, cand).report().first_divergence
        assert found is not None and (found.step, found.kind) == (2, "slot"), found
        assert ("times lr/lr at step 1 / at step 2 = 2:" in (found.note or "")) == noted, found.note


def test_the_lr_change_note_does_not_allow_rounding_of_an_old_peak() -> None:
    """A slot that spiked to 100 at step 1 and decayed with momentum 0.9 to 3e-3 by the lr's halving
    at step 100: a candidate 1.5x the baseline's, or zeroed, is no lr ratio of it. Rounding at the
    all-time peak (3e-3 at 2^-15 x 100) told both 'times the lr ratio = 2'; only 2x is that rule."""
    k = 100
    lrs = [np.float32(0.1)] * k + [np.float32(0.05)]
    rng = np.random.default_rng(1)
    slot = [np.zeros(4, np.float32), np.array([100.0, -50.0, 30.0, 10.0], np.float32)]
    for _ in range(2, k + 1):
        slot.append((0.9 * slot[-1] + rng.normal(0, 1e-4, 4)).astype(np.float32))
    for factor, noted in ((2.0, True), (1.5, False), (0.0, False), (-1.0, False)):
        moved = [*slot[:k], (slot[k].astype(np.float64) * factor).astype(np.float32)]
        base = run("tf1", [series("lr", "lr", lrs), series("slot", "dense/kernel/Momentum:0", slot, order=1)])
        cand = run("tf2", [series("lr", "lr", lrs), series("slot", "m/dense/kernel", moved, order=1)])
        found = Comparison(base, cand).report().first_divergence
        assert found is not None and (found.step, found.kind) == (k, "slot"), found
        assert ("times lr/lr at step 99 / at step 100 = 2:" in (found.note or "")) == noted, (factor, found.note)
        assert "the baseline's slot is" not in (found.note or ""), found.note  # TF1's slot is no Keras slot
        # logged at a few steps only, the step-1 spike decays by the training steps between (a review)
        sparse = [0, 1, 50, 99, k]
        base = run(
            "tf1",
            [
                series("lr", "lr", [lrs[j] for j in sparse], sparse),
                series("slot", "dense/kernel/Momentum:0", [slot[j] for j in sparse], sparse, order=1),
            ],
        )
        cand = run(
            "tf2",
            [
                series("lr", "lr", [lrs[j] for j in sparse], sparse),
                series("slot", "m/dense/kernel", [moved[j] for j in sparse], sparse, order=1),
            ],
        )
        found = Comparison(base, cand).report().first_divergence
        assert found is not None and (found.step, found.kind) == (k, "slot"), found
        assert ("times lr/lr at step 99 / at step 100 = 2:" in (found.note or "")) == noted, (factor, found.note)
