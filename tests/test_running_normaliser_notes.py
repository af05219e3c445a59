"""A running-mean normaliser of inputs ported by hand: what its output diverging first tells.

From a trial: TF1 keeps a running mean and variance of its inputs in non-trainable variables,
updates them through ``UPDATE_OPS`` and normalises the batch with the updated statistics; the
port keeps them in a Keras layer's ``add_weight(trainable=False)`` and updates them in ``call``.
A port with another momentum, or one that normalises with the statistics read before its update,
diverges at step 0 on that layer's output, where the statistics recorded at the step's start
agree; the note sent its user to the data, an activation and epsilon, and never named the layer's
own statistics. Every expectation is checked against numpy's recursion, not against the tool.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(3)
STEPS, BATCH, D, H = 4, 8, 4, 5
LR, M, EPS = 0.05, 0.99, 1e-3
X = (RNG.standard_normal((STEPS * BATCH, D)) * 3 + np.array([5.0, -2.0, 0.5, 10.0])).astype(np.float32)
Y = (X @ RNG.standard_normal((D, 1)) * 0.1 + 1).astype(np.float32)
W1 = (RNG.standard_normal((D, H)) * 0.5).astype(np.float32)
W2 = (RNG.standard_normal((H, 1)) * 0.5).astype(np.float32)


def _tf1(run_dir: str) -> None:
    """The original: the statistics' assigns in ``UPDATE_OPS``, the batch normalised after them."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        with tf.compat.v1.variable_scope("input_norm"):
            mean = tf.compat.v1.get_variable("mean", [D], initializer=tf.zeros_initializer(), trainable=False)
            var = tf.compat.v1.get_variable("variance", [D], initializer=tf.ones_initializer(), trainable=False)
            batch_mean, batch_var = tf.nn.moments(x, [0])
            updates = [mean.assign(M * mean + (1 - M) * batch_mean), var.assign(M * var + (1 - M) * batch_var)]
            for u in updates:
                tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, u)
            with tf.control_dependencies(updates):
                xn = (x - mean.read_value()) / tf.sqrt(var.read_value() + EPS)
        xn = rec.activation("input_norm", xn)
        h = tf.compat.v1.layers.dense(xn, H, tf.tanh, kernel_initializer=tf.constant_initializer(W1), name="dense")
        pred = tf.compat.v1.layers.dense(h, 1, kernel_initializer=tf.constant_initializer(W2), name="dense_1")
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, pred))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, BATCH)


