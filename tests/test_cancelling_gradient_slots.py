"""A slot of a variable whose gradient cancels, from a new user's trial.

The bias of a dense layer right before batch normalization gets a gradient of exactly zero in
exact arithmetic (normalization removes any shift), so in float32 it is rounding noise near 1e-9
that differs between TF1 and its Keras port. Momentum sums that noise: the slot's values are noise
too, and their difference passed the slot rule's floor (atol 1e-8 plus 1e-4 of the slot's largest
element). A faithful port was reported DIVERGE at step 3 or 4 on ``slot/.../dense/bias/Momentum``
while every weight, gradient and loss agreed. A slot's atol now also allows what its gradient's
differences (each within the gradient's own tolerance) add up to by the step (``Pair.allowance``).

Every expectation is checked with numpy on the logged values: the port agrees element-wise on
every weight, gradient and loss; the bias gradient is noise; the slot's difference is past the old
floor; and a wrong beta2 (which moves Adam's second moment while the gradients still agree) is
still found at step 1 on ``v``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from engine_helpers import run, series
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2
from tb_parity_plugin.engine import Comparison, tolerance
from tb_parity_plugin.engine.matrix import REASONS

RNG = np.random.default_rng(3)
STEPS, BATCH, D, H, C = 10, 32, 12, 64, 4
LR = 0.05
X = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
Y = np.eye(C, dtype=np.float32)[RNG.integers(0, C, STEPS * BATCH)]
W1 = (RNG.standard_normal((D, H)) * 0.3).astype(np.float32)
B1 = (RNG.standard_normal(H) * 0.1).astype(np.float32)
W2 = (RNG.standard_normal((H, C)) * 0.3).astype(np.float32)


def _tf1(
    run_dir: str, optimizer: str, weights: tuple[np.ndarray, ...] = (W1, B1, W2), data: tuple[np.ndarray, ...] = (X, Y)
) -> None:
    """The original: dense (with bias) -> batch norm -> relu -> dense on ``placeholder([None, D])``,
    batch norm's moving statistics updated through ``UPDATE_OPS``."""
    w1, b1, w2 = weights
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.float32, [None, C])
        h = tf.compat.v1.layers.dense(
            x, len(b1), kernel_initializer=tf.constant_initializer(w1), bias_initializer=tf.constant_initializer(b1)
        )
        h = tf.nn.relu(tf.compat.v1.layers.batch_normalization(h, training=True))
        logits = tf.compat.v1.layers.dense(h, C, kernel_initializer=tf.constant_initializer(w2))
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        if optimizer == "momentum":
            opt = tf.compat.v1.train.MomentumOptimizer(LR, 0.9)
        else:
            opt = tf.compat.v1.train.AdamOptimizer(LR)
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train_op, (x, y), data, len(data[0]) // BATCH, BATCH)


