"""What an output diverging first, with every weight agreeing, tells: another input, or another function.

From a trial of Keras defaults: a faithful port trained with ``model.fit(x, y, batch_size=8)``
(``shuffle=True`` unless told otherwise) against a TF1 loop feeding batches in order diverged at
step 0 on its first layer's output. True, but nothing said why; the note now does. Each
expectation is checked on the recorded values with numpy, not on the tool.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from engine_helpers import run, series
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2
from tb_parity_plugin.engine import Comparison
from tb_parity_plugin.engine.tolerance import TolerancePolicy

RNG = np.random.default_rng(3)
STEPS, BATCH, D, H, C = 3, 8, 5, 6, 3
X = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
Y = RNG.integers(0, C, STEPS * BATCH).astype(np.int64)
W1 = (RNG.standard_normal((D, H)) * 0.5).astype(np.float32)
W2 = (RNG.standard_normal((H, C)) * 0.5).astype(np.float32)


def _tf1(run_dir: str, dropout: float = 0.0, training: bool = True, rows: int = STEPS * BATCH) -> None:
    """The original; with ``dropout``, a dropout layer (graph seed 2) recorded after the first,
    called with ``training=True`` or, with ``training=False``, as TF1 code often does: without it
    (``tf.compat.v1.layers.dropout`` is off by default). ``rows``: the first rows of the data only
    (fewer than ``STEPS * BATCH``: a partial last batch)."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(2)
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        dense = tf.compat.v1.layers.dense(
            x, H, tf.nn.relu, name="dense", kernel_initializer=tf.constant_initializer(W1)
        )
        h = rec.activation("dense", dense)
        if dropout:
            dropped = (
                tf.compat.v1.layers.dropout(h, dropout, training=True)
                if training
                else tf.compat.v1.layers.dropout(h, dropout)
            )
            h = rec.activation("dropout", dropped)
        logits = tf.compat.v1.layers.dense(h, C, name="dense_1", kernel_initializer=tf.constant_initializer(W2))
        if not dropout:
            rec.activation("dense_1", logits)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        rec.lr(tf.constant(0.1))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        tf1_session.train(rec, train_op, (x, y), (X[:rows], Y[:rows]), STEPS, BATCH)


def _fit(run_dir: str, shuffle: bool, second: str = "linear", order: Any = None) -> None:
    """``order``: the rows of the data in that order (``shuffle=False`` keeps it)."""
    first, out = tf.keras.layers.Dense(H, "relu", name="dense"), tf.keras.layers.Dense(C, second, name="dense_1")
    inputs = tf.keras.Input((D,))
    model = tf.keras.Model(inputs, out(first(inputs)))
    first.set_weights([W1, np.zeros(H, np.float32)])
    out.set_weights([W2, np.zeros(C, np.float32)])
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(tf.keras.optimizers.SGD(0.1), loss)
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=[first, out])
    kwargs = {} if shuffle else {"shuffle": False}  # the default, as users leave it
    rows = np.arange(len(X)) if order is None else order
    model.fit(X[rows], Y[rows], batch_size=BATCH, epochs=1, verbose=0, **kwargs)
    rec.close()


def _first_layer(run_dir: str, step: int) -> np.ndarray:
    got = tensors_by_step(run_dir)[step][("activation", "dense")][2]
    return np.asarray(got).reshape(BATCH, H)


def test_fit_shuffling_by_default_is_named_on_the_first_output(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), shuffle=True)
    # numpy: TF1's step 0 saw rows 0..7; the port's rows are other rows of X (fit shuffled them)
    every = np.maximum(X @ W1, 0.0)
    np.testing.assert_allclose(_first_layer(str(tmp_path / "tf1"), 0), every[:BATCH], rtol=1e-5, atol=1e-6)
    port = _first_layer(str(tmp_path / "tf2"), 0)
    rows = [int(np.argmin(np.abs(every - r).max(axis=1))) for r in port]
    np.testing.assert_allclose(port, every[rows], rtol=1e-5, atol=1e-6)
    assert sorted(rows) != list(range(BATCH))
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dense")
    assert "every recorded weight agrees at this step" in first.note
    assert "Keras fit shuffles unless shuffle=False" in first.note


def test_the_same_batches_agree_and_a_wrong_activation_is_named_as_the_layers_own(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), shuffle=False)
    assert compare(str(tmp_path), baseline="tf1", candidate="tf2").agree
    _fit(str(tmp_path / "tf2_tanh"), shuffle=False, second="tanh")
    # numpy: the first layer's output is the same; the logits are tanh of TF1's
    logits = np.asarray(tensors_by_step(str(tmp_path / "tf1"))[0][("activation", "dense_1")][2]).reshape(BATCH, C)
    port = np.asarray(tensors_by_step(str(tmp_path / "tf2_tanh"))[0][("activation", "dense_1")][2]).reshape(BATCH, C)
    np.testing.assert_allclose(port, np.tanh(logits), rtol=1e-5, atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2_tanh").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dense_1")
    assert "the outputs recorded before it agree at this step: this layer computes another function" in first.note
    assert "shuffle" not in first.note


def test_rows_of_each_batch_in_another_order_on_one_device_name_no_replicas(tmp_path) -> None:
    """A fit port fed TF1's batches with each batch's rows reversed trains the same (numpy: the batch
    mean of the loss does not depend on the row order); no run had replicas, and the note sent it to
    experimental_distribute_dataset first."""
    _tf1(str(tmp_path / "tf1"))
    reversed_rows = np.concatenate([np.arange(s, s + BATCH)[::-1] for s in range(0, len(X), BATCH)])
    _fit(str(tmp_path / "tf2"), shuffle=False, order=reversed_rows)
    every = np.maximum(X @ W1, 0.0)
    np.testing.assert_allclose(_first_layer(str(tmp_path / "tf2"), 0), every[BATCH - 1 :: -1], rtol=1e-5, atol=1e-6)
    logits = every @ W2
    ce = np.log(np.exp(logits).sum(1)) - logits[np.arange(len(Y)), Y]
    recorded = float(tensors_by_step(str(tmp_path / "tf2"))[0][("loss", "loss")][2])
    np.testing.assert_allclose(recorded, ce[:BATCH][::-1].mean(), rtol=1e-5)
    np.testing.assert_allclose(ce[:BATCH][::-1].mean(), ce[:BATCH].mean(), rtol=1e-12)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dense"), first
    assert "same rows in another order" in first.note and "the step trains the same" in first.note, first.note
    assert "replica" not in first.note.replace("Neither run had replicas", ""), first.note


