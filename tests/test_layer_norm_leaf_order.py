"""A layer norm whose variables the port creates in another order, under a scope named otherwise.

BERT's TF1 layer norm (``tf.contrib.layers.layer_norm``, every BERT checkpoint) creates ``beta``
before ``gamma``; Keras's ``LayerNormalization`` creates ``gamma`` first. A new user's BERT port
named its layers ``attention_output_LayerNorm`` where TF1 had ``attention/output/LayerNorm``, so
no name stage paired them, and the last stage paired equally many weights of one shape in
execution order: ``beta`` with ``gamma``, a false DIVERGE at step 0 on a faithful port. Written
as users write it: ``None`` batch dimensions, BERT's epsilon, Keras defaults otherwise; the
layer norm's output is checked against numpy.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, LR, EPS = 4, 0.1, 1e-12
RNG = np.random.default_rng(5)
K1 = (RNG.standard_normal((3, 6)) * 0.5).astype(np.float32)
K2 = (RNG.standard_normal((6, 2)) * 0.5).astype(np.float32)
X = RNG.standard_normal((STEPS, 8, 3)).astype(np.float32)
Y = RNG.standard_normal((STEPS, 8, 2)).astype(np.float32)


def _layer_norm(h: np.ndarray, epsilon: float) -> np.ndarray:
    """Layer norm over the last axis with gamma 1 and beta 0 (both runs' start), in float64."""
    h = h.astype(np.float64)
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    return (h - mean) / np.sqrt(var + epsilon)


def _tf1(run_dir: str) -> np.ndarray:
    """The BERT-style original; returns its layer norm's output at step 0."""
    tf1 = tf.compat.v1
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        x, y = tf1.placeholder(tf.float32, [None, 3]), tf1.placeholder(tf.float32, [None, 2])
        gs = tf1.train.get_or_create_global_step()
        with tf1.variable_scope("encoder"):
            h = tf1.layers.dense(x, 6, name="dense", kernel_initializer=tf1.constant_initializer(K1))
            with tf1.variable_scope("LayerNorm"):  # tf.contrib.layers.layer_norm's order: beta, then gamma
                beta = tf1.get_variable("beta", [6], initializer=tf1.zeros_initializer())
                gamma = tf1.get_variable("gamma", [6], initializer=tf1.ones_initializer())
                mean, var = tf.nn.moments(h, [-1], keepdims=True)
                ln = rec.activation("ln", tf.nn.batch_normalization(h, mean, var, beta, gamma, EPS))
        out = tf1.layers.dense(ln, 2, name="out", kernel_initializer=tf1.constant_initializer(K2))
        loss = rec.loss(tf.reduce_mean(tf.square(rec.activation("out", out) - y)))
        rec.lr(tf.constant(LR))
        train = rec.minimize(tf1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        rec.variables()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for step in range(STEPS):
                _, first, parity = sess.run([train, ln, rec.fetches], {x: X[step], y: Y[step]})
                rec.write(parity)
                if step == 0:
                    ln0 = first
        rec.close()
    return ln0


def _keras(run_dir: str, epsilon: float) -> np.ndarray:
    """The port: Keras layers named by the user, a ``tf.function`` loop; returns its layer norm's
    output at step 0."""
    dense = tf.keras.layers.Dense(6, name="dense")
    norm = tf.keras.layers.LayerNormalization(epsilon=epsilon, name="encoder_LayerNorm")
    head = tf.keras.layers.Dense(2, name="out")
    head(norm(dense(tf.zeros([1, 3]))))
    dense.kernel.assign(K1)
    head.kernel.assign(K2)
    variables = [dense.kernel, dense.bias, norm.gamma, norm.beta, head.kernel, head.bias]
    assert [v.name for v in variables[2:4]] == ["encoder_LayerNorm/gamma:0", "encoder_LayerNorm/beta:0"]
    opt = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with rec.step(opt.iterations, variables=variables):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                ln = rec.activation("ln", norm(dense(x)))
                loss = rec.loss(tf.reduce_mean(tf.square(rec.activation("out", head(ln)) - y)))
            rec.minimize(opt, loss, variables, tape)
        return ln

    ln0 = step(tf.constant(X[0]), tf.constant(Y[0])).numpy()
    for s in range(1, STEPS):
        step(tf.constant(X[s]), tf.constant(Y[s]))
    rec.close()
    return ln0


def test_layer_norm_variables_created_in_another_order_pair_by_their_names(tmp_path) -> None:
    h0 = X[0] @ K1  # both dense biases start at 0
    np.testing.assert_allclose(_tf1(str(tmp_path / "tf1")), _layer_norm(h0, EPS), atol=1e-5)
    np.testing.assert_allclose(_keras(str(tmp_path / "tf2"), EPS), _layer_norm(h0, EPS), atol=1e-5)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.first_divergence is None, report.first_divergence
    pairs = {(m["kind"], m["baseline"]): m["candidate"] for m in report.mapping}
    for leaf in ("beta", "gamma"):
        for kind in ("weight", "grad"):
            assert pairs[(kind, f"encoder/LayerNorm/{leaf}:0")] == f"encoder_LayerNorm/{leaf}:0"


def test_a_wrong_layer_norm_epsilon_is_still_found_at_its_output(tmp_path) -> None:
    """Keras's default epsilon (1e-3) where BERT has 1e-12: numpy puts the outputs apart by more
    than the tolerance at step 0, and the divergence is the layer norm's output there."""
    h0 = X[0] @ K1
    _tf1(str(tmp_path / "tf1"))
    np.testing.assert_allclose(_keras(str(tmp_path / "tf2"), 1e-3), _layer_norm(h0, 1e-3), atol=1e-5)
    assert np.abs(_layer_norm(h0, 1e-3) - _layer_norm(h0, EPS)).max() > 1e-4
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "ln"), first
