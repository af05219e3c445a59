"""TF1 shim: Session loop and MonitoredTrainingSession hook, read back from disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from shim_readback import check_with_reader, load_with_tensorboard, logged_value, tensors_by_step

from tb_parity_plugin import summary_v1
from tb_parity_plugin.records import health, metadata

X = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1, 2, 0, 1]]
W0 = np.random.default_rng(2).standard_normal((3, 3)).astype(np.float32)
LR = 0.5


def _graph(rec: summary_v1.Recorder, use_resource: bool):
    """A linear softmax model; returns (train_op, global_step, kernel)."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=W0, use_resource=use_resource)
    b = tf.compat.v1.get_variable("b", initializer=np.zeros(3, np.float32), use_resource=use_resource)
    logits = rec.activation("logits", tf.matmul(tf.constant(X), w) + b)
    loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), logits))
    rec.lr(tf.constant(LR))
    train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
    return train_op, gs, w


@pytest.mark.parametrize("use_resource", [True, False])
def test_session_loop_logs_weights_before_update(tmp_path, use_resource: bool) -> None:
    run = tmp_path / "tf1"
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(run))
        train_op, _, w = _graph(rec, use_resource)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(4):
                _, parity = sess.run([train_op, rec.fetches])
                rec.write(parity)
            final_w = sess.run(w)
        rec.close()

    got = tensors_by_step(str(run))
    assert sorted(got) == [0, 1, 2, 3]
    name = w.name
    np.testing.assert_array_equal(got[0][("weight", name)][2], W0)
    for k in range(4):
        wk, gk = got[k][("weight", name)][2], got[k][("grad", name)][2]
        nxt = got[k + 1][("weight", name)][2] if k < 3 else final_w
        np.testing.assert_allclose(nxt, wk - LR * gk, rtol=1e-6, atol=1e-7)
        for _spec, row, values in got[k].values():
            np.testing.assert_allclose(row, health.health_numpy(values), rtol=1e-6, atol=1e-7)
    # execution order: lr, weights, activation, loss, grads
    kinds = [s.kind for s in sorted((v[0] for v in got[0].values()), key=lambda s: s.order)]
    assert kinds == ["lr", "weight", "weight", "activation", "loss", "grad", "grad"]

    data = load_with_tensorboard(str(run))
    assert data["info"]["side"] == "tf1" and data["info"]["mode"] == "graph"
    assert data["plugins"][metadata.SCALAR_TAGS["lr"]] == "scalars"
    assert float(data["steps"][2][metadata.SCALAR_TAGS["lr"]]) == LR
    loss2 = got[2][("loss", "loss")][2]
    assert float(data["steps"][2][metadata.SCALAR_TAGS["loss"]]) == pytest.approx(float(loss2))
    check_with_reader(str(tmp_path), "tf1", got)


@pytest.mark.parametrize("use_resource", [True, False])
def test_an_update_built_after_recording_is_ordered_only_if_fetches_is_read_before_the_session(
    tmp_path, use_resource: bool
) -> None:
    """A user who records the weights, then builds the update with the optimizer's own
    ``minimize`` (not the recorder's), and reads ``rec.fetches`` first inside the loop after
    ``sess.run(init)``: the edge ordering the update after the read would be added to an op the
    session has already run, which TensorFlow ignores (weights were then logged after the update
    in about one step in six, a false divergence). That now raises, naming the fix; reading
    ``fetches`` before the session logs the weights before each update (checked with numpy:
    ``w[s+1] == w[s] - lr * g[s]``)."""

    def build(rec: summary_v1.Recorder):
        w = tf.compat.v1.get_variable("w", initializer=W0, use_resource=use_resource)
        logits = tf.matmul(tf.constant(X), w)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), logits))
        rec.weights([w])
        rec.grads(tf.gradients(loss, [w]), [w])
        return tf.compat.v1.train.GradientDescentOptimizer(LR).minimize(loss), w

    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "late"))
        train_op, _ = build(rec)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(ValueError, match="a session has already run the graph.*fetches = rec.fetches"):
                sess.run([train_op, rec.fetches])
        rec.close()

    run = tmp_path / "early"
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(run))
        train_op, w = build(rec)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(6):
                _, parity = sess.run([train_op, fetches])
                rec.write(parity, step=step)
            final_w = sess.run(w)
        rec.close()
    got = tensors_by_step(str(run))
    for k in range(6):
        wk, gk = got[k][("weight", w.name)][2], got[k][("grad", w.name)][2]
        nxt = got[k + 1][("weight", w.name)][2] if k < 5 else final_w
        np.testing.assert_allclose(nxt, wk - LR * gk, rtol=1e-6, atol=1e-7)


