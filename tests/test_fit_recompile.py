"""An instrumented model compiled again with a new optimizer (fine-tuning in two phases).

A new user's second phase (``model.compile(new Adam)``, ``fit`` again) counted
``optimizer.iterations`` from 0 again: it wrote over the first phase's steps in the same run (the
last write won) and was compared with the TF1 run's first steps, whose ``global_step`` went on
counting. The steps now go on. Checked against a float64 numpy replay (plain SGD, a new lr in the
second phase).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(5)
X = RNG.standard_normal((16, 3)).astype(np.float32)
Y = RNG.standard_normal((16, 2)).astype(np.float32)
W = (RNG.standard_normal((3, 2)) * 0.5).astype(np.float32)
BATCH, PHASES = 8, ((0.1, 2), (0.05, 1))  # (lr, epochs) of each compile


def numpy_replay(phases: tuple[tuple[float, int], ...] = PHASES) -> list[dict]:
    """lr and kernel as read at each step's start, in float64 (MSE, no bias)."""
    w, out = W.astype(np.float64), []
    for lr, epochs in phases:
        for _ in range(epochs):
            for i in range(0, len(X), BATCH):
                x, y = X[i : i + BATCH].astype(np.float64), Y[i : i + BATCH]
                out.append({"lr": lr, "kernel": w.copy()})
                w = w - lr * x.T @ (2 * (x @ w - y) / y.size)
    return out


def _tf1(run_dir: str, phases: tuple[tuple[float, int], ...]) -> None:
    """The TF1 original: one feed_dict loop, its lr fed per phase, its global_step counting on."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 2])
        lr = tf.compat.v1.placeholder(tf.float32, [])
        out = tf.compat.v1.layers.dense(x, 2, use_bias=False, kernel_initializer=tf.constant_initializer(W))
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        rec.lr(lr)
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(lr), loss, global_step=gs)
        rec.variables()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for phase_lr, epochs in phases:
                for _ in range(epochs):
                    for i in range(0, len(X), BATCH):
                        feed = {x: X[i : i + BATCH], y: Y[i : i + BATCH], lr: phase_lr}
                        rec.write(sess.run([train_op, rec.fetches], feed)[1])
        rec.close()


def _two_phases(run_dir: str, instrument_each: bool, restored: int = 0) -> None:
    """Compile, fit, compile with a new SGD (its count set to ``restored``), fit, on one recorder."""
    model = tf.keras.Sequential(
        [tf.keras.Input((3,)), tf.keras.layers.Dense(2, use_bias=False, kernel_initializer=tf.constant_initializer(W))]
    )
    rec = summary_v2.Recorder(run_dir)
    for n, (lr, epochs) in enumerate(PHASES):
        optimizer = tf.keras.optimizers.SGD(lr)
        if n:
            optimizer.iterations.assign(restored)
        model.compile(optimizer=optimizer, loss="mse")
        if n == 0 or instrument_each:
            summary_v2.instrument(model, rec)
        model.fit(X, Y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    rec.close()


def _check(recorded: dict, expected: dict) -> None:
    """Each recorded step's lr and kernel against the numpy replay's entry for it."""
    assert sorted(recorded) == sorted(expected)
    for step, ref in expected.items():
        got = {kind: values for (kind, _), (_, _, values) in recorded[step].items() if kind in ("lr", "weight")}
        np.testing.assert_allclose(got["lr"], ref["lr"], rtol=1e-6)
        np.testing.assert_allclose(got["weight"], ref["kernel"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("instrument_each", [False, True])
def test_a_second_compile_numbers_its_steps_after_the_first(tmp_path, instrument_each: bool) -> None:
    """Instrumented once, or again after each ``compile`` (the first needed it after compile, so a
    user does it again: a new numbering started the second phase at 0 again, and a faithful
    two-phase port against TF1 diverged at step 0 on its lr). Before either fix the run held steps
    0-3 only, the second phase written over the first's."""
    _two_phases(str(tmp_path / "tf2"), instrument_each)
    _check(tensors_by_step(str(tmp_path / "tf2")), dict(enumerate(numpy_replay())))


def test_an_optimizer_restored_with_its_count_keeps_it(tmp_path) -> None:
    """A second phase whose optimizer comes back with its count (2, from a checkpoint) writes its
    steps as 2 and 3, as a TF1 run restored to that global_step would; the last write wins."""
    _two_phases(str(tmp_path / "tf2"), instrument_each=False, restored=2)
    reference = numpy_replay()
    _check(tensors_by_step(str(tmp_path / "tf2")), {0: reference[0], 1: reference[1], 2: reference[4], 3: reference[5]})