def test_no_input_note_while_a_weight_is_compared_by_statistics_only() -> None:
    """A faithful Adam port's 3000-row embedding, compared by statistics and an element sample, held
    one element 2.7e-5 apart from step 3 (numpy on both runs' dumps); its lookup's output diverged
    at step 6, and the note said every weight agreed and sent the user to the data. Statistics
    cannot prove a weight agrees: the note is left out then."""
    w = [np.ones(5000, np.float32) for _ in range(2)]
    out = [np.ones(4, np.float32) for _ in range(2)]
    moved = [o + np.float32(0.5) for o in out]
    for keep, noted in ((True, True), (False, False)):
        base = run("tf1", [series("weight", "emb", w, keep_values=keep), series("activation", "emb", out, order=1)])
        cand = run("tf2", [series("weight", "emb", w, keep_values=keep), series("activation", "emb", moved, order=1)])
        first = Comparison(base, cand).report().first_divergence
        assert (first.step, first.kind) == (0, "activation")
        assert ("every recorded weight agrees" in (first.note or "")) == noted, first.note
    # the same for an output before it that only its statistics compare
    small = [np.ones(3, np.float32) for _ in range(2)]
    big = [np.ones(5000, np.float32) for _ in range(2)]
    for keep, noted in ((True, True), (False, False)):
        tensors = [series("weight", "w", small), series("activation", "a", big, order=1, keep_values=keep)]
        base = run("tf1", [*tensors, series("activation", "b", out, order=2)])
        cand = run("tf2", [*tensors, series("activation", "b", moved, order=2)])
        first = Comparison(base, cand).report().first_divergence
        assert (first.step, first.tensor) == (0, "b")
        assert ("the outputs recorded before it agree" in (first.note or "")) == noted, first.note


def test_a_partial_batch_traced_again_is_one_warning_per_run() -> None:
    """Every tf.function loop over a None batch retraces for its partial last batch; a new user's
    every diff ended with one warning per recorded output. One line per run now names how many."""
    changed = "was traced for several batch sizes (float32 [16, 3]; float32 [4, 3]): each step is compared at the shape"
    tensors = [series("activation", name, [np.ones(3, np.float32)], order=i) for i, name in enumerate("abc")]
    cand = [dataclasses.replace(t, layout_change=changed) if t.name != "c" else t for t in tensors]
    warnings = Comparison(run("tf1", tensors), run("tf2", cand)).report().warnings
    assert warnings == [
        "tf2: 2 tensors were traced for several batch sizes, e.g. activation/a (float32 [16, 3]; float32 [4, 3]): "
        "each step is compared at the shape"
    ]
    other = dataclasses.replace(tensors[2], layout_change="changed layout mid-run: float32 [3]; float64 [3]")
    warnings = Comparison(run("tf1", tensors), run("tf2", [*cand[:2], other])).report().warnings
    assert warnings[0] == "tf2: activation/c changed layout mid-run: float32 [3]; float64 [3]"


