"""Fine-tuning with a frozen part: TF1 trains the head through ``minimize(loss, var_list=head)``, the
Keras port sets ``base.trainable = False`` (the guides' transfer learning). Keras's optimizer keeps
slots for what it trains, the head; TF1's likewise. The recorder built and recorded the optimizer's
slots for every variable whose ``tf.Variable.trainable`` flag is set, frozen ones included: the
faithful port had slots TF1 has not (a structure DIVERGE) and its optimizer got slots it never uses.
Checked against a float64 numpy replay (Momentum, MSE)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(11)
X = RNG.standard_normal((12, 3)).astype(np.float32)
Y = RNG.standard_normal((12, 2)).astype(np.float32)
W_BASE = (RNG.standard_normal((3, 4)) * 0.5).astype(np.float32)  # the "pretrained" base
W_HEAD = (RNG.standard_normal((4, 2)) * 0.5).astype(np.float32)
BATCH, STEPS, LR, MOMENTUM = 4, 3, 0.1, 0.9


def numpy_replay() -> list[dict]:
    """The head's kernel and momentum accumulator as read at each step's start, in float64; the base
    never moves (no biases, MSE)."""
    head, accum, out = W_HEAD.astype(np.float64), np.zeros(W_HEAD.shape), []
    for s in range(STEPS):
        x, y = X[s * BATCH : (s + 1) * BATCH].astype(np.float64), Y[s * BATCH : (s + 1) * BATCH]
        out.append({"head": head.copy(), "accum": accum.copy()})
        h = x @ W_BASE
        accum = MOMENTUM * accum + h.T @ (2 * (h @ head - y) / y.size)
        head = head - LR * accum
    return out


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 2])
        h = tf.compat.v1.layers.dense(
            x, 4, use_bias=False, name="base", kernel_initializer=tf.constant_initializer(W_BASE)
        )
        out = tf.compat.v1.layers.dense(
            h, 2, use_bias=False, name="head", kernel_initializer=tf.constant_initializer(W_HEAD)
        )
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM)
        train_op = rec.minimize(opt, loss, global_step=gs, var_list=tf.compat.v1.trainable_variables("head"))
        rec.variables(optimizer=opt)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                feed = {x: X[s * BATCH : (s + 1) * BATCH], y: Y[s * BATCH : (s + 1) * BATCH]}
                rec.write(sess.run([train_op, fetches], feed)[1])
        rec.close()


def _fit(run_dir: str) -> tf.keras.optimizers.Optimizer:
    base = tf.keras.layers.Dense(4, use_bias=False, name="base", kernel_initializer=tf.constant_initializer(W_BASE))
    head = tf.keras.layers.Dense(2, use_bias=False, name="head", kernel_initializer=tf.constant_initializer(W_HEAD))
    model = tf.keras.Sequential([tf.keras.Input((3,)), base, head])
    base.trainable = False
    optimizer = tf.keras.optimizers.SGD(LR, momentum=MOMENTUM)
    model.compile(optimizer=optimizer, loss="mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()
    return optimizer


def test_a_frozen_layer_has_no_slot_recorded_or_built_and_the_faithful_port_agrees(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    optimizer = _fit(str(tmp_path / "tf2"))
    # the port's optimizer keeps what Keras gives it: a momentum for the head's kernel alone
    assert sorted(v.name for v in optimizer.variables if "kernel" in v.name) == ["m/head/kernel:0"], [
        v.name for v in optimizer.variables
    ]
    recorded = tensors_by_step(str(tmp_path / "tf2"))
    for step, ref in enumerate(numpy_replay()):
        got = recorded[step]
        assert sorted(name for kind, name in got if kind == "slot") == ["m/head/kernel"], sorted(got)
        np.testing.assert_allclose(np.ravel(got[("weight", "base/kernel:0")][2]), W_BASE.ravel(), rtol=0, atol=0)
        np.testing.assert_allclose(
            np.ravel(got[("weight", "head/kernel:0")][2]), ref["head"].ravel(), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            np.ravel(got[("slot", "m/head/kernel")][2]), ref["accum"].ravel(), rtol=1e-5, atol=1e-6
        )
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.to_dict()["verdict_text"]


def _tf1_second_phase(run_dir: str) -> None:
    """The head trained by a first MomentumOptimizer for STEPS steps, then by a second one at LR / 2 for
    STEPS more; the second phase recorded on a recorder of its own, fetched with its train op."""
    with tf.Graph().as_default():
        first = summary_v1.Recorder(run_dir + "_unused")
        second = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 2])
        out = tf.compat.v1.layers.dense(
            x @ W_BASE, 2, use_bias=False, name="head", kernel_initializer=tf.constant_initializer(W_HEAD)
        )
        model_vars = tf.compat.v1.trainable_variables()
        loss = second.loss(first.loss(tf.compat.v1.losses.mean_squared_error(y, out)))
        ops = []
        for rec, lr in ((first, LR), (second, LR / 2)):
            rec.lr(tf.constant(lr))
            opt = tf.compat.v1.train.MomentumOptimizer(lr, MOMENTUM)
            ops.append(rec.minimize(opt, loss, global_step=gs))
            rec.variables(model_vars, optimizer=opt)
        fetches = [first.fetches, second.fetches]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(2 * STEPS):
                j = s % STEPS
                feed = {x: X[j * BATCH : (j + 1) * BATCH], y: Y[j * BATCH : (j + 1) * BATCH]}
                (first, second)[s // STEPS].write(sess.run([ops[s // STEPS], fetches[s // STEPS]], feed)[1])
        first.close()
        second.close()


def _fit_second_phase(run_dir: str, same_optimizer: bool) -> None:
    """The port: fit, then compile again at LR / 2 with a new SGD (or model.optimizer, its slots kept),
    the second phase instrumented onto a recorder of its own, numbered on from the first."""
    head = tf.keras.layers.Dense(2, use_bias=False, name="head", kernel_initializer=tf.constant_initializer(W_HEAD))
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Lambda(lambda t: t @ W_BASE), head])
    model.compile(optimizer=tf.keras.optimizers.SGD(LR, momentum=MOMENTUM), loss="mse")
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    if same_optimizer:
        optimizer = model.optimizer
        optimizer.learning_rate.assign(LR / 2)
    else:
        optimizer = tf.keras.optimizers.SGD(LR / 2, momentum=MOMENTUM)
        optimizer.iterations.assign(STEPS)
    model.compile(optimizer=optimizer, loss="mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def test_a_second_phase_that_keeps_the_first_optimizers_slots_is_named_at_its_first_step(tmp_path) -> None:
    """TF1's second optimizer starts its slots at 0, and so does a Keras compile with a new optimizer:
    that port agrees. Compiled again with model.optimizer, the port carries the first phase's momentum
    over (numpy: the phase's accumulator, in Keras's lr units times LR / (LR / 2)), found at the second
    phase's first step on the slot, with a note that names the optimizer carried over."""
    _tf1_second_phase(str(tmp_path / "runs" / "tf1"))
    _fit_second_phase(str(tmp_path / "runs" / "new"), same_optimizer=False)
    _fit_second_phase(str(tmp_path / "runs" / "kept"), same_optimizer=True)
    accum = numpy_replay()[-1]["accum"]  # read before the last step of phase 1: one more update
    x, y = X[-BATCH:].astype(np.float64), Y[-BATCH:]
    h, head = x @ W_BASE, numpy_replay()[-1]["head"]
    accum = MOMENTUM * accum + h.T @ (2 * (h @ head - y) / y.size)
    tf1, kept = tensors_by_step(str(tmp_path / "runs" / "tf1")), tensors_by_step(str(tmp_path / "runs" / "kept"))
    np.testing.assert_array_equal(np.ravel(tf1[STEPS][("slot", "head/kernel/Momentum_1:0")][2]), 0.0)
    np.testing.assert_allclose(np.ravel(kept[STEPS][("slot", "m/head/kernel")][2]), 2 * accum.ravel(), rtol=1e-5)
    report = compare(str(tmp_path / "runs"), baseline="tf1", candidate="new")
    assert report.agree, report.to_dict()["verdict_text"]
    first = compare(str(tmp_path / "runs"), baseline="tf1", candidate="kept").first_divergence
    assert first is not None and (first.step, first.kind) == (STEPS, "slot"), first
    assert "every element is 0 in the baseline at the first step both runs logged" in first.note, first.note
    assert "the candidate carries one over" in first.note, first.note


