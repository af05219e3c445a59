"""Adadelta's and Ftrl's slots, paired by what they hold and told by their own rule.

TF1 names them after the optimizer: ``<v>/Adadelta`` (the mean square of the gradients) and
``/Adadelta_1`` (that of the updates), ``<v>/Ftrl`` (the accumulator) and ``/Ftrl_1`` (the linear
term); tf_keras prefixes ``accumulated_grad``, ``accumulated_delta_var``, ``accumulator``, ``linear``.
No spelling but Keras's ``accumulator`` was known: the slots were paired by shape and order, had no
gradient to bound them, and a helper's port with Adadelta's ``rho=0.9`` where TF1 had 0.95 (its mean
square exactly 2x TF1's at its first update, its first steps 0.7071x) had that slot told nothing and
its weights told the lr, Adam's bias correction, clipping or epsilon.

Expectations come from numpy: the gradients of a mean squared error written out, and each
optimizer's rule as both frameworks document it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from keras_recipes import dense_regression_port
from tf1_recipes import dense_regression

from tb_parity_plugin import compare

RNG = np.random.default_rng(11)
STEPS = 4
X = RNG.normal(size=(STEPS, 8, 4)).astype(np.float32)
Y = RNG.normal(size=(STEPS, 8, 1)).astype(np.float32)
K = (RNG.normal(size=(4, 1)) * 0.5).astype(np.float32)
ADADELTA = ("accum", "accum_update")  # TF1's slot names, in creation order
FTRL = ("accum", "linear")


def _keras_slots(opt: Any) -> dict[str, Any]:
    """The kernel's slots of a tf_keras Adadelta or Ftrl, by TF1's slot name."""
    if hasattr(opt, "_accumulated_grads"):
        return {"accum": opt._accumulated_grads[0], "accum_update": opt._accumulated_delta_vars[0]}
    return {"accum": opt._accumulators[0], "linear": opt._linears[0]}


def _tf1(run_dir: str, make_opt: Any, roles: tuple[str, ...]) -> dict[str, list[np.ndarray]]:
    seen = dense_regression(
        run_dir, K, X, Y, lambda gs, rec: make_opt(), lambda opt, v: {r: opt.get_slot(v[0], r) for r in roles}
    )
    return {r: [step[r] for step in seen] for r in roles}


def _port(run_dir: str, opt: Any) -> dict[str, list[np.ndarray]]:
    """The Keras port: one ``Dense`` from the same kernel, a ``GradientTape`` loop recorded as the README says."""
    return dense_regression_port(run_dir, K, X, Y, opt, _keras_slots)


def _kernel_gradient_at_step_0() -> np.ndarray:
    x, y = X[0].astype(np.float64), Y[0].astype(np.float64)
    return 2.0 * x.T @ (x @ K.astype(np.float64) - y) / len(y)


def _slot_pairs(report: Any) -> dict[str, tuple[str, str]]:
    return {m["baseline"]: (m["candidate"], m["how"]) for m in report.to_dict()["mapping"] if m["kind"] == "slot"}


def test_a_faithful_adadelta_port_pairs_its_slots_by_what_they_hold(tmp_path) -> None:
    tf1 = _tf1(str(tmp_path / "tf1"), lambda: tf.compat.v1.train.AdadeltaOptimizer(1.0), ADADELTA)
    port = _port(str(tmp_path / "tf2"), tf.keras.optimizers.Adadelta(1.0, epsilon=1e-8))
    g = _kernel_gradient_at_step_0()
    np.testing.assert_allclose(tf1["accum"][1], 0.05 * g * g, rtol=1e-5)  # numpy: (1 - rho) g² at the first update
    for role in ADADELTA:  # the frameworks' own slots agree role by role
        np.testing.assert_allclose(port[role], tf1[role], rtol=1e-5, atol=1e-12)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    slots = _slot_pairs(report)
    assert slots["dense/kernel/Adadelta:0"] == ("accumulated_grad/dense/kernel", "canonical"), slots
    assert slots["dense/kernel/Adadelta_1:0"] == ("accumulated_delta_var/dense/kernel", "canonical"), slots


def test_another_adadelta_rho_is_named_on_its_mean_square_at_the_first_update(tmp_path) -> None:
    tf1 = _tf1(str(tmp_path / "tf1"), lambda: tf.compat.v1.train.AdadeltaOptimizer(1.0), ADADELTA)
    port = _port(str(tmp_path / "tf2"), tf.keras.optimizers.Adadelta(1.0, rho=0.9, epsilon=1e-8))
    g = _kernel_gradient_at_step_0()
    # numpy: the mean square is (1 - rho) g² after the first update, 0.1 against 0.05: exactly 2x
    np.testing.assert_allclose(port["accum"][1], 0.1 * g * g, rtol=1e-5)
    np.testing.assert_allclose(port["accum"][1] / tf1["accum"][1], 2.0, rtol=1e-5)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert not report.agree and report.first_divergence.step == 1, report.first_divergence
    at_1 = {(d.kind, d.tensor): d for d in report.divergences_at_first_step}
    mean_square = at_1[("slot", "dense/kernel/Adadelta:0")]
    assert mean_square.candidate_tensor == "accumulated_grad/dense/kernel"
    note = mean_square.note or ""
    assert "times 2" in note and "rho" in note and "the candidate's is 0.9" in note, note
    assert "beta_2" not in note and "Adam's default" not in note, note
    weight = at_1[("weight", "dense/kernel:0")]
    assert "rho" in (weight.note or ""), weight.note  # the weight's note names the slot's rule, rho among it


def test_a_faithful_ftrl_port_pairs_its_slots_by_what_they_hold(tmp_path) -> None:
    def tf1_opt() -> Any:
        return tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.001)

    tf1 = _tf1(str(tmp_path / "tf1"), tf1_opt, FTRL)
    port = _port(str(tmp_path / "tf2"), tf.keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.001))
    g = _kernel_gradient_at_step_0()
    # numpy: the accumulator starts at 0.1 and adds g²; the linear term adds g - (sqrt(a1) - sqrt(a0)) / lr x w
    np.testing.assert_allclose(tf1["accum"][1], 0.1 + g * g, rtol=1e-5)
    linear = g - (np.sqrt(0.1 + g * g) - np.sqrt(0.1)) / 0.1 * K
    np.testing.assert_allclose(tf1["linear"][1], linear, rtol=1e-4, atol=1e-6)
    for role in FTRL:
        np.testing.assert_allclose(port[role], tf1[role], rtol=1e-5, atol=1e-7)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    slots = _slot_pairs(report)
    assert slots["dense/kernel/Ftrl:0"] == ("accumulator/dense/kernel", "canonical"), slots
    assert slots["dense/kernel/Ftrl_1:0"] == ("linear/dense/kernel", "canonical"), slots


def test_an_ftrl_port_without_tf1s_l1_is_told_the_constants_not_adams_settings(tmp_path) -> None:
    """Keras's ``Ftrl`` defaults ``l1_regularization_strength`` to 0: a port that leaves out TF1's
    moves its weights at step 1 while both slots agree (they take no l1), and was told Adam's
    epsilon, betas, momentum and clipping."""

    def tf1_opt() -> Any:
        return tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.05)

    tf1 = _tf1(str(tmp_path / "tf1"), tf1_opt, FTRL)
    port = _port(str(tmp_path / "tf2"), tf.keras.optimizers.Ftrl(0.1))
    for role in FTRL:  # the slots agree at step 1
        np.testing.assert_allclose(port[role][1], tf1[role][1], rtol=1e-5, atol=1e-7)
    # numpy: the kernel after the first update, w = (clip(linear, -l1, l1) - linear) / (sqrt(accum) / lr)
    g = _kernel_gradient_at_step_0()
    accum, linear = 0.1 + g * g, g - (np.sqrt(0.1 + g * g) - np.sqrt(0.1)) / 0.1 * K
    w_tf1, w_port = ((np.clip(linear, -l1, l1) - linear) / (np.sqrt(accum) / 0.1) for l1 in (0.05, 0.0))
    assert np.abs(w_tf1 - w_port).max() > 1e-3  # they part at step 1, by more than any tolerance
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "weight", "dense/kernel:0"), first
    assert "l1_regularization_strength" in first.note and "epsilon" not in first.note, first.note


def _structure_note(report: Any, tag: str) -> str:
    line = next(d for d in report.divergences_at_first_step if f"{d.kind}/{d.tensor or d.candidate_tensor}" == tag)
    assert line.reason == "structure", line
    return line.note or ""


def test_a_slot_that_one_optimizers_rule_alone_keeps_names_that_rule(tmp_path) -> None:
    """Keras's ``Adam(amsgrad=True)`` for TF1's ``AdamOptimizer`` (no AMSGrad) keeps ``vhat``; an RMSprop
    centered on one side only keeps the mean gradient there. Both got a structure line with no word of
    amsgrad or centered."""
    adam = str(tmp_path / "adam")
    _tf1(f"{adam}/tf1", lambda: tf.compat.v1.train.AdamOptimizer(0.05), ("m", "v"))
    port = _port_with(f"{adam}/tf2", tf.keras.optimizers.Adam(0.05, epsilon=1e-8, amsgrad=True), "_velocity_hats")
    # numpy: vhat is the running maximum of v (Keras's own slots, fetched)
    np.testing.assert_array_equal(port["vhat"][-1], np.maximum.accumulate(np.stack(port["v"]))[-1])
    report = compare(adam, baseline="tf1", candidate="tf2")
    assert not report.agree
    note = _structure_note(report, "slot/vhat/dense/kernel")
    assert "amsgrad differs" in note, note

    rms = str(tmp_path / "rms")
    tf1 = _tf1(
        f"{rms}/tf1",
        lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.5, epsilon=1e-10, centered=True),
        ("rms", "mg", "momentum"),
    )
    assert np.any(tf1["mg"][1])  # numpy: (1 - decay) g after the first update, not 0
    _port_with(f"{rms}/tf2", tf.keras.optimizers.RMSprop(0.01, momentum=0.5, epsilon=1e-10), "_velocities")
    report = compare(rms, baseline="tf1", candidate="tf2")
    assert not report.agree
    note = _structure_note(report, "slot/dense/kernel/RMSProp_1:0")
    assert "centered differs" in note and "momentum slot" not in note, note


def _port_with(run_dir: str, opt: Any, watched: str) -> dict[str, list[np.ndarray]]:
    """:func:`_port` for another optimizer: its kernel's ``watched`` slot (and Adam's ``v``), by name,
    after each step. RMSprop's mean square starts at 1, as TF1's does (README)."""

    def prepare(opt: Any, model: Any) -> None:
        opt.build(model.trainable_variables)
        if watched == "_velocities":
            for v in opt._velocities:
                v.assign(tf.ones_like(v))

    def watch(opt: Any) -> dict[str, Any]:
        if watched == "_velocity_hats":
            return {"vhat": opt._velocity_hats[0], "v": opt._velocities[0]}
        return {"rms": opt._velocities[0]}

    return dense_regression_port(run_dir, K, X, Y, opt, watch, prepare, after=True)


def _legacy_rmsprop_port(run_dir: str, epsilon: float, lr: float = 0.01) -> None:
    """A port under ``tf.keras.optimizers.legacy.RMSprop`` (no momentum), its mean square started at 1
    as TF1's (README)."""

    def prepare(opt: Any, model: Any) -> None:
        opt._create_all_weights(model.trainable_variables)
        for v in model.trainable_variables:
            opt.get_slot(v, "rms").assign(tf.ones_like(v))

    dense_regression_port(run_dir, K, X, Y, tf.keras.optimizers.legacy.RMSprop(lr, epsilon=epsilon), prepare=prepare)