def test_a_gradient_recorded_apart_from_the_train_op_reads_ref_weights_before_their_update(tmp_path) -> None:
    """Legacy ref variables (``disable_v2_behavior``'s default) are read through an Identity that
    aliases the buffer the update writes in place. A gradient recorded from its own
    ``tf.gradients`` call, apart from the train op's, is not an input of the update, so its
    backward pass could read the second layer's kernel after that kernel's update: about one
    step in six logged a gradient the update never used. The recorder orders each in-place update
    after such reads; checked in the graph, and with numpy: ``w[s+1] == w[s] - lr * g[s]``. A
    write the user runs on its own (a reset) is left alone: it must not come to need the feed."""
    run = tmp_path / "tf1"
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(run))
        x = tf.compat.v1.placeholder(tf.float32, (None, 3))
        w1 = tf.compat.v1.get_variable("w1", initializer=W0, use_resource=False)
        w2 = tf.compat.v1.get_variable("w2", initializer=W0.T.copy(), use_resource=False)
        reset = w2.assign(W0.T.copy())
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), logits))
        rec.weights([w1, w2])
        grads = tf.gradients(loss, [w1, w2])  # a backward pass of its own, not the train op's
        rec.grads(grads, [w1, w2])
        train_op = tf.compat.v1.train.GradientDescentOptimizer(LR).minimize(loss)
        fetches = rec.fetches
        update_w2 = next(op for op in train_op.control_inputs if "w2" in op.name)
        w2_read = w2.value().op
        readers = [c for c in w2_read.outputs[0].consumers() if c.name.startswith("gradients/")]
        assert readers and all(r in update_w2.control_inputs for r in readers)
        assert not any(r in reset.op.control_inputs for r in readers)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(8):
                _, parity = sess.run([train_op, fetches], {x: X})
                rec.write(parity, step=step)
            final = sess.run(w2)
            sess.run(reset)  # on its own, no feed
            np.testing.assert_array_equal(sess.run(w2), W0.T)
        rec.close()
    assert not np.array_equal(final, W0.T)
    got = tensors_by_step(str(run))
    for k in range(7):
        for name in (w1.name, w2.name):
            wk, gk = got[k][("weight", name)][2], got[k][("grad", name)][2]
            np.testing.assert_allclose(got[k + 1][("weight", name)][2], wk - LR * gk, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("switch", ["disable_v2_behavior", "--control-flow-v1"])
def test_batch_norm_statistics_updated_inside_a_v1_cond_are_logged_before_the_update(tmp_path, switch: str) -> None:
    """Under ``disable_v2_behavior()`` (or control flow v1 alone) ``batch_normalization(training=
    <placeholder>)`` updates its moving statistics inside a v1 ``cond``: the ``AssignSub`` takes the
    variable through a ``(Ref)Switch``, not directly, and the shim did not order it after its read.
    A new user's faithful port then diverged on ``moving_mean`` (logged after the update at every
    step of a 60-step run on one thread; a race, so a short run may not show it). The script checks
    in the graph that the update waits for a read feeding the recorder, and reads the variable
    itself before each step (numpy compares)."""
    script = os.path.join(os.path.dirname(__file__), "v1_behavior_bn.py")
    args = [sys.executable, script, str(tmp_path / "tf1")] + ([switch] if switch.startswith("--") else [])
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=300, env={**os.environ, "TF_USE_LEGACY_KERAS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["resource"] == (switch != "disable_v2_behavior")  # ref variables under disable_v2_behavior
    assert found["updates_ordered_after_the_read"] == [True], found  # one update, after the recorder's read
    logged, read = np.array(found["logged"]), np.array(found["read"])
    assert not np.allclose(read[0], read[-1])  # the statistics move: a post-update value would show
    np.testing.assert_array_equal(logged, read)


def test_a_recorder_created_after_the_session_ran_refuses_to_log_weights_it_cannot_order(tmp_path) -> None:
    """Adding the recorder to a script whose session already ran (init, a first evaluation): the
    edges ordering the existing train op after the recorder's reads would be ignored, and a
    reviewer's run logged 59 of 236 weights after their update. It raises, naming the fix."""
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=W0)
        loss = tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), tf.matmul(tf.constant(X), w))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(LR).minimize(loss, global_step=gs)
        sess = tf.compat.v1.Session()  # not the default session: nothing but the graph knows it ran
        sess.run(tf.compat.v1.global_variables_initializer())
        rec = summary_v1.Recorder(str(tmp_path / "late"))
        with pytest.raises(ValueError, match="a session has already run the graph.*Create the recorder"):
            rec.set_step(gs)
            rec.weights([w])
        sess.close()
        rec.close()
    del train_op


