"""A Keras 3 ``SeedGenerator``'s state is not recorded as the model's ``state``.

Every Keras 3 ``Dropout``, ``LSTM`` and ``GRU`` holds a ``SeedGenerator`` whose state variable
(``seed_generator_state``, shape [2]) counts random draws, whether the layer draws or not. ``instrument``
recorded it as ``state``, and a TF1 original, whose random ops keep their counters inside the op, has
nothing to pair it with: a new user's faithful Keras 3 LSTM port of a ``dynamic_rnn`` text classifier
was a structure DIVERGE on ``state/seed_generator/seed_generator_state``, and the hint offered
``--allow-unmatched 'state/*'``, which would hide every real state. Expected values: numpy's LSTM on
the TF1 weights. The port runs in its own process without ``TF_USE_LEGACY_KERAS`` (the suite sets it).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from keras3_process import run_keras3
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1

RNG = np.random.default_rng(3)
X = RNG.standard_normal((4, 3, 2)).astype(np.float32)  # batch 4, 3 time steps, 2 features
Y = RNG.integers(0, 2, 4).astype(np.int32)
UNITS = 2
KERNEL = (RNG.standard_normal((2 + UNITS, 4 * UNITS)) * 0.5).astype(np.float32)  # TF1: gates i, j, f, o
DENSE = (RNG.standard_normal((UNITS, 2)) * 0.5).astype(np.float32)
STEPS = 3


def _keras_weights() -> list[np.ndarray]:
    """TF1's kernel split into Keras's kernel and recurrent kernel, gates reordered to i, f, c, o,
    TF1's forget_bias=1.0 moved into the bias."""
    i, j, f, o = np.split(KERNEL, 4, axis=1)
    kernel = np.concatenate([i, f, j, o], axis=1)
    bias = np.zeros(4 * UNITS, np.float32)
    bias[UNITS : 2 * UNITS] = 1.0
    return [kernel[:2], kernel[2:], bias]


def _numpy_lstm() -> np.ndarray:
    """The LSTM's outputs [batch, time, units] on the initial weights (TF1's cell)."""
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    h = np.zeros((len(X), UNITS))
    c = np.zeros_like(h)
    out = []
    for t in range(X.shape[1]):
        i, j, f, o = np.split(np.concatenate([X[:, t], h], 1).astype(np.float64) @ KERNEL, 4, axis=1)
        c = sig(f + 1.0) * c + sig(i) * np.tanh(j)
        h = sig(o) * np.tanh(c)
        out.append(h)
    return np.stack(out, 1)


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, None, 2])
        y = tf.compat.v1.placeholder(tf.int32, [None])
        cell = tf.compat.v1.nn.rnn_cell.LSTMCell(UNITS, initializer=tf.constant_initializer(KERNEL))
        seq, _ = tf.compat.v1.nn.dynamic_rnn(cell, x, dtype=tf.float32, scope="lstm")
        seq = rec.activation("lstm", seq)
        logits = tf.compat.v1.layers.dense(
            seq[:, -1], 2, kernel_initializer=tf.constant_initializer(DENSE), name="dense"
        )
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        rec.lr(tf.constant(0.1))
        train = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        rec.variables()
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(STEPS):
                _, parity = sess.run([train, fetches], {x: X, y: Y})
                rec.write(parity)
        rec.close()


_KERAS3_PORT = """
import sys
import numpy as np
import keras
assert keras.__version__.startswith("3"), keras.__version__
from tb_parity_plugin import summary_v2
data = np.load(sys.argv[2])
inp = keras.Input((None, 2))
seq = keras.layers.LSTM(2, return_sequences=True, name="lstm")(inp)
last = keras.layers.Lambda(lambda s: s[:, -1])(seq)
model = keras.Model(inp, keras.layers.Dense(2, name="dense")(last))
model.get_layer("lstm").set_weights([data["kernel"], data["recurrent"], data["bias"]])
model.get_layer("dense").set_weights([data["dense"], np.zeros(2, np.float32)])
model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rec = summary_v2.Recorder(sys.argv[1])
summary_v2.instrument(model, rec, layers=["lstm"])
model.fit(data["X"], data["Y"], batch_size=4, epochs=int(sys.argv[3]), shuffle=False, verbose=0)
rec.close()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("keras3_seed_state")
    _tf1(str(tmp / "logs" / "tf1"))
    script, arrays = tmp / "port.py", tmp / "data.npz"
    script.write_text(_KERAS3_PORT)
    kernel, recurrent, bias = _keras_weights()
    np.savez(arrays, X=X, Y=Y, kernel=kernel, recurrent=recurrent, bias=bias, dense=DENSE)
    run_keras3([str(script), str(tmp / "logs" / "tf2"), str(arrays), str(STEPS)])
    return str(tmp / "logs")


def test_a_keras_3_lstm_port_records_no_seed_generator_state_and_agrees(runs: str) -> None:
    expected = _numpy_lstm()
    for run in ("tf1", "tf2"):  # both compute numpy's LSTM: the port is faithful
        got = tensors_by_step(os.path.join(runs, run))[0][("activation", "lstm")][2]
        np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-5, atol=1e-6)
    recorded = tensors_by_step(os.path.join(runs, "tf2"))[0]
    assert not [name for kind, name in recorded if "seed_generator" in name], sorted(recorded)
    report = compare(runs, baseline="tf1", candidate="tf2", allow_unmatched=["*lstm_cell*"])
    assert report.agree, report.to_dict()["verdict_text"]