def test_a_legacy_rmsprop_port_is_told_its_epsilon_sits_outside_the_square_root(tmp_path) -> None:
    """tf_keras's legacy ``RMSprop`` without momentum steps ``lr g / (sqrt(ms) + epsilon)``, TF1's
    ``lr g / sqrt(ms + epsilon)``: at epsilon 1 a helper's port parted at step 1, its mean square
    agreeing, and was told the lr, Adam's bias correction, clipping or Adadelta's epsilon."""
    tf1 = _tf1(
        str(tmp_path / "tf1"), lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, epsilon=1.0), ("rms", "momentum")
    )
    _legacy_rmsprop_port(str(tmp_path / "tf2"), epsilon=1.0)
    # numpy: the first updates of the two rules from the same mean square 0.9 + 0.1 g²
    g = _kernel_gradient_at_step_0()
    ms = 0.9 + 0.1 * g * g
    np.testing.assert_allclose(tf1["rms"][1], ms, rtol=1e-5)
    inside, outside = 0.01 * g / np.sqrt(ms + 1.0), 0.01 * g / (np.sqrt(ms) + 1.0)
    assert np.abs(inside - outside).max() > 1e-4  # past the weights' atol 1e-5
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*RMSProp_1*"])
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "weight", "dense/kernel:0"), first
    assert "outside the square root" in first.note and "legacy RMSprop" in first.note, first.note


