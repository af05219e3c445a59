"""A metric that differs while the training agrees. A helper's own-``train_step`` port fed its loss
tracker the loss before its regulariser, where the TF1 original logged the total it minimises: the
metric diverged at step 0 with no note, though the loss, every gradient and every weight agreed.
Written the way users write it (``placeholder([None, n])``, an L2 ``kernel_regularizer`` and
``get_regularization_loss()``, a ``tf.function`` loop adding ``model.losses``); the L2 term the metric
lacks is computed with numpy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf1_session

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, BATCH, WD = 3, 8, 0.05
RNG = np.random.default_rng(26)
X = RNG.standard_normal((STEPS * BATCH, 4)).astype(np.float32)
Y = RNG.standard_normal((STEPS * BATCH, 1)).astype(np.float32)
K = (RNG.standard_normal((4, 1)) * 0.5).astype(np.float32)


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x, y = tf.compat.v1.placeholder(tf.float32, [None, 4]), tf.compat.v1.placeholder(tf.float32, [None, 1])
        p = tf.compat.v1.layers.dense(
            x, 1, kernel_initializer=tf.constant_initializer(K), kernel_regularizer=tf.keras.regularizers.l2(WD)
        )
        total = tf.reduce_mean(tf.square(p - y)) + tf.compat.v1.losses.get_regularization_loss()
        loss = rec.loss(total)
        rec.metric("loss", total)
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        rec.variables()
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, BATCH)


def _port(run_dir: str, metric_with_l2: bool) -> list[float]:
    """The port; returns the metric it logged at each step."""
    dense = tf.keras.layers.Dense(
        1, kernel_initializer=tf.constant_initializer(K), kernel_regularizer=tf.keras.regularizers.l2(WD), name="dense"
    )
    model = tf.keras.Sequential([tf.keras.Input((4,)), dense])
    opt = tf.keras.optimizers.SGD(0.1)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with rec.step(opt.iterations, variables=model):
            with tf.GradientTape() as tape:
                mse = tf.reduce_mean(tf.square(model(x, training=True) - y))
                total = mse + tf.add_n(model.losses)
                loss = rec.loss(total)
            rec.metric("loss", total if metric_with_l2 else mse)
            rec.minimize(opt, loss, model.trainable_variables, tape)
        return mse

    logged = [
        float(step(tf.constant(X[s * BATCH : (s + 1) * BATCH]), tf.constant(Y[s * BATCH : (s + 1) * BATCH])))
        for s in range(STEPS)
    ]
    rec.close()
    return logged


def test_a_metric_apart_while_the_training_agrees_is_told_so(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "same"), metric_with_l2=True)
    _port(str(tmp_path / "bare"), metric_with_l2=False)
    assert compare(str(tmp_path), baseline="tf1", candidate="same").agree
    # numpy: at step 0 the bare metric lacks the L2 term of the initial kernel
    assert WD * float(np.sum(K.astype(np.float64) ** 2)) > 1e-3
    first = compare(str(tmp_path), baseline="tf1", candidate="bare").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "metric", "loss"), first
    assert "the runs train alike here" in (first.note or ""), first.note
