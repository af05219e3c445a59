"""A token-level loss over padded sequences divided by every position where TF1 divides by the real tokens.

TF1's ``tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits, weights=mask)`` divides by the
non-zero weights (the real tokens); a port's ``reduce_mean`` over every token, or ``fit``'s
``sample_weight=mask`` with no Keras mask reaching the loss, divides by every position, padding included:
the loss and every gradient are TF1's times real / positions (numpy below). A helper's causal
self-attention ports were told only "the loss is computed differently": the attention's key bias, whose
gradient is 0 in exact arithmetic (softmax is blind to a shift shared by every key), holds rounding noise
in both runs that no factor relates, and kept the "loss scaled as a whole" note away; the count, tokens
and not examples, was named by none. The ``fit`` port, which records its padding whole (it has no Keras
mask to record by), was told it may read its padding. Expected values: numpy's forward pass on the
initial weights.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

V, D, H, K = 6, 4, 2, 2
IDS = np.array([[1, 3, 4, 5, 2], [1, 5, 0, 0, 0], [1, 4, 4, 0, 0]], np.int32)  # 10 real tokens of 15
LABELS = np.array([[3, 4, 5, 2, 1], [5, 2, 0, 0, 0], [4, 4, 3, 0, 0]], np.int32)
STEPS, LR = 2, 0.5
_RNG = np.random.default_rng(4)
W = {
    name: (_RNG.standard_normal(shape) * 0.4).astype(np.float32)
    for name, shape in [
        ("embedding", (V, D)),
        ("query/kernel", (D, H * K)),
        ("query/bias", (H * K,)),
        ("key/kernel", (D, H * K)),
        ("key/bias", (H * K,)),
        ("value/kernel", (D, H * K)),
        ("value/bias", (H * K,)),
        ("attention_output/kernel", (H * K, D)),
        ("attention_output/bias", (D,)),
        ("logits/kernel", (D, V)),
        ("logits/bias", (V,)),
    ]
}
MAP = ["re:^attention/=mha/"]


def numpy_forward(strict: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The attention output and each token's cross-entropy at step 0: causal attention over the real keys
    (``strict``: the earlier keys only), in float64."""
    w = {k: v.astype(np.float64) for k, v in W.items()}
    x = w["embedding"][IDS]
    n, t = IDS.shape

    def heads(name: str) -> np.ndarray:
        return (x @ w[f"{name}/kernel"] + w[f"{name}/bias"]).reshape(n, t, H, K).transpose(0, 2, 1, 3)

    scores = heads("query") @ heads("key").transpose(0, 1, 3, 2) / math.sqrt(K)
    allowed = np.tril(np.ones((t, t)), -1 if strict else 0)[None, None] * (IDS != 0)[:, None, None, :]
    scores = scores + (1 - allowed) * -1e9
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    # a query with no key allowed (the first, under a shifted mask): float32's -1e9 swamps its scores in
    # Keras's masked softmax, which then attends uniformly to every key
    p = np.where(allowed.any(-1, keepdims=True), p, 1.0 / t)
    a = (p @ heads("value")).transpose(0, 2, 1, 3).reshape(n, t, H * K) @ w["attention_output/kernel"]
    a = a + w["attention_output/bias"]
    logits = (x + a) @ w["logits/kernel"] + w["logits/bias"]
    top = logits.max(-1)
    lse = np.log(np.exp(logits - top[..., None]).sum(-1)) + top
    return a, lse - np.take_along_axis(logits, LABELS[..., None], -1)[..., 0]