def test_zeros_of_a_relu_in_one_run_only_are_not_sent_to_a_dropout_seed_when_no_random_op_computes_them(
    tmp_path,
) -> None:
    """A new user's port put a ReLU where TF1 had none (there: before its batch norm, where TF1 applies
    it after): the first output it changes is 0 in the port wherever TF1's is negative, and the note
    began with "a different random mask (dropout: its seed ...)" though neither graph holds a random
    op. Both runs record the random ops an output is computed from (none here), so the note now says
    no random op computes those zeros, and names the ReLU. Numpy: the port's logits are TF1's
    clipped at 0."""
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), shuffle=False, second="relu")
    logits = np.asarray(tensors_by_step(str(tmp_path / "tf1"))[0][("activation", "dense_1")][2]).reshape(BATCH, C)
    port = np.asarray(tensors_by_step(str(tmp_path / "tf2"))[0][("activation", "dense_1")][2]).reshape(BATCH, C)
    np.testing.assert_allclose(port, np.maximum(logits, 0), rtol=1e-5, atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dense_1"), first
    assert (
        f"each of its {int((logits < -1e-5).sum())} elements out of tolerance is exactly 0 in one run only"
        in first.note
    )
    assert "no random op computes" in first.note and "a ReLU switched off in one run" in first.note, first.note
    assert "random mask (dropout" not in first.note, first.note


RATE = 0.3


def _dropout_fit(run_dir: str) -> None:
    tf.keras.utils.set_random_seed(7)
    first, drop = tf.keras.layers.Dense(H, "relu", name="dense"), tf.keras.layers.Dropout(RATE, name="dropout")
    out = tf.keras.layers.Dense(C, name="dense_1")
    inputs = tf.keras.Input((D,))
    model = tf.keras.Model(inputs, out(drop(first(inputs))))
    first.set_weights([W1, np.zeros(H, np.float32)])
    out.set_weights([W2, np.zeros(C, np.float32)])
    model.compile(tf.keras.optimizers.SGD(0.1), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=[first, drop])
    model.fit(X, Y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    rec.close()


def test_dropout_masks_drawn_otherwise_are_named_as_such(tmp_path) -> None:
    """A new user's port seeded its dropout otherwise (both in training mode): the divergence on the
    dropout's output is real, and the note said "this layer computes another function (... training
    flag)". Numpy: every element out of tolerance is 0 in one run and h / (1 - rate) in the other."""
    _tf1(str(tmp_path / "tf1"), dropout=RATE)
    _dropout_fit(str(tmp_path / "tf2"))
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    h = np.asarray(tf1[0][("activation", "dense")][2]).reshape(-1)
    np.testing.assert_allclose(np.asarray(tf2[0][("activation", "dense")][2]).reshape(-1), h, rtol=1e-6, atol=1e-7)
    a, b = (np.asarray(run[0][("activation", "dropout")][2]).reshape(-1) for run in (tf1, tf2))
    apart = ~np.isclose(a, b, rtol=1e-7, atol=1e-5)
    assert apart.any()
    for one, other in ((a, b), (b, a)):  # each element apart: kept (h / (1 - rate)) in one run, dropped in the other
        kept = apart & (one != 0)
        np.testing.assert_allclose(one[kept], h[kept] / (1 - RATE), rtol=1e-6)
        assert (other[kept] == 0).all()
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dropout"), first
    assert f"each of its {int(apart.sum())} elements out of tolerance is exactly 0 in one run only" in first.note
    assert "a different random mask" in first.note and "training flag" not in first.note


def test_dropout_on_in_one_run_only_is_named_with_its_rate(tmp_path) -> None:
    """The classic porting bug, from a trial whose note was generic: the TF1 original calls
    ``tf.compat.v1.layers.dropout(h, rate)`` without ``training=True``, so its dropout never ran,
    and the Keras port's runs under ``fit``. Numpy: the original's dropout output is its input,
    and each element out of tolerance in the port is 0 or h / (1 - rate)."""
    _tf1(str(tmp_path / "tf1"), dropout=RATE, training=False)
    _dropout_fit(str(tmp_path / "tf2"))
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    h = np.asarray(tf1[0][("activation", "dense")][2]).reshape(-1)
    off = np.asarray(tf1[0][("activation", "dropout")][2]).reshape(-1)
    on = np.asarray(tf2[0][("activation", "dropout")][2]).reshape(-1)
    np.testing.assert_array_equal(off, h)
    apart = ~np.isclose(on, off, rtol=1e-7, atol=1e-5)
    assert apart.any() and (on[apart] == 0).any() and (on[apart] != 0).any()
    np.testing.assert_allclose(on[apart & (on != 0)], h[apart & (on != 0)] / (1 - RATE), rtol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dropout"), first
    assert (
        f"in 'tf2' each of its {int(apart.sum())} elements out of tolerance is 0 or 1.42857 times its value in "
        "'tf1': dropout of rate 0.3 is on in 'tf2' only"
    ) in first.note, first.note


def test_no_batch_hint_when_the_input_agrees_or_a_weight_is_one_runs_only() -> None:
    """From a review: a recorded input (kind ``input``) that agrees rules out another batch, so the
    note speaks of the layer; a weight one run alone records (a bias the port dropped, declared
    with ``allow_unmatched``) is not known to agree, so the note does not say every weight agrees: it
    names that weight as never compared (a new user's LSTM cells, declared, got no note at all)."""
    x = [np.arange(4, dtype=np.float32)] * 2
    w = [np.ones(4, np.float32)] * 2
    out = [np.ones(4, np.float32)] * 2
    moved = [o + np.float32(0.5) for o in out]
    common = [series("input", "x", x), series("weight", "dense/kernel:0", w, order=1)]
    base = run("tf1", [*common, series("activation", "dense", out, order=2)])
    first = Comparison(base, run("tf2", [*common, series("activation", "dense", moved, order=2)])).report()
    note = first.first_divergence.note
    assert "the outputs recorded before it agree" in note and "shuffle" not in note, note
    bias = series("weight", "dense/bias:0", [np.zeros(4, np.float32)] * 2, order=1)
    base = run("tf1", [common[1], bias, series("activation", "dense", out, order=2)])
    cand = run("tf2", [common[1], series("activation", "dense", moved, order=2)])
    policy = TolerancePolicy(allow_unmatched=("weight/dense/bias*",))
    note = Comparison(base, cand, policy).report().first_divergence.note
    assert "every recorded weight" not in note and "every weight both runs recorded agrees" in note, note
    assert "1 variable(s) recorded by one run only were never compared (dense/bias:0)" in note, note


def test_a_batch_norm_output_under_a_strategy_names_per_replica_statistics() -> None:
    """A new user's port under MirroredStrategy used a plain BatchNormalization: each replica
    normalized its half of the batch (numpy: 1.8e-7 from batch norm per half, 1.09 from batch norm
    over the batch), and the note spoke of activations and padding."""
    rng = np.random.default_rng(0)
    h = rng.standard_normal((16, 4)).astype(np.float32) * 3 + 1
    w = [np.ones(4, np.float32)]

    def norm(x: np.ndarray) -> np.ndarray:
        return ((x - x.mean(0)) / np.sqrt(x.var(0) + 1e-3)).astype(np.float32)

    whole, halves = norm(h), np.concatenate([norm(h[:8]), norm(h[8:])])
    assert np.abs(whole - halves).max() > 1e-2  # numpy: the two differ
    base = run(
        "tf1",
        [
            series("weight", "dense/kernel:0", w),
            series("activation", "dense", [h], order=1),
            series("activation", "batch_normalization", [whole], order=2),
        ],
    )
    cand = run(
        "tf2",
        [
            series("weight", "dense/kernel:0", w),
            series("activation", "dense", [h], order=1),
            series("activation", "batch_normalization", [halves], order=2),
            series("activation", "batch_normalization@replica0", [halves[:8]], order=2),
            series("activation", "batch_normalization@replica1", [halves[8:]], order=2),
        ],
    )
    first = Comparison(base, cand).report().first_divergence
    assert (first.step, first.tensor) == (0, "batch_normalization"), first
    assert "ran 1 and 2 replicas" in first.note and "SyncBatchNormalization" in first.note, first.note


def test_a_weight_of_a_later_layer_compared_by_statistics_keeps_the_note() -> None:
    """A new user's per-replica batch norm was named only while every weight kept full values: a
    1024x1024 dense after it, compared by statistics, took the note away, though a later layer's
    weight cannot move an earlier output. A weight of this layer or an earlier one still does."""
    out = [np.ones(4, np.float32) for _ in range(2)]
    moved = [o + np.float32(0.5) for o in out]
    small = [np.ones(3, np.float32) for _ in range(2)]
    wide = [np.ones(5000, np.float32) for _ in range(2)]
    for wide_layer, noted in (("dense_1", True), ("dense", False)):

        def tensors(first_out: list, layer: str = wide_layer) -> list:
            return [
                series("weight", "model/dense/kernel:0", small),
                series("weight", f"model/{layer}/bias:0", wide, keep_values=False),
                series("activation", "dense", first_out, order=1),
                series("activation", "dense_1", out, order=2),
            ]

        first = Comparison(run("tf1", tensors(out)), run("tf2", tensors(moved))).report().first_divergence
        assert (first.step, first.tensor) == (0, "dense")
        assert (
            "(but those of layers recorded after it, which statistics alone compare)" in (first.note or "")
        ) == noted
        assert ("computes another function of its input" in (first.note or "")) == noted, first.note


def test_an_output_apart_at_some_sequence_positions_only_says_which_share() -> None:
    """A helper's port masked padded tokens (``Embedding(mask_zero=True)``) where TF1 did not: its
    attention output moved at the padded query rows only (41% of the elements, the share of padded
    tokens), and the note spoke of activations and epsilon. numpy: the rows apart are the padded
    positions; a difference at every position gets no such clause."""
    rng = np.random.default_rng(0)
    ids = np.array([[4, 2, 7, 0, 0], [3, 1, 0, 0, 0]])
    padded = ids == 0
    x = [rng.standard_normal((2, 5, 4)).astype(np.float32)]
    w = [rng.standard_normal((4, 4)).astype(np.float32)]
    out = [x[0] @ w[0]]
    masked = [np.where(padded[..., None], out[0].mean(axis=1, keepdims=True), out[0]).astype(np.float32)]
    common = [series("activation", "embedding", x), series("weight", "mha/kernel:0", w, order=1)]

    def note(cand_out: list) -> str:
        base = run("tf1", [*common, series("activation", "mha", out, order=2)])
        cand = run("tf2", [*common, series("activation", "mha", cand_out, order=2)])
        found = Comparison(base, cand).report().first_divergence
        assert found is not None and (found.step, found.tensor) == (0, "mha"), found
        return found.note or ""

    apart = np.abs(masked[0] - out[0]).max(axis=-1) > 1e-5
    assert (apart == padded).all()
    text = note(masked)
    assert f"lie at {int(padded.sum())} of its 10 (batch, time) positions" in text, text
    assert "Embedding(mask_zero=True)" in text
    everywhere = [(out[0] * np.float32(1.01)).astype(np.float32)]
    assert "(batch, time) positions" not in note(everywhere)
    # a review's: a whole sample apart is another example, not a mask
    sample = [out[0].copy()]
    sample[0][1] *= np.float32(1.5)
    text = note(sample)
    assert "every position of 1 entries of the first axis and none of the others" in text, text
    assert "mask" not in text, text
    # positions apart in the middle of a sample are no padding either: the share, and no mask
    middle = [out[0].copy()]
    middle[0][0, 2] += np.float32(1.0)
    text = note(middle)
    assert "lie at 1 of its 10 (batch, time) positions, every element at the others agreeing" in text, text
    assert "mask" not in text, text
    # one element of a sample's last position, as rounding leaves: a trial's BERT port, its -10000
    # mask the same on both sides, was told "the runs mask them differently"
    one = [out[0].copy()]
    one[0][1, 4, 0] += np.float32(1e-4)
    assert ((np.abs(one[0] - out[0]) > 1e-5).sum(axis=-1) == [[0] * 5, [0, 0, 0, 0, 1]]).all()
    text = note(one)
    assert "lie at 1 of its 10 (batch, time) positions (1 element(s) of their 4)" in text, text
    assert "mask" not in text, text


def test_variables_one_run_records_after_the_output_are_not_said_to_reach_it() -> None:
    """The review of the unpaired-variables note: a dense layer before a declared LSTM diverged (relu
    against tanh: numpy, every element of the output) and was told the LSTM cells' variables reach
    it and of an LSTM's gate order. Those run after it; its note speaks of its own function."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    after = rng.standard_normal((2, 5, 6)).astype(np.float32)

    def side(name: str, dense_out: np.ndarray, cell: list) -> Any:
        return run(
            name,
            [
                series("input", "x", [x], order=0),
                series("weight", "dense/kernel:0", [w], order=1),
                *cell,
                series("activation", "dense", [dense_out], order=10),
                series("activation", "lstm", [after], order=11),
            ],
        )

    tf1_cell = [series("weight", "rnn/lstm_cell/kernel:0", [np.ones((10, 24), np.float32)], order=2)]
    keras_cell = [series("weight", "lstm/lstm_cell/recurrent_kernel:0", [np.ones((6, 24), np.float32)], order=2)]
    policy = TolerancePolicy(allow_unmatched=("*lstm_cell*",))
    relu, tanh = np.maximum(x @ w, 0), np.tanh(x @ w)
    found = Comparison(side("tf1", relu, tf1_cell), side("tf2", tanh, keras_cell), policy).report().first_divergence
    assert found is not None and (found.step, found.tensor) == (0, "dense"), found
    # the port's cell, under the later lstm layer, is left out; TF1's (scope rnn) may feed it, said so
    assert "lstm/lstm_cell" not in found.note and "gate order" not in found.note, found.note
    assert "(rnn/lstm_cell/kernel:0): a difference in them reaches this output if they feed it" in found.note


def test_a_layers_own_unpaired_variable_is_named_whatever_the_other_run_calls_later_layers() -> None:
    """The second review: the port's renumbered ``dense_1`` diverged with its own bias recorded by
    the port only, and the note dropped that bias because the baseline's *later* output is also
    called ``dense_1``. Each run's variables are matched with that run's later outputs, and a
    layer's own variables are always named."""
    x = [np.ones((2, 3), np.float32)]
    w = [np.full((3, 4), 0.5, np.float32)]
    out_b, out_c = [np.full((2, 4), 1.5, np.float32)], [np.full((2, 4), 1.6, np.float32)]
    later = [np.zeros((2, 2), np.float32)]
    base = run(
        "tf1",
        [
            series("input", "x", x),
            series("weight", "dense/kernel:0", w, order=1),
            series("activation", "dense", out_b, order=5),
            series("activation", "dense_1", later, order=6),
        ],
    )
    cand = run(
        "tf2",
        [
            series("input", "x", x),
            series("weight", "dense_1/kernel:0", w, order=1),
            series("weight", "dense_1/bias:0", [np.full(4, 0.1, np.float32)], order=2),
            series("activation", "dense_1", out_c, order=5),
            series("activation", "dense_2", later, order=6),
        ],
    )
    found = Comparison(base, cand).report().first_step_divergence
    assert found is not None and (found.tensor, found.candidate_tensor) == ("dense", "dense_1"), found
    assert "recorded by one run only were never compared (dense_1/bias:0)" in (found.note or ""), found.note


@pytest.mark.parametrize(("in_sync", "scale"), [(True, 1.0), (False, 1.0), (False, 1e-4)])
def test_a_synchronized_batch_norm_is_not_told_it_normalizes_per_replica(in_sync: bool, scale: float) -> None:
    """A helper's ``BatchNormalization(synchronized=True, epsilon=1e-5)`` under MirroredStrategy
    against TF1's 1e-3 was told each replica normalizes its share alone, beside a replicas line
    saying every copy agrees (numpy: the port's output is batch norm over the whole batch at
    epsilon 1e-5). Its moving mean's replica copies agree after an update: no such note, the
    layer's function (epsilon) instead. Copies apart after the update keep the note, also where
    the moving mean is tiny (1e-6, the review's small activations): copies 1.5x apart there are
    within the training atol, but not in sync."""
    rng = np.random.default_rng(0)
    h = rng.standard_normal((16, 4)).astype(np.float32) * 0.05 + 1

    def norm(x: np.ndarray, eps: float) -> np.ndarray:
        return ((x - x.mean(0)) / np.sqrt(x.var(0) + eps)).astype(np.float32)

    base_out, cand_out = norm(h, 1e-3), norm(h, 1e-5)
    assert np.abs(base_out - cand_out).max() > 1e-2  # numpy: epsilon alone moves it past tolerance
    moving = [np.zeros(4, np.float32), (0.01 * scale * h.mean(0)).astype(np.float32)]
    apart = [moving[0], moving[1] * np.float32(1.5)]
    assert (np.abs(apart[1] - moving[1]).max() < 1e-5) == (scale < 1)  # under the training atol
    w = [np.ones(4, np.float32)] * 2
    common = [series("weight", "dense/kernel:0", w), series("activation", "dense", [h, h], order=1)]
    base = run(
        "tf1",
        [
            *common,
            series("activation", "batch_normalization", [base_out] * 2, order=2),
            series("state", "batch_normalization/moving_mean:0", moving, order=3),
        ],
    )
    cand = run(
        "tf2",
        [
            *common,
            series("activation", "batch_normalization", [cand_out] * 2, order=2),
            series("activation", "batch_normalization@replica0", [cand_out[:8]] * 2, order=2),
            series("activation", "batch_normalization@replica1", [cand_out[8:]] * 2, order=2),
            series("state", "batch_normalization/moving_mean:0", moving, order=3),
            series("state", "batch_normalization/moving_mean:0@replica0", moving, order=3),
            series("state", "batch_normalization/moving_mean:0@replica1", moving if in_sync else apart, order=3),
        ],
    )
    first = Comparison(base, cand).report().first_divergence
    assert (first.step, first.tensor) == (0, "batch_normalization"), first
    assert ("SyncBatchNormalization" in first.note) == (not in_sync), first.note
    if in_sync:
        assert "epsilon" in first.note, first.note


def test_zeros_of_padding_and_a_scale_are_not_called_dropout() -> None:
    """A review's tensor2tensor-style embedding: TF1 multiplies by sqrt(d) and zeroes the padding
    id's rows, the port does neither. Each element apart is 0 or 4x the port's, as inverted dropout
    at rate 0.75 would leave, but 30% are zeros, not 75%, and they fill whole rows: padding. numpy
    shows both; the note is the generic one, naming a scale and padding."""
    rng = np.random.default_rng(0)
    vocab, width = 10, 16
    table = (rng.standard_normal((vocab, width)) * 0.05).astype(np.float32)
    ids = np.array([[3, 5, 7, 0, 0], [2, 9, 4, 6, 0]])
    port = table[ids]
    tf1 = (port * np.float32(np.sqrt(width))) * (ids != 0)[..., None].astype(np.float32)
    zeros = (tf1 == 0) & (port != 0)
    assert abs(zeros.mean() - 0.3) < 1e-9 and (zeros.all(axis=-1) | ~zeros.any(axis=-1)).all()
    first = (
        Comparison(
            run(
                "tf1",
                [
                    series("weight", "embedding/embeddings:0", [table]),
                    series("activation", "embedding", [tf1], order=1),
                ],
            ),
            run(
                "tf2",
                [
                    series("weight", "embedding/embeddings:0", [table]),
                    series("activation", "embedding", [port], order=1),
                ],
            ),
        )
        .report()
        .first_divergence
    )
    assert (first.step, first.tensor) == (0, "embedding"), first
    assert "dropout of rate" not in first.note and "a scale" in first.note and "padding" in first.note, first.note


@pytest.mark.parametrize("pipeline", ["restarted", "resumed", "next file"])
def test_a_run_resumed_where_its_first_output_diverges_names_the_resume(tmp_path, pipeline: str) -> None:
    """The baseline crashed after step 4 and was resumed from its step-3 checkpoint into a new event
    file; its input pipeline (a one-shot iterator, which no checkpoint holds) started again from its
    first batch, so from step 3 its first layer saw batch 0 again. numpy: its output at step 3 is
    step 0's, the port's is step 3's; every weight agrees. A helper's TF1 run resumed so under
    MonitoredTrainingSession was told of fit's shuffling. A pipeline resumed where it stopped agrees.
    A file that only goes on where the one before ended (a new recorder each epoch, steps 0-2 then
    3-5) is no resume: its output fed other batches from step 3 is not told of one."""
    from engine_helpers import write_run

    batches = [RNG.standard_normal(6).astype(np.float32) for _ in range(6)]

    def at(s: int, batch: int) -> list:
        return [("weight", "dense/kernel:0", np.full(4, 0.5, np.float32)), ("activation", "dense", batches[batch])]

    logdir = str(tmp_path)
    write_run(logdir, "tf1", range(3 if pipeline == "next file" else 5), lambda s: at(s, s))
    write_run(logdir, "tf1", range(3, 6), lambda s: at(s, s if pipeline == "resumed" else s - 3))
    write_run(logdir, "tf2", range(6), lambda s: at(s, s))
    report = compare(logdir, baseline="tf1", candidate="tf2")
    if pipeline == "resumed":
        assert report.agree, report.first_divergence
        return
    assert not np.allclose(batches[0], batches[3], atol=1e-5)
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (3, "activation"), first
    if pipeline == "next file":
        assert "resumed" not in (first.note or "") and "shuffles" in (first.note or ""), first.note
        return
    assert "'tf1' was resumed at this step" in (first.note or "") and "one-shot" in first.note, first.note
    assert "shuffles" not in first.note


def test_a_partial_batch_divided_by_the_full_batch_size_is_named_with_the_sizes(tmp_path) -> None:
    """A custom loop dividing its summed loss by a BATCH_SIZE constant (what a fixed
    ``compute_average_loss(global_batch_size=...)`` does) halves the loss of a last batch of half
    the size, where TF1's mean does not: a new user's port was told only "the loss is computed
    differently (reduction, from_logits, ...)". numpy on the recorded logits first."""
    rows = (STEPS - 1) * BATCH + BATCH // 2
    _tf1(str(tmp_path / "tf1"), rows=rows)
    first, out = tf.keras.layers.Dense(H, "relu", name="dense"), tf.keras.layers.Dense(C, name="dense_1")
    model = tf.keras.Sequential([tf.keras.Input((D,)), first, out])
    first.set_weights([W1, np.zeros(H, np.float32)])
    out.set_weights([W2, np.zeros(C, np.float32)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(optimizer.iterations):
            rec.lr(tf.constant(0.1))
            with tf.GradientTape() as tape:
                h = rec.activation("dense", first(x))
                logits = rec.activation("dense_1", out(h))
                per_example = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
                loss = rec.loss(tf.reduce_sum(per_example) / BATCH)  # the bug: a fixed batch size
            rec.minimize(optimizer, loss, model.trainable_variables, tape)

    for x, y in tf.data.Dataset.from_tensor_slices((X[:rows], Y[:rows])).batch(BATCH):
        step(x, y)
    rec.close()
    last = STEPS - 1
    base, port = (tensors_by_step(str(tmp_path / run))[last] for run in ("tf1", "tf2"))
    logits = np.asarray(base[("activation", "dense_1")][2], np.float64).reshape(BATCH // 2, C)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ce = -np.log(p[np.arange(BATCH // 2), Y[last * BATCH : rows]])
    np.testing.assert_allclose(np.asarray(base[("loss", "loss")][2]).ravel(), [ce.mean()], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(port[("loss", "loss")][2]).ravel(), [ce.sum() / BATCH], rtol=1e-5)
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (found.step, found.kind, found.tensor) == (last, "loss", "loss")
    assert "times 0.5, and this step's batch holds 4 examples against 8 at earlier steps" in found.note
    assert "divides this partial batch's loss by the full batch size" in found.note


# -- a categorical feature looked up in another vocabulary order ---------------------------------
# TF1 indexes a binary feature with its vocabulary ["M", "F"], the port's StringLookup with ["F", "M"]
# (the embedding copied from TF1): each example gets the other category's row. A batch of four of
# each holds the same rows, in another order, though no example moved: the note said "the same
# examples in another order in the batch" (a dataset sharded by element, a shuffle) and sent its user
# to the input pipeline. Rows that match several rows of the other run prove no reordering.

SEX = np.array([b"M", b"F", b"F", b"M", b"F", b"M", b"M", b"F"] * 2)
SEX_Y = RNG.normal(size=(16, 1)).astype(np.float32)
SEX_TABLE = RNG.normal(size=(2, 3)).astype(np.float32)
SEX_K = RNG.normal(size=(3, 1)).astype(np.float32)


def _sex_tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        sex = tf.compat.v1.placeholder(tf.string, [None])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        vocabulary = tf.compat.v1.lookup.KeyValueTensorInitializer(["M", "F"], [0, 1], value_dtype=tf.int64)
        ids = tf.compat.v1.lookup.StaticHashTable(vocabulary, -1).lookup(sex)
        table = tf.compat.v1.get_variable("embedding", initializer=SEX_TABLE)
        h = rec.activation("embedding", tf.nn.embedding_lookup(table, ids))
        p = tf.compat.v1.layers.dense(h, 1, kernel_initializer=tf.constant_initializer(SEX_K), name="dense")
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, p))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        tf1_session.train(rec, train_op, [sex, y], [SEX, SEX_Y], 2, 8)


def _sex_port(run_dir: str) -> None:
    lookup = tf.keras.layers.StringLookup(vocabulary=["F", "M"], num_oov_indices=0)  # the bug: another order
    embedding = tf.keras.layers.Embedding(2, 3, embeddings_initializer=tf.constant_initializer(SEX_TABLE))
    dense = tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(SEX_K), name="dense")
    model = tf.keras.Sequential([tf.keras.Input((), dtype="string"), lookup, embedding, dense])
    optimizer = tf.keras.optimizers.SGD(0.1)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(optimizer.iterations):
            with tf.GradientTape() as tape:
                h = rec.activation("embedding", embedding(lookup(x)))
                loss = rec.loss(tf.reduce_mean(tf.square(y - dense(h))))
            rec.minimize(optimizer, loss, model.trainable_variables, tape)

    for s in range(2):
        step(tf.constant(SEX[s * 8 : (s + 1) * 8]), tf.constant(SEX_Y[s * 8 : (s + 1) * 8]))
    rec.close()


def test_rows_of_another_category_are_not_told_the_same_examples_in_another_order(tmp_path) -> None:
    _sex_tf1(str(tmp_path / "tf1"))
    _sex_port(str(tmp_path / "tf2"))
    base, port = (
        np.asarray(tensors_by_step(str(tmp_path / run))[0][("activation", "embedding")][2]).reshape(8, 3)
        for run in ("tf1", "tf2")
    )
    # numpy: TF1 looks up row 0 for "M", the port row 1; each example gets the other category's row,
    # so the batch holds the same multiset of rows while every example's row changed
    m = SEX[:8] == b"M"
    np.testing.assert_array_equal(base[m], np.repeat(SEX_TABLE[:1], 4, 0))
    np.testing.assert_array_equal(port[m], np.repeat(SEX_TABLE[1:], 4, 0))
    np.testing.assert_array_equal(np.sort(base, axis=0), np.sort(port, axis=0))
    assert np.abs(base - port).min() > 1e-2
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "embedding"), first
    assert "another order" not in (first.note or ""), first.note


# A tf.data trial: a TF1 original reading images through a one-shot iterator (a seeded shuffle, a map
# scaling by 1/255 and subtracting a per-channel mean, a batch), its input recorded as kind ``input``,
# against custom-loop ports. Each port bug diverged first on the recorded input with no note at all.
PIPE_N, PIPE_BATCH, PIPE_STEPS, PIPE_SEED = 20, 8, 4, 42
PIPE_RNG = np.random.default_rng(49)
IMAGES = PIPE_RNG.integers(0, 256, (PIPE_N, 2, 2, 3)).astype(np.uint8)
IMAGE_LABELS = PIPE_RNG.integers(0, C, PIPE_N).astype(np.int64)
MEAN = (IMAGES.reshape(-1, 3).mean(0) / 255.0).astype(np.float32)
PIPE_W = (PIPE_RNG.standard_normal((12, C)) * 0.3).astype(np.float32)


def _pipeline(bug: str = "") -> Any:
    def pre(img: Any, y: Any) -> Any:
        x = tf.cast(img, tf.float32)
        return (x / 127.5 - 1.0 if bug == "scale" else x / 255.0) - MEAN, y

    # the global seed both sides set (a seed test before this one leaves another in TF2)
    tf.random.set_seed(1) if tf.executing_eagerly() else tf.compat.v1.set_random_seed(1)
    ds = tf.data.Dataset.from_tensor_slices((IMAGES, IMAGE_LABELS))
    ds = ds.shuffle(PIPE_N) if bug == "unseeded" else ds.shuffle(PIPE_N, seed=PIPE_SEED)
    return ds.map(pre).batch(PIPE_BATCH, drop_remainder=bug == "drop").repeat()


def _pipeline_batches(bug: str = "") -> list[np.ndarray]:
    """The inputs each step reads, from plain TensorFlow (no recorder): TF1's from a graph."""
    if bug == "tf1":
        with tf.Graph().as_default():
            nxt = tf.compat.v1.data.make_one_shot_iterator(_pipeline()).get_next()[0]
            with tf.compat.v1.Session() as sess:
                return [sess.run(nxt) for _ in range(PIPE_STEPS)]
    return [x.numpy() for x, _ in _pipeline(bug).take(PIPE_STEPS)]


def _pipeline_tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        x, y = tf.compat.v1.data.make_one_shot_iterator(_pipeline()).get_next()
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = rec.tensor("input", "x", x)
        logits = tf.compat.v1.layers.dense(
            tf.reshape(x, [-1, 12]), C, name="dense", kernel_initializer=tf.constant_initializer(PIPE_W)
        )
        rec.activation("dense", logits)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(PIPE_STEPS):
                rec.write(sess.run([train_op, fetches])[1])
        rec.close()


def _pipeline_loop(run_dir: str, bug: str = "") -> None:
    dense = tf.keras.layers.Dense(C, name="dense")
    model = tf.keras.Sequential([tf.keras.Input((2, 2, 3)), tf.keras.layers.Flatten(), dense])
    dense.set_weights([PIPE_W, np.zeros(C, np.float32)])
    opt = tf.keras.optimizers.SGD(0.1)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def train_step(x: Any, y: Any) -> None:
        with rec.step(opt.iterations, variables=model):
            x = rec.tensor("input", "x", x)
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(y, rec.activation("dense", model(x))))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for x, y in _pipeline(bug).take(PIPE_STEPS):
        train_step(x, y)
    rec.close()


def test_a_recorded_input_that_differs_names_the_data_fed(tmp_path) -> None:
    _pipeline_tf1(str(tmp_path / "tf1"))
    tf1 = _pipeline_batches("tf1")
    for port, original in zip(_pipeline_batches(), tf1, strict=True):  # the same seed: the same batches in TF2
        np.testing.assert_array_equal(port, original)
    _pipeline_loop(str(tmp_path / "faithful"))
    assert compare(str(tmp_path), baseline="tf1", candidate="faithful").agree
    # x / 127.5 - 1 for x / 255: numpy, the port's input is 2 * TF1's + MEAN - 1 per channel
    _pipeline_loop(str(tmp_path / "scale"), "scale")
    np.testing.assert_allclose(_pipeline_batches("scale")[0], 2 * tf1[0] + MEAN - 1, atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="scale").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "input", "x"), first
    offsets = ", ".join(f"{v:.4g}" for v in MEAN - 1)
    assert "the recorded input itself differs at this step" in first.note, first.note
    assert f"is 2 times its value in 'tf1' + [{offsets}] (per channel of the last axis)" in first.note, first.note
    # a shuffle without its seed: another order (plain TF: another first batch)
    _pipeline_loop(str(tmp_path / "unseeded"), "unseeded")
    assert not np.array_equal(_pipeline_batches("unseeded")[0], tf1[0])
    first = compare(str(tmp_path), baseline="tf1", candidate="unseeded").first_divergence
    assert (first.step, first.kind) == (0, "input"), first
    assert "the recorded input itself differs" in first.note and "a shuffle without its seed" in first.note
    assert "scaled or shifted" not in first.note, first.note


