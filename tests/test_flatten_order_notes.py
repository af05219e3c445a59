"""A TF1 CNN written for channels-first checkpoints transposes its maps to NCHW before
``tf.reshape(x, [-1, n])``; a Keras port that flattens its channels-last maps with ``Flatten``
holds the same features in another order, and the dense kernel copied from TF1 meets each at
another row. A new user's port diverged at step 0 on the flattened features and was told the layer
"computes another function of its input (activation, padding, epsilon, a training flag)". Each
expectation is checked against the tensors the frameworks computed, with numpy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, BATCH, FILTERS, CLASSES, SIDE = 2, 4, 3, 2, 4
RNG = np.random.default_rng(45)
X = RNG.standard_normal((STEPS, BATCH, SIDE, SIDE, 1)).astype(np.float32)
Y = RNG.integers(0, CLASSES, (STEPS, BATCH))
CONV = (RNG.standard_normal((3, 3, 1, FILTERS)) * 0.5).astype(np.float32)
HEAD = (RNG.standard_normal((SIDE * SIDE * FILTERS, CLASSES)) * 0.2).astype(np.float32)
LR = 0.1


def _tf1(run_dir: str) -> np.ndarray:
    """The original, flattening channels-first; returns its step-0 features."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, SIDE, SIDE, 1])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        maps = tf.compat.v1.layers.conv2d(
            x, FILTERS, 3, padding="same", activation=tf.nn.relu, kernel_initializer=tf.constant_initializer(CONV)
        )
        flat = tf.reshape(tf.transpose(maps, [0, 3, 1, 2]), [-1, SIDE * SIDE * FILTERS])
        features = rec.activation("features", flat)
        logits = tf.compat.v1.layers.dense(features, CLASSES, kernel_initializer=tf.constant_initializer(HEAD))
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        train = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            seen = sess.run(features, {x: X[0]})
            for s in range(STEPS):
                rec.write(sess.run([train, fetches], {x: X[s], y: Y[s]})[1])
        rec.close()
    return seen


def _keras(run_dir: str, permute: bool, record_before_permute: bool = False) -> np.ndarray:
    """The port: ``permute`` puts ``Permute((3, 1, 2))`` before ``Flatten`` (TF1's order);
    ``record_before_permute`` records the features flattened channels-last while training on the
    permuted ones. Returns the step-0 features it recorded."""
    conv = tf.keras.layers.Conv2D(FILTERS, 3, padding="same", activation="relu")
    head = tf.keras.layers.Dense(CLASSES)
    head(tf.zeros((1, SIDE * SIDE * FILTERS)))
    conv(tf.zeros((1, SIDE, SIDE, 1)))
    conv.kernel.assign(CONV)
    head.kernel.assign(HEAD)
    variables = [conv.kernel, conv.bias, head.kernel, head.bias]
    opt = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    flatten = tf.keras.layers.Flatten()

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with rec.step(opt.iterations):
            with tf.GradientTape() as tape:
                maps = conv(x)
                flat = flatten(tf.keras.layers.Permute((3, 1, 2))(maps) if permute else maps)
                recorded = rec.activation("features", flatten(maps) if record_before_permute else flat)
                loss = rec.loss(loss_fn(y, head(flat)))
            rec.minimize(opt, loss, variables, tape)
        return recorded

    seen = [step(tf.constant(X[s]), tf.constant(Y[s])).numpy() for s in range(STEPS)]
    rec.close()
    return seen[0]


def test_a_channels_last_flatten_of_a_channels_first_original_is_named_at_step_0(tmp_path) -> None:
    tf1, port = _tf1(str(tmp_path / "tf1")), _keras(str(tmp_path / "tf2"), permute=False)
    # numpy: the same values, each row of TF1's read as [channels, positions] and transposed
    assert np.abs(port - tf1).max() > 0.1
    cols = SIDE * SIDE
    np.testing.assert_allclose(tf1.reshape(BATCH, FILTERS, cols).transpose(0, 2, 1).reshape(BATCH, -1), port, atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor, first.reason) == (0, "activation", "features", "value"), first
    assert "same 48 values as the same row of 'tf1' in another order" in first.note, first.note
    assert f"read as [{FILTERS}, {cols}] and transposed to [{cols}, {FILTERS}]" in first.note, first.note
    assert "Permute((3, 1, 2))" in first.note and "another function of its input" not in first.note, first.note