_KERAS3_AMSGRAD_PORT = """
import sys
import numpy as np
import keras
import tensorflow as tf
from tb_parity_plugin import summary_v2

run_dir, arrays = sys.argv[1], np.load(sys.argv[2])
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(arrays["k"]), name="dense")])
opt = keras.optimizers.Adam(0.05, epsilon=1e-8, amsgrad=True)
rec = summary_v2.Recorder(run_dir)

@tf.function
def step(x, y):
    with rec.step(opt.iterations, variables=model, optimizer=opt):
        with tf.GradientTape() as tape:
            loss = rec.loss(tf.reduce_mean(tf.square(model(x) - y)))
        rec.minimize(opt, loss, model.trainable_variables, tape)

for s in range(len(arrays["x"])):
    step(tf.constant(arrays["x"][s]), tf.constant(arrays["y"][s]))
rec.close()
"""


def test_keras3s_amsgrad_maximum_is_named_too(tmp_path) -> None:
    """Keras 3 spells AMSGrad's maximum ``velocity_hat``: its structure line said nothing of amsgrad."""
    from keras3_process import run_keras3

    _tf1(str(tmp_path / "tf1"), lambda: tf.compat.v1.train.AdamOptimizer(0.05), ("m", "v"))
    arrays = tmp_path / "arrays.npz"
    np.savez(arrays, x=X, y=Y, k=K)
    script = tmp_path / "port.py"
    script.write_text(_KERAS3_AMSGRAD_PORT)
    run_keras3([str(script), str(tmp_path / "tf2"), str(arrays)])
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert not report.agree
    line = next(d for d in report.divergences_at_first_step if d.candidate_tensor.endswith("kernel/velocity_hat"))
    assert line.reason == "structure" and "amsgrad differs" in (line.note or ""), line