def _keras(
    run_dir: str,
    optimizer: str,
    beta_2: float = 0.999,
    clipnorm: Optional[float] = None,
    weights: tuple[np.ndarray, ...] = (W1, B1, W2),
    data: tuple[np.ndarray, ...] = (X, Y),
    momentum: float = 0.9,
) -> None:
    """The port: Keras layers with their defaults, the TF1 weights copied in, trained by ``fit``."""
    w1, b1, w2 = weights
    model = tf.keras.Sequential(
        [
            tf.keras.Input((D,)),
            tf.keras.layers.Dense(len(b1), name="dense"),
            tf.keras.layers.BatchNormalization(name="batch_normalization"),
            tf.keras.layers.ReLU(),
            tf.keras.layers.Dense(C, name="dense_1"),
        ]
    )
    model.get_layer("dense").set_weights([w1, b1])
    model.get_layer("dense_1").kernel.assign(w2)
    if optimizer == "momentum":
        opt = tf.keras.optimizers.SGD(LR, momentum=momentum)
    else:  # TF1 Adam's epsilon is 1e-8, Keras's 1e-7
        opt = tf.keras.optimizers.Adam(LR, beta_2=beta_2, epsilon=1e-8, clipnorm=clipnorm)
    model.compile(opt, tf.keras.losses.CategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    model.fit(*data, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def _by_kind(logged: dict, step: int, kind: str, needle: str) -> np.ndarray:
    (found,) = [v[2] for (k, name), v in logged[step].items() if k == kind and needle in name]
    return np.asarray(found, dtype=np.float64)


def test_the_momentum_of_a_bias_before_batch_norm_agrees_on_a_faithful_port(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"), "momentum")
    _keras(str(tmp_path / "tf2"), "momentum")
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    # numpy: the port is faithful — every weight, gradient and loss within the migration guide's tolerance
    for s in range(STEPS):
        for kind, tf1_name, tf2_name in [
            ("weight", "dense/kernel", "dense/kernel"),
            ("weight", "dense_1/kernel", "dense_1/kernel"),
            ("grad", "dense/kernel", "dense/kernel"),
            ("grad", "dense/bias", "dense/bias"),
            ("grad", "dense_1/kernel", "dense_1/kernel"),
            ("loss", "loss", "loss"),
        ]:
            want, got = _by_kind(tf1, s, kind, tf1_name), _by_kind(tf2, s, kind, tf2_name)
            np.testing.assert_allclose(got, want, rtol=tolerance.WARMUP_RTOL, atol=1e-5, err_msg=f"{kind} {s}")
    grads = [(_by_kind(tf1, s, "grad", "dense/bias"), _by_kind(tf2, s, "grad", "dense/bias")) for s in range(STEPS)]
    scale = max(np.abs(_by_kind(tf1, s, "grad", "dense/kernel")).max() for s in range(STEPS))
    assert max(np.abs(b).max() for b, _ in grads) < 1e-5 * scale  # the bias gradient is rounding noise
    # numpy: its momentum differs past the old floor (atol 1e-8 + 1e-4 x largest |element|) at some step...
    slots = [(_by_kind(tf1, s, "slot", "dense/bias/"), _by_kind(tf2, s, "slot", "dense/bias")) for s in range(STEPS)]
    gaps = [np.abs(c - b).max() - (1e-8 + 1e-4 * np.abs(b).max() + 1e-4 * np.abs(b)).min() for b, c in slots]
    assert max(gaps) > 0, gaps
    # ...and never by more than the gradient differences summed up to the step (momentum 0.9 < 1)
    summed = np.cumsum([np.abs(c - b).max() for b, c in grads])
    assert all(np.abs(c - b).max() <= summed[s] + 1e-8 for s, (b, c) in enumerate(slots))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.tolerance_text)


def test_adam_moves_a_bias_before_batch_norm_by_noise_and_the_divergence_says_so(tmp_path) -> None:
    """With Adam the same noise is scaled to steps near lr (``m / sqrt(v)`` of noise is about 1): the
    bias itself drifts apart on a faithful port. That difference is real and recorded, so it stays a
    divergence, but its note says its gradient agreed and was noise (numpy), and what to check."""
    _tf1(str(tmp_path / "tf1"), "adam")
    _keras(str(tmp_path / "tf2"), "adam")
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    out = [
        np.abs(_by_kind(tf2, s, "weight", "dense/bias") - _by_kind(tf1, s, "weight", "dense/bias")).max() > 1e-5
        for s in range(STEPS)
    ]
    first = out.index(True)  # numpy: the first step the bias is out of tolerance
    for s in range(first):
        b, c = _by_kind(tf1, s, "grad", "dense/bias"), _by_kind(tf2, s, "grad", "dense/bias")
        np.testing.assert_allclose(c, b, rtol=tolerance.WARMUP_RTOL, atol=1e-5)
        assert max(np.abs(b).max(), np.abs(c).max()) < 1e-6
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    found = report.first_divergence
    assert (found.step, found.kind, found.tensor) == (first, "weight", "dense/bias:0"), found
    assert "grad/dense/bias:0 agreed element-wise at every earlier step" in found.note, found.note
    wb, wc = _by_kind(tf1, first, "weight", "dense/bias"), _by_kind(tf2, first, "weight", "dense/bias")
    out = np.abs(wc - wb) > 1e-5 + tolerance.WARMUP_RTOL * np.abs(wb)  # numpy: the elements out of tolerance
    largest = max(np.abs(_by_kind(run, s, "grad", "dense/bias")[out]).max() for run in (tf1, tf2) for s in range(first))
    assert f"the {out.sum()} elements out of tolerance had gradients of at most {largest:.3g}" in found.note
    assert "rounding noise" in found.note and "epsilon" in found.note, found.note
    # numpy: tf_keras takes 1 - beta_2 of the Python float, TF1 of beta_2 rounded to float32 first
    ratio = float(np.float32(1 - 0.999)) / float(np.float32(1) - np.float32(0.999))
    assert abs(ratio - 1 - 1.29e-5) < 1e-7
    assert "beta_2=float(np.float32(0.999))) decays as TF1 does" in found.note, found.note
    # and how to hold that tensor alone once the settings are ruled out: its largest drift (numpy)
    drift = max(
        np.abs(_by_kind(tf2, s, "weight", "dense/bias") - _by_kind(tf1, s, "weight", "dense/bias")).max()
        for s in range(STEPS)
    )
    atol = 10.0 ** np.ceil(np.log10(2 * drift))
    assert f"(at most {drift:.3g}): --override 'weight/dense/bias:0:atol={atol:g}'" in found.note, found.note
    held = compare(str(tmp_path), baseline="tf1", candidate="tf2", overrides=[f"weight/dense/bias:0:atol={atol:g}"])
    assert held.first_divergence is None or held.first_divergence.tensor != "dense/bias:0", held.first_divergence


def test_adam_before_batch_norm_a_wrong_beta2_is_still_found_on_v_at_step_1(tmp_path) -> None:
    """The allowance is only what the gradients' own differences can explain: a beta2 of 0.99 moves
    every ``v`` by 10x at step 1 (numpy), far past what the gradients of steps 0 and 1 differ by."""
    _tf1(str(tmp_path / "tf1"), "adam")
    _keras(str(tmp_path / "tf2"), "adam", beta_2=0.99)
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    v_tf1, v_tf2 = _by_kind(tf1, 1, "slot", "dense_1/kernel/Adam_1"), _by_kind(tf2, 1, "slot", "v/dense_1/kernel")
    np.testing.assert_allclose(v_tf2, v_tf1 * 10, rtol=1e-3)
    grads = [(_by_kind(tf1, s, "grad", "dense_1/kernel"), _by_kind(tf2, s, "grad", "dense_1/kernel")) for s in (0, 1)]
    allowed = sum(np.abs(c * c - b * b).max() for b, c in grads)  # v sums g²
    assert np.abs(v_tf2 - v_tf1).max() > 10 * (allowed + 1e-8 + 1e-4 * np.abs(v_tf1).max())
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.first_divergence.step == 1, report.first_divergence
    at_1 = {(d.kind, d.tensor): d.reason for d in report.divergences_at_first_step}
    assert at_1.get(("slot", "dense_1/kernel/Adam_1:0")) == "value", at_1


# -- the rule on drawn series: what the gradients excuse, and refreshes -------------------------

N = 6


def _runs(
    grad_gap: list[float],
    slot_gap: list[float],
    slots: tuple[str, str] = ("dense/bias/Momentum:0", "m/dense/bias"),
    grad: float = 1e-9,
    slot: float = 1e-8,
) -> tuple:
    """A variable's gradient and a slot of it over N steps; the candidate's differ by the gaps
    given per step (on the first element). By default a momentum of noise-sized values."""
    g = [np.full(4, grad, np.float64) for _ in range(N)]
    m = [np.full(4, slot, np.float64) for _ in range(N)]
    g_c = [a.copy() for a in g]
    m_c = [a.copy() for a in m]
    for s in range(N):
        g_c[s][0] += grad_gap[s]
        m_c[s][0] += slot_gap[s]
    base = run("tf1", [series("grad", "dense/bias:0", g, order=0), series("slot", slots[0], m, order=1)])
    cand = run("tf2", [series("grad", "dense/bias:0", g_c, order=0), series("slot", slots[1], m_c, order=1)])
    return base, cand


def test_a_slot_may_differ_by_what_its_gradients_differed_before_the_step_and_no_more() -> None:
    # numpy: gradient gaps of 5e-9 a step (within the slot rule's 1e-8 in the gradient); a slot read
    # at step k holds steps 0..k-1's gradients, so it may be off by k x 5e-9 beyond the floor
    # (1e-8 + 1e-4 x its largest |element| + 1e-4 |b|, about 1e-8): 1.5e-8 at step 2 is past the
    # floor and within 2e-8, 2.5e-8 at steps 4 and 5 within 3e-8 and 3.5e-8
    floor = 1e-8 + 2e-4 * 1e-8
    gaps = [0, 0, 1.5e-8, 2e-8, 2.5e-8, 2.5e-8]
    assert all(gap <= floor + k * 5e-9 for k, gap in enumerate(gaps)) and gaps[2] > floor
    report = Comparison(*_runs([5e-9] * N, gaps)).report()
    assert report.agree, report.first_divergence
    # 3e-8 at step 3 is past the floor plus steps 0-2's 1.5e-8: a divergence there
    assert 3e-8 > floor + 3 * 5e-9
    report = Comparison(*_runs([5e-9] * N, [0, 0, 1.5e-8, 3e-8, 0, 0])).report()
    first = report.first_divergence
    assert (first.step, first.kind) == (3, "slot"), first
    assert "gradient's differences within tolerance" in report.tolerance_text, report.tolerance_text


def test_a_slot_at_step_0_is_held_to_its_rule_alone() -> None:
    """Step 0's slot is its initial value (RMSProp's 1 against 0, Adagrad's 0.1): no gradient has
    reached it yet, so none excuses a difference there (the allowance counted step 0's own)."""
    report = Comparison(*_runs([5e-9] * N, [1.2e-8] + [0] * (N - 1))).report()
    assert (report.first_divergence.step, report.first_divergence.kind) == (0, "slot"), report.first_divergence
    assert report.tolerance_text is not None and "gradient's differences" not in report.tolerance_text


def _scaled_gradient_runs(optimizer: str, scale: float, steps: int) -> tuple:
    """An independent review's false AGREE: a port whose gradient is ``scale`` x the original's
    (``tf.nn.l2_loss`` ported as a plain sum, SUM against MEAN) on a variable with gradients near
    1e-6: within the gradient's atol of 1e-5, so the gradient and weight agree, while its slots
    are ``scale`` x (m) and ``scale²`` x (v) apart. Simulated in numpy: a quadratic loss, TF1's
    MomentumOptimizer accumulator (Keras's velocity as the shim records it) or Adam's m and v."""
    rng = np.random.default_rng(0)
    n = 32
    target = rng.standard_normal(n) * 0.1
    if optimizer == "momentum":  # gradients near 1e-6
        lr, h, w0 = 0.05, rng.uniform(0.5e-5, 1.5e-5, n), rng.standard_normal(n) * 0.1
    else:  # Adam's steps hardly depend on the gradient's scale: a small lr keeps the weights within atol
        lr, h = 5e-5, rng.uniform(6e-5, 9e-5, n)
        w0 = target + rng.choice([-1, 1], n) * rng.uniform(0.07, 0.1, n)
    out = []
    for name, s in (("tf1", 1.0), ("tf2", scale)):
        w, m, v = w0.copy(), np.zeros(n), np.zeros(n)
        tensors: dict[str, list] = {"w": [], "g": [], "m": [], "v": []}
        for k in range(steps):
            g = s * h * (w - target)
            for key, x in (("w", w), ("g", g), ("m", m), ("v", v)):
                tensors[key].append(x.astype(np.float32))
            if optimizer == "momentum":
                m = 0.9 * m + g
                w = w - lr * m
            else:
                m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
                w = w - lr * (m / (1 - 0.9 ** (k + 1))) / (np.sqrt(v / (1 - 0.999 ** (k + 1))) + 1e-8)
        slots = (
            [series("slot", "dense/kernel/Momentum:0" if name == "tf1" else "m/dense/kernel", tensors["m"], order=2)]
            if optimizer == "momentum"
            else [
                series("slot", "dense/kernel/Adam:0" if name == "tf1" else "m/dense/kernel", tensors["m"], order=2),
                series("slot", "dense/kernel/Adam_1:0" if name == "tf1" else "v/dense/kernel", tensors["v"], order=3),
            ]
        )
        out.append(
            (
                run(
                    name,
                    [
                        series("weight", "dense/kernel:0", tensors["w"], order=0),
                        series("grad", "dense/kernel:0", tensors["g"], order=1),
                        *slots,
                    ],
                ),
                tensors,
            )
        )
    return out


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_a_slot_of_a_gradient_2x_off_below_the_gradients_atol_is_found_at_step_1(optimizer: str) -> None:
    (base, b), (cand, c) = _scaled_gradient_runs(optimizer, 2.0, 40)
    # numpy: gradient and weight within the policy's tolerance at every step...
    for k in range(40):
        rtol = tolerance.WARMUP_RTOL if k < 10 else 0.05
        for key in ("g", "w"):
            assert (np.abs(c[key][k] - b[key][k]) <= 1e-5 + rtol * np.abs(b[key][k])).all(), (key, k)
    # ...and the first slot 2x apart at step 1, far past the slot rule
    m_b, m_c = b["m"][1].astype(np.float64), c["m"][1].astype(np.float64)
    np.testing.assert_allclose(m_c, 2 * m_b, rtol=1e-5)
    assert (np.abs(m_c - m_b) / (1e-8 + 1e-4 * np.abs(m_b).max() + 1e-4 * np.abs(m_b))).max() > 10
    report = Comparison(base, cand).report()
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (1, "slot"), first


def test_a_gradient_that_diverged_excuses_nothing() -> None:
    report = Comparison(*_runs([0, 1e-3, 0, 0, 0, 0], [0, 0, 5e-4, 5e-4, 5e-4, 5e-4])).report()
    assert (report.first_divergence.step, report.first_divergence.kind) == (1, "grad")
    matrix = report.matrix()
    column = matrix.tensors.index("slot/dense/bias/Momentum:0")
    assert [REASONS[int(r)] for r in matrix.reason[:, column]] == ["ok", "ok"] + ["value"] * 4


def test_a_refresh_that_rewrote_the_gradient_settles_the_slot_again() -> None:
    """The slot's own rows are unchanged, so a refresh would keep its verdicts; but what it was
    allowed came from the gradient's rows, which a rerun rewrote: the slot must be settled again."""
    comparison = Comparison(*_runs([2e-8] * N, [0, 0, 3e-8, 3e-8, 3e-8, 3e-8]))
    assert comparison.report().agree
    rerun = _runs([0.0] * N, [0, 0, 3e-8, 3e-8, 3e-8, 3e-8])
    comparison.update(*rerun)
    fresh = Comparison(*rerun).report()
    assert comparison.report().to_dict() == fresh.to_dict()
    assert (fresh.first_divergence.step, fresh.first_divergence.kind) == (2, "slot")


def test_a_moving_average_may_differ_by_the_largest_difference_it_averaged_not_their_sum() -> None:
    """Adam's ``v = b v + (1 - b) g²`` moves by at most the largest ``|g_c² - g_b²|`` so far, however
    many steps it averaged; an accumulator ``a + g²`` by their sum. Gradients of 1e-3, 1e-7 apart at
    every step (within the slot rule's 1.1e-7 in the gradient): g² 2e-10 apart a step, 1e-9 summed
    over steps 0-4; a gap of 1.06e-8 in a slot near 1e-6 at step 5 is past the floor (1.02e-8) plus
    the largest (2e-10), within it plus the sum (numpy below)."""
    gaps, slot_gap = [1e-7] * N, [0, 0, 0, 0, 0, 1.06e-8]
    b, c = np.full(N, 1e-3), np.full(N, 1e-3) + 1e-7
    each = np.abs(c * c - b * b)[:5]
    floor = 1e-8 + 2e-4 * 1e-6
    assert floor + each.max() < 1.06e-8 < floor + each.sum()
    averaged = Comparison(*_runs(gaps, slot_gap, ("dense/bias/Adam_1:0", "v/dense/bias"), 1e-3, 1e-6)).report()
    assert (averaged.first_divergence.step, averaged.first_divergence.kind) == (5, "slot"), averaged.first_divergence
    summed = Comparison(*_runs(gaps, slot_gap, ("dense/bias/Adagrad:0", "accumulator/dense/bias"), 1e-3, 1e-6)).report()
    assert summed.agree, summed.first_divergence


def test_the_detail_view_holds_each_element_to_the_atol_the_verdict_used() -> None:
    """The tensor view's per-element tolerance column must be the one the verdict applied: with the
    policy's bare atol it marked a slot's elements out of tolerance at a step the verdict (rightly)
    called ok. numpy: at step 4 the slot's gap (2.5e-8) is past the floor alone and within the floor
    plus the gradient gaps of steps 0-3 (5e-9 each) a momentum sums."""
    from tb_parity_plugin.dashboard import views

    comparison = Comparison(*_runs([5e-9] * N, [0, 0, 1.5e-8, 2e-8, 2.5e-8, 2.5e-8]))
    assert comparison.report().agree
    base = np.full(4, 1e-8)
    floor = 1e-5 * tolerance.SLOT_ATOL_SCALE + tolerance.SLOT_ATOL_OF_MAX * 1e-8  # atol + share of max|b|
    detail = comparison.detail("slot/dense/bias/Momentum:0", step=4)
    assert detail.step_atol == pytest.approx(floor + 4 * 5e-9, rel=1e-12)
    payload = views.tensor_payload(detail, comparison.base, comparison.cand, 4)["values"]
    rtol = tolerance.SLOT_RTOL
    np.testing.assert_allclose(payload["tolerance"], floor + 2e-8 + rtol * np.abs(base), rtol=1e-12)
    gaps = np.abs(np.array(payload["candidate"]) - np.array(payload["baseline"]))
    assert gaps.max() > floor + rtol * base.max()  # past the floor alone...
    assert (gaps <= np.array(payload["tolerance"])).all()  # ...and no element is shown out of tolerance
    # a non-slot tensor is held to the policy's atol, as before
    assert (
        comparison.detail("grad/dense/bias:0", step=4).step_atol == comparison.policy.for_tag("grad/dense/bias:0").atol
    )


CLIPNORM, ATOL = 0.5, 3e-4  # clipped, and loose enough that Adam's epsilon under clipping moves only tiny gradients


def test_a_port_clipping_its_update_is_not_told_rounding_noise(tmp_path) -> None:
    """A new user's ``clipnorm`` where TF1 clipped otherwise (here: not at all): the gradients
    recorded before the clipping agree; Adam is scale-free but for its epsilon, so the first weight
    out of tolerance moved only elements of tiny gradient, and its note said "likely rounding noise
    ... check the epsilon" beside Adam slots 40-140% apart (the user's CNN at atol 1e-4). A slot
    that far apart is past what its gradient's differences allow, and the note now says so."""
    _tf1(str(tmp_path / "tf1"), "adam")
    _keras(str(tmp_path / "tf2"), "adam", clipnorm=CLIPNORM)
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    g_tf1, g_tf2 = _by_kind(tf1, 0, "grad", "dense/kernel"), _by_kind(tf2, 0, "grad", "dense/kernel")
    np.testing.assert_allclose(g_tf2, g_tf1, rtol=1e-5, atol=1e-6)  # numpy: recorded before the clipping
    m_tf1, m_tf2 = _by_kind(tf1, 1, "slot", "dense/kernel/Adam:"), _by_kind(tf2, 1, "slot", "m/dense/kernel")
    np.testing.assert_allclose(m_tf1, 0.1 * g_tf1, rtol=1e-5, atol=1e-9)  # numpy: m = (1 - beta1) g
    clipped = g_tf1 * min(1.0, CLIPNORM / np.linalg.norm(g_tf1))  # Keras clips each gradient to its norm
    np.testing.assert_allclose(m_tf2, 0.1 * clipped, rtol=1e-4, atol=1e-9)
    assert np.abs(m_tf2 - m_tf1).max() > 10 * ATOL
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2", atol=ATOL).first_divergence
    assert (found.step, found.kind) == (1, "weight"), found
    assert "agreed element-wise at every earlier step" in found.note, found.note
    assert "rounding noise" not in found.note and "epsilon" not in found.note, found.note
    assert "the update's input differs beyond rounding" in found.note, found.note
    # under the default atol the first weight out of tolerance moved elements of gradients past atol:
    # no noise to speak of, and the note reads the slot first (a review: it used to list epsilon, which
    # cannot move a slot, before the clipping that did)
    strict = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (strict.step, strict.kind) == (1, "weight") and "below atol" not in strict.note, strict
    assert "the update's input differs beyond rounding" in strict.note, strict.note
    assert "clipnorm clips each variable by its own norm" in strict.note and "epsilon" not in strict.note
    # the faithful port under the same policy: its bias drifts on noise, and is still told so
    _keras(str(tmp_path / "tf2_faithful"), "adam")
    same = compare(str(tmp_path), baseline="tf1", candidate="tf2_faithful", atol=ATOL).first_divergence
    assert same is not None and same.tensor == "dense/bias:0" and "rounding noise" in same.note, same


def _weight_with_slots(cand: bool, own_slot_apart: bool) -> list:
    """A bias drifting on noise gradients (1e-9) beside another variable whose Adam slot is 2x apart
    (another beta1: its own divergence, no evidence about the bias's update); the bias's own slot
    apart too when ``own_slot_apart``."""
    f32, n = np.float32, 3
    bias = [np.zeros(4, f32) for _ in range(n)]
    own = [np.full(4, 0.01 * i, f32) for i in range(n)]
    other = [np.full(6, 0.01 * i, f32) for i in range(n)]
    if cand:
        bias[2] = bias[2] + f32(1e-3)
        other[2] = other[2] * 2
        if own_slot_apart:
            own[2] = own[2] * 2
    return [
        series("weight", "gen/bias:0", bias, order=0),
        series("weight", "disc/kernel:0", [np.ones(6, f32)] * n, order=1),
        series("grad", "gen/bias:0", [np.full(4, 1e-9, f32)] * n, order=10),
        series("grad", "disc/kernel:0", [np.full(6, 0.1, f32)] * n, order=11),
        series("slot", "gen/bias/Adam:0", own, order=20),
        series("slot", "disc/kernel/Adam:0", other, order=21),
    ]


def test_only_the_weights_own_slot_overrules_the_noise_note() -> None:
    """A review of the clipping note: it blamed another optimizer's slot (a GAN's discriminator,
    its beta1 changed) for a generator bias drifting on noise whose own slot agreed."""
    base = run("tf1", _weight_with_slots(False, False))
    found = Comparison(base, run("tf2", _weight_with_slots(True, False))).report().first_divergence
    assert (found.step, found.tensor) == (2, "gen/bias:0") and "rounding noise" in found.note, found.note
    found = Comparison(base, run("tf2", _weight_with_slots(True, True))).report().first_divergence
    assert "rounding noise" not in found.note and "its optimizer slot slot/gen/bias/Adam:0" in found.note, found.note


def _momentum_runs(grads_b: list, grads_c: list, beta_c: float = 0.9) -> tuple:
    """A momentum slot read at each step's start (numpy: a = beta a + g) and its gradient."""
    slots = []
    for grads, beta in ((grads_b, 0.9), (grads_c, beta_c)):
        acc, out = np.zeros(4), []
        for g in grads:
            out.append(acc.astype(np.float32))
            acc = beta * acc + g
        slots.append(out)
    runs = []
    for name, grads, slot in (("tf1", grads_b, slots[0]), ("tf2", grads_c, slots[1])):
        runs.append(
            run(
                name,
                [
                    series("grad", "dense/bias:0", [np.float32(1) * g.astype(np.float32) for g in grads], order=1),
                    series("slot", "dense/bias/Momentum:0", slot, order=2),
                ],
            )
        )
    return tuple(runs)


def test_a_slot_fed_by_noise_says_so_and_one_fed_alike_with_another_rule_does_not() -> None:
    """A new user's faithful port diverged at step 3 on the momentum of a bias before batch norm,
    2.6e-8 apart, with no note. Noise: a gradient below atol that is apart by much of itself."""
    rng = np.random.default_rng(3)
    noise_b = [rng.normal(0, 3e-8, 4) for _ in range(5)]
    noise_c = [rng.normal(0, 3e-8, 4) for _ in range(5)]
    first = Comparison(*_momentum_runs(noise_b, noise_c)).report().first_divergence
    assert first is not None and first.kind == "slot", first  # numpy: the sums part past 1e-8 + allowance
    assert "stayed below atol 1e-05 at every earlier step" in first.note and "rounding noise" in first.note
    small = [np.full(4, 2e-6) * (s + 1) for s in range(5)]  # small, computed alike: another momentum
    first = Comparison(*_momentum_runs(small, small, beta_c=0.5)).report().first_divergence
    assert first is not None and first.kind == "slot", first
    assert "rounding noise" not in (first.note or ""), first.note


def test_a_slot_carrying_its_gradients_admitted_difference_says_so_not_its_rule() -> None:
    """A new user's loosened ``grad/*`` atol admitted a gradient 3.3e-4 apart (an Adam epsilon's doing)
    and its slot, carrying it, was told of clipping, weight decay or its betas. numpy: the gradient of
    1e-2 is 5e-6 apart at step 1 only (within its atol 1e-5, past the slot rule's 1e-8 + 1e-4 |g|),
    and the momentum at step 2 by the same 5e-6, which the slot rule and the capped allowance
    (about 3e-6) do not pass."""
    gaps, slot_gap = [0, 5e-6, 0, 0, 0, 0], [0, 0, 5e-6, 5e-6, 5e-6, 5e-6]
    assert 1e-8 + 1e-4 * 1e-2 < 5e-6 < 1e-5
    report = Comparison(*_runs(gaps, slot_gap, grad=1e-2, slot=1e-2)).report()
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (2, "slot"), first
    assert first.note is not None and "differed by up to 5e-06 (at step 1)" in first.note, first.note
    assert "the slot carries the gradient's difference" in first.note and "clipping" not in first.note


def _noise_runs(kernel_scale: float, steps: int = N, keep_values: bool = True) -> tuple:
    """A bias gradient of noise (2e-8 apart at every step) beside a kernel gradient of
    ``kernel_scale`` (its layer's gradient scale at the step), and the bias's momentum carrying the
    noise; ``keep_values=False``: the bias's gradient and slot kept as statistics only (a wide layer)."""
    g = [np.full(4, 1e-8) for _ in range(steps)]
    g_c = [a + np.array([2e-8, 0, 0, 0]) for a in g]
    m = [np.zeros(4)] + [np.full(4, 1e-8) * s for s in range(1, steps)]
    m_c = [a + np.array([2e-8 * s, 0, 0, 0]) for s, a in enumerate(m)]
    kernel = [np.full(6, kernel_scale) for _ in range(steps)]
    out = []
    for name, grads, slots in (("tf1", g, m), ("tf2", g_c, m_c)):
        out.append(
            run(
                name,
                [
                    series("grad", "dense/kernel:0", kernel, order=0),
                    series("grad", "dense/bias:0", grads, order=1, keep_values=keep_values),
                    series(
                        "slot",
                        "dense/bias/Momentum:0" if name == "tf1" else "m/dense/bias",
                        slots,
                        order=2,
                        keep_values=keep_values,
                    ),
                ],
            )
        )
    return tuple(out)


@pytest.mark.parametrize("keep_values", [True, False])
def test_a_noise_gradient_counts_in_full_up_to_1024_ulps_of_its_layers_gradient_scale(keep_values: bool) -> None:
    """numpy: the bias's momentum is 2e-8 x step apart, past the slot rule and its capped allowance
    (1e-8 + 1e-4 |g| a step); beside a kernel gradient of 1e-3 the noise is 168 ulps of its layer's
    gradient scale and counts in full (at 4 ulps, a new user's faithful U-Net was a false DIVERGE
    in 3 of 11 runs, its conv bias's gradients up to 122 ulps apart); beside one of 1e-5 it is
    16777 ulps, a difference near the layer's own size, and does not. The same when the bias's
    gradient and slot are kept as statistics only (a new user's faithful port 5000 wide under
    MirroredStrategy was a false DIVERGE on that slot at step 12: a slot compared by statistics had
    no allowance, and a gradient kept as statistics gave none)."""
    assert 2e-8 <= tolerance.SLOT_NOISE_OF_MAX * 1e-3 and 2e-8 > tolerance.SLOT_NOISE_OF_MAX * 1e-5
    assert Comparison(*_noise_runs(1e-3, keep_values=keep_values)).report().agree
    first = Comparison(*_noise_runs(1e-5, keep_values=keep_values)).report().first_divergence
    # from statistics only the rounding is granted, not the slot rule's cap (1e-8 a step, which
    # element values earn): the 2e-8 gap, past 1e-8, is then proven at step 1
    assert first is not None and (first.step, first.kind) == (2 if keep_values else 1, "slot"), first


def test_a_refresh_that_rewrote_another_gradient_settles_the_slot_again() -> None:
    """The slot's rows and its own gradient's are unchanged, but a rerun rewrote the kernel's
    gradient, its layer's gradient scale: what the slot was allowed changed with it."""
    comparison = Comparison(*_noise_runs(1e-5))
    assert not comparison.report().agree
    rerun = _noise_runs(0.365)
    comparison.update(*rerun)
    assert comparison.report().to_dict() == Comparison(*rerun).report().to_dict()
    assert comparison.report().agree
    grown = _noise_runs(0.365, N + 3)  # and a refresh that only adds steps keeps agreeing
    comparison.update(*grown)
    assert comparison.report().to_dict() == Comparison(*grown).report().to_dict()


@pytest.mark.parametrize("keep_values", [True, False])
def test_a_slot_that_starts_at_another_value_says_the_optimizers_initialise_it_differently(keep_values: bool) -> None:
    """A new user's TF1 RMSProp (mean square starting at 1) against Keras's (at 0), and Adagrad's
    initial accumulator 0.1 against 0: found at step 0 with no note. The same for a slot kept as
    statistics only (a 5000-wide mean square read "min 1 vs 0" with no note): its exact min and
    max say every element holds one value."""
    ones, zeros = [np.ones(4)] + [np.full(4, 0.9)] * (N - 1), [np.zeros(4)] + [np.full(4, 0.1)] * (N - 1)
    base = run("tf1", [series("slot", "dense/bias/RMSProp:0", ones, order=0, keep_values=keep_values)])
    cand = run("tf2", [series("slot", "velocity/dense/bias", zeros, order=0, keep_values=keep_values)])
    first = Comparison(base, cand).report().first_divergence
    assert first is not None and (first.step, first.kind) == (0, "slot"), first
    assert first.note is not None and "starts at 1 in the baseline and 0 in the candidate" in first.note, first.note
    # one element apart from the rest is not one value: no such note
    mixed = [np.array([0.0, 0.0, 0.0, 1e-3])] + zeros[1:]
    other = run("tf2", [series("slot", "velocity/dense/bias", mixed, order=0, keep_values=keep_values)])
    first = Comparison(base, other).report().first_divergence
    assert first is not None and first.step == 0 and "starts at" not in (first.note or ""), first
    # a slot that starts alike and parts later is not told so
    later = run(
        "tf2", [series("slot", "velocity/dense/bias", [np.ones(4)] + zeros[1:], order=0, keep_values=keep_values)]
    )
    first = Comparison(base, later).report().first_divergence
    assert first is not None and first.step == 1 and "starts at" not in (first.note or ""), first


def test_a_second_moment_is_not_told_it_carries_a_gradient_difference_it_cannot() -> None:
    """A review's wrong beta2 (0.99 against 0.999) on Adam's v under gradients of 0.01 that are 1e-6
    apart: numpy: that difference moves v by at most (1 - b2)(2|g| + d)d = 2e-10, v is 9e-7 apart:
    the note must not say the slot carries the gradient's difference (it compared g² with g)."""
    g_b = [np.full(4, 0.01, np.float32) for _ in range(N)]
    g_c = [a + np.float32(1e-6) for a in g_b]

    def v_of(gs: list, beta2: float) -> list:
        v, out = np.zeros(4), []
        for g in gs:
            out.append(v.astype(np.float32))
            v = beta2 * v + (1 - beta2) * g.astype(np.float64) ** 2
        return out

    vb, vc = v_of(g_b, 0.999), v_of(g_c, 0.99)
    assert np.abs(vc[1] - vb[1]).max() > 1e3 * (1 - 0.99) * (2 * 0.01 + 1e-6) * 1e-6
    base = run(
        "tf1", [series("grad", "dense/bias:0", g_b, order=0), series("slot", "dense/bias/Adam_1:0", vb, order=1)]
    )
    cand = run("tf2", [series("grad", "dense/bias:0", g_c, order=0), series("slot", "v/dense/bias", vc, order=1)])
    first = Comparison(base, cand).report().first_divergence
    assert first is not None and (first.step, first.kind) == (1, "slot"), first
    assert "carries the gradient's difference" not in (first.note or ""), first.note


def test_a_one_element_slot_of_a_resumed_run_is_not_told_it_starts_otherwise() -> None:
    """A review's run resumed at step 100 with momentum 0.9 against 0.5 on a one-element slot: one
    element is always "one value", and step 100 is no slot's start."""
    steps = [100, 101, 102]
    grads = [np.array([0.5], np.float32)] * 3
    m_b = [np.array([x], np.float32) for x in (0.8, 1.22, 1.598)]
    m_c = [np.array([x], np.float32) for x in (0.45, 0.725, 0.8625)]
    base = run("tf1", [series("grad", "s:0", grads, steps, 0), series("slot", "s/Momentum:0", m_b, steps, 1)])
    cand = run("tf2", [series("grad", "s:0", grads, steps, 0), series("slot", "m/s", m_c, steps, 1)])
    first = Comparison(base, cand).report().first_divergence
    assert first is not None and (first.step, first.kind) == (100, "slot"), first
    assert "starts at" not in (first.note or ""), first.note


def test_a_gradient_exactly_zero_on_one_side_is_not_called_rounding_noise() -> None:
    """A helper's stop_gradient on one bias: its gradient, 8.6e-7 in TF1 (below the gradient's atol),
    is exactly 0 in the port, and the momentum parts. The note called it rounding noise and offered
    use_bias=False or an override, which would hide the bug."""
    g_b = [np.full(4, 8.6e-7) for _ in range(N)]
    g_c = [np.zeros(4) for _ in range(N)]
    m_b = [np.full(4, 8.6e-7) * s for s in range(N)]
    m_c = [np.zeros(4) for _ in range(N)]
    base = run("tf1", [series("grad", "res/bias:0", g_b, order=0), series("slot", "res/bias/Momentum:0", m_b, order=1)])
    cand = run("tf2", [series("grad", "res/bias:0", g_c, order=0), series("slot", "m/res/bias", m_c, order=1)])
    first = Comparison(base, cand).report().first_divergence
    assert first is not None and first.kind == "slot", first
    assert first.note is not None and "exactly 0 in the candidate only" in first.note, first.note
    assert "rounding noise (" not in first.note and "--override" not in first.note, first.note


def test_an_output_fed_by_a_weight_loosened_by_an_override_is_not_told_every_weight_agrees() -> None:
    """A helper loosened a noise-fed bias before batch norm as its note advised; the dense output it
    feeds, 2.6e-4 apart like the bias, was told "every recorded weight agrees ... its input differs
    (Keras fit shuffles ...)". numpy: the output's gap is the bias's."""
    bias_b = [np.zeros(3)] + [np.full(3, 0.01)] * (N - 1)
    bias_c = [np.zeros(3)] + [np.full(3, 0.01 + 2.6e-4)] * (N - 1)
    out_b = [np.full((2, 3), 0.5) + b for b in bias_b]
    out_c = [np.full((2, 3), 0.5) + c for c in bias_c]
    base = run(
        "tf1", [series("weight", "dense/bias:0", bias_b, order=0), series("activation", "dense", out_b, order=1)]
    )
    cand = run(
        "tf2", [series("weight", "dense/bias:0", bias_c, order=0), series("activation", "dense", out_c, order=1)]
    )
    policy = tolerance.TolerancePolicy(overrides=(tolerance.ToleranceOverride.parse("weight/dense/bias:0:atol=1e-2"),))
    first = Comparison(base, cand, policy).report().first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "activation", "dense"), first
    assert first.note is not None and "weight/dense/bias:0 agrees here only under your override" in first.note
    assert "every recorded weight" not in first.note, first.note


def test_moving_statistics_fed_by_a_weight_loosened_by_an_override_are_not_told_momentum() -> None:
    """A helper loosened a noise-fed bias before batch norm (and the layer's output) as the notes said;
    its moving mean, apart by momentum's share of the bias's drift, was told "batch normalization's
    momentum". numpy: the moving mean's gap is (1 - 0.99) times the bias's, both updated at 0.99.
    A bias of a layer recorded after the batch norm feeds nothing of it and is not named."""
    drift = [0.0] + [2.6e-2] * (N - 1)
    bias_b = [np.full(3, 0.01) for _ in range(N)]
    bias_c = [np.full(3, 0.01 + d) for d in drift]
    mean_b, mean_c = [np.zeros(3)], [np.zeros(3)]
    for s in range(1, N):  # moving_mean = 0.99 m + 0.01 batch mean, the batch mean carrying the bias
        mean_b.append(0.99 * mean_b[-1] + 0.01 * (0.5 + bias_b[s - 1]))
        mean_c.append(0.99 * mean_c[-1] + 0.01 * (0.5 + bias_c[s - 1]))
    later = [np.full(2, 0.3) for _ in range(N)]

    def side(name: str, bias: list, mean: list, head: list) -> Any:
        return run(
            name,
            [
                series("weight", "conv2d/bias:0", bias, order=0),
                series("weight", "dense/bias:0", head, order=1),
                series("state", "batch_normalization/moving_mean:0", mean, order=2),
                series("activation", "batch_normalization", [np.zeros(3)] * N, order=3),
                series("activation", "dense", [np.zeros(2)] * N, order=4),
            ],
        )

    overrides = tuple(
        tolerance.ToleranceOverride.parse(o) for o in ("weight/conv2d/bias:0:atol=1", "weight/dense/bias:0:atol=1")
    )
    policy = tolerance.TolerancePolicy(overrides=overrides)
    head_c = [h + 0.5 for h in later]  # loosened too, and after the batch norm: no cause of it
    first = Comparison(side("tf1", bias_b, mean_b, later), side("tf2", bias_c, mean_c, head_c), policy).report()
    found = first.first_divergence
    gap = np.abs(mean_c[2] - mean_b[2]).max()
    assert found is not None and (found.step, found.kind) == (2, "state"), found
    np.testing.assert_allclose(found.max_abs_diff, gap, rtol=1e-6)
    assert found.note is not None and "weight/conv2d/bias:0 agrees here only under your override" in found.note
    assert "momentum" not in found.note and "dense/bias" not in found.note, found.note


def test_a_moving_mean_apart_by_its_momentum_is_not_blamed_on_a_weight_an_override_covers() -> None:
    """The review of the note above: a moving mean apart by its momentum (0.9 against 0.99: numpy
    below), with (i) a broad override over a bias only 3e-9 apart (within the default atol), or (ii)
    no outputs recorded and a loosened bias created after the batch norm. Neither is a cause: the
    note names the momentum, as without the override."""
    batch_mean = [np.full(3, 0.5 + 0.1 * s, np.float32) for s in range(N)]

    def averaged(momentum: float) -> list:
        m = [np.zeros(3, np.float32)]
        for s in range(1, N):
            m.append((momentum * m[-1] + (1 - momentum) * batch_mean[s - 1]).astype(np.float32))
        return m

    def side(name: str, momentum: float, bias_off: float, head_off: float) -> Any:
        return run(
            name,
            [
                series("weight", "conv2d/bias:0", [np.full(3, 0.01 + bias_off, np.float32)] * N, order=0),
                series("state", "batch_normalization/moving_mean:0", averaged(momentum), order=1),
                series("weight", "dense/bias:0", [np.full(2, 0.3 + head_off, np.float32)] * N, order=2),
            ],
        )

    for override, bias_off, head_off in (("weight/*:atol=1e-4", 3e-9, 0.0), ("weight/dense/bias:0:atol=1", 0.0, 0.5)):
        policy = tolerance.TolerancePolicy(overrides=(tolerance.ToleranceOverride.parse(override),))
        found = Comparison(side("tf1", 0.99, 0, 0), side("tf2", 0.9, bias_off, head_off), policy).report()
        first = found.first_divergence
        assert first is not None and (first.step, first.kind) == (1, "state"), first
        assert "momentum" in first.note and "under your override" not in first.note, (override, first.note)


def test_after_the_warm_up_a_weight_within_the_default_rtol_is_no_cause() -> None:
    """The second review: past the warm-up (default rtol 5%), a conv bias of about 1, 1e-4 apart
    (within the default policy: numpy allclose) and loosened by a broad override, was blamed for a
    moving mean the port updated once more at step 12 (an evaluation pass in training mode)."""
    steps = 15
    means = [np.array([0.5, 0.7, 0.9], np.float32) + 0.1 * s for s in range(steps)]

    def averaged(extra_at: Optional[int]) -> list:
        m = [np.zeros(3, np.float32)]
        for s in range(1, steps):
            nxt = (0.99 * m[-1] + 0.01 * means[s - 1]).astype(np.float32)
            if s == extra_at:  # one more update, from an evaluation batch
                nxt = (0.99 * nxt + 0.01 * (means[s - 1] + 2.0)).astype(np.float32)
            m.append(nxt)
        return m

    def side(name: str, drift: float, extra_at: Optional[int]) -> Any:
        bias = [np.full(3, 1.0 + 0.01 * s + (drift if s else 0), np.float32) for s in range(steps)]
        return run(
            name,
            [
                series("weight", "conv2d/bias:0", bias, order=0),
                series("state", "batch_normalization/moving_mean:0", averaged(extra_at), order=1),
            ],
        )

    base, cand = side("tf1", 0.0, None), side("tf2", 1e-4, 12)
    b, c = (r.tensors[("weight", "conv2d/bias:0")].values[12] for r in (base, cand))
    assert np.allclose(c, b, rtol=0.05, atol=1e-5) and not np.allclose(c, b, rtol=1e-7, atol=1e-5)
    policy = tolerance.TolerancePolicy(overrides=(tolerance.ToleranceOverride.parse("weight/*:atol=1e-3"),))
    first = Comparison(base, cand, policy).report().first_divergence
    assert first is not None and (first.step, first.kind) == (12, "state"), first
    assert "under your override" not in first.note and "once more" in first.note, first.note


def test_another_layers_large_gradient_excuses_nothing_in_this_layers_slot() -> None:
    """The review of the 4-ulp rule, first written with the step's largest gradient of any layer: a
    gradient 2x off near 4e-7 passed beside another layer's gradient of 1. numpy as in the 2x test
    above (gradients near 1e-6, 1e-6 apart); beside another layer's gradient of 8, the same in both
    runs, 1024 ulps of the model's largest gradient (1e-3) would admit that difference in full."""
    (base, b), (cand, c) = _scaled_gradient_runs("momentum", 2.0, 40)
    assert np.abs(c["g"][0] - b["g"][0]).max() < tolerance.SLOT_NOISE_OF_MAX * 8
    other = series("grad", "other/kernel:0", [np.full(8, 8.0, np.float32)] * 40, order=5)
    base = dataclasses.replace(base, tensors={**base.tensors, ("grad", "other/kernel:0"): other})
    cand = dataclasses.replace(cand, tensors={**cand.tensors, ("grad", "other/kernel:0"): other})
    first = Comparison(base, cand).report().first_divergence
    assert first is not None and (first.step, first.kind) == (1, "slot"), first


def test_another_top_level_variables_large_gradient_excuses_nothing_in_this_ones_slot() -> None:
    """The same with TF1's top-level variables (``tf.Variable(name="w1")``, ``w2``, as TF1 tutorials
    make them): each is a layer of its own, where the scope ``""`` they share made ``w2``'s gradient
    of 8 the scale of ``w1``'s slot, and the slot of ``w1``'s gradient 2x off agreed."""
    (base, b), (cand, c) = _scaled_gradient_runs("momentum", 2.0, 40)
    names = {"dense/kernel:0": "w1:0", "dense/kernel/Momentum:0": "w1/Momentum:0", "m/dense/kernel": "w1/Momentum:0"}
    other = series("grad", "w2:0", [np.full(8, 8.0, np.float32)] * 40, order=5)
    runs = []
    for r in (base, cand):
        tensors = {
            (k, names.get(n, n)): dataclasses.replace(s, name=names.get(n, n)) for (k, n), s in r.tensors.items()
        }
        runs.append(dataclasses.replace(r, tensors={**tensors, ("grad", "w2:0"): other}))
    first = Comparison(*runs).report().first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "slot", "w1/Momentum:0"), first


