"""Notes on a momentum port's weight that diverges after its gradients agreed, on ports written the
way users write them (TF1 ``MomentumOptimizer`` in a Session against Keras ``SGD`` under ``fit``).

* ``nesterov=True`` on the port: the first update is ``1 + momentum`` times TF1's; the note named
  "the learning rate as applied, or Adam's bias correction" (no Adam in sight).
* ``clipnorm`` where TF1 clipped by the global norm: each variable's update is its own factor of
  TF1's and its momentum slot differs at once; the note named the learning rate and Adam too.

Each expectation is checked on the frameworks' own weights (numpy), not on the tool.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf
from tf1_recipes import dense_regression

from tb_parity_plugin import compare, summary_v2

RNG = np.random.default_rng(7)
STEPS, LR, MOMENTUM, CLIP = 3, 0.05, 0.9, 0.1
X = RNG.normal(size=(STEPS, 8, 4)).astype(np.float32)
Y = RNG.normal(size=(STEPS, 8, 1)).astype(np.float32) * 3.0
K = RNG.normal(size=(4, 1)).astype(np.float32) * 0.5


def _tf1(run_dir: str, clip: Optional[float] = None) -> list[list[np.ndarray]]:
    """TF1 dense regression, MomentumOptimizer, gradients recorded before an optional
    ``clip_by_global_norm`` (README); returns [kernel, bias] read before each step."""

    def momentum(gs: Any, rec: Any) -> Any:
        return tf.compat.v1.train.MomentumOptimizer(rec.lr(tf.constant(LR)), MOMENTUM)

    return dense_regression(run_dir, K, X, Y, momentum, lambda opt, variables: variables, clip)


def _port(run_dir: str, momentum: float = MOMENTUM, **sgd: object) -> list[list[np.ndarray]]:
    """The Keras port: SGD with momentum under fit, instrumented (README)."""
    model = tf.keras.Sequential(
        [tf.keras.Input((4,)), tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(K), name="dense")]
    )
    model.compile(tf.keras.optimizers.SGD(LR, momentum=momentum, **sgd), "mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    seen = []
    for s in range(STEPS):
        seen.append([v.numpy() for v in model.get_layer("dense").weights])
        model.fit(X[s], Y[s], batch_size=8, epochs=1, shuffle=False, verbose=0)
    rec.close()
    return seen


def test_nesterov_on_the_port_is_named_by_its_factor_of_one_plus_momentum(tmp_path) -> None:
    tf1 = _tf1(str(tmp_path / "tf1"))
    port = _port(str(tmp_path / "tf2"), nesterov=True)
    # numpy on the frameworks' weights: the same start, then every element's first update 1.9x TF1's
    for a, b in zip(port[0], tf1[0]):
        np.testing.assert_array_equal(a, b)
    ratio = (port[1][0] - port[0][0]) / (tf1[1][0] - tf1[0][0])
    np.testing.assert_allclose(ratio, 1 + MOMENTUM, rtol=1e-4)
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (found.step, found.kind) == (1, "weight"), found
    assert "the update is the baseline's times 1.9 at every element" in found.note, found.note
    assert "Nesterov momentum 0.9 on the candidate only" in found.note, found.note
    assert "bias correction" not in found.note, found.note  # momentum's slots only: no Adam in sight


def test_clipnorm_against_global_clipping_is_told_by_the_momentum_slot_not_the_learning_rate(tmp_path) -> None:
    tf1 = _tf1(str(tmp_path / "tf1"), clip=CLIP)
    port = _port(str(tmp_path / "tf2"), clipnorm=CLIP)
    # numpy: each variable's first update is its own factor of TF1's (global norm over its own norm,
    # both clipped to CLIP), so no one learning rate can explain it
    factors = [float(np.median((p - p0) / (t - t0))) for p, p0, t, t0 in zip(port[1], port[0], tf1[1], tf1[0])]
    assert all(f > 1.05 for f in factors) and abs(factors[0] - factors[1]) > 0.05, factors
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (found.step, found.kind) == (1, "weight"), found
    assert "yet its optimizer slot" in found.note and "clipnorm clips each variable by its own norm" in found.note, (
        found.note
    )
    assert "bias correction" not in found.note and "Nesterov" not in found.note, found.note


def test_another_momentum_is_told_by_the_slots_rule_first(tmp_path) -> None:
    """A review: TF1 momentum 0.9 against Keras 0.5 was told clipnorm first, once the slot check
    came before the settings."""
    tf1 = _tf1(str(tmp_path / "tf1"))
    port = _port(str(tmp_path / "tf2"), momentum=0.5)
    # numpy: the first update agrees (the accumulator is that step's gradient), the second does not
    np.testing.assert_allclose(port[1][0], tf1[1][0], rtol=1e-6)
    assert np.abs(port[2][0] - tf1[2][0]).max() > 1e-4
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.first_divergence.step == 2, report.first_divergence
    (weight,) = [d for d in report.divergences_at_first_step if d.kind == "weight" and "kernel" in d.tensor]
    assert "yet its optimizer slot" in weight.note, weight.note
    assert "the slot's own rule (momentum), clipping" in weight.note and "Nesterov" not in weight.note, weight.note


# -- an embedding under momentum: TF1 updates the looked-up rows only --------------------------
# TF1's MomentumOptimizer applies an embedding lookup's IndexedSlices gradient with
# SparseApplyMomentum: a row the batch does not look up keeps its accumulator and its value. Keras's
# SGD(momentum=...) decays every row's velocity and applies it. A helper's bi-GRU port, faithful in
# float64 but for this, diverged at step 2 on the embedding and was told the slot's rule, clipping
# or a weight decay.

VOCAB, WIDTH = 6, 2
IDS = np.array(
    [
        [[1, 2, 5], [3, 4, 5], [1, 1, 2], [4, 3, 2]],  # step 0 looks up rows 1-5
        [[1, 2, 3], [3, 2, 1], [2, 2, 1], [1, 3, 3]],  # step 1 leaves rows 4 and 5 out
        [[4, 5, 1], [2, 3, 4], [5, 5, 2], [1, 4, 3]],
    ],
    np.int32,
)
TABLE = RNG.normal(size=(VOCAB, WIDTH)).astype(np.float32)
K2 = RNG.normal(size=(WIDTH, 1)).astype(np.float32)
YE = RNG.normal(size=(STEPS, 4, 1)).astype(np.float32)


def _embedding_tf1(run_dir: str, one_hot: bool = False) -> list[np.ndarray]:
    """TF1: ``get_variable`` table, ``embedding_lookup``, mean over the ids, ``dense``, MSE,
    MomentumOptimizer; returns the table read before each step. ``one_hot``: BERT's
    ``use_one_hot_embeddings=True``, ``matmul(one_hot(ids), table)``, a dense gradient, so
    MomentumOptimizer decays and applies every row's accumulator."""
    from tb_parity_plugin import summary_v1

    seen = []
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int32, [None, None])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        table = tf.compat.v1.get_variable("embedding", initializer=TABLE)
        if one_hot:
            looked = tf.matmul(tf.one_hot(tf.reshape(ids, [-1]), VOCAB), table)
            h = tf.reduce_mean(tf.reshape(looked, [tf.shape(ids)[0], tf.shape(ids)[1], WIDTH]), 1)
        else:
            h = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), 1)
        p = tf.compat.v1.layers.dense(h, 1, kernel_initializer=tf.constant_initializer(K2), name="dense")
        loss = rec.loss(tf.reduce_mean(tf.square(p - y)))
        opt = tf.compat.v1.train.MomentumOptimizer(rec.lr(tf.constant(LR)), MOMENTUM)
        train = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                seen.append(sess.run(table))
                _, parity = sess.run([train, fetches], {ids: IDS[s], y: YE[s]})
                rec.write(parity)
        rec.close()
    return seen