def test_a_partial_batch_dropped_on_one_side_is_named_by_its_batch_axis(tmp_path) -> None:
    _pipeline_tf1(str(tmp_path / "tf1"))
    _pipeline_loop(str(tmp_path / "drop"), "drop")
    # numpy: 20 examples in batches of 8 leave 4 at step 2 in TF1; drop_remainder starts the next epoch
    sizes = [len(b) for b in _pipeline_batches("tf1")], [len(b) for b in _pipeline_batches("drop")]
    assert sizes == ([8, 8, 4, 8], [8, 8, 8, 8]), sizes
    first = compare(str(tmp_path), baseline="tf1", candidate="drop").first_divergence
    assert (first.step, first.kind, first.reason) == (2, "input", "shape"), first
    assert "only the first (batch) axis differs (4 examples in 'tf1' against 8 in 'drop')" in first.note, first.note
    assert "drop_remainder=True" in first.note, first.note


def test_two_rows_of_other_examples_are_not_called_scaled() -> None:
    """Any two points lie on a line: a [2, n] input of other examples fits a per-feature scale and
    offset exactly, and must not be told it is the baseline's data scaled (numpy: no single map)."""
    rng = np.random.default_rng(5)
    base, cand = rng.standard_normal((2, 2, 6)).astype(np.float32)
    first = (
        Comparison(run("tf1", [series("input", "x", [base])]), run("tf2", [series("input", "x", [cand])]))
        .report()
        .first_divergence
    )
    assert (first.step, first.kind) == (0, "input"), first
    assert "the recorded input itself differs" in first.note and "scaled or shifted" not in first.note, first.note