@pytest.mark.parametrize("momentum, agree", [(0.9, True), (0.8, False)])
def test_a_wide_bias_before_batch_norm_kept_as_statistics_agrees_on_a_faithful_port(
    tmp_path, momentum: float, agree: bool
) -> None:
    """A new user's port with the dense layer before batch norm 5000 wide: its bias, its gradient
    (noise) and its momentum slot are over the full-values limit, so kept as statistics, and the
    slot's allowance comes from its gradient's statistics (under MirroredStrategy the faithful
    port was a false DIVERGE without it; one device does not reproduce that noise, the synthetic
    case above does). What this guards: that allowance, at most 1e-4 of the gradient a step, does
    not hide another momentum (0.8), found at step 2, where numpy says the weights and slots first
    differ; and the faithful port agrees."""
    rng = np.random.default_rng(11)
    steps, width = 15, 5000
    weights = (
        (rng.standard_normal((D, width)) * 0.3).astype(np.float32),
        (rng.standard_normal(width) * 0.1).astype(np.float32),
        (rng.standard_normal((width, C)) * 0.03).astype(np.float32),
    )
    data = (
        rng.standard_normal((steps * BATCH, D)).astype(np.float32),
        np.eye(C, dtype=np.float32)[rng.integers(0, C, steps * BATCH)],
    )
    _tf1(str(tmp_path / "tf1"), "momentum", weights, data)
    _keras(str(tmp_path / "tf2"), "momentum", weights=weights, data=data, momentum=momentum)
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    for logged in (tf1, tf2):  # statistics, no values, on both sides
        assert logged[0][("grad", "dense/bias:0")][2] is None
    # numpy: each step's update is m = momentum m - lr g, so the first that reads another momentum's
    # result is step 2 (its weights and slots), by 0.1 lr |g_0|: far past any tolerance
    g0 = np.asarray(tf1[0][("grad", "dense_1/bias:0")][2], np.float64)
    assert 0.1 * LR * np.abs(g0).max() > 1e-4
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree == agree, (report.first_divergence, report.tolerance_text)
    if not agree:
        first = report.first_divergence
        assert first is not None and first.step == 2 and first.kind in ("weight", "slot"), first