def test_an_ftrl_port_with_another_lr_is_told_the_lr_among_the_constants(tmp_path) -> None:
    """From a kernel of zeros (a linear model's usual start) Ftrl's linear term takes the gradient
    alone at the first update, whatever the lr: a port at lr 0.2 for TF1's 0.1 keeps both slots
    equal and doubles its weights, and was told l1, l2, beta and learning_rate_power, not the lr."""
    global K
    kernel, K = K, np.zeros_like(K)
    try:
        tf1 = _tf1(str(tmp_path / "tf1"), lambda: tf.compat.v1.train.FtrlOptimizer(0.1), FTRL)
        port = _port(str(tmp_path / "tf2"), tf.keras.optimizers.Ftrl(0.2))
    finally:
        K = kernel
    for role in FTRL:  # numpy: the slots agree at step 1 (linear = g from w = 0, accum = 0.1 + g²)
        np.testing.assert_allclose(port[role][1], tf1[role][1], rtol=1e-6, atol=1e-7)
    x, y = X[0].astype(np.float64), Y[0].astype(np.float64)
    g = 2.0 * x.T @ (x @ np.zeros((4, 1)) - y) / len(y)
    np.testing.assert_allclose(tf1["linear"][1], g, rtol=1e-5)
    w_tf1, w_port = (-g / (np.sqrt(0.1 + g * g) / lr) for lr in (0.1, 0.2))  # numpy: w = -linear / (sqrt(n) / lr)
    assert np.abs(w_port - w_tf1).max() > 1e-2
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "weight", "dense/kernel:0"), first
    assert "Ftrl" in first.note and "the learning rate" in first.note, first.note


