"""Keras 3 ``gradient_accumulation_steps`` under ``instrument``, against TF1's accumulation recipe.

Keras 3 (``tf.keras`` in TF 2.16+ without ``TF_USE_LEGACY_KERAS``) accumulates inside its optimizer:
each ``train_step`` is one micro-batch, ``optimizer.iterations`` counts updates (``_iterations //
n``) and the update applies the mean of the ``n`` micro-batches' gradients, with an lr schedule read
at the micro-batch count. A new user's faithful port of a TF1 original that accumulates two
micro-batches (README "Gradient accumulation") had every step written twice (warnings blaming TF1's
``ParityHook``), the last micro-batch's own gradient compared with TF1's applied mean (a false
DIVERGE at step 0 on every gradient), the accumulators recorded as slots of one run only, and under a
schedule the lr of the update count recorded where Keras applied the micro-batch count's. Now the
update's micro-batch alone is written, with the applied gradient, the accumulators as ``state``, and
the applied lr. Expectations from a float64 numpy replay. The port runs in its own process without
``TF_USE_LEGACY_KERAS`` (the suite sets it).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from keras3_process import run_keras3

from tb_parity_plugin import compare, summary_v1
from tb_parity_plugin.logdir.reader import LogdirReader

RNG = np.random.default_rng(11)
X = RNG.standard_normal((16, 3)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, 16)]
W = (RNG.standard_normal((3, 3)) * 0.5).astype(np.float32)
MICRO, N_ACC = 4, 2  # two micro-batches of 4 per update: 4 updates
UPDATES = len(X) // (MICRO * N_ACC)


def numpy_replay() -> list[dict]:
    """lr, kernel as read at each update's start and the gradient it applies (float64 Adam)."""
    w = W.astype(np.float64)
    m, v, out = np.zeros_like(w), np.zeros_like(w), []
    for k in range(UPDATES):
        grads = []
        for j in range(N_ACC):
            i = (k * N_ACC + j) * MICRO
            x, y = X[i : i + MICRO].astype(np.float64), Y[i : i + MICRO].astype(np.float64)
            z = x @ w
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            grads.append(x.T @ (p - y) / len(x))
        g = sum(grads) / N_ACC
        lr = 0.1 if k * N_ACC + N_ACC - 1 <= 3 else 0.05  # Keras 3: the schedule reads micro-batches
        out.append({"lr": lr, "kernel": w.copy(), "grad": g})
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        w = w - lr * np.sqrt(1 - 0.999 ** (k + 1)) / (1 - 0.9 ** (k + 1)) * m / (np.sqrt(v) + 1e-8)
    return out