def _bn_tf1(run_dir: str, update_ops: bool = True, scale: Optional[float] = None, train_bn: bool = True) -> None:
    """A dense layer and batch normalization in training mode, its output recorded (``bn``), updated
    through UPDATE_OPS unless ``update_ops`` is False (as TF1 code often leaves it out: its moving
    statistics then never move, while the layer still normalizes with the batch's). ``scale``: the
    logits are ``scale`` times it, recorded as ``out``. ``train_bn`` False: the optimizer's var_list is
    the dense layer's (the norm's gamma and beta stay, its statistics still move)."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        h = tf.compat.v1.layers.dense(x, C, name="dense", kernel_initializer=tf.constant_initializer(W1[:, :C]))
        logits = rec.activation("bn", tf.compat.v1.layers.batch_normalization(h, training=True, name="bn"))
        if scale is not None:
            logits = rec.activation("out", scale * logits)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS) if update_ops else []
        with tf.control_dependencies(updates):
            var_list = None if train_bn else tf.compat.v1.trainable_variables("dense")
            train_op = rec.minimize(
                tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs, var_list=var_list
            )
        rec.variables()
        tf1_session.train(rec, train_op, [x, y], [X, Y], STEPS, BATCH)


def _bn_custom_step(run_dir: str, training: Any, scale: Optional[float] = None) -> None:
    """The port's custom step; ``training=None``: the call without ``training=``, as a new user's
    own ``train_step`` wrote it (Keras then runs batch normalization in inference mode). ``scale``:
    the logits are ``scale`` times the normalized output, recorded as ``out``."""
    dense = tf.keras.layers.Dense(C, name="dense", kernel_initializer=tf.constant_initializer(W1[:, :C]))
    bn = tf.keras.layers.BatchNormalization(name="bn")
    model = tf.keras.Sequential([tf.keras.Input((D,)), dense, bn])
    opt = tf.keras.optimizers.SGD(0.1)
    rec = summary_v2.Recorder(run_dir)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb: tf.Tensor, yb: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model):
            with tf.GradientTape() as tape:
                logits = rec.activation("bn", bn(dense(xb), training=training))
                if scale is not None:
                    logits = rec.activation("out", scale * logits)
                loss = rec.loss(loss_fn(yb, logits))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for s in range(STEPS):
        step(tf.constant(X[s * BATCH : (s + 1) * BATCH]), tf.constant(Y[s * BATCH : (s + 1) * BATCH]))
    rec.close()


def test_batch_norm_in_inference_mode_in_one_run_is_named_from_its_frozen_moving_statistics(tmp_path) -> None:
    """A new user's own ``train_step`` called its encoder without ``training=True``: its batch
    normalization normalized with the moving statistics (0 and 1 at step 0), and the first output
    diverged at step 0 with a note of shuffled batches and padding. The port's moving statistics then
    stay as they were while TF1's move: the note says so, and names inference mode."""
    _bn_tf1(str(tmp_path / "tf1"))
    _bn_custom_step(str(tmp_path / "ok"), training=True)
    _bn_custom_step(str(tmp_path / "off"), training=None)
    report = compare(str(tmp_path), baseline="tf1", candidate="ok")
    assert report.agree, report.first_divergence
    # numpy: TF1 normalizes each batch with its own moments; the port divides by sqrt(1 + epsilon) only
    h = X[:BATCH].astype(np.float64) @ W1[:, :C]
    tf1, off = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "off"))
    np.testing.assert_allclose(tf1[0][("activation", "bn")][2], (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-3), atol=1e-5)
    np.testing.assert_allclose(off[0][("activation", "bn")][2], h / np.sqrt(1 + 1e-3), atol=1e-5)
    moving = "bn/moving_mean:0"
    np.testing.assert_array_equal(off[1][("state", moving)][2], np.zeros(C))
    np.testing.assert_allclose(tf1[1][("state", moving)][2], 0.01 * h.mean(0), atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="off").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "bn"), first
    assert f"'off' left {moving} unchanged from step 0 to step 1 where 'tf1' updated it" in first.note, first.note
    assert "inference mode in 'off'" in first.note and "shuffle" not in first.note, first.note


