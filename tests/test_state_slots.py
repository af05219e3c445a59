"""Section 1 of issue 10: every recorded variable as read at the step's start, on both sides;
``state`` and ``slot`` kinds; slots aligned across TF1 and Keras names without a map."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from shim_readback import tensors_by_step

from demo.bn_model import LR, XS, numpy_bn_moving_mean, train_tf1, train_tf2_loop
from tb_parity_plugin import compare, summary_v1, summary_v2

MOVING_MEAN = "batch_normalization/moving_mean:0"


def _pair(tmp_path, optimizer: str = "sgd", legacy: bool = False, update_ops: bool = True, limit: int = 4096):
    train_tf1(str(tmp_path / "tf1"), optimizer, update_ops=update_ops, full_values_limit=limit)
    train_tf2_loop(str(tmp_path / "tf2"), optimizer, legacy=legacy, full_values_limit=limit)
    return compare(str(tmp_path), baseline="tf1", candidate="tf2")


def test_batch_norm_wired_right_agrees_and_reads_state_at_the_step_start(tmp_path) -> None:
    report = _pair(tmp_path)
    assert report.agree, report.first_divergence
    kinds = {m["kind"] for m in report.to_dict()["mapping"]}
    assert {"weight", "state", "grad", "activation"} <= kinds
    got = tensors_by_step(str(tmp_path / "tf1"))
    # independent reference: the moving mean before step 0's update, and before step 1's
    for step, want in enumerate(numpy_bn_moving_mean(2)):
        np.testing.assert_allclose(got[step][("state", MOVING_MEAN)][2], want, rtol=1e-5, atol=1e-7)


def test_tf1_forgetting_update_ops_diverges_at_step_1_on_the_moving_mean(tmp_path) -> None:
    report = _pair(tmp_path, update_ops=False)
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "state", MOVING_MEAN)
    tags = {(d.kind, d.tensor) for d in report.divergences_at_first_step}
    # nothing else at step 1: training-mode batch norm normalizes by the batch's own statistics
    assert tags == {("state", MOVING_MEAN), ("state", MOVING_MEAN.replace("mean", "variance"))}
    got = tensors_by_step(str(tmp_path / "tf1"))
    np.testing.assert_array_equal(got[1][("state", MOVING_MEAN)][2], np.zeros(4, np.float32))
    # the note says which run held the state still, from its own step-0 and step-1 values
    assert "'tf1' did not update it between steps 0 and 1" in first.note, first.note
    assert "UPDATE_OPS" in first.note


def test_forgotten_update_ops_are_named_on_moving_statistics_kept_as_statistics(tmp_path) -> None:
    """A helper's batch norm over 5000 features kept its moving statistics as statistics only, and a
    forgotten UPDATE_OPS got no note: the run whose statistics are the very same at both steps did
    not update it (recorded here with statistics only, full_values_limit=2)."""
    report = _pair(tmp_path, update_ops=False, limit=2)
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor, first.evidence) == (1, "state", MOVING_MEAN, "statistics"), first
    assert "'tf1' did not update it between steps 0 and 1 (its statistics are its step-0 ones)" in first.note
    assert "UPDATE_OPS" in first.note, first.note
    assert _pair(tmp_path / "faithful", limit=2).agree  # statistics only, wired right


def test_an_evaluation_in_training_mode_is_named_on_the_moving_statistics(tmp_path) -> None:
    """The port evaluates between steps 1 and 2 with training=True, which updates the moving
    statistics once more: the state agreed at steps 0 and 1 and parts at step 2."""
    means_tf1: list[np.ndarray] = []
    means_tf2: list[np.ndarray] = []
    train_tf1(str(tmp_path / "tf1"), moving_means=means_tf1)
    train_tf2_loop(str(tmp_path / "tf2"), eval_in_training_after=1, moving_means=means_tf2)
    # independent reference: the variables as each session or layer held them, tolerance of the warm-up
    apart = [not np.allclose(b, c, rtol=1e-7, atol=1e-5) for b, c in zip(means_tf1, means_tf2)]
    assert apart == [False, False, True, True]
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (2, "state", MOVING_MEAN), first
    assert "agreed element-wise at the 2 steps compared before (last at step 1, to float32 rounding)" in first.note
    assert "evaluation or validation pass in training mode" in first.note


@pytest.mark.parametrize("legacy", [False, True], ids=["keras", "keras_legacy"])
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_slots_agree_on_a_faithful_port(tmp_path, optimizer: str, legacy: bool) -> None:
    report = _pair(tmp_path, optimizer, legacy)
    assert report.agree, report.first_divergence
    slots = [m for m in report.to_dict()["mapping"] if m["kind"] == "slot"]
    assert len(slots) == {"momentum": 5, "adam": 10}[optimizer]  # 5 trainable variables
    assert all(m["how"] == "canonical" for m in slots), slots
    tf1 = tensors_by_step(str(tmp_path / "tf1"))
    suffix = {"momentum": "Momentum", "adam": "Adam"}[optimizer]
    slot0 = tf1[0][("slot", f"dense_1/bias/{suffix}:0")][2]
    np.testing.assert_array_equal(slot0, np.zeros(3, np.float32))  # read before the first update
    # independent reference: the output bias's gradient at step 0 is mean(softmax - y)
    grad_b = tf1[0][("grad", "dense_1/bias:0")][2]
    slot1 = tf1[1][("slot", f"dense_1/bias/{suffix}:0")][2]
    want = grad_b if optimizer == "momentum" else 0.1 * grad_b
    np.testing.assert_allclose(slot1, want, rtol=1e-5, atol=1e-8)


def test_a_wrong_momentum_is_found_on_the_slot(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"), "momentum")
    run = tmp_path / "tf2"
    from demo import bn_model as capture_models

    saved = capture_models.OPTIMIZERS["momentum"]
    capture_models.OPTIMIZERS["momentum"] = (saved[0], lambda: tf.keras.optimizers.SGD(LR, momentum=0.5), saved[2])
    try:
        train_tf2_loop(str(run), "momentum")
    finally:
        capture_models.OPTIMIZERS["momentum"] = saved
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    # step 1: the slots hold one gradient on both sides; step 2 mixes in the momentum
    assert first.kind in ("slot", "weight") and first.step == 2, first


# -- bad input ----------------------------------------------------------------------
def test_tf1_variable_read_after_its_update_raises_naming_it(tmp_path) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "bad"))
        v = tf.compat.v1.get_variable("v", initializer=np.ones(2, np.float32))
        update = v.assign_add([1.0, 1.0])
        with tf.control_dependencies([update]), pytest.raises(ValueError, match="weight/v:0 is read after"):
            rec.weight(v)


def test_slots_of_an_optimizer_without_slots_raise_naming_the_variable(tmp_path) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "noslot"))
        v = tf.compat.v1.get_variable("v", initializer=np.ones(2, np.float32))
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        opt.minimize(tf.reduce_sum(v * v))
        with pytest.raises(ValueError, match="keeps no slot for 'v:0'"):
            rec.slots(opt, [v])


def test_tf2_state_recorded_after_the_forward_pass_raises(tmp_path) -> None:
    rec = summary_v2.Recorder(str(tmp_path / "late"))
    bn = tf.keras.layers.BatchNormalization()
    bn.build((None, 3))

    @tf.function
    def step(x: tf.Tensor) -> None:
        with rec.step(0):
            bn(x, training=True)
            rec.state(bn.moving_mean)

    with pytest.raises(ValueError, match="recorded after .* wrote it"):
        step(tf.constant(XS[0]))


def test_tf1_writes_built_anywhere_wait_for_the_read(tmp_path) -> None:
    """An assign built before the variable is recorded, and one built after, outside any block."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "order"))
        v = tf.compat.v1.get_variable("v", initializer=np.ones(2, np.float32))
        early = v.assign_add([1.0, 1.0], read_value=False)
        read = rec.state(v)
        late = v.assign_sub([0.5, 0.5], read_value=False)
        _ = rec.fetches
        assert read.op in early.control_inputs and read.op in late.control_inputs
        assert read.op not in v.initializer.control_inputs


