"""Exponential moving averages of the weights, from a new user's trial.

TF1 keeps them in ``tf.compat.v1.train.ExponentialMovingAverage``'s shadow variables
(``dense/kernel/ExponentialMovingAverage``), non-trainable globals the shim records as ``state``. The
port's tf_keras optimizer keeps them itself with ``use_ema=True`` (``average/dense/kernel``), and the
shim recorded them as ``slot``s: the two never paired, a false structure DIVERGE on a faithful port,
and with plain SGD (no momentum) the port recorded no average at all. Both are ``state`` now, paired
by name. Every expectation is checked against numpy's recursion on the logged weights.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(11)
STEPS, BATCH, D, H, C = 6, 8, 5, 4, 3
LR, DECAY = 0.1, 0.9
X = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
Y = np.eye(C, dtype=np.float32)[RNG.integers(0, C, STEPS * BATCH)]
W1 = (RNG.standard_normal((D, H)) * 0.5).astype(np.float32)
W2 = (RNG.standard_normal((H, C)) * 0.5).astype(np.float32)
VARIABLES = ("dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias")


def _tf1(run_dir: str, momentum: float, ema: bool = True, num_updates: bool = False) -> None:
    """The original: two dense layers on ``placeholder([None, D])``, the averages applied after the update
    (with ``num_updates``: ``num_updates=global_step``, the Inception/ResNet recipe)."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.float32, [None, C])
        h = tf.compat.v1.layers.dense(x, H, tf.tanh, kernel_initializer=tf.constant_initializer(W1), name="dense")
        logits = tf.compat.v1.layers.dense(h, C, kernel_initializer=tf.constant_initializer(W2), name="dense_1")
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        if momentum:
            opt = tf.compat.v1.train.MomentumOptimizer(LR, momentum)
        else:
            opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
        update = rec.minimize(opt, loss, global_step=gs)
        train_op = update
        if ema:
            with tf.control_dependencies([update]):
                averager = tf.compat.v1.train.ExponentialMovingAverage(DECAY, num_updates=gs if num_updates else None)
                train_op = averager.apply(tf.compat.v1.trainable_variables())
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, BATCH)


