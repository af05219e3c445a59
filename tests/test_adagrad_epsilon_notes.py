"""An Adagrad port whose weights part from TF1's by Keras's epsilon is told of Adagrad's, not Adam's.

From a helper's trial: a TF1 model trained with ``AdagradOptimizer(lr, initial_accumulator_value=1e-5)``
(no epsilon: ``w -= lr g / sqrt(a)``) against a Keras port with the same ``initial_accumulator_value``
and Keras's default ``epsilon=1e-7`` (``w -= lr g / sqrt(a + 1e-7)``). The gradients agree at step 0,
the weights part at step 1 (numpy: past the weights' atol), and the note sent the user to "epsilon:
TF1 Adam 1e-8, Keras 1e-7; betas, momentum, nesterov ...; a slot's start: TF1 RMSProp's mean square
1, Keras's 0", settings this optimizer does not have.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf1_session

from tb_parity_plugin import compare, summary_v1, summary_v2

N, F, C, STEPS, LR, ACC = 16, 6, 3, 3, 0.1, 1e-5
RNG = np.random.default_rng(5)
X = (RNG.normal(size=(STEPS * N, F)) * 0.05).astype(np.float32)  # small gradients: small accumulators
Y = RNG.integers(0, C, size=STEPS * N).astype(np.int32)
W0 = (RNG.normal(size=(F, C)) * 0.3).astype(np.float32)


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, F])
        y = tf.compat.v1.placeholder(tf.int32, [None])
        logits = tf.compat.v1.layers.dense(x, C, kernel_initializer=tf.constant_initializer(W0), name="dense")
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, rec.activation("dense", logits)))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.AdagradOptimizer(LR, initial_accumulator_value=ACC)
        train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, N)


def _keras(run_dir: str, epsilon: float) -> None:
    inputs = tf.keras.Input((F,))
    model = tf.keras.Model(
        inputs, tf.keras.layers.Dense(C, kernel_initializer=tf.constant_initializer(W0), name="dense")(inputs)
    )
    model.compile(
        tf.keras.optimizers.Adagrad(LR, initial_accumulator_value=ACC, epsilon=epsilon),
        tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["dense"])
    model.fit(X, Y, batch_size=N, shuffle=False, epochs=1, verbose=0)
    rec.close()


def _kernels(epsilon: float) -> list:
    """numpy, float64: the kernel as read at each step, under Adagrad with ``epsilon`` inside the root."""
    w, b = W0.astype(np.float64), np.zeros(C)
    acc_w, acc_b = np.full(w.shape, ACC), np.full(C, ACC)
    seen = []
    for s in range(STEPS):
        x, y = X[s * N : (s + 1) * N].astype(np.float64), Y[s * N : (s + 1) * N]
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(N), y] -= 1
        gw, gb = x.T @ p / N, p.sum(0) / N
        seen.append(w.copy())
        acc_w, acc_b = acc_w + gw * gw, acc_b + gb * gb
        w, b = w - LR * gw / np.sqrt(acc_w + epsilon), b - LR * gb / np.sqrt(acc_b + epsilon)
    return seen


def test_an_adagrad_port_apart_by_kerass_epsilon_is_told_of_adagrads_epsilon(tmp_path) -> None:
    tf1, port = _kernels(0.0), _kernels(1e-7)
    assert np.array_equal(tf1[0], port[0]) and np.abs(tf1[1] - port[1]).max() > 3e-5  # numpy: apart at step 1
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"), epsilon=1e-7)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "weight", "dense/kernel:0"), first
    note = first.note or ""
    assert "TF1's AdagradOptimizer has none, Keras's Adagrad adds 1e-7" in note, note
    assert "Adam" not in note and "RMSProp" not in note, note


def test_an_adagrad_port_with_epsilon_0_agrees(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"), epsilon=0.0)
    assert compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence is None