def test_monitored_session_hook(tmp_path) -> None:
    run = tmp_path / "hook"
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(run), full_values_limit=4)
        train_op, gs, w = _graph(rec, True)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[summary_v1.ParityHook(rec)]) as sess:
            for _ in range(3):
                sess.run(train_op)
        rec.close()
    got = tensors_by_step(str(run))
    assert sorted(got) == [0, 1, 2]
    spec, row, values = got[0][("weight", w.name)]
    assert values is None  # 9 elements > limit 4: statistics only
    np.testing.assert_allclose(row, health.health_numpy(W0), rtol=1e-6)
    assert got[0][("weight", "b:0")][2] is not None  # 3 elements: full values


def _numpy_sgd(xs: list, steps: int) -> tuple[list, list]:
    """numpy: weights before each SGD step and each step's loss, linear softmax on ``xs[step]``."""
    w, b, ws, losses = W0.astype(np.float64), np.zeros(3), [], []
    for s in range(steps):
        z = xs[s] @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        ws.append(w.copy())
        losses.append(float(-np.mean(np.sum(Y * np.log(p), axis=1))))
        dz = (p - Y) / len(Y)
        w, b = w - LR * xs[s].T @ dz, b - LR * dz.sum(0)
    return ws, losses


@pytest.mark.parametrize("with_global_step", [True, False])
def test_monitored_session_hook_skips_evaluation_runs(tmp_path, with_global_step: bool) -> None:
    """A new user's TF1 loop ran ``sess.run(loss)`` on a validation batch every few steps in the same
    ``MonitoredTrainingSession``: the hook wrote every run, so without a global step each evaluation
    shifted the later step numbers by one (a false divergence blamed on "another batch"), and with
    one the validation batch overwrote the step's. A run that writes no recorded variable is not a
    step; numpy below gives each step's weights and training loss."""
    xs = [X + 0.1 * k for k in range(5)]
    held_out = X[::-1].copy()
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "hook"))
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=W0)
        b = tf.compat.v1.get_variable("b", initializer=np.zeros(3, np.float32))
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), tf.matmul(x, w) + b))
        train_op = rec.minimize(
            tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs if with_global_step else None
        )
        rec.weights([w])
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[summary_v1.ParityHook(rec)]) as sess:
            for k in range(5):
                sess.run(train_op, {x: xs[k]})
                sess.run(loss, {x: held_out})  # an evaluation: trains nothing
        rec.close()
    got = tensors_by_step(str(tmp_path / "hook"))
    assert sorted(got) == [0, 1, 2, 3, 4]
    ws, losses = _numpy_sgd([v.astype(np.float64) for v in xs], 5)
    for k in range(5):
        np.testing.assert_allclose(got[k][("weight", w.name)][2].reshape(3, 3), ws[k], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(got[k][("loss", "loss")][2]), losses[k], rtol=1e-5)


def _placeholders_and_weight() -> tuple[Any, Any, Any, Any]:
    """In the default graph: ``x`` of ``[None, 3]``, an ``is_training`` placeholder, the global step
    and a weight ``w`` starting at ``W0``."""
    x = tf.compat.v1.placeholder(tf.float32, [None, 3])
    is_training = tf.compat.v1.placeholder(tf.bool, [])
    gs = tf.compat.v1.train.get_or_create_global_step()
    return x, is_training, gs, tf.compat.v1.get_variable("w", initializer=W0)


