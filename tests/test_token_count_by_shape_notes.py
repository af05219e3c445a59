"""A token loss divided by every position, or by the batch's sequences, where TF1 divides by the real tokens,
with the padding recorded whole on both sides.

``fit(..., sample_weight=mask)`` has no Keras mask to record by, and a TF1 original recording its lookup with
no ``mask=`` records its padding too: no recorded output holds the real tokens as its nonzero positions. A
trial's Transformer LM ports (TF1's ``softmax_cross_entropy(weights=mask)``) were then told only "by a
constant or a count": the ``fit`` port's loss and gradients 18/28 of TF1's (18 real tokens of 4 x 7
positions), a loop dividing by its 4 sequences 18/4. The factor and the sequence output's shape name both.
Expected values: numpy's cross-entropy on the initial weights.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

V, D = 6, 4
IDS = np.array([[1, 3, 4, 5, 2], [1, 5, 0, 0, 0], [1, 4, 4, 0, 0], [2, 3, 1, 4, 0]], np.int32)  # 14 real of 20
LABELS = np.array([[3, 4, 5, 2, 1], [5, 2, 0, 0, 0], [4, 4, 3, 0, 0], [3, 1, 4, 2, 0]], np.int32)
STEPS, LR = 2, 0.5
_RNG = np.random.default_rng(7)
EMB = (_RNG.standard_normal((V, D)) * 0.5).astype(np.float32)
KERNEL = (_RNG.standard_normal((D, V)) * 0.5).astype(np.float32)


def numpy_token_losses() -> np.ndarray:
    logits = EMB.astype(np.float64)[IDS] @ KERNEL.astype(np.float64)
    top = logits.max(-1)
    lse = np.log(np.exp(logits - top[..., None]).sum(-1)) + top
    return lse - np.take_along_axis(logits, LABELS[..., None], -1)[..., 0]


def train_tf1(run_dir: str) -> None:
    """The original: its lookup recorded whole (no ``mask=``), ``sparse_softmax_cross_entropy(weights=mask)``."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int32, [None, None])
        labels = tf.compat.v1.placeholder(tf.int32, [None, None])
        table = tf.compat.v1.get_variable("embedding", initializer=EMB)
        x = rec.activation("embedding", tf.nn.embedding_lookup(table, ids))
        logits = rec.activation(
            "logits",
            tf.compat.v1.layers.dense(x, V, name="logits", kernel_initializer=tf.constant_initializer(KERNEL)),
        )
        mask = tf.cast(tf.not_equal(labels, 0), tf.float32)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits, weights=mask))
        rec.lr(tf.constant(LR))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        rec.variables()
        train(rec, train_op, [], [], STEPS, 0, fixed={ids: IDS, labels: LABELS})


def _model() -> tf.keras.Model:
    ids = tf.keras.Input((None,), dtype="int32")
    emb = tf.keras.layers.Embedding(V, D, name="embedding")
    out = tf.keras.layers.Dense(V, name="logits")
    model = tf.keras.Model(ids, out(emb(ids)))
    emb.set_weights([EMB])
    out.set_weights([KERNEL, np.zeros(V, np.float32)])
    return model


def train_fit_sample_weight(run_dir: str) -> None:
    model = _model()
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["embedding", "logits"])
    weights = (LABELS != 0).astype(np.float32)
    model.fit(IDS, LABELS, sample_weight=weights, batch_size=4, epochs=STEPS, shuffle=False, verbose=0)
    rec.close()


def train_loop_per_sequence(run_dir: str) -> None:
    """A custom loop summing the masked token losses and dividing by the batch's sequences."""
    model, opt = _model(), tf.keras.optimizers.SGD(LR)
    ce_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    rec = summary_v2.Recorder(run_dir)
    emb, out = model.get_layer("embedding"), model.get_layer("logits")

    @tf.function
    def step(ids: tf.Tensor, labels: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                logits = rec.activation("logits", out(rec.activation("embedding", emb(ids))))
                mask = tf.cast(tf.not_equal(labels, 0), tf.float32)
                total = tf.reduce_sum(ce_fn(labels, logits) * mask)
                loss = rec.loss(total / tf.cast(tf.shape(labels)[0], tf.float32))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for _ in range(STEPS):
        step(tf.constant(IDS), tf.constant(LABELS))
    rec.close()


def test_a_token_loss_divided_otherwise_is_named_from_the_shape_when_padding_is_recorded(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_fit_sample_weight(str(tmp_path / "weighted"))
    train_loop_per_sequence(str(tmp_path / "per_sequence"))
    ce, real = numpy_token_losses(), LABELS != 0
    assert real.sum() == 14 and real.size == 20
    for run, count in (("tf1", 14), ("weighted", 20), ("per_sequence", 4)):
        recorded = float(tensors_by_step(str(tmp_path / run))[0][("loss", "loss")][2])
        np.testing.assert_allclose(recorded, (ce * real).sum() / count, rtol=1e-5)
    # numpy: neither factor is some examples of the 4 over 4 (so no example weights of 0 read the same)
    assert all(abs(s - m / 4) > 1e-3 and abs(s - 4 / m) > 1e-3 for s in (14 / 20, 14 / 4) for m in range(1, 4))

    d = compare(str(tmp_path), baseline="tf1", candidate="weighted").first_divergence
    assert d is not None and (d.step, d.kind) == (0, "loss"), d
    note = d.note or ""
    assert "by 14/20: 'weighted' likely divides the token losses' sum by every (batch, time) position" in note, note
    assert "'tf1' by 14 of them" in note and "(4 x 5 = 20)" in note, note

    d = compare(str(tmp_path), baseline="tf1", candidate="per_sequence").first_divergence
    assert d is not None and (d.step, d.kind) == (0, "loss"), d
    note = d.note or ""
    assert "by 14/4: 'per_sequence' likely divides the token losses' sum by this step's 4 sequences" in note, note
    assert "'tf1' by 14 tokens" in note, note
