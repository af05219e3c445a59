"""Notes on divergences float32 noise can cause: a ReLU kink, and a ratio just past tolerance.

A gradient that diverges because a ReLU unit sits at its kink in one run only.

From a new user's trial: a faithful Adagrad port run without op determinism had one ``fc2`` unit
at exactly 0.0 in TF1 and 3.6e-9 in TF2. ReLU's gradient is 0 at 0 and 1 above it, so that one
unit's rounding moved the gradients by a finite amount for one step: a real, recorded difference,
reported as a divergence with nothing to say that rounding, not the port, may be its cause. The
divergence stays; its note now names the activation and the units at the kink.

Here the kink is made on purpose: the first layer's column 0 is zero, so its pre-activation is
exactly 0 in TF1; the port's bias there is 1e-9 (what rounding would leave), within atol.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from engine_helpers import run, series
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2
from tb_parity_plugin.engine import Comparison, tolerance
from tb_parity_plugin.records import health

RNG = np.random.default_rng(7)
STEPS, BATCH, D, H = 3, 8, 3, 4
X = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
Y = RNG.standard_normal((STEPS * BATCH, 1)).astype(np.float32)
W1 = RNG.standard_normal((D, H)).astype(np.float32)
W1[:, 0] = 0.0
W2 = RNG.standard_normal((H, 1)).astype(np.float32)


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        h = rec.activation(
            "dense", tf.compat.v1.layers.dense(x, H, tf.nn.relu, kernel_initializer=tf.constant_initializer(W1))
        )
        out = tf.compat.v1.layers.dense(h, 1, kernel_initializer=tf.constant_initializer(W2))
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        rec.lr(tf.constant(0.01))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.01), loss, global_step=gs)
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, BATCH)


def _keras(run_dir: str) -> None:
    model = tf.keras.Sequential(
        [tf.keras.Input((D,)), tf.keras.layers.Dense(H, "relu", name="dense"), tf.keras.layers.Dense(1, name="dense_1")]
    )
    bias = np.zeros(H, np.float32)
    bias[0] = 1e-9
    model.get_layer("dense").set_weights([W1, bias])
    model.get_layer("dense_1").set_weights([W2, np.zeros(1, np.float32)])
    model.compile(tf.keras.optimizers.SGD(0.01), "mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=[model.get_layer("dense")])
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def test_a_gradient_moved_by_a_unit_at_its_kink_says_so(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"))
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    h1 = np.asarray(tf1[0][("activation", "dense")][2]).reshape(BATCH, H)
    h2 = np.asarray(tf2[0][("activation", "dense")][2]).reshape(BATCH, H)
    # numpy: column 0 is 0 in TF1 and 1e-9 in the port (within atol); the rest agree
    assert (h1[:, 0] == 0).all() and np.allclose(h2[:, 0], 1e-9) and np.allclose(h1, h2, atol=1e-5)
    g1 = next(v[2] for (k, n), v in tf1[0].items() if k == "grad" and n.startswith("dense/kernel"))
    g2 = next(v[2] for (k, n), v in tf2[0].items() if k == "grad" and n.startswith("dense/kernel"))
    gap = np.abs(np.asarray(g2) - np.asarray(g1)).reshape(D, H)
    assert gap[:, 0].max() > 1e-3 and gap[:, 1:].max() < 1e-5  # numpy: the gradient differs through unit 0 only
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind) == (0, "grad"), first
    kinked = int(((h1 == 0) != (h2 == 0)).sum())
    assert f"activation dense has {kinked} elements exactly 0 in one run and within rounding" in first.note, first.note
    assert "enable_op_determinism" in first.note


def _drawn(kink: float) -> tuple:
    act = [np.array([[0.0, 0.5], [0.0, 0.2]], np.float32) for _ in range(3)]
    grad = [np.array([0.1, 0.2], np.float32) for _ in range(3)]
    act_c, grad_c = [a.copy() for a in act], [g.copy() for g in grad]
    act_c[1][1, 0] = kink
    grad_c[1][0] += 0.05
    base = run("tf1", [series("activation", "fc2/Relu", act, order=0), series("grad", "fc2/kernel:0", grad, order=1)])
    cand = run(
        "tf2", [series("activation", "fc2/Relu", act_c, order=0), series("grad", "fc2/kernel:0", grad_c, order=1)]
    )
    return base, cand


def test_only_a_unit_within_atol_of_zero_is_a_kink() -> None:
    found = Comparison(*_drawn(3.6e-9)).report().first_divergence
    assert (found.step, found.kind) == (1, "grad")
    assert "activation fc2/Relu has 1 element exactly 0 in one run and within rounding" in found.note
    assert "e.g. 0 against 3.6e-09" in found.note
    # 0 against 1e-6 (within atol, 2e-6 of the largest element, 0.5) is more than rounding: no note
    near = Comparison(*_drawn(1e-6)).report().first_divergence
    assert (near.step, near.kind) == (1, "grad") and "kink" not in (near.note or ""), near.note
    # 0 against 0.01 is no kink rounding explains: the activation diverges first, with no such note
    far = Comparison(*_drawn(0.01)).report()
    assert (far.first_divergence.step, far.first_divergence.kind) == (1, "activation")
    assert all("kink" not in (d.note or "") for d in far.divergences_at_first_step)


@pytest.mark.parametrize("gap", [1.5e-5, 1e-4])
def test_a_divergence_just_past_tolerance_says_what_amplifies_noise(gap: float) -> None:
    """New users' faithful CNN with batch norm and 64-unit LSTM diverged at steps 3-6 with error
    ratios of 1.05-1.24: real under the default atol 1e-5 on every intermediate tensor, but noise.
    Under a ratio of 2 the note says so and how to tell noise from a bug; far past it, nothing."""
    act = [np.ones(4, np.float32) for _ in range(2)]
    cand = [a.copy() for a in act]
    cand[1][0] += np.float32(gap)
    found = (
        Comparison(run("tf1", [series("activation", "bn", act)]), run("tf2", [series("activation", "bn", cand)]))
        .report()
        .first_divergence
    )
    # numpy: atol, the warm-up's rtol and an output's share of its largest element (all 1.0 here)
    ratio = float(np.abs(cand[1] - act[1]).max() / (1e-5 + tolerance.WARMUP_RTOL * 1.0 + 2.0**-18 * 1.0))
    assert found.step == 1 and found.error_ratio == pytest.approx(ratio, rel=1e-3)
    assert ("just past tolerance" in (found.note or "")) == (ratio < tolerance.MARGINAL_RATIO), (ratio, found.note)


@pytest.mark.parametrize(
    ("names", "zeros", "told", "not_told"),
    [
        (("lstm", "dense"), False, ["over time steps"], ["batch normalization", "max-pooling", "ReLU"]),
        (("conv2d", "batch_normalization", "max_pooling2d"), False, ["batch normalization", "max-pooling"], ["ReLU"]),
        (("conv1", "bn1"), False, ["batch normalization"], ["ReLU", "max-pooling"]),  # a review's: bn1 second
        (("dense", "dense_1"), True, ["a ReLU's 0"], ["batch normalization", "max-pooling", "time steps"]),
    ],
)
def test_what_amplifies_noise_is_told_from_the_layers_the_runs_have(names, zeros, told, not_told) -> None:
    """A new user's LSTM text model, just past tolerance on an output, was told of batch
    normalization and max-pooling, which it did not have. The note names what the runs' tensors
    show: their names, and outputs holding exact zeros for a ReLU (Keras names it ``dense``)."""
    ones = np.ones(4, np.float32)
    act = [ones.copy() for _ in range(2)]
    if zeros:
        act = [np.array([0, 1, 1, 1], np.float32) for _ in range(2)]
    cand = [a.copy() for a in act]
    cand[1][1] += np.float32(1.5e-5)

    def tensors(values: list) -> list:
        return [series("activation", n, act, order=i) for i, n in enumerate(names[:-1])] + [
            series("activation", names[-1], values, order=len(names))
        ]

    found = Comparison(run("tf1", tensors(act)), run("tf2", tensors(cand))).report().first_divergence
    assert found.tensor == names[-1] and "just past tolerance" in found.note, found
    assert "sums reordered from layer to layer" in found.note
    assert all(t in found.note for t in told) and not any(t in found.note for t in not_told), found.note


def test_a_difference_just_past_tolerance_beside_a_loud_one_is_not_called_noise() -> None:
    """A new user's layer-norm epsilon bug put its activation 3378 times past tolerance at step 0;
    two gradients 1.4 and 1.6 past at that step were told "faithful ports reach this". Beside a
    divergence past what noise reaches, no tensor of that step gets the marginal note."""
    ones = [np.ones(4, np.float32) for _ in range(2)]

    def shifted(by: float) -> list:
        out = [a.copy() for a in ones]
        out[1][0] += np.float32(by)
        return out

    base = run("tf1", [series("activation", "ln", ones), series("grad", "q/bias:0", ones, order=1)])
    alone = run("tf2", [series("activation", "ln", ones), series("grad", "q/bias:0", shifted(1.5e-5), order=1)])
    loud = run("tf2", [series("activation", "ln", shifted(0.03)), series("grad", "q/bias:0", shifted(1.5e-5), order=1)])
    quiet = Comparison(base, alone).report().divergences_at_first_step
    assert [d.kind for d in quiet] == ["grad"] and "just past tolerance" in quiet[0].note
    both = Comparison(base, loud).report().divergences_at_first_step
    assert [d.kind for d in both] == ["activation", "grad"] and both[0].error_ratio > 1000
    assert 1 < both[1].error_ratio < tolerance.MARGINAL_RATIO
    assert all("just past tolerance" not in (d.note or "") for d in both), [d.note for d in both]
    # the reverse order: what comes after a tensor in the step cannot have caused it. A trial's
    # faithful 300-step CNN had conv1 at 1.08 and bn1 after it at 2.03: conv1 got no note at all
    after = run(
        "tf2", [series("activation", "ln", shifted(1.5e-5)), series("grad", "q/bias:0", shifted(0.03), order=1)]
    )
    later = Comparison(base, after).report().divergences_at_first_step
    assert [d.kind for d in later] == ["activation", "grad"] and later[1].error_ratio > 1000
    assert 1 < later[0].error_ratio < tolerance.MARGINAL_RATIO
    assert "just past tolerance" in later[0].note and "just past tolerance" not in (later[1].note or "")


def test_a_difference_just_past_tolerance_that_keeps_growing_is_not_told_noise() -> None:
    """A new user's decoupled weight decay of 1e-5 against TF1's L2 of 1e-5 first diverged at step
    4 on an activation at ratio 1.28, was told faithful ports reach that and to loosen atol, and the
    override made the real difference vanish. Its difference grew 31x over the next 25 steps; a
    faithful port's stays within a few times: the note says which it is, from the records."""
    act = [np.linspace(1, 2, 8, dtype=np.float32) for _ in range(30)]

    def drifted(per_step: float) -> list:
        out = [a.copy() for a in act]
        for s in range(4, 30):
            out[s][3] += np.float32(2.3e-5 * per_step ** (s - 4))  # past atol + 2^-18 x 2, the peak
        return out

    base = run("tf1", [series("activation", "dense_1", act)])
    for per_step, grows in ((1.15, True), (1.0, False)):
        cand = drifted(per_step)
        gaps = [float(np.abs(c.astype(np.float64) - a).max()) for a, c in zip(act, cand)]  # numpy
        assert (max(gaps[5:]) >= 10 * gaps[4]) == grows
        found = Comparison(base, run("tf2", [series("activation", "dense_1", cand)])).report().first_divergence
        assert (found.step, found.kind) == (4, "activation") and 1 < found.error_ratio < 2, found
        assert ("but its largest difference grows" in found.note) == grows, found.note
        assert ("--override" in found.note) != grows
        # numpy: the largest difference after step 4, where, and how many times step 4's
        later = int(np.argmax(gaps[5:])) + 5
        steady = f"It does not grow: over the next 25 steps both runs logged, its largest difference is {gaps[later]:.3g} at most (step {later}), {gaps[later] / gaps[4]:.3g}x this step's {gaps[4]:.3g}."
        assert (steady in found.note) != grows, found.note
        assert "no noise" in found.note or grows  # never "as noise does": a steady setting difference is steady too