def _keras(run_dir: str, momentum: float, ema_momentum: float, overwrite: Optional[int] = None, fits: int = 1) -> None:
    """The port: Keras defaults (zero biases), ``use_ema`` on the optimizer (its weights replaced by
    the averages every ``overwrite`` iterations), trained by ``fit`` (``fits`` calls, each on the
    next equal share of the batches: a loop that evaluates between them)."""
    model = tf.keras.Sequential(
        [tf.keras.Input((D,)), tf.keras.layers.Dense(H, "tanh", name="dense"), tf.keras.layers.Dense(C, name="dense_1")]
    )
    model.get_layer("dense").kernel.assign(W1)
    model.get_layer("dense_1").kernel.assign(W2)
    optimizer = tf.keras.optimizers.SGD(
        LR, momentum=momentum, use_ema=True, ema_momentum=ema_momentum, ema_overwrite_frequency=overwrite
    )
    model.compile(optimizer, tf.keras.losses.CategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    rows = len(X) // fits
    for f in range(fits):
        share = slice(f * rows, (f + 1) * rows)
        model.fit(X[share], Y[share], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def _numpy_averages(logged: dict, name: str, decay: float) -> list[np.ndarray]:
    """The average read at each step's start, from the weights read there: it starts at the weight
    and takes ``decay * average + (1 - decay) * weight`` after each update."""
    weights = [logged[s][("weight", f"{name}:0")][2].astype(np.float64) for s in range(STEPS)]
    out = [weights[0]]
    for w in weights[1:]:
        out.append(decay * out[-1] + (1 - decay) * w)
    return out


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["sgd", "momentum"])
def test_a_faithful_use_ema_port_agrees_on_every_average(tmp_path, momentum: float) -> None:
    _tf1(str(tmp_path / "tf1"), momentum)
    _keras(str(tmp_path / "tf2"), momentum, DECAY)
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    for name in VARIABLES:
        want = _numpy_averages(tf1, name, DECAY)
        for s in range(STEPS):
            np.testing.assert_allclose(tf1[s][("state", f"{name}/ExponentialMovingAverage:0")][2], want[s], atol=1e-6)
            np.testing.assert_allclose(tf2[s][("state", f"average/{name}")][2], want[s], atol=1e-6)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    paired = {(m["baseline"], m["candidate"]) for m in report.to_dict()["mapping"] if m["kind"] == "state"}
    assert {(f"{n}/ExponentialMovingAverage:0", f"average/{n}") for n in VARIABLES} <= paired


def test_a_wrong_ema_momentum_is_found_on_an_average_at_step_1(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"), 0.9)
    _keras(str(tmp_path / "tf2"), 0.9, 0.99)
    tf1 = tensors_by_step(str(tmp_path / "tf1"))
    # numpy: the averages start at the weights (step 0 equal), and differ once the first update is mixed in
    gaps = {n: np.abs(_numpy_averages(tf1, n, DECAY)[1] - _numpy_averages(tf1, n, 0.99)[1]).max() for n in VARIABLES}
    assert min(gaps.values()) > 1e-4, gaps
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind) == (1, "state"), first
    assert first.tensor.endswith("/ExponentialMovingAverage:0"), first
    # the averages never feed the update: nothing else diverges
    assert {d.kind for d in report.divergences_at_first_step} == {"state"}


def test_an_average_the_original_lacks_is_one_run_only_and_not_a_slot_created_twice(tmp_path) -> None:
    """The port averages, the original does not: the averages are named as recorded by the port
    alone; they once read "looks created twice: repeats slot/m/dense/kernel"."""
    _tf1(str(tmp_path / "tf1"), 0.9, ema=False)
    _keras(str(tmp_path / "tf2"), 0.9, DECAY)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert not report.agree and report.first_divergence.reason == "structure"
    only = [(d.kind, d.candidate_tensor, d.note) for d in report.divergences_at_first_step]
    assert sorted(t for _, t, _ in only) == sorted(f"average/{n}" for n in VARIABLES), only
    assert all(kind == "state" and "created twice" not in note for kind, _, note in only), only


def test_weights_replaced_by_their_averages_in_one_run_are_named_so(tmp_path) -> None:
    """tf_keras's ``RMSprop`` alone defaults ``ema_overwrite_frequency`` to 100: a trial's faithful
    ``use_ema=True`` port jumped at step 100 and was told to compare epsilon, betas and clipping.
    Here every 3 iterations. Numpy: the port's weights equal its own recorded averages at the
    first such step and are out of tolerance of the original's there, which never replaces them."""
    _tf1(str(tmp_path / "tf1"), 0.9)
    _keras(str(tmp_path / "tf2"), 0.9, DECAY, overwrite=3)
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    kernel = "dense/kernel"
    replaced = [
        s
        for s in range(1, STEPS)
        if np.array_equal(tf2[s][("weight", f"{kernel}:0")][2], tf2[s][("state", f"average/{kernel}")][2])
    ]
    assert replaced, "the port never replaced its weights"
    step = replaced[0]
    for s in range(step):  # before it, the weights agree: the port is faithful but for the replacing
        np.testing.assert_allclose(
            tf2[s][("weight", f"{kernel}:0")][2], tf1[s][("weight", f"{kernel}:0")][2], atol=1e-6
        )
    assert np.abs(tf2[step][("weight", f"{kernel}:0")][2] - tf1[step][("weight", f"{kernel}:0")][2]).max() > 1e-3
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind) == (step, "weight"), first
    assert (
        f"in 'tf2' this weight equals its own moving average (average/{first.candidate_tensor.removesuffix(':0')}) "
        "at this step, element for element, and in 'tf1' it does not"
    ) in first.note, first.note


