"""A two-head Keras ``fit`` port (dict outputs, ``compile(loss={...}, loss_weights={...})``) against a TF1
loop training on the weighted sum of its two ``tf.compat.v1.losses``.

With the heads' weights swapped the port diverges at step 0 on the loss, whose note names
``loss_weights=``, and each head's gradients are the baseline's times that head's own factor (numpy:
0.5 and 2), which their note calls per-term weights, not one scale of the whole loss (a new user's were
each told of a sum against a mean, a global batch size, micro-batches or a loss scale). The faithful port
agrees. The losses and the heads' gradients are checked against numpy first.

A TF1 original that records each head's loss beside the total has them recorded by itself only (``fit``
records the one loss it minimises): their structure line says so and how to declare them (it said only
"recorded by the baseline 'tf1' only").

A port whose classification head keeps ``activation="softmax"`` (TF1 outputs logits) diverges at step 0
on that head's output, whose note says its values are the softmax of TF1's (it said only "another
function of its input"); under ``fit`` tf_keras takes the logits back for the loss, so the loss agrees
(numpy).

``instrument(model, rec, layers=["x"])`` on an ``InputLayer``, which a model never calls, raises saying so
and how to record an input (it recorded nothing, silently); an ``Identity`` pass-through records it.

A two-input port fed a dict with the keys of its two inputs of one shape crossed, both inputs recorded,
diverges at step 0 on the first input, whose note says it holds the other input's values and the other
its (it said that recording the input would tell another input from another function, which it was).

A TF1 embedding table made with a bare ``get_variable("tok_emb", ...)`` and its lookup recorded as
``tok_emb``, against Keras's ``Embedding(name="tok_emb")``, agrees with no warning that TF1's outputs are
named after the port's layers (every such faithful port got one).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(51)
X = RNG.standard_normal((8, 3)).astype(np.float32)
Y_CLS = RNG.integers(0, 3, 8).astype(np.int32)
Y_REG = RNG.standard_normal((8, 1)).astype(np.float32)
W_SHARED = (RNG.standard_normal((3, 4)) * 0.5).astype(np.float32)
W_CLS = (RNG.standard_normal((4, 3)) * 0.5).astype(np.float32)
W_REG = (RNG.standard_normal((4, 1)) * 0.5).astype(np.float32)
REG_WEIGHT, STEPS = 0.5, 2


def train_tf1(run_dir: str, head_losses: bool = False) -> None:
    """``head_losses``: record each head's loss beside the total too, as TF1 code logging them does."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y_cls = tf.compat.v1.placeholder(tf.int32, [None])
        y_reg = tf.compat.v1.placeholder(tf.float32, [None, 1])
        init = tf.compat.v1.constant_initializer
        h = rec.activation(
            "shared", tf.compat.v1.layers.dense(x, 4, tf.nn.relu, kernel_initializer=init(W_SHARED), name="shared")
        )
        logits = rec.activation("cls", tf.compat.v1.layers.dense(h, 3, kernel_initializer=init(W_CLS), name="cls"))
        pred = rec.activation("reg", tf.compat.v1.layers.dense(h, 1, kernel_initializer=init(W_REG), name="reg"))
        cls_loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(y_cls, logits)
        reg_loss = tf.compat.v1.losses.mean_squared_error(y_reg, pred, weights=REG_WEIGHT)
        if head_losses:
            rec.loss(cls_loss, name="cls_loss")
            rec.loss(reg_loss, name="reg_loss")
        loss = rec.loss(tf.compat.v1.losses.get_total_loss())
        rec.lr(tf.constant(0.1))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        rec.variables()
        tf1_session.train(
            rec, train_op, (), (), STEPS, 1, fixed={x: X, y_cls: Y_CLS, y_reg: Y_REG}
        )  # the whole batch at every step


