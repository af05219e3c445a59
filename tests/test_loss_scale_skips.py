"""A mixed-precision port whose LossScaleOptimizer skips an update on overflow says so, and one that
records (and applies) the scaled gradients without undoing the scale is told of the loss scale.

A new user's faithful ``mixed_float16`` port (the dynamic loss scale starts at 2**15) had inf in its
unscaled gradients at steps 0 and 1, which the optimizer skipped (its weights stayed, the scale
halved), and the verdict said only that its gradients turned non-finite, as if the port's math
produced inf. The data here are small integers and quarters, so the float16 forward pass is exact
and only the scaled backward pass overflows; numpy says where.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf
from tf1_recipes import dense_regression
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(29)
STEPS, SCALE = 3, 2.0**15
X = RNG.integers(-3, 4, size=(STEPS, 8, 4)).astype(np.float32)
Y = RNG.integers(15, 25, size=(STEPS, 8, 1)).astype(np.float32)
K = (RNG.integers(-4, 5, size=(4, 1)) / 4).astype(np.float32)


def _tf1(run_dir: str) -> None:
    """TF1 Adam on a dense regression, in float32."""
    dense_regression(
        run_dir,
        K,
        X,
        Y,
        lambda gs, rec: tf.compat.v1.train.AdamOptimizer(rec.lr(tf.constant(0.01)), epsilon=1e-8),
        lambda opt, variables: {},
    )


def _port(run_dir: str, by_hand: bool) -> list[np.ndarray]:
    """The port's dense layer under the ``mixed_float16`` policy in a custom loop; the loss scaled by a
    ``LossScaleOptimizer`` or, ``by_hand``, by a constant 2**15 and applied by plain Adam (which does
    not skip). Returns the kernel before each step, read from the model."""
    inputs = tf.keras.Input((4,))
    dense = tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(K), dtype="mixed_float16", name="dense")
    model = tf.keras.Model(inputs, dense(inputs))
    adam = tf.keras.optimizers.Adam(0.01, epsilon=1e-8)
    opt = adam if by_hand else tf.keras.mixed_precision.LossScaleOptimizer(adam)
    rec = summary_v2.Recorder(run_dir)
    kernels = []
    for s in range(STEPS):
        kernels.append(dense.kernel.numpy().copy())
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(tf.constant(0.01))
            with tf.GradientTape() as tape:
                loss = rec.loss(tf.reduce_mean(tf.square(tf.cast(model(X[s]), tf.float32) - Y[s])))
                scaled = loss * SCALE if by_hand else opt.get_scaled_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            grads = [g / SCALE for g in grads] if by_hand else opt.get_unscaled_gradients(grads)
            rec.grads(grads, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
    rec.close()
    return kernels


def test_a_loss_scale_skipping_an_overflowing_update_is_named(tmp_path) -> None:
    # numpy: the step-0 kernel gradient is finite, and 2**15 times it is past float16's largest value
    x, y = X[0].astype(np.float64), Y[0].astype(np.float64)
    grad = x.T @ (2.0 * (x @ K.astype(np.float64) - y) / len(x))
    assert np.isfinite(grad).all() and np.abs(grad).max() * SCALE > np.finfo(np.float16).max
    _tf1(str(tmp_path / "tf1"))
    kernels = _port(str(tmp_path / "tf2"), by_hand=False)
    assert np.array_equal(kernels[1], K)  # the LossScaleOptimizer skipped the update
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.reason) == (0, "grad", "nonfinite"), first
    assert "'tf2' has non-finite gradients at this step while its loss is finite" in first.note, first.note
    assert "it skipped this update, as a LossScaleOptimizer does" in first.note
    assert "'tf1' applied its update, so the weights differ by it from step 1 on" in first.note


def test_an_overflowing_update_that_is_applied_is_not_called_skipped(tmp_path) -> None:
    """The loss scaled by hand and plain Adam: the inf reaches the weights, which is no skip."""
    _tf1(str(tmp_path / "tf1"))
    kernels = _port(str(tmp_path / "tf2"), by_hand=True)
    assert not np.isfinite(kernels[1]).all()
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.reason) == (0, "grad", "nonfinite"), first
    assert "skipped" not in (first.note or ""), first.note


XS = (RNG.normal(size=(STEPS, 8, 4)) * 0.5).astype(np.float32)
YS = (RNG.normal(size=(STEPS, 8, 1)) * 0.3).astype(np.float32)
KS = (RNG.normal(size=(4, 1)) * 0.5).astype(np.float32)


def test_gradients_of_the_scaled_loss_never_unscaled_name_the_loss_scale(tmp_path) -> None:
    """The custom step applies ``tape.gradient(opt.get_scaled_loss(loss))`` as it is: every gradient is
    2**15 times TF1's, each element off that factor by float16's rounding, not float32's."""
    dense_regression(
        str(tmp_path / "tf1"),
        KS,
        XS,
        YS,
        lambda gs, rec: tf.compat.v1.train.AdamOptimizer(rec.lr(tf.constant(0.01)), epsilon=1e-8),
        lambda opt, variables: {},
    )
    inputs = tf.keras.Input((4,))
    dense = tf.keras.layers.Dense(
        1, kernel_initializer=tf.constant_initializer(KS), dtype="mixed_float16", name="dense"
    )
    model = tf.keras.Model(inputs, dense(inputs))
    opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.Adam(0.01, epsilon=1e-8))
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    recorded = []
    for s in range(STEPS):
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(tf.constant(0.01))
            with tf.GradientTape() as tape:
                loss = rec.loss(tf.reduce_mean(tf.square(tf.cast(model(XS[s]), tf.float32) - YS[s])))
                scaled = opt.get_scaled_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)  # the port's bug: never unscaled
            recorded.append(grads[0].numpy())
            rec.grads(grads, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
    rec.close()
    # numpy: the step-0 kernel gradient; the port's is 2**15 times it up to float16 rounding, which is
    # past float32's (the rule for one exact factor) but inside the README's grad atol of 1e-3
    x, y = XS[0].astype(np.float64), YS[0].astype(np.float64)
    grad = x.T @ (2.0 * (x @ KS.astype(np.float64) - y) / len(x))
    off = np.abs(recorded[0] / SCALE - grad)
    assert off.max() < 1e-3 and off.max() > 2.0**-21 * np.abs(grad).max() * 8, off.max()
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", overrides=["grad/*:atol=1e-3", "loss/*:atol=1e-3"])
    first = report.first_divergence
    assert (first.step, first.tensor) == (0, "dense/kernel:0"), first
    assert "times 32" in first.note and "2**15, within this gradient's tolerance" in first.note, first.note
    assert "a loss scale not undone" in first.note
    assert "stop_gradient" not in first.note


LAM = 1e-3


def _penalised(run_dir: str, eps: float, steps: int) -> Optional[np.ndarray]:
    """A dense regression plus a group-lasso penalty on its zero-initialised bias,
    ``LAM * sqrt(sum(b**2) + eps)``: in TF1 (float32, Adam) when ``eps``, else the port under
    ``mixed_float16`` with a ``LossScaleOptimizer`` (returning its bias after the last step)."""
    rows = [slice(s * 8, (s + 1) * 8) for s in range(steps)]
    xs, ys = XS.reshape(-1, 4), YS.reshape(-1, 1)
    if eps:
        with tf.Graph().as_default():
            rec = summary_v1.Recorder(run_dir)
            gs = tf.compat.v1.train.get_or_create_global_step()
            x = tf.compat.v1.placeholder(tf.float32, [None, 4])
            y = tf.compat.v1.placeholder(tf.float32, [None, 1])
            out = tf.compat.v1.layers.dense(x, 1, kernel_initializer=tf.constant_initializer(KS), name="dense")
            bias = tf.compat.v1.trainable_variables()[-1]
            penalty = LAM * tf.sqrt(tf.reduce_sum(tf.square(bias)) + eps)
            loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out) + penalty)
            opt = tf.compat.v1.train.AdamOptimizer(rec.lr(tf.constant(0.01)), epsilon=1e-7)
            train_op = rec.minimize(opt, loss, global_step=gs)
            rec.variables(optimizer=opt)
            train(rec, train_op, [x, y], [xs, ys], steps, 8)
        return None
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        inputs = tf.keras.Input((4,))
        dense = tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(KS), name="dense")
        model = tf.keras.Model(inputs, tf.keras.layers.Activation("linear", dtype="float32")(dense(inputs)))
        opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.Adam(0.01))
        rec = summary_v2.Recorder(run_dir)
        for r in rows:
            with rec.step(opt.iterations, variables=model, optimizer=opt):
                rec.lr(tf.constant(0.01))
                with tf.GradientTape() as tape:
                    penalty = LAM * tf.sqrt(tf.reduce_sum(tf.square(dense.bias)))  # the port's bug: no eps
                    loss = rec.loss(tf.reduce_mean(tf.square(model(xs[r]) - ys[r])) + penalty)
                    scaled = opt.get_scaled_loss(loss)
                grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
                rec.grads(grads, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
        rec.close()
        return dense.bias.numpy()
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_a_gradient_non_finite_at_every_step_is_not_called_an_overflow(tmp_path) -> None:
    """sqrt(sum(b**2)) at a zero bias has a 0/0 gradient at every step, whatever the loss scale: the
    LossScaleOptimizer skips every update. It was told of an overflow, 'not an inf of the model's math'."""
    b = np.zeros(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        assert np.isnan(b / np.sqrt(np.sum(b**2))).all()  # the port's penalty gradient at b = 0
        assert (b / np.sqrt(np.sum(b**2) + 1e-12) == 0).all()  # TF1's
    _penalised(str(tmp_path / "tf1"), 1e-12, 4)
    assert np.array_equal(_penalised(str(tmp_path / "tf2"), 0.0, 4), b)  # every update skipped
    overrides = ["loss/*:atol=1e-3", "grad/*:atol=1e-3", "weight/*:atol=1e-3"]
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2", overrides=overrides).first_divergence
    assert (first.step, first.tensor, first.reason) == (0, "dense/bias:0", "nonfinite"), first
    assert "it skipped this update" in first.note and "non-finite at every later step" in first.note, first.note
    assert "not an inf of the model's math" not in first.note, first.note