def test_moving_statistics_left_put_by_missing_update_ops_are_no_inference_mode_when_the_norm_agrees(
    tmp_path,
) -> None:
    """TF1 without the UPDATE_OPS dependency keeps its moving statistics at 0 while normalizing with the
    batch's (its recorded ``bn`` agrees with the port's), and the port scales the output by 2 (another
    bug, after the norm): ``out`` diverges first. The note named inference mode in TF1, which the agreeing
    ``bn`` output contradicts."""
    _bn_tf1(str(tmp_path / "tf1"), update_ops=False, scale=1.0)
    _bn_custom_step(str(tmp_path / "port"), training=True, scale=2.0)
    h = X[:BATCH].astype(np.float64) @ W1[:, :C]
    normed = (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-3)
    tf1, port = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "port"))
    for run_ in (tf1, port):  # both normalize with the batch's moments: the norm agrees
        np.testing.assert_allclose(run_[0][("activation", "bn")][2], normed, atol=1e-5)
    np.testing.assert_allclose(port[0][("activation", "out")][2], 2 * normed, atol=1e-5)
    moving = "bn/moving_mean:0"
    np.testing.assert_array_equal(tf1[1][("state", moving)][2], np.zeros(C))  # never updated
    np.testing.assert_allclose(port[1][("state", moving)][2], 0.01 * h.mean(0), atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="port").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "out"), first
    assert "inference mode" not in (first.note or ""), first.note


