"""A triplet port whose hinge is written ``max(0, d_ap - d_an - m)`` for TF1's ``max(0, d_ap - d_an + m)``:
no triplet passes the port's hinge at step 0, so its loss is exactly 0 there while TF1's is not (numpy),
every weight and embedding agreeing. The note said "units a ReLU switched off in one run ... or padding one
run masks", of a scalar loss; it now names a hinge or margin of another sign or size."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from test_shared_use_gradient_notes import BATCH, LR, MARGIN, NAMES, STEPS, W1, W2, XA, XN, XP, D, E, H, _tf1

from tb_parity_plugin import compare, summary_v2


def _numpy_hinges() -> tuple[float, float]:
    """float64, step 0: the mean of TF1's hinge and of the port's."""
    a, p, n = (np.maximum(x[:BATCH].astype(np.float64) @ W1, 0) @ W2 for x in (XA, XP, XN))
    gap = np.sum((a - p) ** 2, 1) - np.sum((a - n) ** 2, 1)
    return float(np.maximum(gap + MARGIN, 0).mean()), float(np.maximum(gap - MARGIN, 0).mean())


def _port_with_the_margin_subtracted(run_dir: str) -> None:
    tower = tf.keras.Sequential(
        [
            tf.keras.Input((D,)),
            tf.keras.layers.Dense(H, activation="relu", name="hidden"),
            tf.keras.layers.Dense(E, name="embed"),
        ]
    )
    tower.get_layer("hidden").kernel.assign(W1)
    tower.get_layer("embed").kernel.assign(W2)
    opt = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(xa: tf.Tensor, xp: tf.Tensor, xn: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=tower):
            with tf.GradientTape() as tape:
                a, p, n = (rec.activation(name, tower(x)) for name, x in zip(NAMES, (xa, xp, xn)))
                gap = tf.reduce_sum(tf.square(a - p), 1) - tf.reduce_sum(tf.square(a - n), 1)
                loss = rec.loss(tf.reduce_mean(tf.maximum(gap - MARGIN, 0.0)))
            rec.minimize(opt, loss, tower.trainable_variables, tape)

    for s in range(STEPS):
        rows = slice(s * BATCH, (s + 1) * BATCH)
        step(tf.constant(XA[rows]), tf.constant(XP[rows]), tf.constant(XN[rows]))
    rec.close()


def test_a_hinge_with_its_margin_flipped_is_named_as_such(tmp_path) -> None:
    tf1_loss, port_loss = _numpy_hinges()
    assert port_loss == 0.0 and tf1_loss > 0.01
    _tf1(str(tmp_path / "tf1"))
    _port_with_the_margin_subtracted(str(tmp_path / "tf2"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (0, "loss"), first
    assert abs(first.max_abs_diff - tf1_loss) < 1e-5, (first.max_abs_diff, tf1_loss)
    note = first.note or ""
    assert "exactly 0 in one run only: a hinge or margin loss" in note and "ReLU" not in note, note


V, T = 7, 5
TOKENS = np.random.default_rng(41).integers(1, V, (STEPS * BATCH, T)).astype(np.int32)  # no padding (id 0)
EMB = (np.random.default_rng(42).standard_normal((V, E)) * 0.5).astype(np.float32)
OUT = (np.random.default_rng(43).standard_normal((E, V)) * 0.5).astype(np.float32)


def _masked_tf1(run_dir: str) -> None:
    """A next-token model whose per-token loss is weighted by the padding mask (tokens != 0)."""
    from tf1_session import train

    from tb_parity_plugin import summary_v1

    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        tokens = tf.compat.v1.placeholder(tf.int32, [None, T])
        table = tf.compat.v1.get_variable("embedding", initializer=EMB)
        h = tf.nn.embedding_lookup(table, tokens[:, :-1])
        logits = tf.compat.v1.layers.dense(h, V, use_bias=False, kernel_initializer=tf.constant_initializer(OUT))
        mask = tf.cast(tf.not_equal(tokens[:, 1:], 0), tf.float32)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(tokens[:, 1:], logits, weights=mask))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        rec.variables()
        train(rec, train_op, [tokens], [TOKENS], STEPS, BATCH)


def _port_with_the_mask_inverted(run_dir: str) -> None:
    """The port weights each token by ``tokens == 0``: every weight 0 in batches without padding."""
    emb = tf.keras.layers.Embedding(V, E, name="embedding")
    head = tf.keras.layers.Dense(V, use_bias=False, name="dense")
    model = tf.keras.Sequential([tf.keras.Input((T - 1,), dtype="int32"), emb, head])
    emb.embeddings.assign(EMB)
    head.kernel.assign(OUT)
    opt, loss_fn = tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)
    for s in range(STEPS):
        tokens = tf.constant(TOKENS[s * BATCH : (s + 1) * BATCH])
        with rec.step(s, variables=model):
            with tf.GradientTape() as tape:
                weights = tf.cast(tf.equal(tokens[:, 1:], 0), tf.float32)
                loss = rec.loss(loss_fn(tokens[:, 1:], model(tokens[:, :-1]), sample_weight=weights))
            rec.minimize(opt, loss, model.trainable_variables, tape)
    rec.close()


def test_a_loss_weighted_by_0_everywhere_is_not_told_only_of_a_hinge(tmp_path) -> None:
    """The port's padding mask inverted (tokens == 0 for TF1's != 0), on batches without padding: every token
    weighted by 0, its loss exactly 0 at step 0 where TF1's is not (numpy). The note named a hinge or margin
    of another sign and a loss clamped otherwise, where the model has none; it now names the weights too."""
    logits = EMB[TOKENS[:BATCH, :-1]].astype(np.float64) @ OUT
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    tf1_loss = -np.take_along_axis(log_p, TOKENS[:BATCH, 1:, None], -1).mean()
    assert not np.any(TOKENS == 0) and tf1_loss > 0.1  # the port's weights, tokens == 0, are all 0: its loss 0
    _masked_tf1(str(tmp_path / "tf1"))
    _port_with_the_mask_inverted(str(tmp_path / "tf2"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (0, "loss"), first
    assert abs(first.max_abs_diff - tf1_loss) < 1e-5, (first.max_abs_diff, tf1_loss)
    note = first.note or ""
    assert "exactly 0 in one run only" in note and "weighted by 0" in note, note
