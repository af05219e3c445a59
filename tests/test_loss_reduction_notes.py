"""A TF1 regression on ``tf.compat.v1.losses.mean_squared_error`` / a hand-written mean, against Keras
ports whose loss is scaled as a whole or whose labels broadcast.

TF1's ``weights=`` divide by the count of non-zero weights (``SUM_BY_NONZERO_WEIGHTS``), ``fit``'s
``sample_weight=`` by the batch: a batch with zero weights gives a loss and every gradient that are
TF1's times non-zero / batch (a helper's port: 5/8 at step 1), which was told only "the loss is computed
differently (reduction, from_logits, ...)" and its gradients "a scale between the loss and this gradient";
a port summing where TF1 averages likewise (8 times). Labels of shape ``[N]`` against predictions
``[N, 1]`` in a hand-written mean broadcast to ``[N, N]``, and the note named no broadcast; a Huber port
left at Keras's default delta 1 where TF1 gave 2 was told of no parameter of the loss. The losses
are checked against numpy.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(61)
X = RNG.standard_normal((16, 4)).astype(np.float32)
Y = (RNG.standard_normal((16, 1)) * 3).astype(np.float32)
W = (RNG.standard_normal((4, 1)) * 0.5).astype(np.float32)
WEIGHTS = np.array([1, 2, 1, 0.5, 1, 1, 2, 1, 0, 1, 2, 0, 1, 0, 1, 1], np.float32)  # zeros in batch 1 only
BATCH, STEPS, LR = 8, 4, 0.1


def _batches() -> list[slice]:
    return [slice((s % 2) * BATCH, (s % 2) * BATCH + BATCH) for s in range(STEPS)]


def train_tf1(run_dir: str, loss_name: str) -> None:
    """``loss_name``: ``weighted`` (mean_squared_error with weights=), ``mean`` (hand-written) or ``huber``
    (huber_loss with delta=2)."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        w = tf.compat.v1.placeholder(tf.float32, [None, 1])
        pred = rec.activation(
            "out", tf.compat.v1.layers.dense(x, 1, kernel_initializer=tf.constant_initializer(W), name="out")
        )
        if loss_name == "weighted":
            loss = tf.compat.v1.losses.mean_squared_error(y, pred, weights=w)
        elif loss_name == "huber":
            loss = tf.compat.v1.losses.huber_loss(y, pred, delta=2.0)
        else:
            loss = tf.reduce_mean(tf.square(y - pred))
        rec.loss(loss)
        rec.lr(tf.constant(LR))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        rec.variables()
        fed = [np.concatenate([a[sl] for sl in _batches()]) for a in (X, Y, WEIGHTS[:, None])]
        train(rec, train_op, [x, y, w], fed, STEPS, BATCH)


def _model() -> Any:
    return tf.keras.Sequential(
        [tf.keras.Input((4,)), tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(W), name="out")]
    )