def _custom_loop(
    run_dir: str, warm_up: bool, before: bool = False, count_before: bool = False, prefix: str = ""
) -> None:
    """A port's custom loop that keeps the averages by hand, as TF1's shadows are named: the decay capped
    at ``(1 + n) / (10 + n)`` (``n`` the iterations after the update, TF1's ``num_updates=global_step``)
    when ``warm_up``; averaged before ``apply_gradients`` when ``before``; with ``count_before``, averaged
    after it with the decay computed before it (``n`` one short). With ``prefix``, the averages are named
    ``<prefix><variable>`` instead (a loop's own names, which TF1's shadows pair with by order)."""
    model = tf.keras.Sequential(
        [tf.keras.Input((D,)), tf.keras.layers.Dense(H, "tanh", name="dense"), tf.keras.layers.Dense(C, name="dense_1")]
    )
    model.get_layer("dense").kernel.assign(W1)
    model.get_layer("dense_1").kernel.assign(W2)
    opt = tf.keras.optimizers.SGD(LR, momentum=0.9)
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    averages = [
        tf.Variable(
            v, trainable=False, name=f"{prefix}{v.name[:-2]}" if prefix else f"{v.name[:-2]}/ExponentialMovingAverage"
        )
        for v in model.trainable_variables
    ]
    rec = summary_v2.Recorder(run_dir)

    def decay() -> tf.Tensor:
        n = tf.cast(tf.identity(opt.iterations), tf.float32)
        return tf.minimum(DECAY, (1.0 + n) / (10.0 + n)) if warm_up else tf.constant(DECAY)

    def update_averages(d: tf.Tensor) -> None:
        for v, a in zip(model.trainable_variables, averages):
            a.assign(d * a + (1.0 - d) * v)

    @tf.function
    def train_step(x, y):
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(tf.constant(LR))
            rec.states(averages)
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(y, model(x, training=True)))
            grads = rec.grads(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            early = decay()
            if before:
                update_averages(early)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            if not before:
                update_averages(early if count_before else decay())

    for s in range(STEPS):
        train_step(X[s * BATCH : (s + 1) * BATCH], Y[s * BATCH : (s + 1) * BATCH])
    rec.close()


def _numpy_averages_of(logged: dict, name: str, decays: list, before: bool = False) -> list[np.ndarray]:
    """:func:`_numpy_averages` with the decay of each update (``decays[s]`` moves step ``s`` to ``s + 1``),
    averaging the weight read at the step's start when ``before`` (before its update)."""
    weights = [logged[s][("weight", f"{name}:0")][2].astype(np.float64) for s in range(STEPS)]
    out = [weights[0]]
    for s in range(1, STEPS):
        out.append(decays[s - 1] * out[-1] + (1 - decays[s - 1]) * weights[s - 1 if before else s])
    return out


#: TF1's decay with ``num_updates=global_step``: the update at step ``s`` reads the global step after it
CAPPED = [min(DECAY, (1 + n) / (10 + n)) for n in range(1, STEPS + 1)]


@pytest.mark.parametrize(
    "warm_up,before,count_before,prefix",
    [
        (True, False, False, ""),
        (False, False, False, ""),
        (False, False, False, "ema/"),
        (True, True, False, ""),
        (True, False, True, ""),
    ],
    ids=["faithful", "no_cap", "no_cap_own_names", "before", "count_one_short"],
)
def test_a_hand_written_average_is_told_by_its_decays_and_the_weight_it_averaged(
    tmp_path, warm_up, before, count_before, prefix
) -> None:
    """TF1's ``ExponentialMovingAverage(0.9, num_updates=global_step)`` after the train op against a
    custom loop's own averages. Dropping the cap, averaging before ``apply_gradients``, or capping by
    ``optimizer.iterations`` read before it, was told of "its update rule differs (an average's decay
    ...) or inputs no recorded tensor shows" alike: the decays of the second were the same, and its
    input was the recorded weight of the step before. Numpy's recursions on each run's logged weights
    give each run's averages, and the decays the note names: 2/11 (TF1's cap at its first update,
    global step 1), 0.9, and 1/10 (the cap one step short)."""
    _tf1(str(tmp_path / "tf1"), 0.9, num_updates=True)
    _custom_loop(str(tmp_path / "tf2"), warm_up, before, count_before, prefix)
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    short = [min(DECAY, (1 + n) / (10 + n)) for n in range(STEPS)]  # the cap of the iterations before the update
    decays = (short if before or count_before else CAPPED) if warm_up else [DECAY] * STEPS
    for name in VARIABLES:
        shadow = ("state", f"{name}/ExponentialMovingAverage:0")
        want = _numpy_averages_of(tf1, name, CAPPED)
        port = _numpy_averages_of(tf2, name, decays, before)
        for s in range(STEPS):
            np.testing.assert_allclose(tf1[s][shadow][2], want[s], atol=1e-6)
            own = ("state", f"{prefix}{name}:0") if prefix else shadow
            np.testing.assert_allclose(tf2[s][own][2], port[s], atol=1e-6)
            np.testing.assert_allclose(
                tf2[s][("weight", f"{name}:0")][2], tf1[s][("weight", f"{name}:0")][2], atol=1e-6
            )
        assert (np.abs(want[1] - port[1]).max() > 1e-4) == (before or count_before or not warm_up)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    if warm_up and not before and not count_before:
        assert report.agree, report.first_divergence
        return
    first = report.first_divergence
    assert (first.step, first.kind) == (1, "state") and first.tensor.endswith("/ExponentialMovingAverage:0"), first
    if before:
        assert "'tf2' averaged the weight read at step 0, before that step's update" in first.note, first.note
        assert "decay" not in first.note, first.note
        return
    assert f"keeping {CAPPED[0]:.4g} ('tf1') and {decays[0]:.4g} ('tf2')" in first.note, first.note
    assert "in 'tf1' 0.1818 is (1 + 1) / (10 + 1)" in first.note, first.note
    if count_before:
        assert "and in 'tf2' 0.1 is (1 + 0) / (10 + 0): both cap it so, from step counts one apart" in first.note
    else:
        assert "the other run has no such warm-up" in first.note, first.note


def _tf1_batch_norm_ema(run_dir: str) -> tuple[list[dict], dict]:
    """TF1's documented idioms together: batch norm's updates through ``UPDATE_OPS`` around
    ``rec.minimize``, then ``ExponentialMovingAverage.apply`` under the train op's control
    dependencies, on ``placeholder([None, D])``. Returns what ``sess.run`` read of every variable
    before each step, and the variables by name."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.float32, [None, C])
        h = tf.compat.v1.layers.dense(x, H, kernel_initializer=tf.constant_initializer(W1), name="dense")
        h = tf.nn.relu(tf.compat.v1.layers.batch_normalization(h, training=True, name="bn1"))
        logits = tf.compat.v1.layers.dense(h, C, kernel_initializer=tf.constant_initializer(W2), name="dense_1")
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        opt = tf.compat.v1.train.MomentumOptimizer(LR, 0.9)
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = rec.minimize(opt, loss, global_step=gs)
        with tf.control_dependencies([train_op]):
            train_op = tf.compat.v1.train.ExponentialMovingAverage(DECAY).apply(tf.compat.v1.trainable_variables())
        rec.variables(optimizer=opt)
        fetches = rec.fetches
        variables = {v.name: v for v in tf.compat.v1.global_variables() if v is not gs}
        seen = []
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())  # raised FailedPreconditionError (bn1/moving_mean)
            for s in range(STEPS):
                seen.append(sess.run(variables))
                rows = slice(s * BATCH, (s + 1) * BATCH)
                rec.write(sess.run([train_op, fetches], {x: X[rows], y: Y[rows]})[1])
        rec.close()
    return seen, variables


def test_batch_norm_updates_then_ema_under_the_train_op_initialise_and_log_each_steps_start(tmp_path) -> None:
    """A new user's TF1 script crashed in ``global_variables_initializer()`` with the recorder
    (``Could not find variable bn1/moving_mean``), not without: ``rec.minimize``'s weight reads
    took the user's ``control_dependencies(UPDATE_OPS)``, and the recorder ordered the shadows'
    ``initialized_value`` conds (``If`` ops that only read the weights) after those reads, so the
    initializer ran batch norm's update first. Every logged variable is the value ``sess.run`` read
    before the step, and the averages follow numpy's recursion on the logged weights."""
    seen, variables = _tf1_batch_norm_ema(str(tmp_path / "tf1"))
    logged = tensors_by_step(str(tmp_path / "tf1"))
    assert sorted(logged) == list(range(STEPS))
    kinds = {name: kind for kind, name in logged[0] if kind in ("weight", "state", "slot")}
    shadows = [n for n in variables if n.endswith("/ExponentialMovingAverage:0")]
    assert len(shadows) == 6 and {"bn1/moving_mean:0", "bn1/moving_variance:0", *shadows} <= {
        n for n, k in kinds.items() if k == "state"
    }
    for s in range(STEPS):
        for name, kind in kinds.items():
            if kind != "slot":
                np.testing.assert_array_equal(logged[s][(kind, name)][2], seen[s][name], err_msg=f"{name} at {s}")
    for name in ("dense/kernel", "dense/bias", "bn1/gamma", "bn1/beta", "dense_1/kernel", "dense_1/bias"):
        want = _numpy_averages(logged, name, DECAY)
        for s in range(STEPS):
            np.testing.assert_allclose(
                logged[s][("state", f"{name}/ExponentialMovingAverage:0")][2], want[s], atol=1e-6
            )
    # the moving statistics moved: batch norm's updates ran once per step, after the logged read
    assert not np.allclose(seen[1]["bn1/moving_mean:0"], seen[0]["bn1/moving_mean:0"])


def test_weights_replaced_by_their_averages_at_the_end_of_a_fit_call_are_named_so(tmp_path) -> None:
    """A trial's port called ``fit`` once per evaluation interval, ``ema_overwrite_frequency=None``:
    each ``fit`` ends with ``finalize_variable_values``, which replaces the weights by their averages,
    and the note named only ``ema_overwrite_frequency``, which the port did not set. Numpy: the port's
    weights equal its own recorded averages at the second call's first step, agree with the
    original's before it, and are out of tolerance of them there."""
    _tf1(str(tmp_path / "tf1"), 0.9)
    _keras(str(tmp_path / "tf2"), 0.9, DECAY, fits=2)
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    step, kernel = STEPS // 2, "dense/kernel"
    for s in range(step):
        np.testing.assert_allclose(
            tf2[s][("weight", f"{kernel}:0")][2], tf1[s][("weight", f"{kernel}:0")][2], atol=1e-6
        )
    np.testing.assert_array_equal(tf2[step][("weight", f"{kernel}:0")][2], tf2[step][("state", f"average/{kernel}")][2])
    assert np.abs(tf2[step][("weight", f"{kernel}:0")][2] - tf1[step][("weight", f"{kernel}:0")][2]).max() > 1e-3
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind) == (step, "weight"), first
    assert "'tf2' replaced its weights by their averages" in first.note, first.note
    assert (
        "a model.fit call ended before this step: with use_ema, fit ends with optimizer.finalize_variable_values"
        in (first.note)
    ), first.note