def _train_and_evaluate(rec: Any, train_op: Any, loss: Any, feeds: tuple, variables: dict, xs: list) -> tuple:
    """One training run per batch of ``xs`` through a ``ParityHook``, each after a run that only
    reads ``variables`` and before an evaluation (``feeds``: the input and ``is_training``
    placeholders); the recorder closed. Returns what each read gave, the training losses, the
    evaluations' losses and the variables at the end."""
    x, is_training = feeds
    seen, losses, evaluations = [], [], []
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[summary_v1.ParityHook(rec)]) as sess:
        for batch in xs:
            seen.append(sess.run(variables))  # a run that reads: no step either
            losses.append(sess.run([train_op, loss], {x: batch, is_training: True})[1])
            evaluations.append(sess.run(loss, {x: X[::-1], is_training: False}))
        final = sess.run(variables)
    rec.close()
    return seen, losses, evaluations, final


@pytest.mark.parametrize("with_global_step", [True, False])
def test_the_hook_leaves_out_evaluations_through_a_batch_norm_on_an_is_training_placeholder(
    tmp_path, with_global_step: bool
) -> None:
    """With TF2 behaviour, ``batch_normalization(training=is_training)`` builds an ``If``
    (``bn1/cond``) that takes gamma, beta and the moving statistics' handles to read them in either
    branch; the hook counted it as an update, so each evaluation ``sess.run(loss, {is_training:
    False})`` was written as a training step: a faithful pair got INCOMPLETE, an eval-mode extra
    step blamed on gradient accumulation. Exactly the training runs are steps, each with the loss
    and the variables ``sess.run`` gave for it."""
    steps = 4
    xs = [X + 0.1 * k for k in range(steps)]
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "hook"))
        x, is_training, gs, w = _placeholders_and_weight()
        h = tf.compat.v1.layers.batch_normalization(tf.matmul(x, w), training=is_training, name="bn1")
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), h))
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = rec.minimize(
                tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs if with_global_step else None
            )
        rec.variables()
        variables = {v.name: v for v in tf.compat.v1.global_variables() if v is not gs}
        seen, losses, evaluations, _ = _train_and_evaluate(rec, train_op, loss, (x, is_training), variables, xs)
    got = tensors_by_step(str(tmp_path / "hook"))
    assert sorted(got) == list(range(steps))
    assert not np.allclose(evaluations, losses)  # an evaluation written in a step's place would show
    for k in range(steps):
        assert float(got[k][("loss", "loss")][2]) == pytest.approx(float(losses[k]), rel=1e-6)
        for kind, name in got[k]:
            if kind in ("weight", "state"):
                np.testing.assert_array_equal(got[k][(kind, name)][2], seen[k][name], err_msg=f"{name} at {k}")
    assert {name for kind, name in got[0] if kind in ("weight", "state")} == set(variables)