def test_a_layer_left_out_of_the_frozen_set_is_told_it_is_trained_in_one_run_only(tmp_path) -> None:
    """TF1 trains the head alone (var_list); the port forgot base.trainable = False, so fit trains the
    base too. Its kernel diverges at step 1 (numpy: TF1's still the pretrained one, the port's moved by
    lr times its first gradient); the note says which run left it unchanged and that one run trains it."""
    _tf1(str(tmp_path / "tf1"))
    base = tf.keras.layers.Dense(4, use_bias=False, name="base", kernel_initializer=tf.constant_initializer(W_BASE))
    head = tf.keras.layers.Dense(2, use_bias=False, name="head", kernel_initializer=tf.constant_initializer(W_HEAD))
    model = tf.keras.Sequential([tf.keras.Input((3,)), base, head])
    model.compile(optimizer=tf.keras.optimizers.SGD(LR, momentum=MOMENTUM), loss="mse")
    rec = summary_v2.Recorder(str(tmp_path / "unfrozen"))
    summary_v2.instrument(model, rec)
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()
    x, y = X[:BATCH].astype(np.float64), Y[:BATCH]
    grad = x.T @ ((2 * (x @ W_BASE @ W_HEAD - y) / y.size) @ W_HEAD.T)
    tf1, unfrozen = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "unfrozen"))
    np.testing.assert_array_equal(np.ravel(tf1[1][("weight", "base/kernel:0")][2]), W_BASE.ravel())
    moved = np.ravel(unfrozen[1][("weight", "base/kernel:0")][2])
    np.testing.assert_allclose(moved, (W_BASE - LR * grad).ravel(), rtol=1e-5, atol=1e-6)
    report = compare(
        str(tmp_path), baseline="tf1", candidate="unfrozen", allow_unmatched=["grad/base/*", "slot/m/base/*"]
    )
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "weight", "base/kernel:0"), first
    assert "'tf1' left it unchanged from step 0 to step 1 where 'unfrozen' updated it" in first.note, first.note
    assert "one run trains this variable and the other does not" in first.note, first.note


