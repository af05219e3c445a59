"""A siamese port whose second use of the shared tower goes through ``tf.stop_gradient``: every
weight, both calls' outputs and the loss agree at step 0, and the tower's gradients differ (the
shared weight's gradient is the sum over its uses; the port keeps one). A new user's such port, and
a tied embedding whose output use was stopped, diverged at step 0 on a gradient with no note."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from test_shared_layer_outputs import _fit, _tf1

from tb_parity_plugin import compare, summary_v2


def test_a_gradient_that_differs_under_an_agreeing_forward_pass_is_told_so(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), stop_second=True)
    tf1, port = (tensors_by_step(str(tmp_path / run))[0] for run in ("tf1", "tf2"))
    # numpy on the recorded step 0: the loss and both calls' outputs equal, the tower's gradient not
    for key in (("loss", "loss"), ("activation", "embed"), ("activation", "embed/call_1")):
        np.testing.assert_allclose(np.asarray(tf1[key][2]).ravel(), np.asarray(port[key][2]).ravel(), atol=1e-6)
    grad = np.asarray(tf1[("grad", "tower/embed/kernel:0")][2])
    assert np.abs(grad - np.asarray(port[("grad", "embed/kernel:0")][2])).max() > 100 * 1e-5
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (0, "grad"), first
    assert first.note and "what is recorded of the forward pass agrees and the gradient does not" in first.note, (
        first.note
    )
    assert "stop_gradient" in first.note and "sum over them" in first.note, first.note


# -- a regularization loss left out of a custom loop's loss -------------------------------------
# TF1 minimises its data loss plus get_regularization_loss() (an L1 kernel regularizer) and records
# the data loss; the custom-loop port records the same data loss and minimises it alone, without
# sum(model.losses). Every weight, output and the recorded loss agree at step 0; the kernels'
# gradients differ by lambda * sign(w). The note said "the forward pass agrees and the backward pass
# does not" and sent its user to stop_gradients, the loss term it left out never named.

L1, LR1 = 1e-3, 0.1
RNG1 = np.random.default_rng(5)
X1 = RNG1.standard_normal((3 * 8, 4)).astype(np.float32)
Y1 = RNG1.integers(0, 3, 3 * 8)
W1 = (RNG1.standard_normal((4, 3)) * 0.5).astype(np.float32)


def _tf1_regularized(run_dir: str) -> None:
    from tf1_session import train

    from tb_parity_plugin import summary_v1

    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        logits = rec.activation(
            "logits",
            tf.compat.v1.layers.dense(
                x,
                3,
                kernel_initializer=tf.constant_initializer(W1),
                kernel_regularizer=tf.keras.regularizers.l1(L1),
                name="logits",
            ),
        )
        data_loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        total = data_loss + tf.compat.v1.losses.get_regularization_loss()
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR1), total, global_step=gs)
        train(rec, train_op, [x, y], [X1, Y1], 3, 8)


def _custom_loop_without_model_losses(run_dir: str) -> None:
    layer = tf.keras.layers.Dense(3, kernel_regularizer=tf.keras.regularizers.l1(L1), name="logits")
    model = tf.keras.Sequential([tf.keras.Input((4,)), layer])
    layer.kernel.assign(W1)
    opt = tf.keras.optimizers.SGD(LR1)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(y, rec.activation("logits", model(x))))  # the bug: no model.losses
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for s in range(3):
        step(tf.constant(X1[s * 8 : (s + 1) * 8]), tf.constant(Y1[s * 8 : (s + 1) * 8]))
    rec.close()


def test_a_loss_term_left_out_of_what_trains_is_named_not_a_forward_pass_that_agrees(tmp_path) -> None:
    _tf1_regularized(str(tmp_path / "tf1"))
    _custom_loop_without_model_losses(str(tmp_path / "tf2"))
    tf1, port = (tensors_by_step(str(tmp_path / run))[0] for run in ("tf1", "tf2"))
    # numpy on step 0: the recorded losses and logits equal; the kernel's gradients differ by L1 * sign(w)
    for key in (("loss", "loss"), ("activation", "logits")):
        np.testing.assert_allclose(np.asarray(tf1[key][2]).ravel(), np.asarray(port[key][2]).ravel(), atol=1e-6)
    gap = np.asarray(tf1[("grad", "logits/kernel:0")][2]) - np.asarray(port[("grad", "logits/kernel:0")][2])
    np.testing.assert_allclose(gap.reshape(W1.shape), L1 * np.sign(W1), rtol=1e-3, atol=1e-7)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "grad", "logits/kernel:0"), first
    assert "the forward pass agrees and the backward pass does not" not in first.note, first.note
    assert "a term of the loss one run minimises that the recorded loss leaves out" in first.note, first.note
    assert "sum(model.losses)" in first.note and "get_regularization_loss()" in first.note, first.note