def test_slot_names_align_across_optimizer_families() -> None:
    from tb_parity_plugin.engine.align import slot_canonical

    tf1 = ["dense/kernel/Momentum", "dense/kernel/Adam", "dense/kernel/Adam_1"]
    legacy = ["dense/kernel/momentum", "dense/kernel/m", "dense/kernel/v"]
    current = ["m/dense/kernel", "m/dense/kernel", "v/dense/kernel"]
    keras3 = ["dense/kernel/momentum", "dense/kernel/momentum", "dense/kernel/velocity"]
    want = ["dense/kernel/m", "dense/kernel/m", "dense/kernel/v"]
    for names in (tf1, legacy, current, keras3):
        assert [slot_canonical(n) for n in names] == want


def test_a_state_parting_at_its_first_update_names_the_rule_and_statistics_prove_nothing() -> None:
    """An average whose decay differs parts at its first update (TF1's ExponentialMovingAverage
    with num_updates caps 0.999 at (1 + 0) / (10 + 0) = 0.1 at step 0); the note names the rule.
    Compared by statistics only, it names the rule too, saying it agreed by statistics (both runs'
    statistics moved: neither held it still)."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    w = np.linspace(-1.0, 1.0, 6).astype(np.float32)
    base = [np.zeros(6, np.float32), (0.9 * w).astype(np.float32)]  # decay 0.1: 0.9 of the variable
    cand = [np.zeros(6, np.float32), (0.001 * w).astype(np.float32)]  # decay 0.999
    for keep in (True, False):
        first = (
            Comparison(
                run("tf1", [series("state", "dense/kernel/average", base, keep_values=keep)]),
                run("tf2", [series("state", "dense/kernel/average", cand, keep_values=keep)]),
            )
            .report()
            .first_divergence
        )
        assert (first.step, first.kind) == (1, "state"), first
        assert "the only step compared before: its update rule differs" in (first.note or ""), first.note
        assert ("it agreed at step 0 (by statistics)" in first.note) == (not keep), first.note
        if keep:
            assert (
                "num_updates" in first.note
                and "batch normalization" not in first.note
                and "accumulator" not in first.note
            )


def test_a_momentum_that_stayed_within_tolerance_for_a_while_is_not_told_an_extra_update() -> None:
    """A review's moving variance, momentum 0.999 against 0.99, was 6e-6 apart at step 1 (within
    atol) and diverged at step 2: the note said its updates agreed and blamed an evaluation pass."""
    # numpy: the batches' variances, the first near the initial 1
    batch_var = [np.array([1.0003, 0.9997, 1.0002, 0.9999]), np.array([1.5, 0.7, 1.3, 0.8]), np.ones(4)]
    tf1, port = [np.ones(4)], [np.ones(4)]
    for var in batch_var:
        tf1.append(tf1[-1] * 0.999 + var * 0.001)
        port.append(port[-1] * 0.99 + var * 0.01)
    tf1, port = [a.astype(np.float32) for a in tf1], [a.astype(np.float32) for a in port]
    assert np.allclose(port[1], tf1[1], rtol=1e-7, atol=1e-5) and not np.allclose(port[2], tf1[2], rtol=1e-7, atol=1e-5)
    first = _first_of_states("bn/moving_variance:0", tf1, port)
    assert (first.step, first.kind) == (2, "state")
    assert "already apart" in first.note and "momentum" in first.note and "evaluation" not in first.note, first.note


def test_rounding_noise_before_an_extra_update_is_not_called_a_rule() -> None:
    """The next review: a faithful port's moving mean, 6e-8 apart from float32 noise, then one
    extra update at step 4 (an evaluation pass with training=True), was told its momentum differs."""
    rng = np.random.default_rng(2)
    means = [rng.uniform(0.01, 0.05, 4) for _ in range(6)]  # numpy: the batches' means
    tf1, port = [np.zeros(4)], [np.zeros(4)]
    for s, m in enumerate(means):
        tf1.append(tf1[-1] * 0.99 + m * 0.01)
        nxt = port[-1] * 0.99 + m * (1 + 4e-6) * 0.01  # float32 noise in the port's batch mean
        port.append(nxt * 0.99 + means[0] * 0.01 * 50 if s == 3 else nxt)  # the extra update after step 3
    tf1, port = [a.astype(np.float32) for a in tf1], [a.astype(np.float32) for a in port]
    gaps = [float(np.abs(p.astype(np.float64) - t).max()) for t, p in zip(tf1, port)]
    assert 0 < gaps[3] < 1e-7 and gaps[4] > 1e-5  # apart by noise only, then the extra update
    first = _first_of_states("bn/moving_mean:0", tf1, port)
    assert (first.step, first.kind) == (4, "state")
    assert "evaluation or validation pass" in first.note and "already apart" not in first.note, first.note


def _first_of_states(name: str, tf1: list, port: list):
    """The first divergence of one state tensor recorded as ``tf1`` and ``port`` (numpy arrays per step)."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    base, cand = run("tf1", [series("state", name, tf1)]), run("tf2", [series("state", name, port)])
    return Comparison(base, cand).report().first_divergence