def test_growth_reads_past_masked_elements_and_stops_at_a_one_sided_nan() -> None:
    """The next review: masked attention scores at -inf on both sides, or the port turning NaN three
    steps later, cancelled the growth check and brought back the advice to loosen atol."""
    act = [np.linspace(1, 2, 8, dtype=np.float32) for _ in range(8)]
    for a in act:
        a[0] = -np.inf  # masked on both sides
    cand = [a.copy() for a in act]
    cand[2][3] += np.float32(2.5e-5)  # past atol + 2^-18 x 2, the peak
    cand[3][3] += np.float32(1e-3)
    cand[6][5] = np.nan  # one side only, later
    base = run("tf1", [series("activation", "scores", act)])
    found = Comparison(
        base, run("tf2", [series("activation", "scores", cand)]), tolerance.TolerancePolicy(equal_nan=True)
    ).report()
    first = found.first_divergence
    assert (first.step, first.kind) == (2, "activation") and 1 < first.error_ratio < 2, first
    assert "but its largest difference grows from 2.5e-05 to 0.001 by step 3" in first.note, first.note


def test_a_difference_that_grows_a_little_or_is_seen_once_more_is_not_called_steady() -> None:
    """A review: 9x growth (under GROWTH_FACTOR) was told "It does not grow", and so was a window of
    one later step. Steady needs 5 later steps within 4x; between, the note says neither."""
    act = [np.linspace(1, 2, 8, dtype=np.float32) for _ in range(12)]

    def note(later_gap: float, steps: int) -> str:
        cand = [a.copy() for a in act[:steps]]
        for s in range(4, steps):
            cand[s][3] += np.float32(2.5e-5 if s == 4 else later_gap)
        found = (
            Comparison(
                run("tf1", [series("activation", "a", act[:steps])]), run("tf2", [series("activation", "a", cand)])
            )
            .report()
            .first_divergence
        )
        assert (found.step, found.kind) == (4, "activation"), found
        return found.note or ""

    assert "It does not grow" not in note(9 * 2.5e-5, 12) and "but its largest difference grows" not in note(
        9 * 2.5e-5, 12
    )
    assert "It does not grow" not in note(2.5e-5, 6)  # one later step
    assert "It does not grow: over the next 7 steps" in note(3 * 2.5e-5, 12)