W_A = (RNG.standard_normal((4, 4)) * 0.5).astype(np.float32)  # two pretrained layers of one shape
W_B = (RNG.standard_normal((4, 4)) * 0.5).astype(np.float32)


def _two_layers_tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        y = tf.compat.v1.placeholder(tf.float32, [None, 4])
        h = tf.compat.v1.layers.dense(x, 4, use_bias=False, name="l1", kernel_initializer=tf.constant_initializer(W_A))
        out = tf.compat.v1.layers.dense(
            tf.nn.relu(rec.activation("l1", h)),
            4,
            use_bias=False,
            name="l2",
            kernel_initializer=tf.constant_initializer(W_B),
        )
        rec.activation("l2", out)
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        rec.variables()
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(2):
                feed = {x: np.tile(X[s * BATCH : (s + 1) * BATCH], (1, 2))[:, :4], y: np.tile(Y[:BATCH], (1, 2))}
                rec.write(sess.run([train_op, fetches], feed)[1])
        rec.close()


def _two_layers_port(run_dir: str, kernels: tuple) -> None:
    model = tf.keras.Sequential(
        [
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(4, use_bias=False, name="l1"),
            tf.keras.layers.ReLU(),
            tf.keras.layers.Dense(4, use_bias=False, name="l2"),
        ]
    )
    for name, kernel in zip(("l1", "l2"), kernels):
        model.get_layer(name).set_weights([kernel])
    rec = summary_v2.Recorder(run_dir)
    opt = tf.keras.optimizers.SGD(LR)
    loss_fn = tf.keras.losses.MeanSquaredError()
    for s in range(2):
        x = np.tile(X[s * BATCH : (s + 1) * BATCH], (1, 2))[:, :4]
        with rec.step(s, variables=model):
            with tf.GradientTape() as tape:
                h = rec.activation("l1", model.get_layer("l1")(tf.constant(x)))
                out = rec.activation("l2", model.get_layer("l2")(model.layers[1](h)))
                loss = rec.loss(loss_fn(np.tile(Y[:BATCH], (1, 2)), out))
            rec.minimize(opt, loss, model.trainable_variables, tape)
    rec.close()


