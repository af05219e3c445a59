"""An output too large for full values, just past tolerance: its statistics and its element sample
are described as an element-wise difference just past tolerance is.

A new user's faithful Adam U-Net port had its transposed convolution's output (8192 elements, over the
default ``full_values_limit``) 1.13x past tolerance at step 9 by its statistics and 1.08x by its
element sample, Adam amplifying float32 rounding, and got no note at all: the marginal note, which
says what reaches such a ratio on a faithful port and what on a small real difference, read full
values only. The same runs recorded with full values were told it. Here the port's output is TF1's
times ``1 + DELTA``, a small real difference of that size (real TensorFlow, a ``None`` batch, ``fit``
recorded by ``instrument``); the expected ratio is computed with numpy from the outputs' largest
elements and the documented tolerance (atol 1e-5, the warm-up's rtol and 2^-18 of the largest
element).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2
from tb_parity_plugin.engine import tolerance

IN, WIDTH, BATCH, STEPS, LR, DELTA = 4, 640, 8, 2, 0.01, 2e-5  # 8 x 640 = 5120 elements > 4096
RNG = np.random.default_rng(7)
X = RNG.uniform(0.5, 1.0, (BATCH * STEPS, IN)).astype(np.float32)
Y = RNG.standard_normal((BATCH * STEPS, 1)).astype(np.float32)
W1 = RNG.uniform(0.1, 0.3, (IN, WIDTH)).astype(np.float32)
W2 = (RNG.standard_normal((WIDTH, 1)) * 0.05).astype(np.float32)


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, IN])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        h = tf.compat.v1.layers.dense(x, WIDTH, name="wide", kernel_initializer=tf.constant_initializer(W1))
        h = rec.activation("wide", h)
        out = tf.compat.v1.layers.dense(h, 1, name="out", kernel_initializer=tf.constant_initializer(W2))
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        train_op = rec.minimize(
            tf.compat.v1.train.GradientDescentOptimizer(rec.lr(tf.constant(LR))), loss, global_step=gs
        )
        train(rec, train_op, [x, y], [X, Y], STEPS, BATCH)


class Scaled(tf.keras.layers.Layer):
    """The port's small real difference: its output times ``1 + DELTA``."""

    def call(self, t):
        return t * (1.0 + DELTA)


def _fit(run_dir: str) -> None:
    tf.keras.backend.clear_session()
    inp = tf.keras.Input((IN,))
    wide = Scaled(name="wide")(tf.keras.layers.Dense(WIDTH, name="dense")(inp))
    model = tf.keras.Model(inp, tf.keras.layers.Dense(1, name="out")(wide))
    model.get_layer("dense").kernel.assign(W1)
    model.get_layer("out").kernel.assign(W2)
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.MeanSquaredError())
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["wide"])
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def test_an_output_just_past_tolerance_by_its_statistics_and_its_sample_is_described(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", mapping=["dense/kernel:0=wide/kernel:0"])
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor, first.evidence) == (0, "activation", "wide", "statistics"), first
    # numpy: the largest element moves by DELTA of itself, held to atol + (rtol + 2^-18) x itself
    top = float((X[:BATCH] @ W1).max())
    ratio = DELTA * top / (1e-5 + (tolerance.WARMUP_RTOL + tolerance.OUTPUT_ATOL_OF_MAX) * top)
    assert 1.0 < ratio < tolerance.MARGINAL_RATIO
    assert first.error_ratio >= ratio * 0.99, (first.error_ratio, ratio)
    assert first.error_ratio < tolerance.MARGINAL_RATIO, first
    assert "its statistics put it just past tolerance" in first.note, first.note
    assert "Record it with full values" in first.note, first.note
    (sample,) = [d for d in report.divergences_at_first_step if d.tensor == "wide#sample"]
    assert 1.0 < sample.error_ratio < tolerance.MARGINAL_RATIO, sample
    assert "just past tolerance on its sampled elements" in sample.note, sample.note