def test_a_biased_against_unbiased_moving_variance_is_told_apart_from_momentum() -> None:
    """A new user's TF1 fused batch norm (the default on 4-D inputs) averages the unbiased batch
    variance, Keras's synchronized one the biased: the moving variances part at the first update by
    the n / (n - 1) in it while the moving means agree, and the note blamed the momentum. numpy:
    the batch statistics of 32 values per channel, momentum 0.99 on both sides; another momentum
    moves the mean too, and keeps the momentum note."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    rng = np.random.default_rng(4)
    batch = rng.normal(2.0, 3.0, (32, 4))
    mean, var = batch.mean(0), batch.var(0)  # numpy's var is the biased one
    n = len(batch)
    for momentum_c, bessel_c, told in (
        (0.99, 1.0, "the batch variance it averages differs"),
        (0.9, n / (n - 1), "momentum"),
    ):
        runs = []
        for momentum, bessel in ((0.99, n / (n - 1)), (momentum_c, bessel_c)):
            means = [np.zeros(4), momentum * 0 + (1 - momentum) * mean]
            variances = [np.ones(4), momentum * 1 + (1 - momentum) * var * bessel]
            runs.append(
                [
                    series("state", "batch_normalization/moving_mean:0", [m.astype(np.float32) for m in means]),
                    series(
                        "state",
                        "batch_normalization/moving_variance:0",
                        [v.astype(np.float32) for v in variances],
                        order=1,
                    ),
                ]
            )
        first = Comparison(run("tf1", runs[0]), run("tf2", runs[1])).report().first_divergence
        assert first is not None and first.step == 1, first
        assert told in first.note, first.note
        if momentum_c == 0.99:
            assert first.tensor == "batch_normalization/moving_variance:0" and "momentum:" not in first.note
            assert "n / (n - 1)" in first.note and "synchronized=True" in first.note


def test_a_biased_moving_variance_just_past_tolerance_still_gets_its_note() -> None:
    """A trial's TF1 fused batch norm against Keras's synchronized one under MirroredStrategy: the
    moving variances crossed tolerance at an error ratio of 1.18, under what rounding reaches, and
    the note the agreeing moving mean proves was withheld. numpy: 6000 values per channel, so
    n / (n - 1) moves the variance by 1.5e-5 at momentum 0.99."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    batch = np.random.default_rng(4).normal(2.0, 3.0, (6000, 4))
    mean, var, n = batch.mean(0), batch.var(0), len(batch)
    runs = []
    for bessel in (n / (n - 1), 1.0):
        means = [np.zeros(4), 0.01 * mean]
        variances = [np.ones(4), 0.99 + 0.01 * var * bessel]
        runs.append(
            [
                series("state", "bn/moving_mean:0", [m.astype(np.float32) for m in means]),
                series("state", "bn/moving_variance:0", [v.astype(np.float32) for v in variances], order=1),
            ]
        )
    first = Comparison(run("tf1", runs[0]), run("tf2", runs[1])).report().first_divergence
    assert (first.step, first.tensor) == (1, "bn/moving_variance:0"), first
    assert 1 < first.error_ratio < 2, first.error_ratio
    assert "its moving mean agrees at this step" in first.note, first.note
    # Keras 3's BatchNormalization (keras/src/layers/normalization: ops.moments) is biased, every one
    # of them: a new user's faithful Keras 3 CNN port was sent to synchronized=True, which it did not use
    assert "Keras 3's BatchNormalization (every one" in first.note, first.note