def test_adam_with_betas_rounded_to_float32_decays_its_second_moment_as_tf1_does(tmp_path) -> None:
    """A new user's LSTM port under Adam drifted on seldom looked-up embedding rows at step 2: tf_keras
    Adam decays v by ``1 - beta_2`` of the Python float (1e-3) where TF1 rounds beta_2 to float32
    first (0.99998713e-3), so v is 1.3e-5 of itself apart from its first update. The noise note
    names it; this checks the remedy it gives on the logged second moments: with the betas rounded
    to float32 the bias's ``v`` at step 1 is TF1's within float32 rounding, with Keras's defaults
    1.3e-5 of itself apart (numpy on the recorded values)."""
    _tf1(str(tmp_path / "tf1"), "adam")
    tf1 = tensors_by_step(str(tmp_path / "tf1"))
    gaps = {}
    for beta_2 in (0.999, float(np.float32(0.999))):
        _keras(str(tmp_path / f"tf2_{beta_2}"), "adam", beta_2=beta_2)
        tf2 = tensors_by_step(str(tmp_path / f"tf2_{beta_2}"))
        vb, vc = _by_kind(tf1, 1, "slot", "dense_1/bias/Adam_1"), _by_kind(tf2, 1, "slot", "v/dense_1/bias")
        gaps[beta_2] = np.abs(vc / vb - 1).max()
    assert 1.2e-5 < gaps[0.999] < 1.4e-5, gaps
    assert gaps[float(np.float32(0.999))] < 1e-6, gaps