def test_pretrained_weights_loaded_into_the_wrong_layers_of_one_shape_are_named_swapped(tmp_path) -> None:
    """The port maps the checkpoint's two 4x4 kernels crosswise (l1 gets l2's), outputs recorded (which
    keep the layers paired by name: alignment): both diverge at step 0 (numpy: each is exactly the
    other's), with a note saying the two are swapped (there was none); loaded right it agrees."""
    _two_layers_tf1(str(tmp_path / "tf1"))
    _two_layers_port(str(tmp_path / "right"), (W_A, W_B))
    _two_layers_port(str(tmp_path / "crossed"), (W_B, W_A))
    crossed = tensors_by_step(str(tmp_path / "crossed"))
    np.testing.assert_array_equal(np.ravel(crossed[0][("weight", "l1/kernel:0")][2]), W_B.ravel())
    np.testing.assert_array_equal(np.ravel(crossed[0][("weight", "l2/kernel:0")][2]), W_A.ravel())
    assert compare(str(tmp_path), baseline="tf1", candidate="right").agree
    first = compare(str(tmp_path), baseline="tf1", candidate="crossed").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "weight", "l1/kernel:0"), first
    assert "the candidate's values are the baseline's weight/l2/kernel:0 at this step" in first.note, first.note
    assert "the two are swapped" in first.note, first.note


def test_a_gradient_one_run_computed_without_applying_it_is_told_so() -> None:
    """A two-phase schedule recorded on one recorder a side: TF1 fetched the base's gradient in the
    head-only phase, Keras computed none, and the step-0 divergence said only "logged by the baseline
    only at this step". Where neither run moved the weight, the note says the gradient was not
    applied and how to record such a schedule; where the baseline did move it, it says nothing of it.
    Numpy series: the base weight held still for 6 steps in both runs, then moved alike."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    rng = np.random.default_rng(0)
    w, h = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((2, 1)).astype(np.float32)
    gw = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(12)]
    gh = [rng.standard_normal((2, 1)).astype(np.float32) for _ in range(12)]
    heads = [h - np.float32(0.01 * s) for s in range(12)]

    def side(name: str, grad_steps: list[int], bases: list[np.ndarray]) -> object:
        return run(
            name,
            [
                series("weight", "base/kernel:0", bases, order=0),
                series("weight", "head/kernel:0", heads, order=1),
                series("grad", "base/kernel:0", [gw[s] for s in grad_steps], steps=grad_steps, order=2),
                series("grad", "head/kernel:0", gh, order=3),
            ],
        )

    still = [w] * 7 + [w - np.float32(0.01 * (s + 1)) for s in range(5)]
    assert np.array_equal(still[0], still[1]) and not np.array_equal(still[6], still[7])
    first = Comparison(side("tf1", list(range(12)), still), side("tf2", list(range(6, 12)), still)).report()
    found = first.first_divergence
    assert found is not None and (found.step, found.kind, found.reason) == (0, "grad", "missing"), found
    assert "neither run moved weight/base/kernel:0 from step 0 to step 1" in (found.note or ""), found.note
    assert "recorder of its own" in found.note
    moved = [w - np.float32(0.01 * s) for s in range(12)]  # the baseline trains it: another matter
    other = Comparison(side("tf1", list(range(12)), moved), side("tf2", list(range(6, 12)), still)).report()
    assert other.first_divergence is not None and "neither run moved" not in (other.first_divergence.note or "")
