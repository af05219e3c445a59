"""An lr set per epoch one epoch late, in a Keras ``fit`` port of a TF1 ``feed_dict`` loop.

A ``LearningRateScheduler`` callback that drops the lr one epoch late is the TF1 schedule shifted
by one epoch of steps. The lr note named shifts of 1-3 steps only, so a new user's port (4 steps
an epoch) got the divergence at the right step and no word of why. The expected step and shift
come from the schedules written out in numpy, and the TF1 side's recorded lr is checked against
them.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(5)
X = RNG.standard_normal((32, 3)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, 32)]
W = (RNG.standard_normal((3, 3)) * 0.5).astype(np.float32)
BATCH, EPOCHS = 8, 6
PER_EPOCH = len(X) // BATCH


def lr_of_epoch(epoch: int, drop_at: int) -> float:
    return 0.1 if epoch < drop_at else 0.03


def _tf1_graph(rec: Any, lr_of: Callable[[Any], Any]) -> tuple[Any, Any, Any, Any]:
    """The original's graph (one dense layer on ``placeholder([None, 3])``, plain SGD) with the lr
    ``lr_of(global_step)``; returns the input and label placeholders, the lr and the train op."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    x = tf.compat.v1.placeholder(tf.float32, [None, 3])
    y = tf.compat.v1.placeholder(tf.float32, [None, 3])
    lr = rec.lr(lr_of(gs))
    logits = tf.compat.v1.layers.dense(x, 3, kernel_initializer=tf.constant_initializer(W), name="dense")
    loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
    train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(lr), loss, global_step=gs)
    rec.variables()
    return x, y, lr, train_op


def _fit(run_dir: str, lr: Any, epochs: int, callbacks: Sequence[Any] = (), steps_per_execution: int = 1) -> None:
    """The port: the same layer under ``fit`` with Keras defaults; ``lr`` a float or a schedule."""
    model = tf.keras.Sequential(
        [tf.keras.Input((3,)), tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(W), name="dense")]
    )
    model.compile(
        tf.keras.optimizers.SGD(lr),
        tf.keras.losses.CategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    model.fit(X, Y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks))
    rec.close()


def train_tf1(run_dir: str, drop_at: int) -> None:
    """The original, its lr fed per epoch through a placeholder."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        x, y, lr, train_op = _tf1_graph(rec, lambda gs: tf.compat.v1.placeholder(tf.float32, []))
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for epoch in range(EPOCHS):
                for i in range(PER_EPOCH):
                    feed = {x: X[i * BATCH : (i + 1) * BATCH], y: Y[i * BATCH : (i + 1) * BATCH]}
                    _, parity = sess.run([train_op, fetches], {**feed, lr: lr_of_epoch(epoch, drop_at)})
                    rec.write(parity)
        rec.close()


def train_fit(run_dir: str, drop_at: int) -> None:
    callback = tf.keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr_of_epoch(epoch, drop_at))
    _fit(run_dir, lr_of_epoch(0, drop_at), EPOCHS, [callback])


def numpy_lrs(drop_at: int) -> np.ndarray:
    return np.array([lr_of_epoch(s // PER_EPOCH, drop_at) for s in range(EPOCHS * PER_EPOCH)], np.float64)


def numpy_shift(base: np.ndarray, cand: np.ndarray) -> tuple[int, int]:
    """(first step apart, shift d) with cand[k] == base[k + d] wherever k + d is a step, from there on."""
    first = int(np.flatnonzero(base != cand)[0])
    for d in sorted(range(-len(base) + 1, len(base)), key=lambda d: (abs(d), -d)):
        ks = [k for k in range(first, len(base)) if 0 <= k + d < len(base)]
        if d and len(ks) >= 2 and all(cand[k] == base[k + d] for k in ks):
            return first, d
    raise AssertionError("no shift")


def test_an_lr_dropped_one_epoch_late_by_a_callback_is_named_as_a_shift_of_one_epoch(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"), drop_at=2)
    recorded = tensors_by_step(str(tmp_path / "tf1"))
    np.testing.assert_allclose([recorded[s][("lr", "lr")][2] for s in sorted(recorded)], numpy_lrs(2), rtol=1e-7)
    for name, drop_at in (("late", 3), ("early", 1)):
        train_fit(str(tmp_path / name), drop_at)
        first, shift = numpy_shift(numpy_lrs(2), numpy_lrs(drop_at))
        assert abs(shift) == PER_EPOCH
        d = compare(str(tmp_path), baseline="tf1", candidate=name).first_divergence
        assert d is not None and (d.step, d.kind) == (first, "lr"), d
        side = "later" if shift > 0 else "earlier"
        assert f"the baseline's {PER_EPOCH} steps {side} (at step {first}: the baseline's at step {first + shift})" in (
            d.note or ""
        ), d.note
        assert f"one epoch {'early' if shift > 0 else 'late'} if an epoch is {PER_EPOCH} steps" in d.note


def train_tf1_decay(run_dir: str, decay_steps: int) -> None:
    """The original with ``tf.compat.v1.train.exponential_decay`` on the global step, in stairs."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        x, y, _, train_op = _tf1_graph(
            rec, lambda gs: tf.compat.v1.train.exponential_decay(0.1, gs, decay_steps, 0.5, staircase=True)
        )
        tf1_session.train(rec, train_op, (x, y), (np.tile(X, (4, 1)), np.tile(Y, (4, 1))), 4 * PER_EPOCH, BATCH)


