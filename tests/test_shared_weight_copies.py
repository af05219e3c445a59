"""Ports that un-share a TF1 weight, their copies started from the TF1 values: a siamese tower
(``variable_scope(reuse=AUTO_REUSE)``) built once per input, and a tied output projection
(``matmul(h, embedding, transpose_b=True)``) ported as a ``Dense`` of its own. Both are structure
divergences; a new user got "ambiguous" for each tower variable and "recorded by the candidate only"
for the projection, with no word of the copies. The structure lines now name them; numpy on the
recorded gradients checks what the notes say: the shared weight's gradient is the sum of its uses',
which each copy takes apart."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from test_shared_layer_outputs import BATCH, INIT, LR, XA, XB, D, E, H, Y, _tf1
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2


def _grad(run_dir: str, name: str) -> np.ndarray:
    """The gradient ``name`` as recorded at step 0, full values."""
    return np.asarray(tensors_by_step(run_dir)[0][("grad", name)][2])


def test_a_tower_built_once_per_input_is_named_as_copies_of_the_shared_one(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    xa, xb = tf.keras.Input((D,)), tf.keras.Input((D,))
    towers = [(tf.keras.layers.Dense(H, activation="relu"), tf.keras.layers.Dense(E)) for _ in range(2)]
    ea, eb = (embed(hidden(x)) for (hidden, embed), x in zip(towers, (xa, xb)))
    logits = tf.keras.layers.Dense(1, name="head")(tf.keras.layers.Lambda(lambda t: tf.abs(t[0] - t[1]))([ea, eb]))
    model = tf.keras.Model([xa, xb], logits)
    for hidden, embed in towers:  # the converter copied the one TF1 tower into both
        hidden.kernel.assign(INIT["hidden"])
        embed.kernel.assign(INIT["embed"])
    model.get_layer("head").kernel.assign(INIT["head"])
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.BinaryCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    summary_v2.instrument(model, rec)
    model.fit([XA, XB], Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()
    # numpy on the recorded step-0 gradients: the shared kernel's is the sum of the two copies'
    copies = [_grad(str(tmp_path / "tf2"), embed.kernel.name) for _, embed in towers]
    np.testing.assert_allclose(_grad(str(tmp_path / "tf1"), "tower/embed/kernel:0"), sum(copies), atol=1e-6)
    assert np.abs(copies[0] - copies[1]).max() > 1e-3  # each copy's own use differs
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*", "activation/*"])
    lines = {(d.kind, d.tensor): d.note for d in report.divergences_at_first_step if d.reason == "structure"}
    for name in ("tower/hidden/kernel:0", "tower/embed/kernel:0"):
        note = lines[("weight", name)]
        assert "2 of them start as this one does" in note and "built once per use" in note, note


V, T, W = 12, 3, 4  # vocabulary, sequence length, width of the tied language model


def test_an_untied_output_projection_is_named_as_the_embedding_transposed(tmp_path) -> None:
    rng = np.random.default_rng(25)
    ids = rng.integers(0, V, (4 * BATCH, T + 1)).astype(np.int32)
    table = (rng.standard_normal((V, W)) * 0.5).astype(np.float32)
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.int32, [None, T])
        y = tf.compat.v1.placeholder(tf.int32, [None, T])
        emb = tf.compat.v1.get_variable("embedding", [V, W], initializer=tf.constant_initializer(table))
        h = tf.reshape(tf.nn.embedding_lookup(emb, x), [-1, W])
        logits = tf.matmul(h, emb, transpose_b=True)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(tf.reshape(y, [-1]), logits))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        train(rec, train_op, [x, y], [ids[:, :-1], ids[:, 1:]], 4, BATCH)

    class Untied(tf.keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.emb = tf.keras.layers.Embedding(V, W)
            self.out = tf.keras.layers.Dense(V, use_bias=False)

        def call(self, tokens: tf.Tensor) -> tf.Tensor:
            return self.out(tf.reshape(self.emb(tokens), [-1, W]))

    model = Untied()
    model(tf.zeros((1, T), tf.int32))
    model.emb.embeddings.assign(table)
    model.out.kernel.assign(table.T)  # the converter's copy of the tied weight
    opt = tf.keras.optimizers.SGD(LR)
    ce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rec2 = summary_v2.Recorder(str(tmp_path / "tf2"))

    @tf.function
    def step(tokens: tf.Tensor, targets: tf.Tensor) -> None:
        with rec2.step(opt.iterations, variables=model):
            with tf.GradientTape() as tape:
                loss = rec2.loss(ce(tf.reshape(targets, [-1]), model(tokens)))
            rec2.minimize(opt, loss, model.trainable_variables, tape)

    for s in range(4):
        rows = slice(s * BATCH, (s + 1) * BATCH)
        step(tf.constant(ids[rows, :-1]), tf.constant(ids[rows, 1:]))
    rec2.close()
    # numpy on the recorded step-0 gradients: the tied table's is the lookup's plus the projection's
    port = [_grad(str(tmp_path / "tf2"), v.name) for v in (model.emb.embeddings, model.out.kernel)]
    np.testing.assert_allclose(_grad(str(tmp_path / "tf1"), "embedding:0"), port[0] + port[1].T, atol=1e-6)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    notes = {(d.kind, d.candidate_tensor): d.note for d in report.divergences_at_first_step if d.reason == "structure"}
    note = notes[("weight", model.out.kernel.name)]
    assert "starts as the transpose of the baseline's weight/embedding:0" in note, note


def test_towers_copied_in_the_original_against_one_shared_tower_are_named_as_twins(tmp_path) -> None:
    """The other direction: the TF1 original builds a tower per input (two variable scopes, both
    initialised from the same values), the port shares one. One copy pairs with the port's tower; the
    other was "recorded by the baseline only" with no word of its twin."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        gs = tf.compat.v1.train.get_or_create_global_step()
        xa = tf.compat.v1.placeholder(tf.float32, [None, D])
        xb = tf.compat.v1.placeholder(tf.float32, [None, D])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        dense, init = tf.compat.v1.layers.dense, tf.constant_initializer

        def tower(x: tf.Tensor, scope: str) -> tf.Tensor:
            with tf.compat.v1.variable_scope(scope):
                h = dense(x, H, tf.nn.relu, kernel_initializer=init(INIT["hidden"]), name="hidden")
                return dense(h, E, kernel_initializer=init(INIT["embed"]), name="embed")

        ea, eb = tower(xa, "tower_a"), tower(xb, "tower_b")
        logits = dense(tf.abs(ea - eb), 1, kernel_initializer=init(INIT["head"]), name="head")
        loss = rec.loss(tf.compat.v1.losses.sigmoid_cross_entropy(y, logits))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        train(rec, train_op, [xa, xb, y], [XA, XB, Y], 4, BATCH)
    xa2, xb2 = tf.keras.Input((D,)), tf.keras.Input((D,))
    hidden = tf.keras.layers.Dense(H, activation="relu", name="hidden")
    embed = tf.keras.layers.Dense(E, name="embed")
    diff = tf.keras.layers.Lambda(lambda t: tf.abs(t[0] - t[1]))([embed(hidden(xa2)), embed(hidden(xb2))])
    model = tf.keras.Model([xa2, xb2], tf.keras.layers.Dense(1, name="head")(diff))
    for name, kernel in INIT.items():
        model.get_layer(name).kernel.assign(kernel)
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.BinaryCrossentropy(from_logits=True))
    rec2 = summary_v2.Recorder(str(tmp_path / "tf2"))
    summary_v2.instrument(model, rec2)
    model.fit([XA, XB], Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec2.close()
    # numpy on the recorded step-0 gradients: the shared kernel's is the sum of the two copies'
    copies = [_grad(str(tmp_path / "tf1"), f"tower_{t}/embed/kernel:0") for t in "ab"]
    np.testing.assert_allclose(_grad(str(tmp_path / "tf2"), embed.kernel.name), sum(copies), atol=1e-6)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*", "activation/*"])
    assert not report.agree
    lines = {(d.kind, d.tensor): d.note for d in report.divergences_at_first_step if d.reason == "structure"}
    for tower, other in (("a", "b"), ("b", "a")):
        for layer in ("hidden", "embed"):
            note = lines[("weight", f"tower_{tower}/{layer}/kernel:0")]
            assert f"it and this run's weight/tower_{other}/{layer}/kernel:0 start alike" in note, note
            assert f"as the candidate's weight/{layer}/kernel:0 does" in note and "a copy per use" in note, note
    ported = {(d.kind, d.candidate_tensor): d.note for d in report.divergences_at_first_step if d.reason == "structure"}
    shared = ported[("weight", "embed/kernel:0")]  # the port's one tower is not said to be a copy
    assert "a copy per use" not in shared, shared