def test_instrumenting_onto_another_recorder_numbers_from_the_optimizer(tmp_path) -> None:
    """A new recorder is a new run: its steps are the optimizer's own, not the last run's."""
    model = tf.keras.Sequential(
        [tf.keras.Input((3,)), tf.keras.layers.Dense(2, use_bias=False, kernel_initializer=tf.constant_initializer(W))]
    )
    for n, (lr, epochs) in enumerate(PHASES):
        rec = summary_v2.Recorder(str(tmp_path / f"run{n}"))
        model.compile(optimizer=tf.keras.optimizers.SGD(lr), loss="mse")
        summary_v2.instrument(model, rec)
        model.fit(X, Y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
        rec.close()
    assert sorted(tensors_by_step(str(tmp_path / "run1"))) == [0, 1]


def test_a_two_phase_fit_agrees_with_its_tf1_loop_and_a_wrong_second_lr_is_found_where_it_starts(tmp_path) -> None:
    """The port against the TF1 loop it replaces, whose global_step counts on: faithful, it agrees at
    every step; with TF1's second lr 0.06 against 0.05 it parts at the first step of the second
    phase, on the lr (numpy: where the two schedules first differ)."""
    _two_phases(str(tmp_path / "runs" / "tf2"), instrument_each=True)
    wrong = (PHASES[0], (0.06, PHASES[1][1]))
    _tf1(str(tmp_path / "runs" / "tf1"), PHASES)
    _tf1(str(tmp_path / "runs" / "tf1_wrong"), wrong)
    faithful = compare(str(tmp_path / "runs"), baseline="tf1", candidate="tf2")
    assert faithful.agree and faithful.steps_compared == len(numpy_replay()), faithful.to_dict()["verdict_text"]
    first = next(k for k, (a, b) in enumerate(zip(numpy_replay(), numpy_replay(wrong))) if a["lr"] != b["lr"])
    assert first == 4
    d = compare(str(tmp_path / "runs"), baseline="tf1_wrong", candidate="tf2").first_divergence
    assert d is not None and (d.step, d.kind) == (first, "lr"), d


def test_a_second_compile_instruments_the_same_layers_again(tmp_path) -> None:
    """Fine-tuning in two phases, each compile instrumented with the layers whose outputs to record
    (as the first needed it after compile): the second call raised "layer 'dense' is already
    instrumented" and the port stopped before its second phase. Each step's output is numpy's
    x @ kernel, the kernel replayed in float64, under both phases' steps."""
    model = tf.keras.Sequential(
        [
            tf.keras.Input((3,)),
            tf.keras.layers.Dense(2, use_bias=False, kernel_initializer=tf.constant_initializer(W), name="dense"),
        ]
    )
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    for lr, epochs in PHASES:
        model.compile(optimizer=tf.keras.optimizers.SGD(lr), loss="mse")
        summary_v2.instrument(model, rec, layers=["dense"])
        model.fit(X, Y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    rec.close()
    recorded = tensors_by_step(str(tmp_path / "tf2"))
    reference = numpy_replay()
    assert sorted(recorded) == list(range(len(reference)))
    for step, ref in enumerate(reference):
        x = X[(step % 2) * BATCH : (step % 2 + 1) * BATCH].astype(np.float64)
        output = recorded[step][("activation", "dense")][2]
        np.testing.assert_allclose(np.reshape(output, (BATCH, 2)), x @ ref["kernel"], rtol=1e-5, atol=1e-6)


def test_the_slots_of_an_optimizer_keras_built_before_instrument_are_recorded(tmp_path) -> None:
    """A first fit unrecorded (a warm-up, or a first phase), then ``instrument`` and a second fit on the
    same optimizer: Keras built its slots in its own first update, under the optimizer's name scope
    (``SGD/m/dense/kernel``), and the recorder, looking for ``m/dense/kernel``, recorded no slot at all,
    silently. Each step's momentum is numpy's accumulator (TF1's units: Keras's velocity over -lr)."""
    model = tf.keras.Sequential(
        [
            tf.keras.Input((3,)),
            tf.keras.layers.Dense(2, use_bias=False, kernel_initializer=tf.constant_initializer(W), name="dense"),
        ]
    )
    lr, momentum = 0.1, 0.9
    model.compile(optimizer=tf.keras.optimizers.SGD(lr, momentum=momentum), loss="mse")
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    summary_v2.instrument(model, rec)
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()
    w, accum, expected = W.astype(np.float64), np.zeros(W.shape), {}
    for step in range(4):
        x, y = X[(step % 2) * BATCH : (step % 2 + 1) * BATCH].astype(np.float64), Y[(step % 2) * BATCH :][:BATCH]
        expected[step] = accum.copy()
        accum = momentum * accum + x.T @ (2 * (x @ w - y) / y.size)
        w = w - lr * accum
    recorded = tensors_by_step(str(tmp_path / "tf2"))
    assert sorted(recorded) == [2, 3], sorted(recorded)
    for step in (2, 3):
        slots = {name: values for (kind, name), (_, _, values) in recorded[step].items() if kind == "slot"}
        assert list(slots) == ["m/dense/kernel"], sorted(recorded[step])
        np.testing.assert_allclose(np.ravel(slots["m/dense/kernel"]), expected[step].ravel(), rtol=1e-5, atol=1e-7)