def test_features_recorded_in_another_layout_alone_are_said_to_train_the_same(tmp_path) -> None:
    """The port flattens as TF1 does but records its features before the permute: the loss and
    every gradient agree, and the note says only the recorded layout differs."""
    tf1, port = _tf1(str(tmp_path / "tf1")), _keras(str(tmp_path / "tf2"), permute=True, record_before_permute=True)
    assert np.abs(port - tf1).max() > 0.1 and np.allclose(np.sort(port, axis=1), np.sort(tf1, axis=1), atol=1e-6)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.tensor) == (0, "features"), first
    assert "the step trains the same" in first.note, first.note
    others = [d.tensor for d in report.divergences_at_first_step if d.tensor != "features"]
    assert others == [], others  # numpy's verdict too: only the recorded layout differs


VOCAB, DIM, SEQ = 10, 3, 5
EMB = RNG.standard_normal((VOCAB, DIM)).astype(np.float32)
SEQ_HEAD = (RNG.standard_normal((SEQ * DIM, 1)) * 0.3).astype(np.float32)
TOKENS = [[list(RNG.integers(1, VOCAB, n)) for n in (2, 3, 4, 5)] for _ in range(STEPS)]
TARGETS = RNG.standard_normal((STEPS, 4, 1)).astype(np.float32)


def _padded(seqs: list, where: str) -> np.ndarray:
    out = np.zeros((len(seqs), SEQ), np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s if where == "post" else 0
        if where == "pre":
            out[i, SEQ - len(s) :] = s
    return out


def _tf1_embedded(run_dir: str) -> np.ndarray:
    """A TF1 sequence regression fed its tokens padded at the end; returns its step-0 embeddings."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.int64, [None, SEQ])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        with tf.compat.v1.variable_scope("embedding"):
            table = tf.compat.v1.get_variable("embeddings", initializer=EMB)
        embedded = rec.activation("embedded", tf.nn.embedding_lookup(table, x))
        flat = tf.reshape(embedded, [-1, SEQ * DIM])
        p = tf.compat.v1.layers.dense(flat, 1, kernel_initializer=tf.constant_initializer(SEQ_HEAD), name="dense")
        loss = rec.loss(tf.reduce_mean(tf.square(p - y)))
        train = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            seen = sess.run(embedded, {x: _padded(TOKENS[0], "post")})
            for s in range(STEPS):
                rec.write(sess.run([train, fetches], {x: _padded(TOKENS[s], "post"), y: TARGETS[s]})[1])
        rec.close()
    return seen


def _keras_embedded(run_dir: str) -> np.ndarray:
    """The port, fed pad_sequences' default padding="pre"; returns its step-0 embeddings."""
    emb = tf.keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=tf.constant_initializer(EMB))
    head = tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(SEQ_HEAD))
    model = tf.keras.Sequential([tf.keras.Input((SEQ,)), emb, tf.keras.layers.Flatten(), head])
    opt = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with rec.step(opt.iterations):
            with tf.GradientTape() as tape:
                embedded = rec.activation("embedded", emb(x))
                loss = rec.loss(tf.reduce_mean(tf.square(head(tf.reshape(embedded, [-1, SEQ * DIM])) - y)))
            rec.minimize(opt, loss, model.trainable_variables, tape)
        return embedded

    seen = [step(tf.constant(_padded(TOKENS[s], "pre")), tf.constant(TARGETS[s])).numpy() for s in range(STEPS)]
    rec.close()
    return seen[0]


def test_sequences_padded_at_the_other_end_are_not_told_to_permute_before_flatten(tmp_path) -> None:
    """Keras's pad_sequences pads "pre" by default; a port fed so, where TF1 padded "post", holds each
    row's values in another order too, and was told of channels-first maps and Permute((3, 1, 2))."""
    tf1, port = _tf1_embedded(str(tmp_path / "tf1")), _keras_embedded(str(tmp_path / "tf2"))
    # numpy: each row's positions are TF1's rolled by the padding's length, and not in place
    assert np.abs(port - tf1).max() > 0.1
    for i, n in enumerate((2, 3, 4, 5)):
        np.testing.assert_allclose(np.roll(tf1[i], SEQ - n, axis=0), port[i], atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor, first.reason) == (0, "activation", "embedded", "value"), first
    assert "padding at the other end" in first.note and "Permute" not in first.note, first.note