def _keras(run_dir: str, momentum: float, stale: bool, x_fed: np.ndarray = X, y_fed: np.ndarray = Y) -> None:
    """The port: a layer holding the statistics, updated in ``call`` when training; ``stale``
    normalises with the values read before the update; ``x_fed``, ``y_fed``: what its fit is fed."""

    class RunningNorm(tf.keras.layers.Layer):
        def build(self, shape):
            self.mean = self.add_weight("mean", shape[-1:], initializer="zeros", trainable=False)
            self.variance = self.add_weight("variance", shape[-1:], initializer="ones", trainable=False)

        def call(self, x, training=None):
            mean, var = (tf.identity(self.mean), tf.identity(self.variance)) if stale else (self.mean, self.variance)
            if training:
                self.mean.assign(momentum * self.mean + (1 - momentum) * tf.reduce_mean(x, 0))
                self.variance.assign(momentum * self.variance + (1 - momentum) * tf.math.reduce_variance(x, 0))
            return (x - mean) / tf.sqrt(var + EPS)

    model = tf.keras.Sequential(
        [
            tf.keras.Input((D,)),
            RunningNorm(name="input_norm"),
            tf.keras.layers.Dense(H, "tanh", name="dense"),
            tf.keras.layers.Dense(1, name="dense_1"),
        ]
    )
    model.get_layer("dense").kernel.assign(W1)
    model.get_layer("dense_1").kernel.assign(W2)
    model.compile(tf.keras.optimizers.SGD(LR), "mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["input_norm"])
    model.fit(x_fed, y_fed, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def _numpy(momentum: float, stale: bool, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The statistics read at ``step``'s start (mean, variance) and its first batch normalised."""
    mean, var = np.zeros(D), np.ones(D)
    for s in range(step + 1):
        x = X[s * BATCH : (s + 1) * BATCH].astype(np.float64)
        new_mean, new_var = momentum * mean + (1 - momentum) * x.mean(0), momentum * var + (1 - momentum) * x.var(0)
        used = (mean, var) if stale else (new_mean, new_var)
        if s == step:
            return mean, var, (x - used[0]) / np.sqrt(used[1] + EPS)
        mean, var = new_mean, new_var
    raise AssertionError


@pytest.mark.parametrize(
    "momentum,stale", [(M, False), (0.01, False), (M, True)], ids=["faithful", "momentum", "stale"]
)
def test_a_running_normaliser_output_names_its_own_statistics(tmp_path, momentum: float, stale: bool) -> None:
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"), momentum, stale)
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    for logged, (m, st) in ((tf1, (M, False)), (tf2, (momentum, stale))):
        for s in range(STEPS):
            mean, var, xn = _numpy(m, st, s)
            np.testing.assert_allclose(logged[s][("state", "input_norm/mean:0")][2], mean, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(logged[s][("state", "input_norm/variance:0")][2], var, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(logged[s][("activation", "input_norm")][2], xn, rtol=1e-4, atol=1e-4)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    if momentum == M and not stale:
        assert report.agree, report.first_divergence
        return
    # numpy: the statistics read at step 0 are the initial ones in both; at step 1 they part by the momentum only
    assert np.abs(_numpy(M, False, 1)[0] - _numpy(momentum, stale, 1)[0]).max() > 0.1 or stale
    first = report.first_divergence
    assert (first.step, first.tensor) == (0, "input_norm"), first
    assert "its layer's state (input_norm/mean:0, input_norm/variance:0) agrees as read at" in first.note, first.note
    if stale:
        assert "one run computes this output from the state before the step's update" in first.note, first.note
    else:
        assert "at step 1 input_norm/mean:0, input_norm/variance:0 part: its input differs" in first.note, first.note
        assert "or the two runs update the layer's state otherwise within the step" in first.note, first.note


def test_a_running_normaliser_fed_other_batches_is_told_its_input_may_differ(tmp_path) -> None:
    """The port's pipeline feeds the batches in another order (as fit's default shuffle=True does), its
    normaliser the same as TF1's: its output diverges at step 0 and its statistics part at step 1, from
    the other batch they average. It was told only that the runs update the state otherwise (its
    momentum, the variance's bias), with no word of its input, which nothing recorded before it shows."""
    order = np.arange(STEPS)[::-1]
    x_fed = np.concatenate([X[i * BATCH : (i + 1) * BATCH] for i in order])
    y_fed = np.concatenate([Y[i * BATCH : (i + 1) * BATCH] for i in order])
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"), M, False, x_fed, y_fed)
    tf2 = tensors_by_step(str(tmp_path / "tf2"))
    # numpy: the same recursion, one momentum, over the port's first batch (TF1's last)
    x0 = x_fed[:BATCH].astype(np.float64)
    mean1, var1 = (1 - M) * x0.mean(0), M + (1 - M) * x0.var(0)
    np.testing.assert_allclose(tf2[1][("state", "input_norm/mean:0")][2], mean1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tf2[1][("state", "input_norm/variance:0")][2], var1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tf2[0][("activation", "input_norm")][2], (x0 - mean1) / np.sqrt(var1 + EPS), atol=1e-4)
    assert np.abs(_numpy(M, False, 0)[2] - (x0 - mean1) / np.sqrt(var1 + EPS)).max() > 0.1
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.tensor) == (0, "input_norm"), first
    assert "its input differs, which the state averages too (another batch" in first.note, first.note
