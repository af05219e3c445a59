"""A small L2 term on one side only, found steps after it began, is still named as a decay.

A new user's CNN port regularized its dense layer's bias too (``bias_regularizer=l2``), where TF1's
``tf.nn.l2_loss`` term covered the kernels alone. The bias starts at 0, so the term is 0 at step 0;
its gradient difference, λ times the bias, first passes atol at step 2, when the runs' weights have
already parted below tolerance and the difference is λ·b only to about 1%. The decay note asked for
λ·b to float32 rounding and said nothing; the first divergence was told it was "just past tolerance
... float32 rounding ... reaches this on faithful ports" and offered an --override. At an earlier
step, where the weights agreed, the difference is λ·b: the note finds it there and checks the
same factor explains the divergent step. Expected steps and factors come from a numpy replay.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf1_session

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(3)
X = RNG.standard_normal((96, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 96).astype(np.int32)
W = (RNG.standard_normal((6, 3)) * 0.4).astype(np.float32)
BATCH, STEPS, LAM, LR = 8, 12, 7e-4, 0.01


def numpy_adam(bias_l2: bool) -> list[dict[str, np.ndarray]]:
    """Weights and gradients at each step (float64): softmax cross-entropy plus LAM * l2_loss(kernel)
    (and of the bias when ``bias_l2``), TF1's Adam."""
    p = {"w": W.astype(np.float64), "b": np.zeros(3)}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    out = []
    for s in range(STEPS):
        x, y = X[s * BATCH : (s + 1) * BATCH].astype(np.float64), np.eye(3)[Y[s * BATCH : (s + 1) * BATCH]]
        z = x @ p["w"] + p["b"]
        q = np.exp(z - z.max(1, keepdims=True))
        q /= q.sum(1, keepdims=True)
        d = (q - y) / len(x)
        g = {"w": x.T @ d + LAM * p["w"], "b": d.sum(0) + (LAM * p["b"] if bias_l2 else 0.0)}
        out.append({**{k: val.copy() for k, val in p.items()}, **{"g" + k: val for k, val in g.items()}})
        t = s + 1
        for k in p:
            m[k] = 0.9 * m[k] + 0.1 * g[k]
            v[k] = 0.999 * v[k] + 0.001 * g[k] ** 2
            p[k] = p[k] - LR * np.sqrt(1 - 0.999**t) / (1 - 0.9**t) * m[k] / (np.sqrt(v[k]) + 1e-8)
    return out


def train_tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 6])
        y = tf.compat.v1.placeholder(tf.int32, [None])
        logits = tf.compat.v1.layers.dense(
            x,
            3,
            kernel_initializer=tf.constant_initializer(W),
            kernel_regularizer=lambda w: LAM * tf.nn.l2_loss(w),
            name="dense",
        )
        ce = tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits)
        loss = rec.loss(ce + tf.compat.v1.losses.get_regularization_loss())
        opt = tf.compat.v1.train.AdamOptimizer(rec.lr(tf.constant(LR)))
        train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train_op, (x, y), (X, Y), STEPS, BATCH)


def train_tf2(run_dir: str) -> None:
    """The port, its bias regularized too (Keras l2(λ/2): TF1's l2_loss halves)."""
    reg = tf.keras.regularizers.l2(LAM / 2)
    dense = tf.keras.layers.Dense(
        3, kernel_initializer=tf.constant_initializer(W), kernel_regularizer=reg, bias_regularizer=reg, name="dense"
    )
    model = tf.keras.Sequential([tf.keras.Input((6,)), dense])
    optimizer = tf.keras.optimizers.Adam(LR, epsilon=1e-8)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)

    @tf.function(input_signature=[tf.TensorSpec([None, 6]), tf.TensorSpec([None], tf.int32)])
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(optimizer.iterations, variables=model, optimizer=optimizer):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(y, model(x, training=True)) + tf.add_n(model.losses))
            rec.minimize(optimizer, loss, model.trainable_variables, tape)

    for s in range(STEPS):
        step(X[s * BATCH : (s + 1) * BATCH], Y[s * BATCH : (s + 1) * BATCH])
    rec.close()


def test_a_bias_decay_in_the_port_only_found_late_is_named_as_a_decay(tmp_path) -> None:
    base, port = numpy_adam(False), numpy_adam(True)
    gap = [float(np.abs(port[s]["gb"] - base[s]["gb"]).max()) for s in range(STEPS)]
    # numpy: the bias gradients part by LAM * b, under atol 1e-5 at step 1, past it at step 2 (every
    # other gradient and weight far under it there), where the weights have parted and LAM * b holds to
    # about 1% only, far past float32 rounding
    first = next(s for s in range(STEPS) if gap[s] > 1.2e-5)
    assert first == 2 and gap[1] < 0.9e-5, gap
    assert max(float(np.abs(port[2][k] - base[2][k]).max()) for k in ("gw", "w", "b")) < 2e-6
    np.testing.assert_allclose(port[1]["gb"] - base[1]["gb"], LAM * base[1]["b"], rtol=1e-9)
    off = np.abs(port[2]["gb"] - base[2]["gb"] - LAM * port[2]["b"]) / np.abs(LAM * port[2]["b"])
    assert off.max() > 1e-3, off
    train_tf1(str(tmp_path / "tf1"))
    train_tf2(str(tmp_path / "tf2"))
    d = compare(str(tmp_path)).first_divergence
    assert d is not None and (d.step, d.kind, d.tensor) == (first, "grad", "dense/bias:0"), d
    assert "times the weight dense/bias:0" in (d.note or "") and "weight decay" in d.note, d.note
    assert "at step 1 too" in d.note, d.note
    assert "just past tolerance" not in d.note, d.note