def test_a_legacy_rmsprop_port_at_another_lr_is_not_told_of_epsilons_place(tmp_path) -> None:
    """At epsilon 1e-10 on both sides the mean square (near 1) is far above it, and where epsilon sits
    moves no step past float32; a legacy RMSprop port at twice TF1's lr steps twice as far at every
    element, and was told its epsilon sits outside the square root."""
    tf1 = _tf1(
        str(tmp_path / "tf1"), lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, epsilon=1e-10), ("rms", "momentum")
    )
    _legacy_rmsprop_port(str(tmp_path / "tf2"), epsilon=1e-10, lr=0.02)
    g = _kernel_gradient_at_step_0()
    ms = 0.9 + 0.1 * g * g
    np.testing.assert_allclose(tf1["rms"][1], ms, rtol=1e-5)
    inside, outside = 0.01 * g / np.sqrt(ms + 1e-10), 0.01 * g / (np.sqrt(ms) + 1e-10)
    assert np.abs(inside - outside).max() < 1e-9  # numpy: epsilon's place is below float32 here
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*RMSProp_1*"])
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "weight", "dense/kernel:0"), first
    assert "outside the square root" not in first.note and "times 2" in first.note, first.note


def test_an_ftrl_port_without_l1_whose_weights_tf1_holds_at_0_is_told_the_constants_not_nonneg(tmp_path) -> None:
    """A linear model from zeros, its features non-negative and its targets below 0: every gradient of
    the first step is positive and below TF1's l1, so TF1's Ftrl holds each weight at exactly 0 while the
    port without l1 moves each below 0, its slots agreeing. That is the pattern of a NonNeg projection
    (0 where the other is negative, none below 0), and the weight was told of a kernel_constraint, not
    of Ftrl's constants; a projection keeps the positive elements, and this weight has none."""
    xs, ys = np.abs(X), -np.abs(Y) * 0.02
    zeros = np.zeros_like(K)
    watch = lambda opt, v: {r: opt.get_slot(v[0], r) for r in FTRL}  # noqa: E731
    tf1_opt = lambda gs, rec: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.05)  # noqa: E731
    seen = dense_regression(str(tmp_path / "tf1"), zeros, xs, ys, tf1_opt, watch)
    port = dense_regression_port(str(tmp_path / "tf2"), zeros, xs, ys, tf.keras.optimizers.Ftrl(0.1), _keras_slots)
    for role in FTRL:  # the slots agree at step 1
        np.testing.assert_allclose(port[role][1], seen[1][role], rtol=1e-5, atol=1e-7)
    # numpy: from w = 0, linear = g (every element in (0, 0.05)), w = (clip(linear, -l1, l1) - linear) * lr / sqrt(accum)
    g = 2.0 * xs[0].astype(np.float64).T @ (-ys[0].astype(np.float64)) / len(ys[0])
    assert np.all((g > 0) & (g < 0.05)), g
    w_tf1, w_port = ((np.clip(g, -l1, l1) - g) * 0.1 / np.sqrt(0.1 + g * g) for l1 in (0.05, 0.0))
    assert np.all(w_tf1 == 0) and np.all(w_port < -1e-3), (w_tf1, w_port)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "weight", "dense/kernel:0"), first
    assert "NonNeg" not in first.note and "Ftrl" in first.note, first.note


