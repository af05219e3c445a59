"""A triplet model: one tower called on the anchor, the positive and the negative. TF1 shares it with
``variable_scope(reuse=AUTO_REUSE)``, so each weight's gradient is the sum over its three uses; a port's
hand-written loop took each use's gradient and averaged them, every gradient 1/3 of TF1's. The note named
the loss's reduction, micro-batches or a loss scale, and nothing of the tower recorded three times a step;
it now names the layer's calls and the average over its uses (numpy: the sum over the three uses is the
baseline's gradient, three times the port's)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, BATCH, D, H, E, LR, MARGIN = 2, 8, 5, 6, 3, 0.05, 1.0
RNG = np.random.default_rng(31)
XA = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
XP = (XA + 0.5 * RNG.standard_normal((STEPS * BATCH, D))).astype(np.float32)
XN = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
W1 = (RNG.standard_normal((D, H)) * 0.5).astype(np.float32)
W2 = (RNG.standard_normal((H, E)) * 0.5).astype(np.float32)
NAMES = ("embed", "embed/call_1", "embed/call_2")


def _numpy_kernel_gradients() -> tuple[np.ndarray, np.ndarray]:
    """float64, step 0: the two kernels' gradients summed over the tower's three uses (biases start at 0)."""
    xs = [x[:BATCH].astype(np.float64) for x in (XA, XP, XN)]
    zs = [x @ W1 for x in xs]
    a, p, n = (np.maximum(z, 0) @ W2 for z in zs)
    active = ((np.sum((a - p) ** 2, 1) - np.sum((a - n) ** 2, 1) + MARGIN) > 0)[:, None] / BATCH
    d_outs = (active * 2 * (n - p), active * -2 * (a - p), active * 2 * (a - n))
    g1 = sum(x.T @ ((d @ W2.T) * (z > 0)) for x, z, d in zip(xs, zs, d_outs))
    g2 = sum(np.maximum(z, 0).T @ d for z, d in zip(zs, d_outs))
    return g1, g2


def _triplet_loss(a: tf.Tensor, p: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
    d_ap, d_an = tf.reduce_sum(tf.square(a - p), 1), tf.reduce_sum(tf.square(a - n), 1)
    return tf.reduce_mean(tf.maximum(d_ap - d_an + MARGIN, 0.0))


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        inputs = [tf.compat.v1.placeholder(tf.float32, [None, D]) for _ in range(3)]
        dense, init = tf.compat.v1.layers.dense, tf.constant_initializer

        def tower(x: tf.Tensor) -> tf.Tensor:
            with tf.compat.v1.variable_scope("tower", reuse=tf.compat.v1.AUTO_REUSE):
                h = dense(x, H, tf.nn.relu, kernel_initializer=init(W1), name="hidden")
                return dense(h, E, kernel_initializer=init(W2), name="embed")

        a, p, n = (rec.activation(name, tower(x)) for name, x in zip(NAMES, inputs))
        loss = rec.loss(_triplet_loss(a, p, n))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        train(rec, train_op, inputs, [XA, XP, XN], STEPS, BATCH)


def _port_averaging_uses(run_dir: str) -> np.ndarray:
    """A custom loop whose gradients are each use's, averaged; returns the recorded kernels' step-0 gradients."""
    tower = tf.keras.Sequential(
        [
            tf.keras.Input((D,)),
            tf.keras.layers.Dense(H, activation="relu", name="hidden"),
            tf.keras.layers.Dense(E, name="embed"),
        ]
    )
    tower.get_layer("hidden").kernel.assign(W1)
    tower.get_layer("embed").kernel.assign(W2)
    opt = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)
    kept = []

    @tf.function
    def step(xa: tf.Tensor, xp: tf.Tensor, xn: tf.Tensor) -> list:
        with rec.step(opt.iterations, variables=tower):
            with tf.GradientTape(persistent=True) as tape:
                outs = [rec.activation(name, tower(x)) for name, x in zip(NAMES, (xa, xp, xn))]
                loss = rec.loss(_triplet_loss(*outs))
            d_outs = tape.gradient(loss, outs)
            uses = [tape.gradient(o, tower.trainable_variables, output_gradients=g) for o, g in zip(outs, d_outs)]
            grads = [tf.add_n(list(g)) / len(uses) for g in zip(*uses)]
            rec.grads(grads, tower.trainable_variables)
            opt.apply_gradients(zip(grads, tower.trainable_variables))
        return grads

    for s in range(STEPS):
        rows = slice(s * BATCH, (s + 1) * BATCH)
        kept.append(step(tf.constant(XA[rows]), tf.constant(XP[rows]), tf.constant(XN[rows])))
    rec.close()
    return [g.numpy() for g in kept[0]]


def test_a_shared_tower_whose_gradients_are_averaged_over_its_uses_is_named(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    grads = _port_averaging_uses(str(tmp_path / "tf2"))
    g1, g2 = _numpy_kernel_gradients()
    np.testing.assert_allclose(3 * grads[0], g1, atol=1e-5)  # the port's: a third of the sum over the uses
    np.testing.assert_allclose(3 * grads[2], g2, atol=1e-5)
    assert np.abs(g1).max() > 1e-2
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (0, "grad"), first
    note = first.note or ""
    assert "times 0.3333" in note and "activation/embed is recorded 3 times a step" in note, note
    assert "averages over its uses where the other sums them" in note, note