def train_fit(run_dir: str, loss: Any, sample_weight: Optional[np.ndarray]) -> None:
    model = _model()
    model.compile(optimizer=tf.keras.optimizers.SGD(LR), loss=loss)
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["out"])
    model.fit(X, Y, batch_size=BATCH, epochs=STEPS // 2, shuffle=False, verbose=0, sample_weight=sample_weight)
    rec.close()


def train_loop(run_dir: str, labels: np.ndarray, name: str = "out") -> None:
    """A custom loop on a hand-written mean squared error, fed ``labels`` (``[N, 1]`` or flat ``[N]``);
    ``name``: what the output is recorded as (another than its layer's ties it to no bias gradient)."""
    model, opt = _model(), tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                pred = rec.activation(name, model(x))
                loss = rec.loss(tf.reduce_mean(tf.square(y - pred)))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for sl in _batches():
        step(tf.constant(X[sl]), tf.constant(labels[sl]))
    rec.close()


def numpy_losses(loss: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> list[float]:
    """Float64 SGD on ``loss(residual [B, 1], weights [B, 1], y [B, 1])``, its gradient taken by central
    differences in the prediction (the loss is quadratic in it, so they are exact to rounding): the loss
    at each step, before its update."""
    kernel, bias, out = W.astype(np.float64), np.zeros(1), []
    for sl in _batches():
        x, y, w = X[sl].astype(np.float64), Y[sl].astype(np.float64), WEIGHTS[sl, None].astype(np.float64)
        pred = x @ kernel + bias
        out.append(float(loss(pred, w, y)))
        dz = np.zeros_like(pred)
        for i in range(len(pred)):
            e = np.zeros_like(pred)
            e[i] = 1e-3
            dz[i] = (loss(pred + e, w, y) - loss(pred - e, w, y)) / 2e-3
        kernel, bias = kernel - LR * x.T @ dz, bias - LR * dz.sum(0)
    return out


def tf1_weighted(p: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (w * (p - y) ** 2).sum() / np.count_nonzero(w)


def keras_weighted(p: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (w * (p - y) ** 2).sum() / len(p)


def test_zero_sample_weights_and_a_sum_are_told_as_the_loss_scaled_as_a_whole(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"), "weighted")
    nonzero = np.array([np.count_nonzero(WEIGHTS[sl]) for sl in _batches()], np.float32)
    train_fit(str(tmp_path / "rescaled"), "mse", WEIGHTS * BATCH / np.repeat(nonzero[:2], BATCH))
    train_fit(str(tmp_path / "raw"), "mse", WEIGHTS)
    got = {run: tensors_by_step(str(tmp_path / run)) for run in ("tf1", "raw")}
    for run, loss in (("tf1", tf1_weighted), ("raw", keras_weighted)):
        want = numpy_losses(loss)
        np.testing.assert_allclose([float(got[run][s][("loss", "loss")][2]) for s in range(STEPS)], want, rtol=1e-5)
    tf1_loss, raw_loss = numpy_losses(tf1_weighted), numpy_losses(keras_weighted)
    assert tf1_loss[0] == raw_loss[0] and abs(raw_loss[1] / tf1_loss[1] - 5 / 8) < 1e-12  # step 1: 5 of 8 non-zero
    assert compare(str(tmp_path), baseline="tf1", candidate="rescaled").agree
    report = compare(str(tmp_path), baseline="tf1", candidate="raw")
    d = report.first_divergence
    assert d is not None and (d.step, d.kind) == (1, "loss"), d
    assert "by 5/8" in (d.note or "") and "non-zero weights (5)" in (d.note or "") and "'tf1'" in (d.note or ""), d.note
    grads = [g for g in report.divergences_at_first_step if g.kind == "grad" and g.note]
    assert grads and all("and so is loss/loss" in (g.note or "") for g in grads), [g.note for g in grads]

    train_fit(str(tmp_path / "summed"), tf.keras.losses.MeanSquaredError(reduction="sum"), WEIGHTS)
    d = compare(str(tmp_path), baseline="tf1", candidate="summed").first_divergence
    assert d is not None and (d.step, d.kind) == (0, "loss"), d
    assert "by 8, this step's batch: 'summed' sums" in (d.note or ""), d.note


def test_flat_labels_broadcast_in_a_hand_written_mean_are_named(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"), "mean")
    train_loop(str(tmp_path / "tf2"), Y)
    train_loop(str(tmp_path / "flat"), Y[:, 0])
    mean = numpy_losses(lambda p, w, y: ((p - y) ** 2).mean())
    broadcast = numpy_losses(lambda p, w, y: ((y.reshape(1, -1) - p) ** 2).mean())
    for run, want in (("tf1", mean), ("tf2", mean), ("flat", broadcast)):
        got = tensors_by_step(str(tmp_path / run))
        np.testing.assert_allclose([float(got[s][("loss", "loss")][2]) for s in range(STEPS)], want, rtol=1e-5)
    assert abs(broadcast[0] / mean[0] - 1) > 1e-2
    assert compare(str(tmp_path), baseline="tf1", candidate="tf2").agree
    d = compare(str(tmp_path), baseline="tf1", candidate="flat").first_divergence
    assert d is not None and (d.step, d.kind) == (0, "loss"), d
    assert "labels of shape [8] against it broadcast to [8, 8]" in (d.note or ""), d.note
    assert "grad/out/bias:0, its one-element bias's gradient, agrees" in (d.note or ""), d.note


def test_a_broadcast_is_not_guessed_without_the_bias_gradient_to_check_it(tmp_path) -> None:
    """Two trials' [n, 1] outputs (a GAN discriminator's second call, a siamese distance) with labels of
    that very shape were told of labels broadcast to [n, n], with no bias gradient of theirs recorded to
    check it against. Here both runs record the output as "pred", which names no layer: the flat-label
    port still diverges at its loss (numpy: the broadcast mean is another number), told no broadcast."""
    train_loop(str(tmp_path / "tf2"), Y, name="pred")
    train_loop(str(tmp_path / "flat"), Y[:, 0], name="pred")
    mean = numpy_losses(lambda p, w, y: ((p - y) ** 2).mean())
    broadcast = numpy_losses(lambda p, w, y: ((y.reshape(1, -1) - p) ** 2).mean())
    got = tensors_by_step(str(tmp_path / "flat"))
    np.testing.assert_allclose([float(got[s][("loss", "loss")][2]) for s in range(STEPS)], broadcast, rtol=1e-5)
    assert abs(broadcast[0] / mean[0] - 1) > 1e-2
    d = compare(str(tmp_path), baseline="tf2", candidate="flat").first_divergence
    assert d is not None and (d.step, d.kind) == (0, "loss"), d
    assert "broadcast" not in (d.note or ""), d.note


def huber(delta: float) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    def loss(p: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
        r = np.abs(p - y)
        return np.where(r <= delta, 0.5 * r**2, delta * r - 0.5 * delta**2).mean()

    return loss


def test_a_huber_port_with_another_delta_is_told_of_the_losss_parameter(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"), "huber")
    train_fit(str(tmp_path / "tf2"), tf.keras.losses.Huber(delta=2.0), None)
    train_fit(str(tmp_path / "default"), tf.keras.losses.Huber(), None)
    pred, ones = X[:BATCH] @ W.astype(np.float64), np.ones((BATCH, 1))
    want = {delta: float(huber(delta)(pred, ones, Y[:BATCH])) for delta in (1.0, 2.0)}
    assert abs(want[1.0] / want[2.0] - 1) > 0.1  # residuals past 1: the delta changes the loss at step 0
    for run, delta in (("tf1", 2.0), ("tf2", 2.0), ("default", 1.0)):
        got = tensors_by_step(str(tmp_path / run))[0][("loss", "loss")][2]
        np.testing.assert_allclose(got, want[delta], rtol=1e-5)
    assert compare(str(tmp_path), baseline="tf1", candidate="tf2").agree
    d = compare(str(tmp_path), baseline="tf1", candidate="default").first_divergence
    assert d is not None and (d.step, d.kind) == (0, "loss"), d
    assert "Huber's delta" in (d.note or ""), d.note
    # the deltas clip the residuals apart, and so the bias gradients: no broadcast of the labels
    assert "broadcast" not in (d.note or ""), d.note


def _train_tf1_l2(run_dir: str, lam: float) -> None:
    """The original with ``kernel_regularizer=l2(lam)`` on its [N, 1] output layer, minimising the mean squared
    error plus get_regularization_loss()."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        init, reg = tf.constant_initializer(W), tf.keras.regularizers.l2(lam)
        pred = rec.activation(
            "out", tf.compat.v1.layers.dense(x, 1, kernel_initializer=init, kernel_regularizer=reg, name="out")
        )
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, pred) + tf.compat.v1.losses.get_regularization_loss())
        rec.lr(tf.constant(LR))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        rec.variables()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for sl in _batches():
                rec.write(sess.run([train_op, rec.fetches], {x: X[sl], y: Y[sl]})[1])
        rec.close()


def test_a_port_without_tf1s_kernel_regularizer_is_not_told_of_a_label_broadcast(tmp_path) -> None:
    """A kernel L2 term left out of the port changes the loss and the kernel's gradient (by 2 lam w) but
    not the one-element bias's gradient: the loss's note on the [N, 1] output named labels broadcast to
    [N, N] and gave the bias's agreeing gradient as its evidence, while the kernel's gradient was rightly
    told of a weight decay. A gradient apart by a factor of its weight is an L2 term, no broadcast."""
    lam = 0.05
    _train_tf1_l2(str(tmp_path / "tf1"), lam)
    train_fit(str(tmp_path / "tf2"), "mse", None)
    x, y, w = (a.astype(np.float64) for a in (X[:BATCH], Y[:BATCH], W))
    residual = 2.0 * (x @ w - y) / BATCH  # numpy: the mean squared error's gradient in each prediction
    tf1, port = ({t: v[2] for t, v in tensors_by_step(str(tmp_path / run))[0].items()} for run in ("tf1", "tf2"))
    np.testing.assert_allclose(port[("grad", "out/kernel:0")].reshape(4, 1), x.T @ residual, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        tf1[("grad", "out/kernel:0")].reshape(4, 1), x.T @ residual + 2 * lam * w, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(tf1[("grad", "out/bias:0")], port[("grad", "out/bias:0")], rtol=1e-6)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    at_0 = {(d.kind, d.tensor): d.note or "" for d in report.divergences_at_first_step}
    assert report.first_divergence.step == 0, report.first_divergence
    assert "regularization terms" in at_0[("loss", "loss")] and "broadcast" not in at_0[("loss", "loss")], at_0
    assert "weight decay" in at_0[("grad", "out/kernel:0")], at_0


def test_a_factor_at_a_large_batch_is_not_read_as_a_count_of_non_zero_weights() -> None:
    """At a batch of 10000 any factor lies within 1e-4 of some m/10000: a review's loss 0.3137 times the
    baseline's was told 3137 non-zero weights of 10000. The count is named only where a chance match is
    rare (built from numpy series: the loss and one gradient scaled alike)."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    rng = np.random.default_rng(3)
    out = rng.standard_normal((10000, 2)).astype(np.float32)
    grad = rng.standard_normal((3, 2)).astype(np.float32)
    kernel = rng.standard_normal((3, 2)).astype(np.float32)
    factor = np.float32(0.3137)

    def side(name: str, scale: np.float32) -> object:
        return run(
            name,
            [
                series("weight", "dense/kernel:0", [kernel, kernel], order=0),
                series("output", "dense", [out, out], order=1),
                series("loss", "loss", [np.float32(1.5), np.float32(1.25) * scale], order=2),
                series("grad", "dense/kernel:0", [grad, grad * scale], order=3),
            ],
        )

    first = Comparison(side("tf1", np.float32(1)), side("tf2", factor)).report().first_divergence
    assert first is not None and (first.step, first.kind) == (1, "loss"), first
    assert "non-zero weights (3137)" not in (first.note or ""), first.note
    assert "the loss as a whole is scaled" in (first.note or ""), first.note