def test_a_wrong_beta2_on_a_second_moment_kept_as_statistics_is_found() -> None:
    """A review: identical gradients of 5000 elements kept as statistics, Adam's v with beta_2
    0.9999 against 0.99995 (numpy: v 2x off from its first update). The statistics allowance was
    granted whole at every step and the run agreed; it now grants only the gradient's rounding."""
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(5000).astype(np.float32) for _ in range(6)]

    def v_of(beta2: float) -> list:
        v, out = np.zeros(5000), []
        for g in grads:
            out.append(v.astype(np.float32))
            v = beta2 * v + (1 - beta2) * g.astype(np.float64) ** 2
        return out

    vb, vc = v_of(0.9999), v_of(0.99995)
    assert np.abs(vc[1] / vb[1] - 0.5).max() < 1e-3  # numpy: half at step 1
    base = run(
        "tf1",
        [
            series("grad", "dense/kernel:0", grads, keep_values=False),
            series("slot", "dense/kernel/Adam_1:0", vb, order=1, keep_values=False),
        ],
    )
    cand = run(
        "tf2",
        [
            series("grad", "dense/kernel:0", grads, keep_values=False),
            series("slot", "v/dense/kernel", vc, order=1, keep_values=False),
        ],
    )
    first = Comparison(base, cand).report().first_divergence
    assert first is not None and (first.step, first.kind) == (1, "slot"), first