def test_a_moving_variance_apart_by_noise_of_either_sign_is_not_sent_to_the_batch_variance() -> None:
    """A review's: a moving variance drifting just past tolerance by differences of either sign per
    channel, as rounding leaves, its moving mean agreeing. A biased against an unbiased variance
    moves every channel the same way (n / (n - 1)); this one was told it did."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    rng = np.random.default_rng(1)
    channels = 16
    mb, vb, mc, vc = ([np.full(channels, fill, np.float32)] for fill in (0.0, 1.0, 0.0, 1.0))
    for k in range(1, 6):
        batch_mean, batch_var = rng.standard_normal(channels), 1 + rng.random(channels)
        mb.append((0.99 * mb[-1] + 0.01 * batch_mean).astype(np.float32))
        vb.append((0.99 * vb[-1] + 0.01 * batch_var).astype(np.float32))
        mc.append((mb[-1] + rng.standard_normal(channels) * 1e-8).astype(np.float32))
        vc.append((vb[-1] + rng.choice([-1, 1], channels) * rng.random(channels) * 4e-6 * k**2).astype(np.float32))
    tensors = [
        [series("state", "bn1/moving_mean:0", m), series("state", "bn1/moving_variance:0", v, order=1)]
        for m, v in ((mb, vb), (mc, vc))
    ]
    first = Comparison(run("tf1", tensors[0]), run("tf2", tensors[1])).report().first_divergence
    assert first.tensor == "bn1/moving_variance:0" and 1 < first.error_ratio < 2, first
    d = vc[first.step].astype(np.float64) - vb[first.step]
    assert (d > 0).any() and (d < 0).any()  # numpy: both signs
    assert "the batch variance it averages differs" not in (first.note or ""), first.note


# -- a batch norm run twice per training step -----------------------------------------
_TWICE_X = np.random.default_rng(40).normal(1.0, 2.0, (3, 8, 4)).astype(np.float32)
_TWICE_Y = np.random.default_rng(41).integers(0, 3, (3, 8))
_TWICE_K = np.random.default_rng(42).uniform(-1, 1, (4, 3)).astype(np.float32)


def _twice_tf1(run_dir: str) -> None:
    """TF1: input batch norm (UPDATE_OPS), dense, SGD, the moving statistics updated once a step."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, (None, 4))
        y = tf.compat.v1.placeholder(tf.int64, (None,))
        h = rec.activation("batch_normalization", tf.compat.v1.layers.batch_normalization(x, training=True))
        logits = tf.compat.v1.layers.dense(h, 3, kernel_initializer=tf.constant_initializer(_TWICE_K))
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        rec.variables()
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for xs, ys in zip(_TWICE_X, _TWICE_Y):
                rec.write(sess.run([train_op, fetches], {x: xs, y: ys})[1])
        rec.close()