def train_tf1(run_dir: str, l2: float = 0.0) -> None:
    """The original: dense q/k/v, a causal and key-padding mask, ``sparse_softmax_cross_entropy(weights=mask)``;
    ``l2``: it trains on that loss plus ``l2 * sum(w ** 2)`` of the logits' kernel, recording the loss alone."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int32, [None, None])
        labels = tf.compat.v1.placeholder(tf.int32, [None, None])
        real = tf.not_equal(ids, 0)
        table = tf.compat.v1.get_variable("embedding", initializer=W["embedding"])
        x = rec.activation("embedding", tf.nn.embedding_lookup(table, ids), mask=real)
        n, t = tf.shape(ids)[0], tf.shape(ids)[1]

        def dense(h: tf.Tensor, name: str, units: int) -> tf.Tensor:
            init = tf.constant_initializer
            return tf.compat.v1.layers.dense(
                h,
                units,
                name=name,
                kernel_initializer=init(W[f"{name}/kernel"]),
                bias_initializer=init(W[f"{name}/bias"]),
            )

        with tf.compat.v1.variable_scope("attention"):
            q, k, v = (
                tf.transpose(tf.reshape(dense(x, s, H * K), [n, t, H, K]), [0, 2, 1, 3])
                for s in ("query", "key", "value")
            )
            allowed = (
                tf.linalg.band_part(tf.ones([t, t]), -1, 0)[None, None] * tf.cast(real, tf.float32)[:, None, None, :]
            )
            p = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / math.sqrt(K) + (1.0 - allowed) * -1e9)
            ctx = tf.reshape(tf.transpose(tf.matmul(p, v), [0, 2, 1, 3]), [n, t, H * K])
            a = rec.activation("mha", dense(ctx, "attention_output", D), mask=real)
        logits = rec.activation("logits", dense(x + a, "logits", V), mask=real)
        mask = tf.cast(tf.not_equal(labels, 0), tf.float32)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits, weights=mask))
        rec.lr(tf.constant(LR))
        if l2:
            kernel = tf.compat.v1.trainable_variables("logits/kernel")[0]
            loss = loss + l2 * tf.reduce_sum(tf.square(kernel))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        rec.variables()
        train(rec, train_op, [], [], STEPS, 0, fixed={ids: IDS, labels: LABELS})


def _model(strict: bool = False) -> tf.keras.Model:
    """The port: Embedding (no mask), MultiHeadAttention given the causal and key mask, Dense logits;
    ``strict``: the causal mask shifted by one (each token attends to the earlier ones only, not itself)."""
    ids = tf.keras.Input((None,), dtype="int32")
    x = tf.keras.layers.Embedding(V, D, name="embedding")(ids)

    def attention_mask(i: tf.Tensor) -> tf.Tensor:
        t = tf.shape(i)[1]
        earlier = (
            tf.range(t)[:, None] > tf.range(t)[None, :] if strict else tf.range(t)[:, None] >= tf.range(t)[None, :]
        )
        return earlier[None] & tf.not_equal(i, 0)[:, None, :]

    mha = tf.keras.layers.MultiHeadAttention(H, K, name="mha")
    a = mha(x, x, attention_mask=tf.keras.layers.Lambda(attention_mask, name="attention_mask")(ids))
    model = tf.keras.Model(ids, tf.keras.layers.Dense(V, name="logits")(tf.keras.layers.Add()([x, a])))
    mha.set_weights(
        [
            W[f"{name}/{part}"].reshape((D, H, K) if part == "kernel" else (H, K))
            for name in ("query", "key", "value")
            for part in ("kernel", "bias")
        ]
        + [W["attention_output/kernel"].reshape(H, K, D), W["attention_output/bias"]]
    )
    model.get_layer("embedding").set_weights([W["embedding"]])
    model.get_layer("logits").set_weights([W["logits/kernel"], W["logits/bias"]])
    return model


def train_loop(run_dir: str, mean: bool, strict: bool = False, l2: float = 0.0) -> None:
    """A custom loop whose loss is ``reduce_mean(ce * mask)`` (``mean``: every position, padding included)
    or ``reduce_sum(ce * mask) / reduce_sum(mask)`` (the real tokens, TF1's); ``l2``: plus ``l2 * sum(w ** 2)``
    of the logits' kernel, recorded with it."""
    model, opt = _model(strict), tf.keras.optimizers.SGD(LR)
    ce_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    rec = summary_v2.Recorder(run_dir)
    emb, mha, out, masks = (model.get_layer(n) for n in ("embedding", "mha", "logits", "attention_mask"))

    @tf.function
    def step(ids: tf.Tensor, labels: tf.Tensor) -> None:
        real = tf.not_equal(ids, 0)
        with rec.step(opt.iterations, variables=model):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                x = rec.activation("embedding", emb(ids), mask=real)
                a = rec.activation("mha", mha(x, x, attention_mask=masks(ids)), mask=real)
                logits = rec.activation("logits", out(x + a), mask=real)
                mask = tf.cast(tf.not_equal(labels, 0), tf.float32)
                masked = ce_fn(labels, logits) * mask
                loss = tf.reduce_mean(masked) if mean else tf.reduce_sum(masked) / tf.reduce_sum(mask)
                loss = rec.loss(loss + l2 * tf.reduce_sum(tf.square(out.kernel)) if l2 else loss)
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for _ in range(STEPS):
        step(tf.constant(IDS), tf.constant(LABELS))
    rec.close()


def train_fit_sample_weight(run_dir: str) -> None:
    """``fit(..., sample_weight=mask)``: no Keras mask reaches the loss, so it divides by every position."""
    model = _model()
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["embedding", "mha", "logits"], zero_masked=True)
    weights = (LABELS != 0).astype(np.float32)
    model.fit(IDS, LABELS, sample_weight=weights, batch_size=3, epochs=STEPS, shuffle=False, verbose=0)
    rec.close()