def test_the_override_a_marginal_note_offers_loosens_the_tolerance() -> None:
    """A review: the note offered atol=1e-4 to an activation of peak 100, held to 1e-5 + 2^-18 x 100
    = 3.9e-4; an override's atol replaces that share, so the advice made the ratio 4.5, not less."""
    act = [np.linspace(-100, 100, 8, dtype=np.float32) for _ in range(2)]
    held = 1e-5 + 2.0**-18 * 100  # numpy: atol, the warm-up's rtol on an element of 0 is nothing
    cand = [a.copy() for a in act]
    cand[1][3] += np.float32(1.2 * held)  # act[1][3] is -14.3: its rtol adds 1.4e-6
    base, port = run("tf1", [series("activation", "a", act)]), run("tf2", [series("activation", "a", cand)])
    found = Comparison(base, port).report().first_divergence
    assert (found.step, found.kind) == (1, "activation") and 1 < found.error_ratio < 2, found
    advice = re.search(r"--override '(activation/\*:atol=[^']+)'", found.note)
    assert advice is not None and advice.group(1) == "activation/*:atol=0.001", found.note
    loosened = tolerance.TolerancePolicy(overrides=(tolerance.ToleranceOverride.parse(advice.group(1)),))
    assert Comparison(base, port, loosened).report().agree