def test_a_frozen_batch_norm_under_fit_is_named_as_frozen_in_the_inference_mode_note(tmp_path) -> None:
    """A fine-tuning port freezes the layers TF1 leaves out of its var_list (``trainable = False``) and
    trains them with ``fit``: since Keras 2 a frozen ``BatchNormalization`` normalizes in inference mode
    though ``fit`` calls it with ``training=True``, where TF1's ``training=True`` layer normalizes with
    the batch's moments and moves its statistics. The note named ``training=False`` and a custom
    ``train_step`` only, neither of which the port has."""
    _bn_tf1(str(tmp_path / "tf1"), train_bn=False)
    dense = tf.keras.layers.Dense(C, name="dense", kernel_initializer=tf.constant_initializer(W1[:, :C]))
    bn = tf.keras.layers.BatchNormalization(name="bn")
    model = tf.keras.Sequential([tf.keras.Input((D,)), dense, bn])
    bn.trainable = False
    model.compile(
        optimizer=tf.keras.optimizers.SGD(0.1), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    rec = summary_v2.Recorder(str(tmp_path / "frozen"))
    summary_v2.instrument(model, rec, layers=["bn"])
    model.fit(X[: STEPS * BATCH], Y[: STEPS * BATCH], batch_size=BATCH, shuffle=False, verbose=0)
    rec.close()
    # numpy: TF1 normalizes with the batch's moments; the frozen layer with its moving ones (0 and 1)
    h = X[:BATCH].astype(np.float64) @ W1[:, :C]
    tf1, frozen = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "frozen"))
    np.testing.assert_allclose(tf1[0][("activation", "bn")][2], (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-3), atol=1e-5)
    np.testing.assert_allclose(frozen[0][("activation", "bn")][2], h / np.sqrt(1 + 1e-3), atol=1e-5)
    np.testing.assert_array_equal(frozen[1][("state", "bn/moving_mean:0")][2], np.zeros(C))
    first = compare(str(tmp_path), baseline="tf1", candidate="frozen", allow_unmatched=["lr/*"]).first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "bn"), first
    assert "inference mode in 'frozen'" in first.note, first.note
    assert "trainable = False" in first.note, first.note