def _softmax_grads(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """numpy, float64: the linear softmax model's gradients on ``x`` (labels ``Y``) and its loss."""
    z = x @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = (p - Y) / len(Y)
    return x.T @ dz, dz.sum(0), float(-np.mean(np.sum(Y * np.log(p), axis=1)))


def test_the_hook_does_not_take_a_batch_of_the_training_iterator_in_an_evaluation_that_updates_statistics(
    tmp_path,
) -> None:
    """The production style: input from a ``tf.data`` one-shot iterator (no feeds), and every other
    step an evaluation on its own iterator that also runs its statistics' update
    (``sess.run([eval_loss, eval_update])``, as batch norm's UPDATE_OPS of an evaluation built in
    training mode). That run writes a recorded variable, so the hook took it for a training step and
    added its fetches, whose activations and loss read the *training* iterator: each evaluation
    consumed a training batch, the TF1 original trained on other batches under the hook than
    without it (a new user's faithful port was a false DIVERGE after the first evaluation, and the
    run stopped early when its dataset ran out). Each step's loss and weights are numpy's on the
    batches in order."""
    steps = 5
    xs = np.stack([X + 0.1 * k for k in range(steps + 3)])  # room for batches a faulty hook would take
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "hook"))
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.from_tensor_slices(xs)).get_next()
        x_eval = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensors(X[::-1].copy()).repeat()
        ).get_next()
        w = tf.compat.v1.get_variable("w", initializer=W0)
        b = tf.compat.v1.get_variable("b", initializer=np.zeros(3, np.float32))
        moving = tf.compat.v1.get_variable("moving_mean", initializer=np.zeros(3, np.float32), trainable=False)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), tf.matmul(x, w) + b))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        eval_logits = tf.matmul(x_eval, w) + b
        eval_loss = tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), eval_logits, loss_collection=None)
        eval_update = moving.assign(0.9 * moving + 0.1 * tf.reduce_mean(eval_logits, 0))
        rec.variables()
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=steps), summary_v1.ParityHook(rec)]
        losses = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
                while not sess.should_stop():
                    losses.append(sess.run([train_op, loss])[1])
                    if len(losses) % 2 == 0 and not sess.should_stop():
                        sess.run([eval_loss, eval_update])
        rec.close()
    assert len(losses) == steps
    got = tensors_by_step(str(tmp_path / "hook"))
    assert sorted(got) == list(range(steps))
    w_np, b_np = W0.astype(np.float64), np.zeros(3)
    for k in range(steps):
        gw, gb, want = _softmax_grads(xs[k].astype(np.float64), w_np, b_np)
        assert float(losses[k]) == pytest.approx(want, rel=1e-5)
        assert float(got[k][("loss", "loss")][2]) == pytest.approx(want, rel=1e-5), k
        np.testing.assert_allclose(got[k][("weight", w.name)][2].reshape(3, 3), w_np, rtol=1e-5, atol=1e-6)
        w_np, b_np = w_np - LR * gw, b_np - LR * gb
    assert any("does not run 'IteratorGetNext'" in str(c.message) for c in caught)  # the evaluation, said


def test_the_hook_does_not_take_a_micro_batch_in_the_apply_and_zeroing_runs_of_gradient_accumulation(
    tmp_path,
) -> None:
    """Gradient accumulation over 2 micro-batches from a ``tf.data`` iterator: ``sess.run(accumulate)``
    per micro-batch, then ``sess.run(apply)`` and ``sess.run(zero)``. Both write recorded variables
    and read no input, and the hook's fetches (the loss) took a micro-batch in each: the original
    trained on micro-batches 0, 1, 4, 5, 8, 9 and stopped after 3 of 6 updates. The weights recorded
    at each step are numpy's, on the micro-batches in order."""
    updates = 3
    xs = np.stack([X + 0.1 * k for k in range(2 * updates)])
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "accumulate"))
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.from_tensor_slices(xs)).get_next()
        w = tf.compat.v1.get_variable("w", initializer=W0)
        b = tf.compat.v1.get_variable("b", initializer=np.zeros(3, np.float32))
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), tf.matmul(x, w) + b))
        accumulators = [tf.Variable(tf.zeros_like(v), trainable=False, name=f"{v.op.name}_acc") for v in (w, b)]
        accumulate = tf.group([a.assign_add(g) for a, g in zip(accumulators, tf.gradients(loss, [w, b]))])
        opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
        apply = opt.apply_gradients([(a / 2.0, v) for a, v in zip(accumulators, (w, b))], global_step=gs)
        zero = tf.group([a.assign(tf.zeros_like(a)) for a in accumulators])
        rec.set_step(gs)
        rec.variables()
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=updates), summary_v1.ParityHook(rec)]
        runs = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
                while not sess.should_stop():
                    sess.run(accumulate)
                    runs += 1
                    if runs % 2 == 0:
                        sess.run(apply)
                        if not sess.should_stop():
                            sess.run(zero)
        rec.close()
    assert runs == 2 * updates
    got = tensors_by_step(str(tmp_path / "accumulate"))
    assert sorted(got) == list(range(updates))
    w_np, b_np = W0.astype(np.float64), np.zeros(3)
    for k in range(updates):
        np.testing.assert_allclose(got[k][("weight", w.name)][2].reshape(3, 3), w_np, rtol=1e-5, atol=1e-6)
        (gw0, gb0, _), (gw1, gb1, last) = (_softmax_grads(xs[2 * k + i].astype(np.float64), w_np, b_np) for i in (0, 1))
        assert float(got[k][("loss", "loss")][2]) == pytest.approx(last, rel=1e-5)  # the last micro-batch's
        w_np, b_np = w_np - LR * (gw0 + gw1) / 2, b_np - LR * (gb0 + gb1) / 2