def test_a_variable_trained_by_adagrad_where_tf1_has_ftrl_is_told_so_on_ftrls_linear_term(tmp_path) -> None:
    """A trial's wide-and-deep port trained its wide part with the deep part's Adagrad where TF1 had
    Ftrl. Adagrad's accumulator pairs with Ftrl's (both start at 0.1 and add g²), and Ftrl's linear term
    was a bare "recorded by the baseline only" line."""
    tf1 = _tf1(str(tmp_path / "tf1"), lambda: tf.compat.v1.train.FtrlOptimizer(0.1), FTRL)
    watch = lambda opt: {"accum": opt._accumulators[0]}  # noqa: E731
    port = dense_regression_port(str(tmp_path / "tf2"), K, X, Y, tf.keras.optimizers.Adagrad(0.1, epsilon=0.0), watch)
    np.testing.assert_allclose(port["accum"][1], tf1["accum"][1], rtol=1e-5)  # numpy: 0.1 + g² in both
    # numpy: the kernel after the first update, Ftrl's (l1 = l2 = 0) against Adagrad's w - lr g / sqrt(accum)
    g = _kernel_gradient_at_step_0()
    accum, linear = 0.1 + g * g, g - (np.sqrt(0.1 + g * g) - np.sqrt(0.1)) / 0.1 * K
    w_ftrl, w_adagrad = -linear / (np.sqrt(accum) / 0.1), K - 0.1 * g / np.sqrt(accum)
    assert np.abs(w_ftrl - w_adagrad).max() > 1e-3
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert not report.agree
    note = _structure_note(report, "slot/dense/kernel/Ftrl_1:0")
    assert "Ftrl's linear term" in note and "Adagrad" in note, note
    first = report.first_step_divergence
    assert (first.step, first.kind, first.tensor) == (1, "weight", "dense/kernel:0"), first


def test_ftrls_linear_term_is_not_told_another_optimizer_where_the_other_run_records_no_slot_of_it(tmp_path) -> None:
    """A wide-and-deep port that trains its wide kernel with Ftrl, as TF1 does, but records the deep
    optimizer's slots only (``variables=model, optimizer=deep_opt``): TF1's ``Ftrl_1`` was told the port
    "trains this variable with another optimizer than Ftrl ... the weights part at the first update",
    though the port records no slot of that variable at all and its weights agree at every step. Both runs
    here are the same numpy replay: Ftrl (l1 = l2 = 0) on the wide kernel, Adagrad on the deep one."""
    from engine_helpers import write_run

    rng = np.random.default_rng(4)
    wide, deep = rng.normal(size=(6, 1)), rng.normal(size=(3, 2))
    steps: list[dict[str, np.ndarray]] = []
    acc_w, lin_w, acc_d = np.full_like(wide, 0.1), np.zeros_like(wide), np.full_like(deep, 0.1)
    for _ in range(3):
        g_w, g_d = rng.normal(size=wide.shape), rng.normal(size=deep.shape)
        steps.append(
            {"wide": wide, "deep": deep, "g_w": g_w, "g_d": g_d, "acc_w": acc_w, "lin_w": lin_w, "acc_d": acc_d}
        )
        new_acc = acc_w + g_w * g_w
        lin_w = lin_w + g_w - (np.sqrt(new_acc) - np.sqrt(acc_w)) / 0.1 * wide
        acc_w, wide = new_acc, -lin_w / (np.sqrt(new_acc) / 0.1)
        acc_d = acc_d + g_d * g_d
        deep = deep - 0.1 * g_d / np.sqrt(acc_d)

    def at(port: bool):
        def tensors(step: int) -> list:
            s = {k: v.astype(np.float32) for k, v in steps[step].items()}
            out = [("weight", "wide/kernel:0", s["wide"]), ("weight", "deep/kernel:0", s["deep"])]
            out += [("grad", "wide/kernel:0", s["g_w"]), ("grad", "deep/kernel:0", s["g_d"])]
            if port:  # the deep optimizer's slots only
                return out + [("slot", "accumulator/deep/kernel", s["acc_d"])]
            return out + [
                ("slot", "wide/kernel/Ftrl:0", s["acc_w"]),
                ("slot", "wide/kernel/Ftrl_1:0", s["lin_w"]),
                ("slot", "deep/kernel/Adagrad:0", s["acc_d"]),
            ]

        return tensors

    write_run(str(tmp_path), "tf1", range(3), at(False))
    write_run(str(tmp_path), "tf2", range(3), at(True))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=[])
    assert all(d.reason == "structure" for d in report.divergences_at_first_step), report.divergences_at_first_step
    note = _structure_note(report, "slot/wide/kernel/Ftrl_1:0")
    assert "another optimizer than Ftrl" not in note, note