def _jumping(grad_gaps: list[float], weight_gap: float = 0.0) -> tuple:
    """A weight and loss that agree (the weight ``weight_gap`` apart at step 4) and a gradient of 0.1
    whose first element is ``grad_gaps[s]`` apart at step ``s``: a faithful ResNet's conv kernel
    gradient jumped so when one ReLU unit flipped at its kink (no activation recorded)."""
    w = [np.full(8, 0.5, np.float32) for _ in grad_gaps]
    g = [np.full(8, 0.1, np.float64) for _ in grad_gaps]
    w_c, g_c = [a.copy() for a in w], [a.copy() for a in g]
    for s, gap in enumerate(grad_gaps):
        g_c[s][0] += gap
    w_c[4][0] += weight_gap
    loss = [np.float32(1.0 / (s + 1)) for s in range(len(grad_gaps))]
    return tuple(
        run(
            name,
            [
                series("weight", "conv/kernel:0", ws, order=0),
                series("loss", "loss", loss, order=1),
                series("grad", "conv/kernel:0", gs, order=2),
            ],
        )
        for name, ws, gs in (("tf1", w, g), ("tf2", w_c, g_c))
    )


JUMPED = "arises inside this step from agreeing inputs"


def test_a_gradient_that_jumps_while_every_input_agrees_says_it_arose_inside_the_step() -> None:
    """numpy: 1e-8 apart at steps 0-3 (ratio 1e-3 against atol 1e-5), 3e-5 at step 4 (ratio 3): a
    jump of 3000x with the weight and loss equal. Growth of 1.4x (0.9e-5 to 1.3e-5), or a weight
    apart at that step too, is told nothing of the kind."""
    first = Comparison(*_jumping([1e-8] * 4 + [3e-5, 3e-5])).report().first_divergence
    assert first is not None and (first.step, first.kind) == (4, "grad"), first
    assert JUMPED in (first.note or "") and "enable_op_determinism" in first.note, first.note
    grown = Comparison(*_jumping([2e-6, 5e-6, 7e-6, 9e-6, 1.3e-5, 1.3e-5])).report().first_divergence
    assert grown is not None and (grown.step, grown.kind) == (4, "grad") and JUMPED not in (grown.note or "")
    moved = Comparison(*_jumping([1e-8] * 4 + [3e-5, 3e-5], weight_gap=1e-3)).report()
    assert moved.first_divergence.kind == "weight"
    assert all(JUMPED not in (d.note or "") for d in moved.divergences_at_first_step)