def test_a_weight_an_lr_of_0_left_equal_to_its_average_is_not_said_replaced() -> None:
    """A review's: BERT's warm-up gives TF1 an lr of 0 at step 0, the port's warm-up is one step
    off; both keep an average that starts at the weight. At step 1 the TF1 weight has not moved and
    equals its average (numpy), though nothing replaced it: no such note."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    grads = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]

    def train(lrs: list) -> tuple[list, list]:
        w, avg, ws, avgs = w0.copy(), w0.copy(), [], []
        for k in range(4):
            ws.append(w.copy())
            avgs.append(avg.copy())
            w = (w - np.float32(lrs[k]) * grads[k]).astype(np.float32)
            avg = (avg - np.float32(1 - DECAY) * (avg - w)).astype(np.float32)
        return ws, avgs

    (bw, ba), (cw, ca) = train([0.0, 0.01, 0.02, 0.03]), train([0.01, 0.02, 0.03, 0.04])
    assert np.array_equal(bw[1], ba[1]) and np.array_equal(bw[1], bw[0]) and not np.array_equal(cw[1], ca[1])
    tensors = [
        [
            series("weight", "dense/kernel:0", w),
            series("state", name, a, order=1),
            series("grad", "dense/kernel:0", grads, order=2),
        ]
        for w, a, name in ((bw, ba, "dense/kernel/ExponentialMovingAverage:0"), (cw, ca, "average/dense/kernel"))
    ]
    first = Comparison(run("tf1", tensors[0]), run("tf2", tensors[1])).report().first_divergence
    assert (first.step, first.kind) == (1, "weight"), first
    assert "replaced its weights by their averages" not in (first.note or ""), first.note


_KERAS3_USE_EMA = """
import sys
import numpy as np
import keras
assert keras.__version__.startswith("3"), keras.__version__
from tb_parity_plugin import summary_v2
data = np.load(sys.argv[2])
model = keras.Sequential(
    [keras.Input((data["X"].shape[1],)), keras.layers.Dense(data["W1"].shape[1], "tanh", name="dense"),
     keras.layers.Dense(data["W2"].shape[1], name="dense_1")]
)
model.get_layer("dense").kernel.assign(data["W1"])
model.get_layer("dense_1").kernel.assign(data["W2"])
opt = keras.optimizers.SGD(float(data["lr"]), momentum=0.9, use_ema=True, ema_momentum=float(data["decay"]))
model.compile(opt, keras.losses.CategoricalCrossentropy(from_logits=True))
rec = summary_v2.Recorder(sys.argv[1])
summary_v2.instrument(model, rec)
model.fit(data["X"], data["Y"], batch_size=int(data["batch"]), epochs=1, shuffle=False, verbose=0)
rec.close()
"""


def test_keras_3_averages_that_start_at_zeros_are_named_so(tmp_path) -> None:
    """Keras 3's ``use_ema`` builds its averages as zeros and takes the weight whole at its first update
    (``ema_momentum`` times ``iterations != 0``); TF1's shadows start at the weight. A trial's port
    diverged at step 0 on the kernels' averages with no note. Numpy on the logged values: the port's
    average is 0 at step 0 and its weight at step 1, TF1's the weight at step 0."""
    from keras3_process import run_keras3

    _tf1(str(tmp_path / "tf1"), 0.9)
    script, arrays = tmp_path / "port.py", tmp_path / "data.npz"
    script.write_text(_KERAS3_USE_EMA)
    np.savez(arrays, X=X, Y=Y, W1=W1, W2=W2, lr=LR, decay=DECAY, batch=BATCH)
    run_keras3([str(script), str(tmp_path / "tf2"), str(arrays)])
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    averages = {kind_name[1]: kind_name for kind_name in tf2[0] if kind_name[0] == "state"}
    port = averages["sequential/dense/kernel/average"]
    np.testing.assert_array_equal(tf2[0][port][2], 0)
    np.testing.assert_allclose(tf2[1][port][2], tf2[1][("weight", "sequential/dense/kernel")][2], atol=1e-7)
    np.testing.assert_array_equal(tf1[0][("state", "dense/kernel/ExponentialMovingAverage:0")][2], W1)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "state", "dense/kernel/ExponentialMovingAverage:0"), first
    assert "'tf2' holds 0 at every element and 'tf1' the weight's own value" in first.note, first.note
    assert "Keras 3's use_ema builds its averages as zeros" in first.note, first.note