def _embedding_port(run_dir: str, optimizer: Any = None) -> list[np.ndarray]:
    """Keras: Embedding, GlobalAveragePooling1D, Dense under fit with SGD(momentum=...) (or
    ``optimizer``), instrumented; returns the table before each step."""
    model = tf.keras.Sequential(
        [
            tf.keras.Input((None,), dtype="int32"),
            tf.keras.layers.Embedding(VOCAB, WIDTH, embeddings_initializer=tf.constant_initializer(TABLE)),
            tf.keras.layers.GlobalAveragePooling1D(),
            tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(K2), name="dense"),
        ]
    )
    model.compile(optimizer or tf.keras.optimizers.SGD(LR, momentum=MOMENTUM), "mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    seen = []
    for s in range(STEPS):
        seen.append(model.layers[0].embeddings.numpy())
        model.fit(IDS[s], YE[s], batch_size=4, epochs=1, shuffle=False, verbose=0)
    rec.close()
    return seen


def test_rows_tf1_momentum_leaves_alone_are_told_as_a_sparse_update(tmp_path) -> None:
    tf1 = _embedding_tf1(str(tmp_path / "tf1"))
    port = _embedding_port(str(tmp_path / "tf2"))
    # numpy on the frameworks' tables: the first update agrees; at step 1 rows 4 and 5 are not looked
    # up: TF1 leaves them, Keras moves them by momentum times their first step; the other rows agree
    np.testing.assert_allclose(port[1], tf1[1], atol=1e-6)
    np.testing.assert_array_equal(tf1[2][4:], tf1[1][4:])
    np.testing.assert_allclose(port[2][4:] - port[1][4:], MOMENTUM * (port[1][4:] - port[0][4:]), rtol=1e-3, atol=1e-7)
    assert np.abs(port[2][4:] - tf1[2][4:]).min() > 1e-4
    np.testing.assert_allclose(port[2][:4], tf1[2][:4], atol=1e-6)
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (found.step, found.kind, found.tensor) == (2, "weight", "embedding:0"), found
    assert "exactly 0 in both runs at step 1" in found.note, found.note
    assert "'tf1' left every one where it was while 'tf2' moved each" in found.note, found.note
    assert "MomentumOptimizer" in found.note and "weight decay" not in found.note, found.note


def test_rows_a_port_leaves_alone_under_a_dense_tf1_gradient_are_told_the_port_updates_them_alone(tmp_path) -> None:
    """The other direction: TF1's one-hot embedding moves every row under momentum, and the port's
    Keras Embedding under ``tf.keras.optimizers.legacy.SGD(momentum=...)`` applies the lookup's
    ``IndexedSlices`` to its rows alone. The note named the port's run as the one that kept the rows,
    then told it to match TF1 by updating the looked-up rows alone, which it already did."""
    tf1 = _embedding_tf1(str(tmp_path / "tf1"), one_hot=True)
    port = _embedding_port(str(tmp_path / "tf2"), tf.keras.optimizers.legacy.SGD(LR, momentum=MOMENTUM))
    # numpy on the frameworks' tables: equal until step 1; at step 2 TF1 moved rows 4 and 5 (not looked
    # up at step 1) by momentum times their first step, the port kept them; the other rows agree
    np.testing.assert_allclose(port[1], tf1[1], atol=1e-6)
    np.testing.assert_array_equal(port[2][4:], port[1][4:])
    np.testing.assert_allclose(tf1[2][4:] - tf1[1][4:], MOMENTUM * (tf1[1][4:] - tf1[0][4:]), rtol=1e-3, atol=1e-7)
    assert np.abs(port[2][4:] - tf1[2][4:]).min() > 1e-4
    np.testing.assert_allclose(port[2][:4], tf1[2][:4], atol=1e-6)
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (found.step, found.kind, found.tensor) == (2, "weight", "embedding:0"), found
    assert "'tf2' left every one where it was while 'tf1' moved each" in found.note, found.note
    assert "'tf2' updates a sparse gradient's looked-up rows only, 'tf1' every row" in found.note, found.note
    assert "a port matches TF1 only with an update of the looked-up rows alone" not in found.note, found.note
