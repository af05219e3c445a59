"""A Transformer's embedding scaled by sqrt(d_model) before its positions are added in TF1, not in the port.

tensor2tensor-style TF1 code computes ``embedding_lookup(table, ids) * sqrt(d) + positions``; a port that
drops the scale gives ``lookup + positions``: the difference is ``(1 - sqrt(d))`` times the lookup, the
output recorded just before, at every element. A trial's port was told only that the layer "computes
another function of its input (activation, padding, epsilon, a training flag)". Expected values: numpy.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

V, D = 7, 8
IDS = np.array([[1, 3, 4, 5], [2, 6, 1, 0]], np.int32)
LABELS = np.array([[3, 4, 5, 2], [6, 1, 3, 0]], np.int32)
STEPS, LR = 2, 0.1
_RNG = np.random.default_rng(11)
EMB = (_RNG.standard_normal((V, D)) * D**-0.5).astype(np.float32)
KERNEL = (_RNG.standard_normal((D, V)) * 0.3).astype(np.float32)


def positions(t: int) -> np.ndarray:
    """Sinusoids as tensor2tensor's get_timing_signal_1d lays them out (sines, then cosines)."""
    inv = np.exp(np.arange(D // 2) * -(math.log(1.0e4) / (D // 2 - 1)))
    angles = np.arange(t)[:, None] * inv[None]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)


def train_tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int32, [None, None])
        labels = tf.compat.v1.placeholder(tf.int32, [None, None])
        pos = tf.compat.v1.placeholder(tf.float32, [None, D])
        table = tf.compat.v1.get_variable("embedding", initializer=EMB)
        x = rec.activation("embedding", tf.nn.embedding_lookup(table, ids))
        x = rec.activation("positional", x * D**0.5 + pos[None])
        logits = tf.compat.v1.layers.dense(x, V, name="logits", kernel_initializer=tf.constant_initializer(KERNEL))
        mask = tf.cast(tf.not_equal(labels, 0), tf.float32)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits, weights=mask))
        rec.lr(tf.constant(LR))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        rec.variables()
        train(rec, train_op, [], [], STEPS, 0, fixed={ids: IDS, labels: LABELS, pos: positions(IDS.shape[1])})


def train_port(run_dir: str, scaled: bool) -> None:
    emb, out = tf.keras.layers.Embedding(V, D, name="embedding"), tf.keras.layers.Dense(V, name="logits")
    model = tf.keras.Sequential([tf.keras.Input((None,), dtype="int32"), emb, out])
    emb.set_weights([EMB])
    out.set_weights([KERNEL, np.zeros(V, np.float32)])
    opt = tf.keras.optimizers.SGD(LR)
    ce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(ids: tf.Tensor, labels: tf.Tensor, pos: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                x = rec.activation("embedding", emb(ids))
                if scaled:
                    x *= tf.math.sqrt(tf.cast(D, tf.float32))
                x = rec.activation("positional", x + pos[None])
                mask = tf.cast(tf.not_equal(labels, 0), tf.float32)
                loss = rec.loss(tf.reduce_sum(ce(labels, out(x)) * mask) / tf.reduce_sum(mask))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for _ in range(STEPS):
        step(tf.constant(IDS), tf.constant(LABELS), tf.constant(positions(IDS.shape[1])))
    rec.close()


def test_an_embedding_scale_lost_in_the_port_is_named_as_sqrt_d_model(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_port(str(tmp_path / "faithful"), scaled=True)
    train_port(str(tmp_path / "unscaled"), scaled=False)
    lookup = EMB.astype(np.float64)[IDS]
    expected = {"tf1": lookup * math.sqrt(D) + positions(4), "unscaled": lookup + positions(4)}
    for run, want in expected.items():
        got = tensors_by_step(str(tmp_path / run))[0][("activation", "positional")][2].reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # numpy: the port's minus TF1's is (1 - sqrt(8)) = -1.828 times the lookup
    np.testing.assert_allclose(expected["unscaled"] - expected["tf1"], (1 - math.sqrt(D)) * lookup, atol=1e-12)

    assert compare(str(tmp_path), baseline="tf1", candidate="faithful").agree
    d = compare(str(tmp_path), baseline="tf1", candidate="unscaled").first_divergence
    assert d is not None and (d.step, d.tensor) == (0, "positional"), d
    note = d.note or ""
    assert "its candidate minus its baseline is -1.828 times activation/embedding" in note, note
    assert "2.828 = sqrt(8)" in note and "'tf1' likely scales its input by sqrt(d_model)" in note, note
    assert "computes another function of its input" not in note, note


def test_an_input_added_in_one_run_only_is_not_read_as_sqrt_d_model_at_a_width_of_4() -> None:
    """A residual dropped in the port: the original's output is ``x + p``, the port's ``p``, so the
    difference is -1 times the input, and at a last axis of 4 that is 1 - sqrt(4): it was told of an
    embedding's sqrt(d_model) (a review's counter-example). numpy builds both outputs."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    p = np.broadcast_to(rng.standard_normal((3, 4)).astype(np.float32), x.shape).copy()
    assert np.allclose((p - (x + p)) / x, -1.0) and math.sqrt(4) == 1 - (-1)
    runs = [
        run(
            name,
            [
                series("weight", "dense/kernel:0", [w], order=0),
                series("activation", "embedding", [x], order=1),
                series("activation", "positional", [out], order=2),
            ],
            side=name,
        )
        for name, out in (("tf1", x + p), ("tf2", p))
    ]
    first = Comparison(*runs).report().first_divergence
    assert first is not None and (first.step, first.tensor) == (0, "positional"), first
    assert "sqrt(d_model)" not in (first.note or ""), first.note
    assert "the input itself added in 'tf1' only" in (first.note or ""), first.note