def _twice_port(run_dir: str, twice: bool) -> None:
    """The migration guide's first port: the same code in a track_tf1_style_variables layer, in a
    tf.function loop; ``twice`` also computes a training accuracy from a second training-mode call."""
    rec = summary_v2.Recorder(run_dir)

    class Model(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x, training=None):
            with tf.compat.v1.variable_scope("model"):  # as the guide's model_mapping does
                h = tf.compat.v1.layers.batch_normalization(x, training=training)
                return h, tf.compat.v1.layers.dense(h, 3, kernel_initializer=tf.constant_initializer(_TWICE_K))

    model = Model()
    model(tf.zeros((1, 4)), training=False)
    opt = tf.keras.optimizers.SGD(0.1)
    ce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                h, logits = model(x, training=True)
                rec.activation("batch_normalization", h)
                loss = rec.loss(ce(y, logits))
            if twice:
                tf.reduce_mean(tf.cast(tf.equal(tf.argmax(model(x, training=True)[1], 1), y), tf.float32))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for xs, ys in zip(_TWICE_X, _TWICE_Y):
        step(tf.constant(xs), tf.constant(ys))
    rec.close()


def test_a_batch_norm_run_twice_per_step_is_told_from_its_momentum(tmp_path) -> None:
    """A new user's track_tf1_style_variables port computed a training accuracy from a second
    forward pass with training=True: its moving statistics took two updates a step, as a momentum
    of 0.99² would, and the note at step 1 (one step compared before) blamed the momentum, which
    is 0.99 on both sides. numpy: the moving mean of the input's batch means."""
    _twice_tf1(str(tmp_path / "tf1"))
    _twice_port(str(tmp_path / "tf2"), twice=True)
    mean0 = _TWICE_X[0].astype(np.float64).mean(0)
    tf1, port = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    np.testing.assert_allclose(tf1[1][("state", MOVING_MEAN)][2], 0.01 * mean0, rtol=1e-5)
    np.testing.assert_allclose(
        port[1][("state", "model/batch_normalization/moving_mean:0")][2], 0.0199 * mean0, rtol=1e-5
    )
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "state", MOVING_MEAN), first
    assert "'tf2' moved it 1.99 times as far as 'tf1'" in first.note, first.note
    assert "two updates of momentum 0.99" in first.note and "twice in training mode" in first.note, first.note
    # swapped: the baseline ran it twice; and the faithful port agrees
    assert "'tf2' moved it 1.99 times" in compare(str(tmp_path), baseline="tf2", candidate="tf1").first_divergence.note
    _twice_port(str(tmp_path / "once"), twice=False)
    assert compare(str(tmp_path), baseline="tf1", candidate="once").agree


def test_another_momentum_at_the_first_update_is_no_second_update() -> None:
    """Momentum 0.9 against 0.99 moves the moving mean 10 times as far: the momentum note stays."""
    mean = np.array([0.5, -1.0, 2.0, 0.25])  # numpy: one batch's means, then the next
    tf1 = [np.zeros(4), 0.01 * mean, 0.99 * 0.01 * mean + 0.01 * mean]
    port = [np.zeros(4), 0.1 * mean, 0.9 * 0.1 * mean + 0.1 * mean]
    first = _first_of_states(
        "bn/moving_mean:0", [a.astype(np.float32) for a in tf1], [a.astype(np.float32) for a in port]
    )
    assert (first.step, first.kind) == (1, "state")
    assert "update rule differs (batch normalization's momentum" in first.note and "twice" not in first.note, first.note