def _tf1(run_dir: str) -> None:
    """The TF1 original: the README's recipe, accumulators as state, the update run with the last micro-batch."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 3])
        logits = tf.compat.v1.layers.dense(
            x, 3, use_bias=False, kernel_initializer=tf.constant_initializer(W), name="dense"
        )
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        lr = rec.lr(tf.compat.v1.train.piecewise_constant(gs, [1], [0.1, 0.05]))
        opt = tf.compat.v1.train.AdamOptimizer(lr)
        tvars = tf.compat.v1.trainable_variables()
        grads = tf.gradients(loss, tvars)
        accs = [
            tf.compat.v1.get_variable("acc/" + v.op.name, v.shape, initializer=tf.zeros_initializer(), trainable=False)
            for v in tvars
        ]
        accumulate = tf.group(*[a.assign_add(g) for a, g in zip(accs, grads)])
        applied = [(a + g) / N_ACC for a, g in zip(accs, grads)]
        rec.grads(applied, tvars)
        train = opt.apply_gradients(zip(applied, tvars), global_step=gs)
        with tf.control_dependencies([train]):
            zero = tf.group(*[a.assign(tf.zeros_like(a)) for a in accs])
        rec.set_step(gs)
        rec.variables(optimizer=opt)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for k in range(UPDATES):
                i = k * N_ACC * MICRO
                sess.run(accumulate, {x: X[i : i + MICRO], y: Y[i : i + MICRO]})
                _, parity = sess.run(
                    [zero, fetches], {x: X[i + MICRO : i + 2 * MICRO], y: Y[i + MICRO : i + 2 * MICRO]}
                )
                rec.write(parity)
        rec.close()


_KERAS3_PORT = """
import os, sys
import numpy as np
import keras
assert keras.__version__.startswith("3"), keras.__version__
from tb_parity_plugin import summary_v2
data = np.load(sys.argv[2])
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, use_bias=False, name="dense")])
model.get_layer("dense").kernel.assign(data["W"])
schedule = keras.optimizers.schedules.PiecewiseConstantDecay([3], [0.1, 0.05])  # in micro-batches
opt = keras.optimizers.Adam(schedule, epsilon=1e-8, gradient_accumulation_steps=int(sys.argv[3]))
model.compile(optimizer=opt, loss=keras.losses.CategoricalCrossentropy(from_logits=True))
rec = summary_v2.Recorder(sys.argv[1])
summary_v2.instrument(model, rec)
model.fit(data["X"], data["Y"], batch_size=int(sys.argv[4]), epochs=1, shuffle=False, verbose=0)
rec.close()
"""


def _keras3(tmp_path, run_dir: str) -> None:
    script, arrays = tmp_path / "port.py", tmp_path / "data.npz"
    script.write_text(_KERAS3_PORT)
    np.savez(arrays, X=X, Y=Y, W=W)
    run_keras3([str(script), run_dir, str(arrays), str(N_ACC), str(MICRO)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keras3_accumulation")
    _tf1(str(tmp / "tf1"))
    _keras3(tmp, str(tmp / "tf2"))
    return str(tmp)


def test_each_update_is_written_once_with_what_it_applies(runs) -> None:
    expected = numpy_replay()
    run = LogdirReader(runs).run("tf2")
    assert run.notices == []  # no step written twice
    tensors = run.tensors
    for (kind, name), series in tensors.items():
        assert list(map(int, series.steps)) == list(range(UPDATES)), (kind, name)
    steps, lrs = run.scalars["lr"]
    np.testing.assert_allclose(lrs, [e["lr"] for e in expected], rtol=1e-7)
    for k, e in enumerate(expected):
        np.testing.assert_allclose(
            np.asarray(tensors[("weight", "sequential/dense/kernel")].values[k]).reshape(3, 3), e["kernel"], atol=2e-6
        )
        np.testing.assert_allclose(
            np.asarray(tensors[("grad", "sequential/dense/kernel")].values[k]).reshape(3, 3), e["grad"], atol=2e-6
        )
    assert ("state", "sequential/dense/kernel/gradient_accumulator") in tensors
    assert not any("gradient_accumulator" in name for kind, name in tensors if kind == "slot")


def test_faithful_port_agrees_with_tf1_accumulation(runs) -> None:
    expected = numpy_replay()
    tf1 = LogdirReader(runs).run("tf1").tensors
    for k, e in enumerate(expected):  # the baseline is what numpy says too
        np.testing.assert_allclose(
            np.asarray(tf1[("grad", "dense/kernel:0")].values[k]).reshape(3, 3), e["grad"], atol=2e-6
        )
    report = compare(runs, baseline="tf1", candidate="tf2")
    assert report.agree, report.to_dict()["verdict_text"]
    assert report.steps_compared == UPDATES


_KERAS3_UNUSED_HEAD = """
import sys
import numpy as np
import keras
from tb_parity_plugin import summary_v2
from tb_parity_plugin.logdir.reader import LogdirReader
inp = keras.Input((3,))
model = keras.Model(inp, [keras.layers.Dense(3, name="a")(inp), keras.layers.Dense(2, name="b")(inp)])
model.compile(optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), loss=["mse", None])
rec = summary_v2.Recorder(sys.argv[1])
summary_v2.instrument(model, rec)
x = np.random.default_rng(0).standard_normal((16, 3)).astype("float32")
model.fit(x, [x, x[:, :2]], batch_size=4, shuffle=False, verbose=0)
rec.close()
grads = sorted(name for kind, name in LogdirReader(sys.argv[1]).run(".").tensors if kind == "grad")
print(grads)
"""


def test_a_variable_without_gradient_is_left_out_under_accumulation(tmp_path) -> None:
    """A head with no loss (``loss=[..., None]``) has no gradient: Keras 3 skips it, and the
    accumulated gradient it applies was built from it (``tf.convert_to_tensor(None)``), which raised
    in ``fit``. Its variables' gradients are left out, as without accumulation."""
    script = tmp_path / "unused_head.py"
    script.write_text(_KERAS3_UNUSED_HEAD)
    done = run_keras3([str(script), str(tmp_path / "run")])
    assert "['a/bias', 'a/kernel']" in done.stdout, done.stdout
