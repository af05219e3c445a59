"""Dropout ports checked under the migration guide's DeterministicRandomTestTool: the note names the rate and
the mask's shape.

From a trial of dropout as users port it, both runs under the tool in its default ``constant`` mode (the
draws then agree, so a faithful port agrees): TF1's ``tf.compat.v1.nn.dropout(h, keep_prob=0.8)`` ported
as Keras ``Dropout(0.8)`` was told "dropout of rate 0.75 is on in the port only", though both ran dropout
(rate 0.2 and 0.8: the keep probability taken for the rate); and a port of per-channel dropout
(``noise_shape=[batch, 1, channels]``) with an element-wise ``Dropout`` was told of a mask drawn with
another seed. Each expectation is checked on the recorded values with numpy, not on the tool.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(2)
STEPS, BATCH, T, D, H, C = 2, 8, 10, 4, 8, 3
X = RNG.standard_normal((STEPS * BATCH, T, D)).astype(np.float32)
Y = RNG.integers(0, C, STEPS * BATCH).astype(np.int64)
K = (RNG.standard_normal((3, D, H)) * 0.4).astype(np.float32)
W = (RNG.standard_normal(((T - 2) * H, C)) * 0.2).astype(np.float32)


def _tf1(run_dir: str, keep_prob: bool) -> None:
    """The original: a conv1d, then ``nn.dropout(h, keep_prob=0.8)`` element-wise (``keep_prob``) or of rate
    0.25 per channel (``noise_shape=[batch, 1, channels]``), a dense layer; a ``sess.run`` loop."""
    with tf.compat.v1.keras.utils.DeterministicRandomTestTool().scope(), tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, T, D])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        conv = tf.compat.v1.layers.conv1d(
            x, H, 3, activation=tf.nn.relu, name="conv1d", kernel_initializer=tf.constant_initializer(K)
        )
        h = rec.activation("conv1d", conv)
        if keep_prob:
            dropped = tf.compat.v1.nn.dropout(h, keep_prob=0.8)
        else:
            dropped = tf.compat.v1.nn.dropout(h, rate=0.25, noise_shape=[tf.shape(h)[0], 1, H])
        h = rec.activation("dropout", dropped)
        flat = tf.compat.v1.layers.flatten(h)
        logits = tf.compat.v1.layers.dense(flat, C, name="dense", kernel_initializer=tf.constant_initializer(W))
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, rec.activation("dense", logits)))
        rec.lr(tf.constant(0.05))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.05), loss, global_step=gs)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                rows = slice(s * BATCH, (s + 1) * BATCH)
                rec.write(sess.run([train_op, fetches], {x: X[rows], y: Y[rows]})[1])
        rec.close()


def _fit(run_dir: str, drop: tf.keras.layers.Layer) -> None:
    """The port under ``fit``, under the tool too, with ``drop`` for the dropout."""
    with tf.compat.v1.keras.utils.DeterministicRandomTestTool().scope():
        conv = tf.keras.layers.Conv1D(H, 3, activation="relu", name="conv1d")
        dense = tf.keras.layers.Dense(C, name="dense")
        inputs = tf.keras.Input((T, D))
        model = tf.keras.Model(inputs, dense(tf.keras.layers.Flatten()(drop(conv(inputs)))))
        conv.set_weights([K, np.zeros(H, np.float32)])
        dense.set_weights([W, np.zeros(C, np.float32)])
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(tf.keras.optimizers.SGD(0.05), loss)
        rec = summary_v2.Recorder(run_dir)
        summary_v2.instrument(model, rec, layers=[conv, drop, dense])
        model.fit(X, Y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
        rec.close()


def _step0(run_dir: str) -> tuple[np.ndarray, np.ndarray]:
    got = tensors_by_step(run_dir)[0]
    return tuple(np.asarray(got[("activation", name)][2]).reshape(BATCH, T - 2, H) for name in ("conv1d", "dropout"))


def test_keep_prob_ported_as_the_rate_names_both_rates(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"), keep_prob=True)
    _fit(str(tmp_path / "faithful"), tf.keras.layers.Dropout(0.2, name="dropout"))
    _fit(str(tmp_path / "tf2"), tf.keras.layers.Dropout(0.8, name="dropout"))
    (h, a), (h_port, b), (_, same) = (_step0(str(tmp_path / n)) for n in ("tf1", "tf2", "faithful"))
    np.testing.assert_array_equal(h_port, h)
    np.testing.assert_array_equal(same, a)  # numpy: the faithful port's mask is the original's
    live = h != 0
    # numpy: each run's kept elements are its input / keep: 0.8 in the original, 0.2 in the port
    np.testing.assert_allclose(a[live & (a != 0)], h[live & (a != 0)] / 0.8, rtol=1e-6)
    np.testing.assert_allclose(b[live & (b != 0)], h[live & (b != 0)] / 0.2, rtol=1e-6)
    assert (live & (a == 0)).any() and (live & (a != 0) & (b == 0)).any()
    assert compare(str(tmp_path), baseline="tf1", candidate="faithful").agree
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dropout"), first
    assert "'tf1' keeps x / 0.8 (rate 0.2), 'tf2' x / 0.2 (rate 0.8)" in first.note, first.note
    assert "the rate and the keep probability swapped" in first.note
    assert "on in 'tf2' only" not in first.note


def test_per_channel_dropout_ported_element_wise_names_the_mask_shape(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"), keep_prob=False)
    _fit(str(tmp_path / "faithful"), tf.keras.layers.SpatialDropout1D(0.25, name="dropout"))
    _fit(str(tmp_path / "tf2"), tf.keras.layers.Dropout(0.25, name="dropout"))
    (h, a), (h_port, b), (_, same) = (_step0(str(tmp_path / n)) for n in ("tf1", "tf2", "faithful"))
    np.testing.assert_array_equal(h_port, h)
    np.testing.assert_array_equal(same, a)
    live = h != 0

    def shared_over_time(out: np.ndarray) -> bool:  # numpy: one keep/drop per (sample, channel)
        kept = out != 0
        return all(len(set(kept[n, live[n, :, c], c])) <= 1 for n in range(BATCH) for c in range(H))

    assert shared_over_time(a) and not shared_over_time(b)
    assert compare(str(tmp_path), baseline="tf1", candidate="faithful").agree
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dropout"), first
    assert f"'tf1' draws one value for all elements along axis 1 (noise_shape [batch, 1, {H}]" in first.note
    assert "'tf2' draws each element on its own" in first.note, first.note
    assert "seed" not in first.note