def train_fit(run_dir: str, loss_weights: dict[str, float], cls_activation: str | None = None) -> None:
    init = tf.keras.initializers.Constant
    x = tf.keras.Input((3,), name="x")
    h = tf.keras.layers.Dense(4, "relu", kernel_initializer=init(W_SHARED), name="shared")(x)
    cls = tf.keras.layers.Dense(3, cls_activation, kernel_initializer=init(W_CLS), name="cls")(h)
    reg = tf.keras.layers.Dense(1, kernel_initializer=init(W_REG), name="reg")(h)
    model = tf.keras.Model({"x": x}, {"cls": cls, "reg": reg})
    model.compile(
        optimizer=tf.keras.optimizers.SGD(0.1),
        loss={"cls": tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"},
        loss_weights=loss_weights,
    )
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["shared", "cls", "reg"])
    model.fit({"x": X}, {"cls": Y_CLS, "reg": Y_REG}, batch_size=8, epochs=STEPS, shuffle=False, verbose=0)
    rec.close()


def numpy_step0(w_cls: float, w_reg: float) -> tuple[float, np.ndarray, np.ndarray]:
    """The loss and the two heads' kernel gradients at step 0, float64."""
    h = np.maximum(X.astype(np.float64) @ W_SHARED, 0.0)
    z = h @ W_CLS
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    r = h @ W_REG
    n = len(X)
    loss = w_cls * -np.log(p[np.arange(n), Y_CLS]).mean() + w_reg * ((r - Y_REG) ** 2).mean()
    dz = p.copy()
    dz[np.arange(n), Y_CLS] -= 1.0
    return float(loss), h.T @ (w_cls * dz / n), h.T @ (w_reg * 2.0 * (r - Y_REG) / n)