def test_the_hook_counts_a_train_op_under_a_cond_and_not_a_cond_that_only_may_update_statistics(tmp_path) -> None:
    """Functional control flow both ways: the forward pass's own ``tf.cond(is_training, ...)``
    updates a moving mean in its training branch (an evaluation runs it with the other one: no
    step), and the train op is itself a ``tf.cond`` (an ``If`` whose branch applies the gradient:
    each training run is a step). Checked against what ``sess.run`` gave for each training run."""
    steps = 4
    xs = [X + 0.1 * k for k in range(steps)]
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "conds"))
        x, is_training, gs, w = _placeholders_and_weight()
        moving = tf.compat.v1.get_variable("moving_mean", initializer=np.zeros(3, np.float32), trainable=False)
        z = tf.matmul(x, w)

        def batch_mean() -> tf.Tensor:
            mean = tf.reduce_mean(z, 0)
            with tf.control_dependencies([moving.assign(0.9 * moving + 0.1 * mean)]):
                return tf.identity(mean)

        h = z - tf.cond(is_training, batch_mean, moving.read_value)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), h))
        opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
        pairs = rec.grads_and_vars(opt.compute_gradients(loss, [w]))
        rec.set_step(gs)
        train_op = tf.cond(is_training, lambda: tf.group(opt.apply_gradients(pairs, global_step=gs)), tf.no_op)
        rec.variables()
        variables = {v.name: v for v in (w, moving)}
        seen, losses, _, final = _train_and_evaluate(rec, train_op, loss, (x, is_training), variables, xs)
    got = tensors_by_step(str(tmp_path / "conds"))
    assert sorted(got) == list(range(steps))
    assert not np.allclose(final["w:0"], seen[-1]["w:0"]) and not np.allclose(final["moving_mean:0"], 0)
    for k in range(steps):
        assert float(got[k][("loss", "loss")][2]) == pytest.approx(float(losses[k]), rel=1e-6)
        np.testing.assert_array_equal(got[k][("weight", "w:0")][2], seen[k]["w:0"])
        np.testing.assert_array_equal(got[k][("state", "moving_mean:0")][2], seen[k]["moving_mean:0"])


