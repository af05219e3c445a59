"""A wide table warm-started from a TF1 checkpoint under Ftrl, from a trial's wide-and-deep port.

TF1's ``FtrlOptimizer`` applies an embedding lookup's sparse gradient to the looked-up rows only;
tf_keras's ``Ftrl`` assigns the whole variable from its slots at each update, so every row no batch
looked up (its linear term 0) becomes 0. A table that starts at 0 hides it; one restored from a
checkpoint parts at the first update, by statistics alone (the table is above ``full_values_limit``),
and the divergence had no note. ``tf.keras.optimizers.legacy.Ftrl`` keeps TF1's rule and agrees.
Expectations are checked against numpy: Ftrl's rule w = (clip(linear, -l1, l1) - linear) /
(sqrt(accumulator) / lr + 2 l2) with linear 0 at rows never looked up.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2
from tb_parity_plugin.records import metadata

ROWS, BATCH, STEPS, LR = 5000, 16, 2, 0.1  # 5000 > 4096: the table is kept as statistics and a sample
RNG = np.random.default_rng(5)
TABLE = (RNG.standard_normal((ROWS, 1)) * 0.05).astype(np.float32)  # "restored from the TF1 checkpoint"
IDS = RNG.integers(0, ROWS, (STEPS, BATCH, 2))
Y = RNG.integers(0, 2, (STEPS, BATCH, 1)).astype(np.float32)


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        table = tf.compat.v1.get_variable("crossed/weights", initializer=TABLE)
        logits = tf.reduce_sum(tf.nn.embedding_lookup(table, ids), axis=1)
        loss = rec.loss(tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits)))
        opt = tf.compat.v1.train.FtrlOptimizer(LR, l2_regularization_strength=0.01)
        train = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                rec.write(sess.run([train, fetches], {ids: IDS[s], y: Y[s]})[1])
        rec.close()


def _port(run_dir: str, legacy: bool) -> None:
    ids = tf.keras.Input((2,), dtype=tf.int64)
    rows = tf.keras.layers.Embedding(ROWS, 1, embeddings_initializer=tf.constant_initializer(TABLE), name="crossed")
    model = tf.keras.Model(ids, tf.reduce_sum(rows(ids), axis=1))
    opt = (tf.keras.optimizers.legacy.Ftrl if legacy else tf.keras.optimizers.Ftrl)(LR, l2_regularization_strength=0.01)
    if legacy:
        opt._create_all_weights(model.trainable_variables)
    else:
        opt.build(model.trainable_variables)
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                loss = rec.loss(bce(y, model(x)))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for s in range(STEPS):
        step(tf.constant(IDS[s]), tf.constant(Y[s]))
    rec.close()


def _zeros_after_first_update(run_dir: str) -> int:
    """The zero elements of the table as the run recorded it at step 1 (after the first update)."""
    logged = tensors_by_step(run_dir)[1]
    (stats,) = [row for (kind, name), (_, row, _) in logged.items() if kind == "weight" and "#" not in name]
    return int(stats[metadata.STAT_INDEX["zero"]])


@pytest.mark.parametrize("legacy", [False, True], ids=["tf_keras Ftrl", "legacy Ftrl"])
def test_ftrl_that_sets_every_row_of_a_warm_started_table_is_named(tmp_path, legacy: bool) -> None:
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "tf2"), legacy)
    looked_up = len(np.unique(IDS[0]))
    # numpy: a row no gradient reached keeps linear 0, so Ftrl's rule gives it weight 0; TF1 leaves it alone
    assert _zeros_after_first_update(str(tmp_path / "tf1")) == 0
    expected = 0 if legacy else ROWS - looked_up
    assert _zeros_after_first_update(str(tmp_path / "tf2")) == expected
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    if legacy:  # TF1's rule: a faithful port
        assert report.agree, report.first_divergence
        return
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "weight", "crossed/weights:0"), first
    note = first.note or ""
    assert f"0 wherever its Ftrl linear term is 0 ({ROWS - looked_up} of its {ROWS}" in note, note
    assert "in 'tf2'" in note and "tf.keras.optimizers.legacy.Ftrl" in note, note


L1_ROWS, L1_DIM, L1 = 10, 4, 1.0
L1_TABLE = (np.random.default_rng(3).standard_normal((L1_ROWS, L1_DIM)) * 0.05).astype(np.float32)
L1_IDS = np.array([[0, 1], [2, 3], [4, 5], [6, 7]])  # rows 8 and 9 are never looked up
L1_Y = np.array([[1.0], [0.0], [1.0], [0.0]], np.float32)


def _numpy_sparse_ftrl_step(l1: float) -> np.ndarray:
    """float64, the table after TF1's sparse Ftrl update of step 0 (initial accumulator 0.1, l2 0, lr power
    -0.5): the looked-up rows only, each set from its slots, w = 0 where |linear| <= l1."""
    w = L1_TABLE.astype(np.float64)
    logits = w[L1_IDS].sum(axis=(1, 2))
    d_logit = (1 / (1 + np.exp(-logits)) - L1_Y[:, 0]) / len(L1_Y)
    out = w.copy()
    for row in range(L1_ROWS):
        g = np.full(L1_DIM, d_logit[(L1_IDS == row).any(1)].sum())
        if not (L1_IDS == row).any():
            continue
        acc = 0.1 + g * g
        linear = g - (np.sqrt(acc) - np.sqrt(0.1)) / LR * w[row]
        out[row] = np.where(np.abs(linear) > l1, (np.clip(linear, -l1, l1) - linear) / (np.sqrt(acc) / LR), 0.0)
    return out


@pytest.mark.parametrize("limit", [4096, 8], ids=["full values", "statistics"])
def test_an_l1_left_out_is_not_told_of_tf_keras_ftrl(tmp_path, limit: int) -> None:
    """TF1's FtrlOptimizer with l1 1.0 and a port under legacy Ftrl (TF1's own sparse rule) that left the l1
    out, both on a warm-started table: l1 sets TF1's looked-up rows to 0, while rows 8 and 9, their linear
    0, keep their warm values in both runs. The note said TF1 "sets the whole variable from its slots at
    each update (tf_keras's Ftrl ...)": from counts, 32 zeros in TF1 against 8 elements of linear 0."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"), full_values_limit=limit)
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        table = tf.compat.v1.get_variable("emb/embeddings", initializer=L1_TABLE)
        logits = tf.reduce_sum(tf.nn.embedding_lookup(table, ids), axis=[1, 2])[:, None]
        loss = rec.loss(tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits)))
        opt = tf.compat.v1.train.FtrlOptimizer(LR, l1_regularization_strength=L1)
        train = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(STEPS):
                rec.write(sess.run([train, fetches], {ids: L1_IDS, y: L1_Y})[1])
        rec.close()
    inp = tf.keras.Input((2,), dtype=tf.int64)
    emb = tf.keras.layers.Embedding(
        L1_ROWS, L1_DIM, embeddings_initializer=tf.constant_initializer(L1_TABLE), name="emb"
    )
    model = tf.keras.Model(inp, tf.reduce_sum(emb(inp), axis=[1, 2])[:, None])
    port_opt = tf.keras.optimizers.legacy.Ftrl(LR)  # l1 left out
    port_opt._create_all_weights(model.trainable_variables)
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    port = summary_v2.Recorder(str(tmp_path / "tf2"), full_values_limit=limit)

    @tf.function
    def step(x: tf.Tensor, t: tf.Tensor) -> None:
        with port.step(port_opt.iterations, variables=model, optimizer=port_opt):
            with tf.GradientTape() as tape:
                loss = port.loss(bce(t, model(x)))
            port.minimize(port_opt, loss, model.trainable_variables, tape)

    for _ in range(STEPS):
        step(tf.constant(L1_IDS), tf.constant(L1_Y))
    port.close()
    # numpy: l1 zeroes every looked-up row in TF1 and none in the port; rows 8 and 9 keep their warm values
    tf1_after, port_after = _numpy_sparse_ftrl_step(L1), _numpy_sparse_ftrl_step(0.0)
    assert not tf1_after[:8].any() and port_after[:8].all()
    np.testing.assert_array_equal(tf1_after[8:], L1_TABLE[8:])
    for run, want in (("tf1", tf1_after), ("tf2", port_after)):
        stats = [r for (kind, n), (_, r, _) in tensors_by_step(str(tmp_path / run))[1].items() if kind == "weight"]
        assert int(stats[0][metadata.STAT_INDEX["zero"]]) == int((want == 0).sum()), run
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "weight", "emb/embeddings:0"), first
    assert "tf_keras's Ftrl assigns every row" not in (first.note or ""), first.note
