"""Two same-shaped embedding tables made outside any scope, created in another order by the port.

TF1 recommender code makes its tables with top-level ``get_variable("user_emb")`` and
``get_variable("item_emb")``; the Keras port names them ``user_embedding/embeddings`` and
``item_embedding/embeddings``. No name pairs them, so they were paired by creation order, and the
re-pairing by first values (written for layers that Keras numbers by creation order) skipped them:
it took only variables under a scope for layers. A new user's faithful two-table port, whose TF1
graph created the item table first, got a false DIVERGE at step 0 on ``weight/item_emb:0`` against
the port's user table, with no word that the pairing was a guess. Every expectation here is from a
float64 numpy replay of TF1's Adam on the same batches.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from keras3_process import run_keras3
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

D, F, B, STEPS, LR, EPS = 16, 3, 8, 3, 1e-2, 1e-7
RNG = np.random.default_rng(5)
W = (RNG.standard_normal((2 * D, 1)) * 0.3).astype(np.float32)


def _data(vocab: int) -> tuple:
    rng = np.random.default_rng(vocab)
    user, item = (rng.standard_normal((2, vocab, D)) * 0.1).astype(np.float32)
    uids, iids = rng.integers(0, vocab, (2, STEPS, B, F))
    ys = rng.integers(0, 2, (STEPS, B, 1)).astype(np.float32)
    return user, item, uids, iids, ys


def _train_tf1(run_dir: str, vocab: int) -> None:
    """The TF1 original: the item table is created first, both at the top level."""
    user, item, uids, iids, ys = _data(vocab)
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        u_ids = tf.compat.v1.placeholder(tf.int64, [None, F])
        i_ids = tf.compat.v1.placeholder(tf.int64, [None, F])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        item_emb = tf.compat.v1.get_variable("item_emb", initializer=item)
        user_emb = tf.compat.v1.get_variable("user_emb", initializer=user)
        u = tf.reduce_mean(tf.nn.embedding_lookup(user_emb, u_ids), 1)
        i = tf.reduce_mean(tf.nn.embedding_lookup(item_emb, i_ids), 1)
        logits = tf.compat.v1.layers.dense(
            tf.concat([u, i], 1), 1, name="dense", kernel_initializer=tf.constant_initializer(W)
        )
        rec.activation("dense", logits)
        loss = rec.loss(tf.compat.v1.losses.sigmoid_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.AdamOptimizer(LR, epsilon=EPS)
        train = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(
            rec, train, (u_ids, i_ids, y), (uids.reshape(-1, F), iids.reshape(-1, F), ys.reshape(-1, 1)), STEPS, B
        )


def _train_port(run_dir: str, vocab: int, item_row0: bool = True) -> None:
    """The Keras ``fit`` port: the user table first (the model's first input). ``item_row0=False``:
    a converter that zeroed the item table's first row (a real bug)."""
    user, item, uids, iids, ys = _data(vocab)
    if not item_row0:
        item = item.copy()
        item[0] = 0.0
    uin, iin = tf.keras.Input((F,), dtype=tf.int64), tf.keras.Input((F,), dtype=tf.int64)
    u = tf.keras.layers.Embedding(vocab, D, name="user_embedding", embeddings_initializer=tf.constant_initializer(user))
    i = tf.keras.layers.Embedding(vocab, D, name="item_embedding", embeddings_initializer=tf.constant_initializer(item))
    pooled = [tf.keras.layers.GlobalAveragePooling1D()(u(uin)), tf.keras.layers.GlobalAveragePooling1D()(i(iin))]
    out = tf.keras.layers.Dense(1, name="dense", kernel_initializer=tf.constant_initializer(W))(
        tf.keras.layers.Concatenate()(pooled)
    )
    model = tf.keras.Model([uin, iin], out)
    model.compile(tf.keras.optimizers.Adam(LR, epsilon=EPS), tf.keras.losses.BinaryCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["dense"])
    model.fit([uids.reshape(-1, F), iids.reshape(-1, F)], ys.reshape(-1, 1), batch_size=B, shuffle=False, verbose=0)
    rec.close()


def _numpy_tables(vocab: int) -> list[dict[str, np.ndarray]]:
    """TF1's training in float64: each table as read at the start of each step (Adam, dense
    semantics: TF1's sparse apply decays every row's moments, as Keras's does)."""
    user, item, uids, iids, ys = _data(vocab)
    params = [user.astype(np.float64), item.astype(np.float64), W.astype(np.float64), np.zeros(1)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    out = []
    for k in range(STEPS):
        out.append({"user_emb": params[0].copy(), "item_emb": params[1].copy()})
        x = np.concatenate([params[0][uids[k]].mean(1), params[1][iids[k]].mean(1)], 1)
        z = x @ params[2] + params[3]
        dz = (1 / (1 + np.exp(-z)) - ys[k]) / B
        dx = dz @ params[2].T
        grads = [np.zeros_like(params[0]), np.zeros_like(params[1]), x.T @ dz, dz.sum(0)]
        np.add.at(grads[0], uids[k].reshape(-1), np.repeat(dx[:, None, :D] / F, F, 1).reshape(-1, D))
        np.add.at(grads[1], iids[k].reshape(-1), np.repeat(dx[:, None, D:] / F, F, 1).reshape(-1, D))
        t = k + 1
        for p, g, mi, vi in zip(params, grads, m, v):
            mi[:] = 0.9 * mi + 0.1 * g
            vi[:] = 0.999 * vi + 0.001 * g**2
            p -= LR * np.sqrt(1 - 0.999**t) / (1 - 0.9**t) * mi / (np.sqrt(vi) + EPS)
    return out


@pytest.mark.parametrize("vocab", [50, 300])  # 800 elements: full values; 4800: statistics and a sample
def test_a_faithful_port_of_scopeless_tables_created_in_another_order_agrees(tmp_path, vocab: int) -> None:
    _train_tf1(str(tmp_path / "tf1"), vocab)
    _train_port(str(tmp_path / "tf2"), vocab)
    if vocab == 50:  # numpy: each table trains as the one of its name, not of its creation order
        expected = _numpy_tables(vocab)
        tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
        for k in range(STEPS):
            for b, c in (("user_emb", "user_embedding"), ("item_emb", "item_embedding")):
                np.testing.assert_allclose(tf1[k][("weight", f"{b}:0")][2], expected[k][b], atol=1e-6)
                np.testing.assert_allclose(tf2[k][("weight", f"{c}/embeddings:0")][2], expected[k][b], atol=1e-6)
        # and the two tables are far apart: pairing them crosswise is a divergence
        assert np.abs(expected[0]["user_emb"] - expected[0]["item_emb"]).max() > 0.1
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    pairs = {(m["kind"], m["baseline"]): m["candidate"] for m in report.to_dict()["mapping"]}
    for b, c in (("user_emb", "user_embedding"), ("item_emb", "item_embedding")):
        assert pairs[("weight", f"{b}:0")] == f"{c}/embeddings:0"
        assert pairs[("grad", f"{b}:0")] == f"{c}/embeddings:0"
        assert pairs[("slot", f"{b}/Adam:0")] == f"m/{c}/embeddings"
        assert pairs[("slot", f"{b}/Adam_1:0")] == f"v/{c}/embeddings"
    assert any("paired user_emb:0 with user_embedding/* by their first-step values" in w for w in report.warnings)


def test_a_zeroed_row_in_one_table_diverges_on_that_table_against_its_namesake(tmp_path) -> None:
    """The re-pairing does not hide a real difference: the port's item table with its first row
    zeroed still pairs with TF1's item table (the user tables start alike, the one left over pairs
    with the one left over) and diverges at step 0 on the elements of that row out of tolerance."""
    vocab = 50
    _train_tf1(str(tmp_path / "tf1"), vocab)
    _train_port(str(tmp_path / "tf2"), vocab, item_row0=False)
    item = _numpy_tables(vocab)[0]["item_emb"]
    out_of_tolerance = int(np.sum(np.abs(item[0]) > 1e-5 + 1e-7 * np.abs(item[0])))  # numpy's allclose, rtol 1e-7
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None
    assert (first.step, first.tensor, first.candidate_tensor) == (0, "item_emb:0", "item_embedding/embeddings:0")
    assert first.mismatch_fraction == pytest.approx(out_of_tolerance / item.size)
    assert first.max_abs_diff == pytest.approx(np.abs(item[0]).max(), rel=1e-6)


def test_every_slot_that_starts_otherwise_says_so_a_one_element_bias_included(tmp_path) -> None:
    """TF1 ``AdagradOptimizer(initial_accumulator_value=1.0)`` (old recommender code) against
    Keras ``Adagrad``'s default 0.1: every accumulator differs at step 0, and each was told the
    optimizers start it differently but the sigmoid output's bias, whose slot has one element
    (a CTR model always has one): its line had no note. numpy: each slot holds its initial value
    at step 0, 1 against float32(0.1)."""
    vocab = 50
    user, item, uids, iids, ys = _data(vocab)
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        gs = tf.compat.v1.train.get_or_create_global_step()
        u_ids = tf.compat.v1.placeholder(tf.int64, [None, F])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        table = tf.compat.v1.get_variable("embedding", initializer=user)
        pooled = tf.reduce_mean(tf.nn.embedding_lookup(table, u_ids), 1)
        logits = tf.compat.v1.layers.dense(pooled, 1, name="dense", kernel_initializer=tf.constant_initializer(W[:D]))
        loss = rec.loss(tf.compat.v1.losses.sigmoid_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.AdagradOptimizer(LR, initial_accumulator_value=1.0)
        train = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train, (u_ids, y), (uids.reshape(-1, F), ys.reshape(-1, 1)), STEPS, B)
    uin = tf.keras.Input((F,), dtype=tf.int64)
    emb = tf.keras.layers.Embedding(vocab, D, name="embedding", embeddings_initializer=tf.constant_initializer(user))
    out = tf.keras.layers.Dense(1, name="dense", kernel_initializer=tf.constant_initializer(W[:D]))(
        tf.keras.layers.GlobalAveragePooling1D()(emb(uin))
    )
    model = tf.keras.Model(uin, out)
    model.compile(tf.keras.optimizers.Adagrad(LR), tf.keras.losses.BinaryCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    summary_v2.instrument(model, rec)
    model.fit(uids.reshape(-1, F), ys.reshape(-1, 1), batch_size=B, shuffle=False, verbose=0)
    rec.close()
    start = tensors_by_step(str(tmp_path / "tf2"))[0][("slot", "accumulator/dense/bias")][2]
    np.testing.assert_array_equal(start, np.full(1, np.float32(0.1)))  # Keras's default, one element
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    slots = [d for d in report.divergences_at_first_step if d.kind == "slot"]
    assert report.first_divergence.step == 0
    assert {d.tensor for d in slots} == {"embedding/Adagrad:0", "dense/kernel/Adagrad:0", "dense/bias/Adagrad:0"}
    for d in slots:
        assert d.note is not None and "starts at 1 in the baseline and 0.1 in the candidate" in d.note, (
            d.tensor,
            d.note,
        )


def _train_module_port(run_dir: str, vocab: int, swapped: bool) -> None:
    """A port written as a ``tf.Module`` of plain ``tf.Variable``s named as TF1 named them, trained by a
    custom loop. ``swapped``: a checkpoint converter that loaded each table into the other's variable."""
    user, item, uids, iids, ys = _data(vocab)
    if swapped:
        user, item = item, user
    user_emb, item_emb = tf.Variable(user, name="user_emb"), tf.Variable(item, name="item_emb")
    kernel, bias = tf.Variable(W, name="dense/kernel"), tf.Variable(tf.zeros(1), name="dense/bias")
    variables = [user_emb, item_emb, kernel, bias]
    opt = tf.keras.optimizers.Adam(LR, epsilon=EPS)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def train_step(u: tf.Tensor, i: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=variables, optimizer=opt):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                pooled = [
                    tf.reduce_mean(tf.nn.embedding_lookup(t, ids), 1) for t, ids in ((user_emb, u), (item_emb, i))
                ]
                logits = rec.activation("dense", tf.concat(pooled, 1) @ kernel + bias)
                loss = rec.loss(tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y, logits)))
            rec.minimize(opt, loss, variables, tape)

    for k in range(STEPS):
        train_step(tf.constant(uids[k]), tf.constant(iids[k]), tf.constant(ys[k]))
    rec.close()


@pytest.mark.parametrize("swapped", [False, True])
def test_top_level_variables_named_alike_in_both_runs_are_paired_by_their_names(tmp_path, swapped: bool) -> None:
    """Names both runs gave a top-level variable are no creation-order guess: a converter that swapped
    the two tables is found at step 0 (numpy: each table is 0.1 apart from the other), where the
    re-pairing by first values, applied to them, paired the swapped tables crosswise and agreed."""
    vocab = 50
    _train_tf1(str(tmp_path / "tf1"), vocab)
    _train_module_port(str(tmp_path / "tf2"), vocab, swapped)
    user, item = _data(vocab)[:2]
    assert np.abs(user - item).max() > 0.1
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    if not swapped:
        assert report.agree, report.first_divergence
        return
    first = report.first_divergence
    assert first is not None and first.step == 0 and first.kind == "weight", first
    assert {d.tensor for d in report.divergences_at_first_step if d.kind == "weight"} == {"item_emb:0", "user_emb:0"}


_KERAS3_MODULE_PORT = """
import sys
sys.path.insert(0, {tests!r})
import keras
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf
import test_scopeless_tables as t
from tb_parity_plugin import summary_v2
user, item, uids, iids, ys = t._data(50)
user_emb, item_emb = keras.Variable({user}, name={user_name!r}), keras.Variable({item}, name={item_name!r})
with keras.name_scope("dense"):
    kernel, bias = keras.Variable(t.W, name="kernel"), keras.Variable(np.zeros(1, np.float32), name="bias")
assert [v.path for v in (user_emb, kernel)] == [{user_name!r}, "dense/kernel"]
variables = [user_emb, item_emb, kernel, bias]
opt = keras.optimizers.Adam(t.LR, epsilon=t.EPS)
opt.build(variables)
rec = summary_v2.Recorder({run_dir!r})
with rec.step(0, variables=variables, optimizer=opt):
    rec.lr(tf.constant(t.LR))
    with tf.GradientTape() as tape:
        pooled = [tf.reduce_mean(tf.gather(v.value, tf.constant(i)), 1) for v, i in ((user_emb, uids[0]), (item_emb, iids[0]))]
        logits = rec.activation("dense", tf.concat(pooled, 1) @ kernel.value + bias.value)
        loss = rec.loss(tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(tf.constant(ys[0]), logits)))
    grads = tape.gradient(loss, [v.value for v in variables])
    rec.grads(grads, variables)
    opt.apply_gradients(zip(grads, variables))
rec.close()
"""


def _train_keras3_module(run_dir: str, **names: str) -> None:
    """The Keras 3 module port in a subprocess (Keras 3 is not the tf_keras these tests import)."""
    script = _KERAS3_MODULE_PORT.format(tests=os.path.dirname(os.path.abspath(__file__)), run_dir=run_dir, **names)
    run_keras3(["-c", script])


def test_keras3_top_level_tables_named_otherwise_are_named_as_variables_when_re_paired(tmp_path) -> None:
    """A faithful Keras 3 port naming its top-level tables ``users`` and ``items``, the user table
    created first where TF1 created the item table first: paired by creation order, re-paired by their
    first values, and the warning saying so named each port table as a scope, ``users/*``."""
    _train_keras3_module(str(tmp_path / "tf2"), user="user", item="item", user_name="users", item_name="items")
    _train_tf1(str(tmp_path / "tf1"), 50)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.first_divergence is None, report.first_divergence  # the port runs step 0 only
    repaired = [w for w in report.warnings if "by their first-step values" in w]
    assert any("paired item_emb:0 with items " in w for w in repaired), report.warnings
    assert not any("/*" in w for w in repaired), repaired


def test_top_level_variables_named_alike_but_for_their_output_index_are_paired_by_their_names(tmp_path) -> None:
    """Keras 3 records a top-level ``keras.Variable(name="user_emb")`` by its path, ``user_emb``,
    where TF1 has ``user_emb:0``: alike but for ``:0``, paired canonically, and a converter that
    swapped the two tables was re-paired crosswise by value (a warning each), its tables agreeing and
    the divergence left to the loss. Found at step 0 on both tables."""
    # swapped: the port's user_emb holds the item table
    _train_keras3_module(str(tmp_path / "tf2"), user="item", item="user", user_name="user_emb", item_name="item_emb")
    _train_tf1(str(tmp_path / "tf1"), 50)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and first.step == 0 and first.kind == "weight", first
    assert {d.tensor for d in report.divergences_at_first_step if d.kind == "weight"} == {"item_emb:0", "user_emb:0"}
