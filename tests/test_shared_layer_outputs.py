"""A siamese model: one tower applied to two inputs, a TF1 ``variable_scope(reuse=AUTO_REUSE)``
original against a Keras ``fit`` port that calls its shared layers twice, the tower's output
recorded with ``instrument(model, rec, layers=["embed"])``. The second call of the instrumented
layer was refused as "logged twice in one step; give each a distinct name", which ``instrument``
gives no way to do: a new user's faithful port crashed at its first step. Each call now records
its own output, ``embed`` then ``embed/call_1`` (checked against numpy's towers)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, BATCH, D, H, E = 4, 8, 5, 6, 3
RNG = np.random.default_rng(24)
XA = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
XB = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
Y = RNG.integers(0, 2, (STEPS * BATCH, 1)).astype(np.float32)
INIT = {
    "hidden": (RNG.standard_normal((D, H)) * 0.5).astype(np.float32),
    "embed": (RNG.standard_normal((H, E)) * 0.5).astype(np.float32),
    "head": (RNG.standard_normal((E, 1)) * 0.5).astype(np.float32),
}
LR = 0.1


def _tower(x: np.ndarray) -> np.ndarray:
    """numpy's tower on the initial weights (biases start at 0)."""
    return np.maximum(x @ INIT["hidden"], 0) @ INIT["embed"]


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        xa = tf.compat.v1.placeholder(tf.float32, [None, D])
        xb = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        dense, init = tf.compat.v1.layers.dense, tf.constant_initializer

        def tower(x: tf.Tensor) -> tf.Tensor:
            with tf.compat.v1.variable_scope("tower", reuse=tf.compat.v1.AUTO_REUSE):
                h = dense(x, H, tf.nn.relu, kernel_initializer=init(INIT["hidden"]), name="hidden")
                return dense(h, E, kernel_initializer=init(INIT["embed"]), name="embed")

        ea = rec.activation("embed", tower(xa))
        eb = rec.activation("embed/call_1", tower(xb))
        logits = dense(tf.abs(ea - eb), 1, kernel_initializer=init(INIT["head"]), name="head")
        loss = rec.loss(tf.compat.v1.losses.sigmoid_cross_entropy(y, logits))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        train(rec, train_op, [xa, xb, y], [XA, XB, Y], STEPS, BATCH)


def _fit(run_dir: str, second_input_is_a: bool = False, stop_second: bool = False) -> None:
    """``second_input_is_a``: the port's bug, its second branch copied from the first (``xa`` twice);
    ``stop_second``: the second use's output through ``tf.stop_gradient`` (its gradient left out)."""
    xa, xb = tf.keras.Input((D,)), tf.keras.Input((D,))
    hidden = tf.keras.layers.Dense(H, activation="relu", name="hidden")
    embed = tf.keras.layers.Dense(E, name="embed")
    ea = embed(hidden(xa))
    eb = embed(hidden(xa if second_input_is_a else xb))
    if stop_second:
        eb = tf.keras.layers.Lambda(tf.stop_gradient)(eb)
    logits = tf.keras.layers.Dense(1, name="head")(tf.keras.layers.Lambda(lambda t: tf.abs(t[0] - t[1]))([ea, eb]))
    model = tf.keras.Model([xa, xb], logits)
    for name, kernel in INIT.items():
        model.get_layer(name).kernel.assign(kernel)
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.BinaryCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["embed"])
    model.fit([XA, XB], Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def test_a_shared_layer_records_each_call_and_the_port_agrees(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"))
    got = tensors_by_step(str(tmp_path / "tf2"))[0]
    assert sorted(n for k, n in got if k == "activation") == ["embed", "embed/call_1"]
    rows = slice(0, BATCH)
    for name, x in (("embed", XA[rows]), ("embed/call_1", XB[rows])):  # each call's own input, in call order
        np.testing.assert_allclose(np.asarray(got[("activation", name)][2]).reshape(BATCH, E), _tower(x), atol=1e-5)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*"])
    assert report.agree, report.first_divergence
    assert report.steps_compared == STEPS
    assert {m["baseline"] for m in report.to_dict()["mapping"] if m["kind"] == "activation"} == {
        "embed",
        "embed/call_1",
    }


def test_a_port_whose_second_call_takes_the_first_input_diverges_there(tmp_path) -> None:
    assert np.abs(_tower(XA[:BATCH]) - _tower(XB[:BATCH])).max() > 0.1  # numpy: the two calls differ at step 0
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), second_input_is_a=True)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*"]).first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "embed/call_1"), first