def train_fit_decay(run_dir: str, decay_steps: int) -> None:
    """The port: ``ExponentialDecay`` in stairs, four epochs under ``fit``."""
    _fit(run_dir, tf.keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps, 0.5, staircase=True), 4)


def test_a_decay_counted_in_epochs_on_one_side_and_steps_on_the_other_is_named_as_a_time_scale(tmp_path) -> None:
    """TF1 decays every epoch (``decay_steps=4``, 4 steps an epoch); the port wrote the epoch count,
    ``decay_steps=1``, and decays every step: numpy says its lr at step s is TF1's at step 4 s, apart
    from step 1. The other way round, TF1's lr at step s is the port's at step 4 s."""
    steps = np.arange(4 * PER_EPOCH)
    per_epoch, per_step = 0.1 * 0.5 ** (steps // PER_EPOCH), 0.1 * 0.5**steps
    assert per_step[1] != per_epoch[1] and all(per_step[s] == per_epoch[PER_EPOCH * s] for s in (1, 2, 3))
    assert all(per_epoch[s] == per_step[s // PER_EPOCH] for s in steps)
    train_tf1_decay(str(tmp_path / "tf1_epoch"), PER_EPOCH)
    train_tf1_decay(str(tmp_path / "tf1_step"), 1)
    recorded = tensors_by_step(str(tmp_path / "tf1_epoch"))
    np.testing.assert_allclose([recorded[s][("lr", "lr")][2] for s in sorted(recorded)], per_epoch, rtol=1e-6)
    train_fit_decay(str(tmp_path / "fit_step"), 1)
    train_fit_decay(str(tmp_path / "fit_epoch"), PER_EPOCH)
    for base, cand, mapped in (
        ("tf1_epoch", "fit_step", f"{PER_EPOCH} s"),
        ("tf1_step", "fit_epoch", f"s // {PER_EPOCH}"),
    ):
        d = compare(str(tmp_path), baseline=base, candidate=cand).first_divergence
        assert d is not None and (d.step, d.kind) == (1, "lr"), d
        assert f"the candidate's value at each step s is the baseline's at step {mapped}" in (d.note or ""), d.note
        assert f"if an epoch is {PER_EPOCH} steps" in d.note, d.note


@pytest.mark.parametrize("n, batch, epochs", [(30, 8, 5), (26, 4, 3)])
def test_epochs_of_other_lengths_are_named_not_a_phase_shifted_by_one_step(tmp_path, n, batch, epochs) -> None:
    """TF1's loop runs ``N // BATCH`` batches an epoch, dropping the partial last batch that the
    ``fit`` port keeps; both halve the lr each epoch (a placeholder fed per epoch, a
    ``LearningRateScheduler``). numpy: epochs of 3 steps against 4, so the lr parts at step 3 and the
    candidate lags one more step each epoch. A new user's such port was told one phase of its
    schedule ran a step behind, as a warm-up counted from 1 against 0 (epochs of 6 steps against 7,
    three of them: the runs agree again on the last epoch's lr); with more epochs there was no note."""
    per_tf1, per_fit = n // batch, -(-n // batch)
    halving = lambda epoch, lr=None: 0.1 * 0.5**epoch  # noqa: E731
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        x, y, lr, train_op = _tf1_graph(rec, lambda gs: tf.compat.v1.placeholder(tf.float32, []))
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for epoch in range(epochs):
                for i in range(per_tf1):
                    feed = {x: X[i * batch : (i + 1) * batch], y: Y[i * batch : (i + 1) * batch], lr: halving(epoch)}
                    rec.write(sess.run([train_op, fetches], feed)[1])
        rec.close()
    model = tf.keras.Sequential(
        [tf.keras.Input((3,)), tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(W), name="dense")]
    )
    model.compile(tf.keras.optimizers.SGD(0.1), tf.keras.losses.CategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(str(tmp_path / "fit"))
    summary_v2.instrument(model, rec)
    callback = tf.keras.callbacks.LearningRateScheduler(halving)
    model.fit(X[:n], Y[:n], batch_size=batch, epochs=epochs, shuffle=False, verbose=0, callbacks=[callback])
    rec.close()
    base = np.array([halving(s // per_tf1) for s in range(epochs * per_tf1)])
    cand = np.array([halving(s // per_fit) for s in range(epochs * per_tf1)])
    recorded = tensors_by_step(str(tmp_path / "fit"))
    np.testing.assert_allclose([recorded[s][("lr", "lr")][2] for s in range(len(cand))], cand, rtol=1e-7)
    first = int(np.flatnonzero(base != cand)[0])
    assert first == per_tf1
    # no one shift holds from there on: the candidate lags one more step each epoch
    assert all(any(cand[k] != base[k - d] for k in range(first, len(cand))) for d in (1, 2, 3))
    d = compare(str(tmp_path), baseline="tf1", candidate="fit").first_divergence
    assert d is not None and (d.step, d.kind) == (first, "lr"), d
    assert f"epochs of {per_tf1} steps in the baseline and {per_fit} in the candidate" in (d.note or ""), d.note
    assert "partial last batch" in d.note and "one phase" not in d.note, d.note


def piecewise_lrs(boundaries: Sequence[int], steps: int) -> np.ndarray:
    """``piecewise_constant`` / ``PiecewiseConstantDecay`` written out: value k while the step is past k
    boundaries (a step equal to a boundary is still before it)."""
    return np.array([0.1 * 0.5 ** sum(s > b for b in boundaries) for s in range(steps)], np.float32)


def numpy_time_scales(base: np.ndarray, cand: np.ndarray) -> list[int]:
    """Every whole m >= 2 with cand[s] == base[m s] at every step s from the first apart with m s logged
    (at least one)."""
    first = int(np.flatnonzero(base != cand)[0])
    return [
        m
        for m in range(2, len(base))
        if any(m * s < len(base) for s in range(first, len(cand)))
        and all(cand[s] == base[m * s] for s in range(first, len(cand)) if m * s < len(base))
    ]


def numpy_changes(lrs: np.ndarray) -> list[int]:
    """The steps whose lr differs from the step before."""
    return [int(s) + 1 for s in np.flatnonzero(np.diff(lrs))]


def test_piecewise_boundaries_written_in_epochs_name_the_epoch(tmp_path) -> None:
    """TF1's ``piecewise_constant(global_step, boundaries in steps)`` ported to ``PiecewiseConstantDecay``
    with the boundaries in epochs (4 steps an epoch, 6 epochs). A boundary is passed at ``boundary + 1``, so a
    change of the port at step i lands on TF1's at ``4 (i - 1) + 1``, not ``4 i``: the note tried only
    ``j = m i``, so boundaries [2, 4] for [8, 16] had no note, and [1, 2] for [4, 8] (numpy: the values
    fit 3 and 4, the changes 4 alone) were named "3 times as fast ... if an epoch is 3 steps"."""
    n = EPOCHS * PER_EPOCH
    for tf1_bounds, port_bounds in (([2 * PER_EPOCH, 4 * PER_EPOCH], [2, 4]), ([PER_EPOCH, 2 * PER_EPOCH], [1, 2])):
        base, cand = piecewise_lrs(tf1_bounds, n), piecewise_lrs(port_bounds, n)
        first = int(np.flatnonzero(base != cand)[0])
        assert PER_EPOCH in numpy_time_scales(base, cand)
        landing = [PER_EPOCH * (i - 1) + 1 for i in numpy_changes(cand)]
        assert [t for t in landing if t < n] == numpy_changes(base)
        name = "_".join(map(str, port_bounds))
        with tf.Graph().as_default():
            rec = summary_v1.Recorder(str(tmp_path / name / "tf1"))
            x, y, _, train_op = _tf1_graph(
                rec, lambda gs, b=tf1_bounds: tf.compat.v1.train.piecewise_constant(gs, b, [0.1, 0.05, 0.025])
            )
            tf1_session.train(rec, train_op, (x, y), (np.tile(X, (EPOCHS, 1)), np.tile(Y, (EPOCHS, 1))), n, BATCH)
        recorded = tensors_by_step(str(tmp_path / name / "tf1"))
        np.testing.assert_allclose([recorded[s][("lr", "lr")][2] for s in sorted(recorded)], base, rtol=1e-7)
        schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay(port_bounds, [0.1, 0.05, 0.025])
        _fit(str(tmp_path / name / "fit"), schedule, EPOCHS)
        d = compare(str(tmp_path / name), baseline="tf1", candidate="fit").first_divergence
        assert d is not None and (d.step, d.kind) == (first, "lr"), d
        assert f"the baseline's at step {PER_EPOCH} s" in (d.note or ""), d.note
        assert f"its schedule runs {PER_EPOCH} times as fast as the baseline's" in d.note, d.note
        assert f"if an epoch is {PER_EPOCH} steps" in d.note, d.note


def _warm_up(step: Any) -> Any:
    """A warm-up over 7 steps, written once for TF1's graph (a global-step tensor) and numpy."""
    return (
        0.1 * np.minimum(1.0, (step + 1) / 7.0)
        if isinstance(step, (int, np.ndarray))
        else (0.1 * tf.minimum(1.0, tf.cast(step + 1, tf.float32) / 7.0))
    )


class _WarmUpByBatch(tf.keras.callbacks.Callback):
    """The port's warm-up, set per batch from the epoch and the batch index Keras passes."""

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.model.optimizer.learning_rate.assign(float(_warm_up(self.epoch * PER_EPOCH + batch)))


def test_a_per_batch_callback_under_steps_per_execution_is_named(tmp_path) -> None:
    """TF1 warms its lr up from the global step; the fit port sets the same warm-up per batch from a
    callback, compiled with ``steps_per_execution=3``: Keras calls batch callbacks once per execution
    (batches 0 and 3 of each epoch of 4), so its lr holds for the execution's steps. numpy: the port's
    lr is TF1's at each execution's first step, and parts from it at step 1. A new user's such port
    diverged on its lr at step 1 with no note."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        x, y, _, train_op = _tf1_graph(rec, _warm_up)
        tf1_session.train(rec, train_op, (x, y), (np.tile(X, (2, 1)), np.tile(Y, (2, 1))), 2 * PER_EPOCH, BATCH)
    _fit(str(tmp_path / "fit"), float(_warm_up(0)), 2, [_WarmUpByBatch()], steps_per_execution=3)
    steps = np.arange(2 * PER_EPOCH)
    held = np.array([_warm_up((s // PER_EPOCH) * PER_EPOCH + (s % PER_EPOCH) // 3 * 3) for s in steps])
    recorded = tensors_by_step(str(tmp_path / "fit"))
    np.testing.assert_allclose([recorded[s][("lr", "lr")][2] for s in steps], held, rtol=1e-6)
    first = int(np.flatnonzero(~np.isclose(held, _warm_up(steps), rtol=1e-6))[0])
    assert first == 1
    d = compare(str(tmp_path), baseline="tf1", candidate="fit").first_divergence
    assert d is not None and (d.step, d.kind) == (first, "lr"), d
    assert "'fit' ran fit with steps_per_execution=3" in (d.note or ""), d.note
    assert "once per execution of 3 steps" in d.note, d.note


def test_staircase_decays_of_other_decay_steps_are_not_only_told_of_epoch_lengths(tmp_path) -> None:
    """TF1 decays every 3 steps, the port every 4 (``staircase=True``), both over epochs of 4 steps:
    the stairs fit the epoch-length note's test, which named only a partial batch, batch sizes or
    an epoch's examples, and not the decay_steps that differ."""
    steps = np.arange(4 * PER_EPOCH)
    base, cand = 0.1 * 0.5 ** (steps // 3), 0.1 * 0.5 ** (steps // 4)
    train_tf1_decay(str(tmp_path / "tf1"), 3)
    train_fit_decay(str(tmp_path / "fit"), 4)
    recorded = tensors_by_step(str(tmp_path / "tf1"))
    np.testing.assert_allclose([recorded[s][("lr", "lr")][2] for s in sorted(recorded)], base, rtol=1e-6)
    first = int(np.flatnonzero(base != cand)[0])
    d = compare(str(tmp_path), baseline="tf1", candidate="fit").first_divergence
    assert d is not None and (d.step, d.kind) == (first, "lr"), d
    assert "decay_steps" in (d.note or "") and "3 against 4" in d.note, d.note
