"""Padded positions a port computes otherwise, that nothing downstream reads.

A helper's faithful Transformer port (``Embedding(mask_zero=True)`` into ``MultiHeadAttention``,
which then masks padded queries as well as keys, against TF1's attention masking keys only) was a
DIVERGE at step 0 on its attention output: its padded query rows attend uniformly where TF1's attend
to the real keys, and no mask-aware pooling or later attention reads them (a float64 replay of both
agreed to 1e-15 everywhere else). ``rec.activation(name, t, mask=...)`` and
``instrument(..., zero_masked=True)`` record padded positions as 0, so only real ones are compared.
Expected values are numpy's attention on the initial weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from engine_helpers import run, series
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v2
from tb_parity_plugin.engine import Comparison

IDS = np.array([[3, 5, 2, 0, 0], [4, 1, 0, 0, 0], [2, 6, 7, 1, 5]], np.int32)
LABELS = np.array([0, 2, 1], np.int32)
STEPS = 3


def _model(mask_zero: bool) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input((None,), dtype="int32")
    x = tf.keras.layers.Embedding(8, 6, mask_zero=mask_zero, name="embedding")(ids)
    keys = None if mask_zero else tf.not_equal(ids, 0)
    a = tf.keras.layers.MultiHeadAttention(2, 3, name="mha")(
        x, x, attention_mask=None if keys is None else keys[:, None, :]
    )
    pool = tf.keras.layers.GlobalAveragePooling1D(name="pool")
    pooled = pool(a) if keys is None else pool(a, mask=keys)
    return tf.keras.Model(ids, tf.keras.layers.Dense(3, name="logits")(pooled))


def _numpy_attention(model: tf.keras.Model) -> np.ndarray:
    """Attention over the real keys only, at every query (TF1's masking), on the model's weights."""
    x = model.get_layer("embedding").get_weights()[0][IDS].astype(np.float64)
    wq, bq, wk, bk, wv, bv, wo, bo = (w.astype(np.float64) for w in model.get_layer("mha").get_weights())
    q = np.einsum("btd,dhk->bthk", x, wq) + bq
    k = np.einsum("btd,dhk->bthk", x, wk) + bk
    v = np.einsum("btd,dhk->bthk", x, wv) + bv
    scores = np.einsum("bqhk,bshk->bhqs", q / np.sqrt(3.0), k) + np.where(IDS[:, None, None, :] == 0, -1e9, 0.0)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqs,bshk,hkd->bqd", p, v, wo) + bo


def _baseline(logdir: str, weights: list, masked: bool) -> None:
    """Keys masked by hand, every query attending (TF1's attention), in a recorded custom loop."""
    model = _model(mask_zero=False)
    model.set_weights(weights)
    opt = tf.keras.optimizers.SGD(0.1)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(logdir)
    ids, labels = tf.constant(IDS), tf.constant(LABELS)

    @tf.function
    def step() -> None:
        with rec.step(opt.iterations, variables=model):
            rec.lr(opt.learning_rate)
            keys = tf.not_equal(ids, 0)
            with tf.GradientTape() as tape:
                x = model.get_layer("embedding")(ids)
                a = model.get_layer("mha")(x, x, attention_mask=keys[:, None, :])
                rec.activation("mha", a, mask=keys if masked else None)
                logits = model.get_layer("logits")(model.get_layer("pool")(a, mask=keys))
                loss = rec.loss(loss_fn(labels, logits))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for _ in range(STEPS):
        step()
    rec.close()


def _candidate(logdir: str, zero_masked: bool) -> tuple[list, np.ndarray]:
    """The port: Embedding(mask_zero=True), MultiHeadAttention masking queries and keys, fit."""
    model = _model(mask_zero=True)
    model.compile(tf.keras.optimizers.SGD(0.1), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    weights = model.get_weights()
    expected = _numpy_attention(model)
    rec = summary_v2.Recorder(logdir)
    summary_v2.instrument(model, rec, layers=["mha"], zero_masked=zero_masked)
    model.fit(IDS, LABELS, batch_size=3, epochs=STEPS, shuffle=False, verbose=0)
    rec.close()
    return weights, expected


def test_a_port_masking_padded_queries_agrees_when_both_record_real_positions_only(tmp_path) -> None:
    weights, expected = _candidate(str(tmp_path / "masked" / "tf2"), zero_masked=True)
    _baseline(str(tmp_path / "masked" / "tf1"), weights, masked=True)
    real = IDS != 0
    got = tensors_by_step(str(tmp_path / "masked" / "tf2"))[0][("activation", "mha")][2].reshape(expected.shape)
    np.testing.assert_allclose(got[real], expected[real], rtol=1e-4, atol=1e-6)
    assert (got[~real] == 0).all()  # padding recorded as 0
    base = tensors_by_step(str(tmp_path / "masked" / "tf1"))[0][("activation", "mha")][2].reshape(expected.shape)
    np.testing.assert_allclose(base[real], expected[real], rtol=1e-4, atol=1e-6)
    assert (base[~real] == 0).all()
    report = compare(str(tmp_path / "masked"), baseline="tf1", candidate="tf2")
    assert report.first_divergence is None, report.first_divergence

    # recorded whole, the port's padded query rows differ (numpy: uniform over every key against the
    # real keys), a divergence whose note says how to compare the real positions alone
    _candidate(str(tmp_path / "whole" / "tf2"), zero_masked=False)
    _baseline(str(tmp_path / "whole" / "tf1"), weights, masked=False)
    model = _model(mask_zero=True)
    model.set_weights(weights)
    x = model.get_layer("embedding").get_weights()[0][IDS]
    uniform = model.get_layer("mha")(tf.constant(x), tf.constant(x), attention_mask=tf.zeros((3, 5, 5), tf.bool))
    assert np.abs(uniform.numpy()[~real] - expected[~real]).max() > 1e-2
    first = compare(str(tmp_path / "whole"), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.tensor) == (0, "mha"), first
    assert "zero_masked=True" in (first.note or "") and "mask=" in (first.note or ""), first.note


def test_real_positions_apart_with_padding_zero_in_both_runs_are_not_called_masking() -> None:
    """A port with LayerNormalization's default epsilon, padding recorded as 0 on both sides: its
    real positions (a run at each sample's start) were told the runs mask padding differently."""
    rng = np.random.default_rng(0)
    real = IDS != 0
    out = rng.standard_normal((3, 5, 4)).astype(np.float32) * real[..., None]
    moved = (out * np.float32(1.01)).astype(np.float32)  # every real element apart, padding 0 in both
    embedded = [real[..., None] * np.ones((3, 5, 4), np.float32)]
    w = [rng.standard_normal((4, 4)).astype(np.float32)]
    common = [series("activation", "embedding", embedded), series("weight", "ln/gamma:0", w, order=1)]
    base = run("tf1", [*common, series("activation", "ln", [out], order=2)])
    cand = run("tf2", [*common, series("activation", "ln", [moved], order=2)])
    first = Comparison(base, cand).report().first_divergence
    assert first is not None and (first.step, first.tensor) == (0, "ln"), first
    assert "mask them differently" not in (first.note or ""), first.note
    assert "its real positions differ" in (first.note or ""), first.note


def _numpy_probabilities(model: tf.keras.Model) -> np.ndarray:
    """The attention probabilities ``[batch, heads, query, key]`` over the real keys, on the model's weights."""
    x = model.get_layer("embedding").get_weights()[0][IDS].astype(np.float64)
    wq, bq, wk, bk = (w.astype(np.float64) for w in model.get_layer("mha").get_weights()[:4])
    q = np.einsum("btd,dhk->bthk", x, wq) + bq
    k = np.einsum("btd,dhk->bthk", x, wk) + bk
    scores = np.einsum("bqhk,bshk->bhqs", q / np.sqrt(3.0), k) + np.where(IDS[:, None, None, :] == 0, -1e9, 0.0)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _fit_recorded(logdir: str, outputs: Any, layers: list) -> tf.keras.Model:
    """One recorded fit step of ``ids -> Embedding(mask_zero=True) -> outputs(x)`` pooled into 3 logits."""
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input((None,), dtype="int32")
    x = tf.keras.layers.Embedding(8, 6, mask_zero=True, name="embedding")(ids)
    pooled = [tf.keras.layers.GlobalAveragePooling1D()(t) for t in outputs(x)]
    joined = pooled[0] if len(pooled) == 1 else tf.keras.layers.Concatenate()(pooled)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(3, name="logits")(joined))
    model.compile(tf.keras.optimizers.SGD(0.1), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    initial = tf.keras.models.clone_model(model)
    initial.set_weights(model.get_weights())
    rec = summary_v2.Recorder(logdir)
    summary_v2.instrument(model, rec, layers=layers, zero_masked=True)
    model.fit(IDS, LABELS, batch_size=3, epochs=1, shuffle=False, verbose=0)
    rec.close()
    return initial


def test_an_output_keras_attaches_no_mask_to_is_recorded_whole(tmp_path) -> None:
    """A Conv1D after ``Embedding(mask_zero=True)``: Keras drops the mask (the conv does not support
    masking), so its output has none and is recorded whole. ``zero_masked=True`` asked the conv's
    ``compute_mask`` for one, which raises for a layer that does not support masking: the user's
    ``fit`` failed with a TypeError. Expected values: numpy's ``same`` convolution of the embedding."""
    model = _fit_recorded(
        str(tmp_path), lambda x: [tf.keras.layers.Conv1D(4, 3, padding="same", name="conv")(x)], ["conv"]
    )
    table = model.get_layer("embedding").get_weights()[0].astype(np.float64)
    kernel, bias = (w.astype(np.float64) for w in model.get_layer("conv").get_weights())
    x = np.pad(table[IDS], ((0, 0), (1, 1), (0, 0)))
    expected = sum(np.einsum("btd,du->btu", x[:, i : i + IDS.shape[1]], kernel[i]) for i in range(3)) + bias
    got = tensors_by_step(str(tmp_path))[0][("activation", "conv")][2].reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    assert np.abs(expected[IDS == 0]).min() > 1e-4  # padded positions recorded too, not as 0


def test_each_output_is_recorded_with_the_mask_keras_attaches_to_it(tmp_path) -> None:
    """``MultiHeadAttention(..., return_attention_scores=True)`` under ``Embedding(mask_zero=True)``:
    Keras attaches the query mask ``[batch, time]`` to the attention output and the attention mask
    ``[batch, 1, query, key]`` (its softmax's) to the scores ``[batch, heads, query, key]``. The query
    mask, given to both, was laid on the scores' ``[batch, heads]``: with 5 heads over 5 positions,
    a short sample's heads 2-4 were recorded as 0 at its real queries, and its padded query rows kept
    in the other heads (with 2 heads, ``fit`` failed on the shapes). Expected: numpy's probabilities
    over the real keys, 0 at padded queries and keys."""
    model = _fit_recorded(
        str(tmp_path),
        lambda x: [tf.keras.layers.MultiHeadAttention(5, 3, name="mha")(x, x, return_attention_scores=True)[0]],
        ["mha"],
    )
    real = IDS != 0
    p = _numpy_probabilities(model) * (real[:, None, :, None] & real[:, None, None, :])
    step = tensors_by_step(str(tmp_path))[0]
    got = step[("activation", "mha/1")][2].reshape(p.shape)
    np.testing.assert_allclose(got, p, rtol=1e-4, atol=1e-6)
    expected = _numpy_attention(model) * real[..., None]
    out = step[("activation", "mha/0")][2].reshape(expected.shape)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-6)


def _pooled_model(mask_zero: bool, vocabulary: int = 8) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(1)
    ids = tf.keras.Input((None,), dtype="int32")
    x = tf.keras.layers.Embedding(vocabulary, 6, mask_zero=mask_zero, name="embedding")(ids)
    pooled = tf.keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return tf.keras.Model(ids, tf.keras.layers.Dense(3, name="logits")(pooled))


@pytest.mark.parametrize("vocabulary", [8, 2000])
def test_a_port_that_reads_its_padding_is_not_told_to_record_the_real_positions_alone(tmp_path, vocabulary) -> None:
    """A port without ``mask_zero=True``, instrumented with ``zero_masked=True`` as the README says,
    against an original that masks: the embedding's padded positions are recorded whole in the port
    (it has no mask to apply) and as 0 in the original, as a faithful port recorded whole is. The note
    said only the real positions need agree and to record those alone, which the user did already,
    while the port's pooling averaged the padding and its loss differed (numpy) at that step. With a
    table of 2000 rows (12000 elements, compared by statistics only, as a helper's 100000-row table
    was) there was no note at all, and the user was sent to record the table with full values: what
    the note says is read off the lookup's own values, which statistics upstream do not change."""
    model = _pooled_model(mask_zero=False, vocabulary=vocabulary)
    model.compile(tf.keras.optimizers.SGD(0.1), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    weights = model.get_weights()
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    summary_v2.instrument(model, rec, layers=["embedding"], zero_masked=True)
    model.fit(IDS, LABELS, batch_size=3, epochs=STEPS, shuffle=False, verbose=0)
    rec.close()

    base = _pooled_model(mask_zero=False, vocabulary=vocabulary)
    base.set_weights(weights)
    opt = tf.keras.optimizers.SGD(0.1)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(str(tmp_path / "tf1"))
    ids, labels = tf.constant(IDS), tf.constant(LABELS)

    @tf.function
    def step() -> None:
        with rec.step(opt.iterations, variables=base):
            rec.lr(opt.learning_rate)
            real = tf.not_equal(ids, 0)
            with tf.GradientTape() as tape:
                x = rec.activation("embedding", base.get_layer("embedding")(ids), mask=real)
                logits = base.get_layer("logits")(base.get_layer("pool")(x, mask=real))
                loss = rec.loss(loss_fn(labels, logits))
            rec.minimize(opt, loss, base.trainable_variables, tape)

    for _ in range(STEPS):
        step()
    rec.close()

    # numpy, on the initial weights: the mean over every position against the real ones moves the loss
    table, kernel, bias = (w.astype(np.float64) for w in weights)
    real = (IDS != 0)[..., None]
    losses = []
    for pooled in (table[IDS].mean(1), (table[IDS] * real).sum(1) / real.sum(1)):
        z = pooled @ kernel + bias
        z -= z.max(1, keepdims=True)
        losses.append(float(-(z[np.arange(3), LABELS] - np.log(np.exp(z).sum(1))).mean()))
    assert abs(losses[0] - losses[1]) > 1e-3, losses
    got = tensors_by_step(str(tmp_path / "tf2"))[0][("loss", "loss")][2]
    np.testing.assert_allclose(float(got), losses[0], rtol=1e-5)

    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert ("weight/embedding/embeddings:0" in report.statistics_only) == (vocabulary == 2000)
    first = report.first_divergence
    assert first is not None and (first.step, first.tensor) == (0, "embedding"), first
    note = first.note or ""
    assert "the loss differs at this step too" in note and "'tf2', which records them nonzero" in note, note
    assert "only the real positions need agree" not in note, note