def test_swapped_loss_weights_are_told_per_head_weights(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_fit(str(tmp_path / "tf2"), {"cls": 1.0, "reg": REG_WEIGHT})
    train_fit(str(tmp_path / "swapped"), {"cls": REG_WEIGHT, "reg": 1.0})
    for run, weights in (("tf1", (1.0, REG_WEIGHT)), ("tf2", (1.0, REG_WEIGHT)), ("swapped", (REG_WEIGHT, 1.0))):
        loss, g_cls, g_reg = numpy_step0(*weights)
        got = tensors_by_step(str(tmp_path / run))[0]
        np.testing.assert_allclose(got[("loss", "loss")][2], loss, rtol=1e-5)
        grads = {name.partition(":")[0]: v[2] for (kind, name), v in got.items() if kind == "grad"}
        np.testing.assert_allclose(grads["cls/kernel"], g_cls, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(grads["reg/kernel"], g_reg, rtol=1e-4, atol=1e-6)
    assert compare(str(tmp_path), baseline="tf1", candidate="tf2").agree
    report = compare(str(tmp_path), baseline="tf1", candidate="swapped")
    d = report.first_divergence
    assert d is not None and (d.step, d.kind, d.tensor) == (0, "loss", "loss"), d
    assert "loss_weights=" in (d.note or ""), d.note
    by_name = {x.tensor.partition(":")[0]: x for x in report.divergences_at_first_step}
    for head, factor, other in (
        ("cls/kernel", "0.5", "reg/kernel:0's is its baseline's times 2"),
        ("reg/kernel", "2", "cls/kernel:0's is its baseline's times 0.5"),
    ):
        note = by_name[head].note or ""
        assert f"times {factor} " in note and other in note and "loss_weights=" in note, note


def test_per_head_losses_of_one_run_are_told_fit_records_the_total(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"), head_losses=True)
    train_fit(str(tmp_path / "tf2"), {"cls": 1.0, "reg": REG_WEIGHT})
    got = tensors_by_step(str(tmp_path / "tf1"))[0]
    loss, _, _ = numpy_step0(1.0, REG_WEIGHT)
    np.testing.assert_allclose(got[("loss", "loss")][2], loss, rtol=1e-5)
    parts = float(got[("loss", "cls_loss")][2]) + float(got[("loss", "reg_loss")][2])
    np.testing.assert_allclose(parts, loss, rtol=1e-5)  # the heads' weighted losses sum to the total
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert not report.agree
    lines = [d for d in report.divergences_at_first_step if d.reason == "structure"]
    assert [d.tensor for d in lines] == ["cls_loss", "reg_loss"], lines
    note = lines[0].note or ""
    assert "no per-head losses" in note and "--allow-unmatched 'loss/reg_loss'" in note, note
    declared = ["loss/cls_loss", "loss/reg_loss"]
    assert compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=declared).agree


def test_a_softmax_left_on_a_head_is_told_softmax_of_the_logits(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_fit(str(tmp_path / "tf2"), {"cls": 1.0, "reg": REG_WEIGHT}, cls_activation="softmax")
    h = np.maximum(X.astype(np.float64) @ W_SHARED, 0.0)
    z = h @ W_CLS
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    got = {run: tensors_by_step(str(tmp_path / run))[0] for run in ("tf1", "tf2")}
    np.testing.assert_allclose(got["tf1"][("activation", "cls")][2], z, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["tf2"][("activation", "cls")][2], p, rtol=1e-5, atol=1e-6)
    loss, _, _ = numpy_step0(1.0, REG_WEIGHT)
    np.testing.assert_allclose(got["tf2"][("loss", "loss")][2], loss, rtol=1e-5)  # the logits taken back
    d = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert d is not None and (d.step, d.kind, d.tensor) == (0, "activation", "cls"), d
    assert "its values in 'tf2' are the softmax of those in 'tf1'" in (d.note or ""), d.note


def test_an_input_layer_is_refused_and_a_pass_through_records_the_input(tmp_path) -> None:
    x = tf.keras.Input((3,), name="x")
    seen = tf.keras.layers.Identity(name="x_in")(x)
    out = tf.keras.layers.Dense(1, name="out")(seen)
    model = tf.keras.Model({"x": x}, out)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    with pytest.raises(ValueError, match="'x' is an InputLayer.*Identity"):
        summary_v2.instrument(model, rec, layers=["x"])
    summary_v2.instrument(model, rec, layers=["x_in"])
    model.fit({"x": X}, Y_REG, batch_size=8, epochs=1, shuffle=False, verbose=0)
    rec.close()
    np.testing.assert_array_equal(tensors_by_step(str(tmp_path / "tf2"))[0][("activation", "x_in")][2], X)


XB = (RNG.standard_normal((8, 3)) * 2.0).astype(np.float32)  # a second input of X's shape
W_B = (RNG.standard_normal((3, 4)) * 0.5).astype(np.float32)


def train_tf1_two_inputs(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        a = tf.compat.v1.placeholder(tf.float32, [None, 3])
        b = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        init = tf.compat.v1.constant_initializer
        ha = tf.compat.v1.layers.dense(rec.activation("a_in", a), 4, kernel_initializer=init(W_SHARED), name="da")
        hb = tf.compat.v1.layers.dense(rec.activation("b_in", b), 4, kernel_initializer=init(W_B), name="db")
        pred = rec.activation(
            "reg", tf.compat.v1.layers.dense(tf.concat([ha, hb], 1), 1, kernel_initializer=init(0.1), name="reg")
        )
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, pred))
        rec.lr(tf.constant(0.1))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        rec.variables()
        tf1_session.train(rec, train_op, (), (), 1, 1, fixed={a: X, b: XB, y: Y_REG})


def fit_two_inputs(run_dir: str, crossed: bool) -> None:
    init = tf.keras.initializers.Constant
    a, b = tf.keras.Input((3,), name="a"), tf.keras.Input((3,), name="b")
    ha = tf.keras.layers.Dense(4, kernel_initializer=init(W_SHARED), name="da")(
        tf.keras.layers.Identity(name="a_in")(a)
    )
    hb = tf.keras.layers.Dense(4, kernel_initializer=init(W_B), name="db")(tf.keras.layers.Identity(name="b_in")(b))
    out = tf.keras.layers.Dense(1, kernel_initializer=init(0.1), name="reg")(tf.keras.layers.Concatenate()([ha, hb]))
    model = tf.keras.Model({"a": a, "b": b}, out)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["a_in", "b_in", "reg"])
    x = {"a": XB, "b": X} if crossed else {"a": X, "b": XB}
    model.fit(x, Y_REG, batch_size=8, epochs=1, shuffle=False, verbose=0)
    rec.close()


def test_inputs_fed_crosswise_are_told_so(tmp_path) -> None:
    train_tf1_two_inputs(str(tmp_path / "tf1"))
    fit_two_inputs(str(tmp_path / "tf2"), crossed=False)
    fit_two_inputs(str(tmp_path / "crossed"), crossed=True)
    got = tensors_by_step(str(tmp_path / "crossed"))[0]
    np.testing.assert_array_equal(got[("activation", "a_in")][2], XB)
    np.testing.assert_array_equal(got[("activation", "b_in")][2], X)
    assert compare(str(tmp_path), baseline="tf1", candidate="tf2").agree
    d = compare(str(tmp_path), baseline="tf1", candidate="crossed").first_divergence
    assert d is not None and (d.step, d.kind, d.tensor) == (0, "activation", "a_in"), d
    note = d.note or ""
    assert "are those of b_in in 'tf1', and b_in's in 'crossed' are this one's" in note and "crosswise" in note, note


IDS = RNG.integers(0, 10, (8, 4)).astype(np.int32)
TABLE = (RNG.standard_normal((10, 3)) * 0.5).astype(np.float32)


def test_a_bare_tf1_embedding_variable_names_its_own_output(tmp_path) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int32, [None, 4])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        table = tf.compat.v1.get_variable("tok_emb", initializer=TABLE)
        pooled = tf.reduce_mean(rec.activation("tok_emb", tf.nn.embedding_lookup(table, ids)), axis=1)
        pred = rec.activation(
            "reg",
            tf.compat.v1.layers.dense(pooled, 1, kernel_initializer=tf.compat.v1.constant_initializer(0.2), name="reg"),
        )
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, pred))
        rec.lr(tf.constant(0.1))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        rec.variables()
        tf1_session.train(rec, train_op, (), (), STEPS, 1, fixed={ids: IDS, y: Y_REG})  # the whole batch at every step
    inp = tf.keras.Input((4,), dtype="int32")
    emb = tf.keras.layers.Embedding(10, 3, embeddings_initializer=tf.keras.initializers.Constant(TABLE), name="tok_emb")
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(0.2), name="reg")(
        tf.keras.layers.GlobalAveragePooling1D()(emb(inp))
    )
    model = tf.keras.Model(inp, out)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    summary_v2.instrument(model, rec, layers=["tok_emb", "reg"])
    model.fit(IDS, Y_REG, batch_size=8, epochs=STEPS, shuffle=False, verbose=0)
    rec.close()
    r = TABLE.astype(np.float64)[IDS].mean(1) @ np.full((3, 1), 0.2)
    loss = float(((r - Y_REG) ** 2).mean())
    for run in ("tf1", "tf2"):
        np.testing.assert_allclose(tensors_by_step(str(tmp_path / run))[0][("loss", "loss")][2], loss, rtol=1e-5)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    assert not [w for w in report.warnings if "names no layer of its own" in w], report.warnings


def test_every_layer_of_a_functional_model_instruments_all_but_its_input_layers(tmp_path) -> None:
    """``instrument(model, rec, layers=model.layers)``, the idiom for a Sequential model, on a functional
    model, whose ``layers`` hold its InputLayer: raised for the input nobody named; its other layers are
    recorded (numpy), and an InputLayer named alone is still refused."""
    x = tf.keras.Input((3,), name="x")
    out = tf.keras.layers.Dense(1, name="out", kernel_initializer="ones")(x)
    model = tf.keras.Model(x, out)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    assert type(model.layers[0]).__name__ == "InputLayer"
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    with pytest.raises(ValueError, match="'x' is an InputLayer"):
        summary_v2.instrument(model, rec, layers=[model.layers[0]])
    summary_v2.instrument(model, rec, layers=model.layers)
    model.fit(X, Y_REG, batch_size=8, epochs=1, shuffle=False, verbose=0)
    rec.close()
    recorded = tensors_by_step(str(tmp_path / "tf2"))[0]
    np.testing.assert_allclose(recorded[("activation", "out")][2], X[:8].sum(axis=1, keepdims=True), rtol=1e-5)