def test_a_one_hot_moved_in_each_of_many_rows_is_told_so_without_a_loop_over_the_rows() -> None:
    """A bucketized feature of 200k examples whose every example lands one bucket over in the port: the
    note that each row's value moved within its row compared the rows one by one in Python (about 5 s per
    100k rows, a minute for a million), on every refresh; it is read in one pass now (its time is no
    assertion here: measured 0.17 s at 100k rows, against 5.25 s before)."""
    rows, buckets = 200_000, 4
    cat = np.random.default_rng(5).integers(0, buckets, rows)
    tf1, port = (np.eye(buckets, dtype=np.float32)[b] for b in (cat, (cat + 1) % buckets))
    # numpy: every row differs, and in each the 1 that TF1 holds the port holds in another column
    assert np.all((tf1 != port).sum(1) == 2) and np.array_equal(tf1.sum(1), port.sum(1))
    kernel = np.ones((buckets, 2), np.float32)
    runs = [
        run(name, [series("output", "buckets", [tf1, out]), series("weight", "dense/kernel:0", [kernel] * 2, order=1)])
        for name, out in (("tf1", tf1), ("tf2", port))
    ]
    first = Comparison(*runs).report().first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "output", "buckets"), first
    assert f"in each of its {rows} row(s) that differ" in first.note and "another column" in first.note, first.note