def test_the_reads_minimize_builds_under_update_ops_wait_for_none_of_them(tmp_path) -> None:
    """``rec.minimize`` under ``control_dependencies(UPDATE_OPS)`` built its weight and global-step
    reads there too, so each waited for batch norm's updates: running one needed the step's feed and
    moved the moving statistics, and ``ExponentialMovingAverage.apply`` under the train op fed
    them to its shadows' initializer (``global_variables_initializer()`` then failed). The
    recorder's ops take none of the user's control dependencies now; the reads, run alone and with
    no feed, give what ``sess.run`` reads of the variables, which they leave as they were."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "reads"))
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        w = tf.compat.v1.get_variable("w", initializer=W0)
        h = tf.compat.v1.layers.batch_normalization(tf.matmul(x, w), training=True, name="bn1")
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(tf.constant(Y), h))
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        variables = [v for v in tf.compat.v1.global_variables() if v is not gs]
        reads = dict(zip((v.name for v in variables), rec.variables(variables)))  # minimize's reads, once read
        reads["global_step"] = rec.fetches["step"]
        by_name = {**{v.name: v for v in variables}, "global_step": gs}
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            before = sess.run(by_name)
            alone = sess.run(reads)  # no feed
            untouched = sess.run(by_name)
            sess.run(train_op, {x: X})
            after = sess.run(by_name)
        rec.close()
    assert sorted(reads) == sorted(by_name) and len(variables) == 5  # w, gamma, beta, moving mean and variance
    for name, value in before.items():
        np.testing.assert_array_equal(alone[name], value, err_msg=name)
        np.testing.assert_array_equal(untouched[name], value, err_msg=name)
    assert not np.allclose(after["bn1/moving_mean:0"], before["bn1/moving_mean:0"])  # the train op updates it


@pytest.mark.parametrize("order", ["before_minimize", "after_minimize"])
def test_variables_with_an_optimizer_whose_slots_are_not_built_yet_raise_instead_of_recording_none(
    tmp_path, order: str
) -> None:
    """TF1 builds Adam's slots in ``minimize``: ``rec.variables(optimizer=opt)`` called before it
    recorded the weights and no slot, silently, and ``tb-parity diff`` then told a new user (whose
    script had passed ``optimizer=opt``) that the run "was not asked to" record slots: pass
    ``rec.variables(optimizer=opt)``. It now raises saying to call it after the update is built;
    called there, the slots are recorded, Adam's moments after one step as numpy computes them."""
    logdir = str(tmp_path / order)
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(logdir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        w = tf.compat.v1.get_variable("w", initializer=W0)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(Y, tf.matmul(x, w)))
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        if order == "before_minimize":
            with pytest.raises(ValueError, match=r"AdamOptimizer has no slots yet .* after rec\.minimize"):
                rec.variables(optimizer=opt)
            rec.variables(optimizer=tf.compat.v1.train.GradientDescentOptimizer(LR))  # keeps no slot: no error
            return
        train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):
                _, parity = sess.run([train_op, rec.fetches], {x: X})
                rec.write(parity)
        rec.close()
    logits = X.astype(np.float64) @ W0
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = X.T.astype(np.float64) @ (p - Y) / len(X)
    got = tensors_by_step(logdir)
    np.testing.assert_allclose(logged_value(got, 1, "slot", "w/Adam:0"), 0.1 * g, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(logged_value(got, 1, "slot", "w/Adam_1:0"), 0.001 * g**2, rtol=1e-5, atol=1e-9)


def test_before_update_context_and_errors(tmp_path) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "ctx"))
        v = tf.compat.v1.get_variable("v", initializer=np.ones(2, np.float32))
        first = rec.weight(v)
        assert rec.weight(v) is first  # a variable is read once per step
        rec.metric("m", tf.constant(1.0))
        with pytest.raises(ValueError, match="logged twice"):
            rec.metric("m", tf.constant(2.0))
        with pytest.raises(TypeError, match="string"):
            rec.tensor("metric", "s", tf.constant("x"))
        with rec.before_update():
            update = v.assign_add([1.0, 1.0])
        rec.loss(tf.constant(1.0))  # recording goes on until fetches is read
        _ = rec.fetches
        with pytest.raises(RuntimeError, match="record every tensor before"):
            rec.loss(tf.constant(1.0), name="late")
        with tf.compat.v1.Session() as sess:
            sess.run(v.initializer)
            for step in range(2):
                _, parity = sess.run([update, rec.fetches])
                rec.write(parity, step=step)
        rec.close()
    got = tensors_by_step(str(tmp_path / "ctx"))
    np.testing.assert_array_equal(got[1][("weight", "v:0")][2], [2.0, 2.0])


def test_weights_without_ordering_warn(tmp_path) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "warn"))
        rec.weight(tf.compat.v1.get_variable("v", initializer=np.ones(2, np.float32)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _ = rec.fetches  # the property read is what warns
        assert any("may be read after the update" in str(w.message) for w in caught)
        rec.close()


def test_a_url_run_directory_is_written_through_tensorflows_file_systems(tmp_path) -> None:
    """``ram://`` stands in for ``gs://`` (TensorFlow's GCS file system needs a bucket): same records as on disk."""
    runs = {"local": str(tmp_path / "tf1"), "url": "ram://tbp-shim-url/tf1"}
    for run in runs.values():
        with tf.Graph().as_default():
            rec = summary_v1.Recorder(run)
            train_op, _, _ = _graph(rec, True)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(3):
                    _, parity = sess.run([train_op, rec.fetches])
                    rec.write(parity)
            rec.close()
    (remote,) = tf.io.gfile.glob(runs["url"] + "/*tfevents*")
    copy = tmp_path / "copy" / "tf1"
    copy.mkdir(parents=True)
    (copy / remote.rpartition("/")[2]).write_bytes(tf.io.gfile.GFile(remote, "rb").read())
    local, url = tensors_by_step(runs["local"]), tensors_by_step(str(copy))
    assert sorted(url) == sorted(local) == [0, 1, 2]
    for step in local:
        assert local[step].keys() == url[step].keys()
        for key in local[step]:
            np.testing.assert_array_equal(local[step][key][2], url[step][key][2])