def test_a_token_loss_divided_by_every_position_is_named_with_its_real_tokens(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_loop(str(tmp_path / "mean"), mean=True)
    train_fit_sample_weight(str(tmp_path / "weighted"))
    ce, real = numpy_forward()[1], LABELS != 0
    assert real.sum() == 10 and real.size == 15
    recorded = {
        run: float(tensors_by_step(str(tmp_path / run))[0][("loss", "loss")][2]) for run in ("tf1", "mean", "weighted")
    }
    np.testing.assert_allclose(recorded["tf1"], (ce * real).sum() / 10, rtol=1e-5)
    for run in ("mean", "weighted"):
        np.testing.assert_allclose(recorded[run], (ce * real).sum() / 15, rtol=1e-5)

    report = compare(str(tmp_path), baseline="tf1", candidate="mean", mapping=MAP)
    d = report.first_divergence
    assert d is not None and (d.step, d.kind) == (0, "loss"), d
    note = d.note or ""
    assert "every gradient both runs recorded" in note and "by 10/15" in note, note
    assert "'tf1' divides the token losses' weighted sum by its real tokens (10)" in note, note

    # the fit port records its padding whole, TF1 as 0: the embedding's padded positions come first, and
    # the loss and every gradient scaled by one factor say nothing reads that padding
    d = compare(str(tmp_path), baseline="tf1", candidate="weighted", mapping=MAP).first_divergence
    assert d is not None and (d.step, d.tensor) == (0, "embedding"), d
    note = d.note or ""
    assert "by 10/15" in note and "likely reads its padding nowhere that trains" in note, note
    assert "may read its padding" not in note, note


def test_an_attention_apart_at_its_real_positions_is_not_told_masking_cannot_explain_it(tmp_path) -> None:
    """A causal mask shifted by one (``q > k``: a token attends to the earlier ones, not to itself) moves
    the attention output at real positions only, padding recorded as 0 on both sides: the note said
    "masking does not explain it", and sent its user away from the attention mask. The faithful loop
    agrees. Expected: numpy's attention under each mask at step 0."""
    train_tf1(str(tmp_path / "tf1"))
    train_loop(str(tmp_path / "faithful"), mean=False)
    train_loop(str(tmp_path / "shifted"), mean=False, strict=True)
    assert compare(str(tmp_path), baseline="tf1", candidate="faithful", mapping=MAP).agree
    real = IDS != 0
    got, base = (
        tensors_by_step(str(tmp_path / run))[0][("activation", "mha")][2].reshape(3, 5, D) for run in ("shifted", "tf1")
    )
    np.testing.assert_allclose(got[real], numpy_forward(strict=True)[0][real], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(base[real], numpy_forward()[0][real], rtol=1e-4, atol=1e-5)
    assert np.abs(base[real] - got[real]).max() > 1e-2 and (base[~real] == 0).all() and (got[~real] == 0).all()
    d = compare(str(tmp_path), baseline="tf1", candidate="shifted", mapping=MAP).first_divergence
    assert d is not None and (d.step, d.tensor) == (0, "mha"), d
    note = d.note or ""
    assert "its real positions differ" in note and "masking does not explain it" not in note, note
    assert "causal mask shifted by one" in note, note


def test_a_loss_recorded_without_its_l2_term_is_told_so_beside_a_rounding_noise_gradient(tmp_path) -> None:
    """TF1 trains on its token loss plus an L2 term of the logits' kernel but records the loss alone; the port
    records the total it trains on. Both train on one objective (every gradient agrees, numpy: the same
    function), and only the recorded loss differs, by the L2 term. The attention's key bias, whose gradient is
    0 in exact arithmetic, holds rounding noise in both runs, which no two runs share: it kept every gradient
    from "agreeing to float32 rounding", and the note said "the loss is computed differently" (the README's
    case of a TF1 loss recorded without get_regularization_loss()), where the key bias says nothing."""
    l2 = 0.01
    train_tf1(str(tmp_path / "tf1"), l2=l2)
    train_loop(str(tmp_path / "total"), mean=False, l2=l2)
    ce, real = numpy_forward()[1], LABELS != 0
    term = l2 * float((W["logits/kernel"].astype(np.float64) ** 2).sum())
    tf1, total = (tensors_by_step(str(tmp_path / run))[0] for run in ("tf1", "total"))
    np.testing.assert_allclose(float(tf1[("loss", "loss")][2]), (ce * real).sum() / 10, rtol=1e-5)
    np.testing.assert_allclose(float(total[("loss", "loss")][2]), (ce * real).sum() / 10 + term, rtol=1e-5)
    # the key bias's gradient is rounding noise in both runs (0 in exact arithmetic), others are of order 0.1
    key_bias = [v[2] for (kind, name), v in {**tf1, **total}.items() if kind == "grad" and "key/bias" in name]
    assert len(key_bias) == 2 and all(np.abs(g).max() < 1e-6 for g in key_bias), key_bias
    d = compare(str(tmp_path), baseline="tf1", candidate="total", mapping=MAP).first_divergence
    assert d is not None and (d.step, d.kind) == (0, "loss"), d
    note = d.note or ""
    assert "runs likely record different losses" in note, note
