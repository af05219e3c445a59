"""Weight constraints: a TF1 original whose ``tf.compat.v1.layers.dense`` layers take
``kernel_constraint=MaxNorm(0.5)`` and ``NonNeg()``, trained by ``MomentumOptimizer``, which
applies each variable's constraint after its update (numpy replay below), against Keras ``fit``
ports. The faithful port agrees; a port whose layer leaves a constraint out diverges at step 1 on
that kernel while its gradient agreed at step 0. A trial's such port was told to compare the
optimizers' epsilon, momentum, nesterov and clipping; the note now names the constraint."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from keras_recipes import fit_recorded
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1

STEPS, BATCH, D, H, OUT = 3, 8, 4, 8, 2
LR, MOMENTUM, CAP = 0.1, 0.9, 0.5
RNG = np.random.default_rng(62)
X = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
Y = RNG.standard_normal((STEPS * BATCH, OUT)).astype(np.float32)
W1 = (RNG.standard_normal((D, H)) * 0.5).astype(np.float32)
W2 = (RNG.standard_normal((H, OUT)) * 0.5).astype(np.float32)


def _max_norm(w: np.ndarray) -> np.ndarray:
    norms = np.sqrt((w**2).sum(0, keepdims=True))
    return w * (np.clip(norms, 0, CAP) / (1e-7 + norms))


def _numpy_kernels() -> list[tuple[np.ndarray, np.ndarray]]:
    """float64 replay of TF1's training: the two kernels as read before each step."""
    params = [W1.astype(np.float64), np.zeros(H), W2.astype(np.float64), np.zeros(OUT)]
    velocity = [np.zeros_like(p) for p in params]
    kernels = []
    for s in range(STEPS):
        x, y = (a[s * BATCH : (s + 1) * BATCH].astype(np.float64) for a in (X, Y))
        kernels.append((params[0].copy(), params[2].copy()))
        w1, b1, w2, b2 = params
        h = np.tanh(x @ w1 + b1)
        dout = 2 * (h @ w2 + b2 - y) / y.size
        dz = dout @ w2.T * (1 - h**2)
        grads = [x.T @ dz, dz.sum(0), h.T @ dout, dout.sum(0)]
        velocity = [MOMENTUM * v + g for v, g in zip(velocity, grads)]
        params = [p - LR * v for p, v in zip(params, velocity)]
        params[0], params[2] = _max_norm(params[0]), np.maximum(params[2], 0)
    return kernels


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.float32, [None, OUT])
        dense, init = tf.compat.v1.layers.dense, tf.constant_initializer
        h = dense(
            x,
            H,
            tf.nn.tanh,
            kernel_initializer=init(W1),
            kernel_constraint=tf.keras.constraints.MaxNorm(CAP),
            name="dense",
        )
        out = dense(h, OUT, kernel_initializer=init(W2), kernel_constraint=tf.keras.constraints.NonNeg(), name="out")
        rec.activation("dense", h)
        rec.activation("out", out)
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM)
        train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        train(rec, train_op, [x, y], [X, Y], STEPS, BATCH)


def _fit(run_dir: str, max_norm: bool = True, non_neg: bool = True) -> None:
    dense = tf.keras.layers.Dense(
        H, "tanh", kernel_constraint=tf.keras.constraints.MaxNorm(CAP) if max_norm else None, name="dense"
    )
    out = tf.keras.layers.Dense(OUT, kernel_constraint=tf.keras.constraints.NonNeg() if non_neg else None, name="out")
    model = tf.keras.Sequential([tf.keras.Input((D,)), dense, out])
    dense.kernel.assign(W1)
    out.kernel.assign(W2)
    fit_recorded(run_dir, model, ["dense", "out"], X, Y, BATCH, tf.keras.optimizers.SGD(LR, momentum=MOMENTUM))


def test_tf1_applies_the_constraints_after_each_update_and_a_faithful_port_agrees(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"))
    recorded = tensors_by_step(str(tmp_path / "tf1"))
    for s, (w1, w2) in enumerate(_numpy_kernels()):
        np.testing.assert_allclose(
            np.asarray(recorded[s][("weight", "dense/kernel:0")][2]).reshape(D, H), w1, atol=1e-6
        )
        np.testing.assert_allclose(
            np.asarray(recorded[s][("weight", "out/kernel:0")][2]).reshape(H, OUT), w2, atol=1e-6
        )
    assert np.sqrt((_numpy_kernels()[1][0] ** 2).sum(0)).max() <= CAP + 1e-6  # the constraint binds at step 1
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    assert report.steps_compared == STEPS


def test_a_port_that_leaves_a_max_norm_constraint_out_is_told_so(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), max_norm=False)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "weight", "dense/kernel:0"), first
    assert "caps the columns' norm after the update" in first.note and "MaxNorm(0.5)" in first.note, first.note
    assert "compare the optimizers' settings" not in first.note, first.note


def test_a_port_that_leaves_a_non_neg_constraint_out_is_told_so(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), non_neg=False)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "weight", "out/kernel:0"), first
    assert "exactly 0 in 'tf1' where 'tf2' has it negative" in first.note and "NonNeg()" in first.note, first.note
    assert "compare the optimizers' settings" not in first.note, first.note