def test_a_gradient_moved_at_every_element_from_one_step_on_is_not_told_it_jumped_at_a_kink() -> None:
    """numpy: every element 3e-5 apart from step 4 (a term that starts acting there on one side,
    such as a threshold first reached): 100 % of the elements move, which one unit at its kink does
    not do (it moved 0.3-8 % of the ResNets' kernel gradients)."""
    base, cand = _jumping([1e-8] * 6)
    grad = cand.tensors[("grad", "conv/kernel:0")]
    grad.values[4:] += 3e-5
    grad.stats[4:] = [health.health_numpy(v) for v in grad.values[4:]]
    first = Comparison(base, cand).report().first_divergence
    assert first is not None and (first.step, first.kind) == (4, "grad"), first
    assert first.mismatch_fraction == 1.0 and JUMPED not in (first.note or ""), first.note


def _three_layers(flip: bool, clipped: bool = False, table: bool = False) -> list:
    """numpy, float64: a = x W0, z = a W1, h = relu(z), loss = sum(h W2); the gradients of W0, W1
    and W2 (execution order 2, 3, 4) beside the weights and the loss at steps 0-4. At step 4, with
    ``flip``, the ReLU of unit (sample 0, unit 1) lets no gradient through: a unit at its kink, where
    float32 rounding decided otherwise in this run. ``clipped``: every gradient times 0.9 at step 4
    instead (a clip by global norm first reached). ``table``: l0's weight and gradient are kept as
    statistics only, as an embedding table's above ``full_values_limit`` are."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3))
    w0, w1, w2 = rng.standard_normal((3, 3)), rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    grads: list[list[np.ndarray]] = [[], [], []]
    for step in range(5):
        a = x @ w0
        z = a @ w1
        mask = (z > 0).astype(np.float64)
        if step == 4:
            mask[0, 1] = 0.0 if flip else 1.0  # z[0, 1] is 1e-9 from 0 there: rounding decides
        dz = np.ones((4, 2)) @ w2.T * mask
        found = [x.T @ (dz @ w1.T), a.T @ dz, (np.maximum(z, 0)).T @ np.ones((4, 2))]
        for g, value in zip(grads, found):
            g.append((value * (0.9 if clipped and step == 4 else 1.0) + 1e-9 * step).astype(np.float32))
    weights = [np.asarray(w, np.float32) for w in (w0, w1, w2)]
    full = [not (table and i == 0) for i in range(3)]
    return [
        *(series("weight", f"l{i}/kernel:0", [w] * 5, order=0, keep_values=full[i]) for i, w in enumerate(weights)),
        series("loss", "loss", [np.float32(1.0)] * 5, order=1),
        *(series("grad", f"l{i}/kernel:0", g, order=2 + i, keep_values=full[i]) for i, g in enumerate(grads)),
    ]


def test_a_kink_moving_every_element_of_an_earlier_gradient_names_the_gradient_it_barely_moved() -> None:
    """A helper's faithful ResNet (float64 replays agreeing to 2e-10): at step 9 one unit of its last
    block, 5.8e-7 from 0 in float64, flipped in float32; the first gradient in execution order, its
    first conv's, moved at 82 % of its elements and got no note, while the block's own gradients,
    moved at 3 %, got the kink note. numpy: the flip moves l1's gradient at 1 of its 4 columns (25 %)
    and, through the backward pass, l0's at every element; a clip every gradient reaches at once
    moves every element of each and is told nothing of a kink."""
    base = run("tf1", _three_layers(flip=False))
    grads = base.tensors
    flipped = run("tf2", _three_layers(flip=True))
    moved = [
        float(
            np.mean(
                np.abs(
                    flipped.tensors[("grad", f"l{i}/kernel:0")].values[4] - grads[("grad", f"l{i}/kernel:0")].values[4]
                )
                > 1e-5
            )
        )
        for i in range(3)
    ]
    assert moved == [1.0, 0.25, 0.0], moved  # numpy: every element of l0's, one column of l1's
    first = Comparison(base, flipped).report().first_divergence
    assert first is not None and (first.step, first.tensor) == (4, "l0/kernel:0"), first
    assert JUMPED in (first.note or "") and "but only 25.00% of those of l1/kernel:0" in first.note, first.note
    clipped = Comparison(base, run("tf2", _three_layers(flip=False, clipped=True))).report()
    assert clipped.first_divergence is not None and clipped.first_divergence.step == 4
    assert all(JUMPED not in (d.note or "") for d in clipped.divergences_at_first_step)


def test_a_gradient_compared_by_statistics_only_before_a_kink_gets_the_kink_note() -> None:
    """A new user's faithful port (a 20000 x 50 embedding, flatten, a 2000-unit ReLU layer, Adam;
    a float64 replay puts one hidden unit 5.9e-8 from 0 at step 4) diverged first, at step 4, on its
    table's gradient, compared by statistics only, with no note, while the hidden bias's gradient,
    one element apart, got the kink note on the line below. numpy: the flip moves every element of
    l0's gradient (kept as statistics only here, as a table's is) and one column of l1's; a clip
    that every gradient reaches at once is told nothing of a kink."""
    base = run("tf1", _three_layers(flip=False, table=True))
    flipped = run("tf2", _three_layers(flip=True, table=True))
    full = [
        np.abs(a - b)
        for a, b in zip(
            (g.values[4] for g in (_three_layers(flip=True)[4 + i] for i in range(3))),
            (g.values[4] for g in (_three_layers(flip=False)[4 + i] for i in range(3))),
        )
    ]
    assert [float(np.mean(d > 1e-5)) for d in full] == [1.0, 0.25, 0.0]  # numpy: l0 all, l1 one column
    assert flipped.tensors[("grad", "l0/kernel:0")].values is None  # statistics only
    report = Comparison(base, flipped).report()
    first = report.first_divergence
    assert first is not None and (first.step, first.tensor, first.evidence) == (4, "l0/kernel:0", "statistics"), first
    assert JUMPED in (first.note or "") and "but only 25.00% of those of l1/kernel:0" in first.note, first.note
    assert "Its statistics show that elements moved, not how many" in first.note, first.note
    clipped = Comparison(base, run("tf2", _three_layers(flip=False, clipped=True, table=True))).report()
    assert clipped.first_divergence is not None and clipped.first_divergence.step == 4
    assert all(JUMPED not in (d.note or "") for d in clipped.divergences_at_first_step)


def test_a_slot_that_carries_a_gradient_moved_at_a_kink_names_the_kink() -> None:
    """numpy: at step 2 one ReLU unit is 0 in one run and 3e-7 in the other (rounding of its largest
    element, 1), and the kernel's gradient 8e-6 apart there (within its atol 1e-5); the Momentum slot
    carries those 8e-6 from step 3 on, past its rule (1e-8 + 1e-4 of the slot). A helper's faithful
    ResNet, its ReLU outputs recorded, diverged so on the slot and was told of epsilon."""
    steps = 5
    relu = [np.array([0.0, 0.4, 1.0, 0.7], np.float32) for _ in range(steps)]
    relu_c = [a.copy() for a in relu]
    relu_c[2][0] = 3e-7
    g = [np.full(4, 0.01) for _ in range(steps)]
    g_c = [a.copy() for a in g]
    g_c[2][0] += 8e-6
    m = [np.full(4, 0.01 * s) for s in range(steps)]
    m_c = [a + np.array([8e-6 if s >= 3 else 0.0, 0, 0, 0]) for s, a in enumerate(m)]
    base, cand = (
        run(
            name,
            [
                series("activation", "relu", acts, order=1),
                series("grad", "dense/kernel:0", grads, order=2),
                series("slot", slot, moms, order=0),
            ],
        )
        for name, acts, grads, slot, moms in (
            ("tf1", relu, g, "dense/kernel/Momentum:0", m),
            ("tf2", relu_c, g_c, "m/dense/kernel", m_c),
        )
    )
    first = Comparison(base, cand).report().first_divergence
    assert first is not None and (first.step, first.kind) == (3, "slot"), first
    assert "at step 2 activation relu has 1 element exactly 0 in one run" in (first.note or ""), first.note
    assert "optimizer's epsilon" not in first.note


def _embedding_and_kernel(moved: bool) -> list:
    """numpy, float64: an embedding's gradient (50 rows, the 3 a step's batch looks up non-zero) and a
    kernel's, beside their weights and the loss at steps 0-5. With ``moved``, at step 4 each gradient
    is 5 % off at every element it holds (a difference spread over the whole backward pass, no unit
    at a kink)."""
    rng = np.random.default_rng(9)
    table, kernel = rng.standard_normal((50, 4)), rng.standard_normal((4, 3))
    embedding, dense = [], []
    for step in range(6):
        g_table = np.zeros((50, 4))
        rows = rng.choice(50, 3, replace=False)
        g_table[rows] = rng.standard_normal((3, 4))
        g_kernel = rng.standard_normal((4, 3))
        noise = 1 + 0.05 * rng.standard_normal((3, 4)), 1 + 0.05 * rng.standard_normal((4, 3))
        if moved and step == 4:
            g_table[rows] *= noise[0]
            g_kernel *= noise[1]
        embedding.append(g_table.astype(np.float32))
        dense.append(g_kernel.astype(np.float32))
    return [
        series("weight", "emb:0", [table.astype(np.float32)] * 6, order=0),
        series("weight", "k:0", [kernel.astype(np.float32)] * 6, order=0),
        series("loss", "loss", [np.float32(1.0)] * 6, order=1),
        series("grad", "emb:0", embedding, order=2),
        series("grad", "k:0", dense, order=3),
    ]


def test_an_embedding_gradient_moved_at_every_row_it_holds_is_not_a_few_elements_moved() -> None:
    """The kink note rests on a gradient moved at few of its elements; an embedding's gradient is 0
    in both runs at every row no sample looked up, so one moved at every row it holds (numpy: 12 of
    its 200 elements, every non-zero one) counted as 6 % moved, got the kink note, and lent it to the
    kernel's gradient moved at every element ("but only 6.00% of those of emb:0")."""
    base = run("tf1", _embedding_and_kernel(moved=False))
    cand = run("tf2", _embedding_and_kernel(moved=True))
    b, c = (r.tensors[("grad", "emb:0")].values[4] for r in (base, cand))
    apart = np.abs(b - c) > 1e-5
    assert apart.sum() == 12 and (apart == ((b != 0) | (c != 0))).all()  # every element it holds moved
    found = Comparison(base, cand).report().divergences_at_first_step
    assert [(d.step, d.tensor) for d in found] == [(4, "emb:0"), (4, "k:0")], found
    assert all(JUMPED not in (d.note or "") for d in found), [d.note for d in found]
