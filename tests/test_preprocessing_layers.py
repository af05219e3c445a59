"""A Keras preprocessing layer's adapted statistics are not recorded as the model's ``state``.

The feature-column migration guide ports TF1's ``numeric_column(normalizer_fn=...)`` to an adapted
``Normalization`` per numeric feature. TF1 holds the mean and std as constants of the graph; the
port holds them as the layer's non-trainable ``mean``, ``variance`` and ``count``, which tf_keras
names without the layer's scope (``mean:0``). ``instrument`` recorded them as ``state``: a faithful
port with one such layer was a structure DIVERGE on ``state/mean:0`` (the hint offered
``--allow-unmatched 'state/*'``), and one with two crashed ``fit`` at its first step with
"state/'mean:0' is logged twice". Expected values: numpy's standardisation and SGD.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(11)
A = RNG.normal(3.0, 2.0, (24, 1)).astype(np.float32)
B = RNG.normal(-1.0, 0.5, (24, 1)).astype(np.float32)
Y = (A + B > 2.0).astype(np.float32)
KERNEL = np.array([[0.5], [-0.3]], np.float32)
LR, BATCH, STEPS = 0.1, 8, 3


def _normalized(a: np.ndarray, b: np.ndarray, data: tuple = (A, B)) -> np.ndarray:
    """numpy: each feature standardised by the mean and (population) std of ``data``."""
    cols = [(x.astype(np.float64) - d.mean()) / d.std() for x, d in zip((a, b), data)]
    return np.concatenate(cols, axis=1)


def _sgd_kernels() -> list[np.ndarray]:
    """numpy: the kernel before each step of SGD on the sigmoid cross-entropy (bias 0 at the start)."""
    k, bias, out = KERNEL.astype(np.float64), 0.0, []
    for s in range(STEPS):
        out.append(k.copy())
        rows = slice(s * BATCH, (s + 1) * BATCH)
        x = _normalized(A[rows], B[rows])
        dz = (1 / (1 + np.exp(-(x @ k + bias))) - Y[rows]) / BATCH
        k, bias = k - LR * x.T @ dz, bias - LR * dz.sum()
    return out


def _tf1(logdir: str) -> None:
    """The original: a normalizer_fn per numeric_column (graph constants), input_layer, one dense."""
    fc = tf.compat.v1.feature_column
    with tf.Graph().as_default():
        columns = [
            fc.numeric_column(name, normalizer_fn=lambda x, d=d: (x - float(d.mean())) / float(d.std()))
            for name, d in (("a", A), ("b", B))
        ]
        a = tf.compat.v1.placeholder(tf.float32, [None, 1])
        b = tf.compat.v1.placeholder(tf.float32, [None, 1])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        rec = summary_v1.Recorder(logdir)
        net = rec.activation("input_layer", fc.input_layer({"a": a, "b": b}, columns))
        logits = tf.compat.v1.layers.dense(net, 1, kernel_initializer=tf.compat.v1.constant_initializer(KERNEL))
        loss = rec.loss(tf.compat.v1.losses.sigmoid_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=step)
        rec.variables()
        train(rec, train_op, [a, b, y], [A, B, Y], STEPS, BATCH)


def _port(logdir: str, adapt_b_on: np.ndarray = B) -> tf.keras.Model:
    """The guide's port: an adapted Normalization per feature inside the model, under fit."""
    layers = tf.keras.layers
    norm_a, norm_b = layers.Normalization(), layers.Normalization()
    norm_a.adapt(A)
    norm_b.adapt(adapt_b_on)
    ia, ib = tf.keras.Input((1,), name="a"), tf.keras.Input((1,), name="b")
    x = layers.Concatenate(name="input_layer")([norm_a(ia), norm_b(ib)])
    model = tf.keras.Model([ia, ib], layers.Dense(1, name="dense", kernel_initializer="zeros")(x))
    model.get_layer("dense").kernel.assign(KERNEL)
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.BinaryCrossentropy(from_logits=True), ["accuracy"])
    rec = summary_v2.Recorder(logdir)
    summary_v2.instrument(model, rec, layers=["input_layer"])
    model.fit({"a": A, "b": B}, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()
    return model


def test_adapted_normalization_layers_are_no_state_and_a_faithful_port_agrees(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    model = _port(str(tmp_path / "tf2"))
    assert len(model.non_trainable_variables) == 6  # the two layers' mean, variance, count
    steps = tensors_by_step(str(tmp_path / "tf2"))
    assert not [key for key in steps[0] if key[0] == "state"]
    for step, kernel in enumerate(_sgd_kernels()):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        np.testing.assert_allclose(
            steps[step][("activation", "input_layer")][2].reshape(-1, 2), _normalized(A[rows], B[rows]), atol=1e-5
        )
        np.testing.assert_allclose(steps[step][("weight", "dense/kernel:0")][2].reshape(2, 1), kernel, atol=1e-6)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    assert not any(report.to_dict()["unmatched"].values())


def test_a_normalization_adapted_on_other_data_is_found_on_its_output_at_step_0(tmp_path) -> None:
    other = RNG.normal(0.0, 1.0, (24, 1)).astype(np.float32)
    # numpy: the port's b column is standardised by the other split's statistics, far from TF1's
    assert np.abs(_normalized(A[:BATCH], B[:BATCH], (A, other)) - _normalized(A[:BATCH], B[:BATCH])).max() > 1.0
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "tf2"), adapt_b_on=other)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "input_layer"), first


AGES = np.array([19, 52, 31, 44, 27, 58, 40, 22, 33, 25, 47, 35, 29, 56, 38, 41], np.float32)[:, None]
BOUNDS = [25.0, 35.0, 45.0]


def _buckets(ages: np.ndarray, bounds: list) -> np.ndarray:
    """numpy: the one-hot bucket of each age, a value equal to a boundary in the bucket above it."""
    return np.eye(len(bounds) + 1)[np.searchsorted(bounds, ages[:, 0], side="right")]


def _bucket_runs(logdir: str, bounds: list) -> None:
    """TF1: bucketized_column's indicator through input_layer; the port: Discretization and
    CategoryEncoding under fit, the same dense layer on top."""
    fc = tf.compat.v1.feature_column
    kernel = np.array([[0.4], [-0.2], [0.1], [0.3]], np.float32)
    y = (AGES > 36).astype(np.float32)
    with tf.Graph().as_default():
        age = tf.compat.v1.placeholder(tf.float32, [None, 1])
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
        rec = summary_v1.Recorder(f"{logdir}/tf1")
        column = fc.indicator_column(fc.bucketized_column(fc.numeric_column("age"), boundaries=BOUNDS))
        net = rec.activation("input_layer", fc.input_layer({"age": age}, [column]))
        logits = tf.compat.v1.layers.dense(net, 1, kernel_initializer=tf.compat.v1.constant_initializer(kernel))
        loss = rec.loss(tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits))
        rec.lr(tf.constant(LR))
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=step)
        rec.variables()
        train(rec, train_op, [age, labels], [AGES, y], 2, BATCH)
    layers = tf.keras.layers
    inp = tf.keras.Input((1,), name="age")
    onehot = layers.CategoryEncoding(4, output_mode="one_hot")(layers.Discretization(bin_boundaries=bounds)(inp))
    x = layers.Identity(name="input_layer")(onehot)
    model = tf.keras.Model(inp, layers.Dense(1, name="dense", kernel_initializer="zeros")(x))
    model.get_layer("dense").kernel.assign(kernel)
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.BinaryCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(f"{logdir}/tf2")
    summary_v2.instrument(model, rec, layers=["input_layer"])
    model.fit(AGES, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def test_discretization_boundaries_moved_are_told_a_category_in_another_column(tmp_path) -> None:
    """Discretization and bucketized_column put a value on a boundary in the bucket above it (numpy:
    searchsorted right), so the same boundaries agree. Boundaries a year above TF1's move the ages on
    a boundary (25 and 35, both in the second batch) a bucket down: found at step 1 on the features,
    whose note named a random mask, padding or a ReLU the model did not have."""
    bumped = [b + 1 for b in BOUNDS]
    assert (_buckets(AGES[:BATCH], BOUNDS) == _buckets(AGES[:BATCH], bumped)).all()
    moved = (_buckets(AGES[BATCH:], BOUNDS) != _buckets(AGES[BATCH:], bumped)).any(axis=1)
    assert moved.sum() == 2
    _bucket_runs(str(tmp_path / "same"), BOUNDS)
    report = compare(str(tmp_path / "same"), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    steps = tensors_by_step(str(tmp_path / "same" / "tf2"))
    for step in (0, 1):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        values = steps[step][("activation", "input_layer")][2].reshape(-1, 4)
        np.testing.assert_array_equal(values, _buckets(AGES[rows], BOUNDS))
    _bucket_runs(str(tmp_path / "moved"), bumped)
    first = compare(str(tmp_path / "moved"), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "activation", "input_layer"), first
    assert "in each of its 2 row(s) that differ" in first.note and "another column" in first.note, first.note
    assert "random mask (dropout" not in first.note, first.note


VOCAB = ["a", "b", "c"]
TAGS = np.array([["a"], ["zz"], ["c"], ["b"], ["a"], ["yy"], ["c"], ["c"]], object)  # zz, yy: out of vocabulary
TABLE = RNG.normal(0.0, 0.5, (4, 2)).astype(np.float32)  # TF1's rows: a, b, c, then the OOV bucket


def test_a_string_lookup_port_holding_the_table_with_its_oov_row_first_is_told_so(tmp_path) -> None:
    """TF1's vocabulary_list column puts its OOV bucket after the vocabulary, StringLookup at index 0:
    the port copies TF1's table with its last row first and computes the same (numpy: each example's
    row of TF1's table, on both sides). The table is another layout, found at step 0, and its note named
    a transposed kernel, heads or gates; it names the rows rolled and the lookup's OOV index now."""
    fc = tf.compat.v1.feature_column
    ids = np.array([VOCAB.index(t) if t in VOCAB else len(VOCAB) for t in TAGS[:, 0]])
    y = np.array([[1], [0], [1], [0], [1], [0], [0], [1]], np.float32)
    with tf.Graph().as_default():
        tags = tf.compat.v1.placeholder(tf.string, [None, 1])
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        column = fc.embedding_column(
            fc.categorical_column_with_vocabulary_list("tags", VOCAB, num_oov_buckets=1),
            2,
            initializer=tf.compat.v1.constant_initializer(TABLE),
        )
        net = rec.activation("input_layer", fc.input_layer({"tags": tags}, [column]))
        logits = tf.compat.v1.layers.dense(net, 1, kernel_initializer=tf.compat.v1.constant_initializer(KERNEL))
        loss = rec.loss(tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits))
        rec.lr(tf.constant(LR))
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=step)
        rec.variables()
        train(rec, train_op, [tags, labels], [TAGS, y], 1, len(TAGS))  # the vocabulary is a table
    layers = tf.keras.layers
    inp = tf.keras.Input((1,), dtype=tf.string, name="tags")
    embedded = layers.Embedding(4, 2, name="tags_embedding")(layers.StringLookup(vocabulary=VOCAB)(inp))
    x = layers.Reshape((2,), name="input_layer")(embedded)
    model = tf.keras.Model(inp, layers.Dense(1, name="dense", kernel_initializer="zeros")(x))
    model.get_layer("tags_embedding").embeddings.assign(np.roll(TABLE, 1, axis=0))  # OOV row first
    model.get_layer("dense").kernel.assign(KERNEL)
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.BinaryCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    summary_v2.instrument(model, rec, layers=["input_layer"])
    model.fit(TAGS.astype(str), y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()
    for run in ("tf1", "tf2"):
        looked_up = tensors_by_step(str(tmp_path / run))[0][("activation", "input_layer")][2].reshape(-1, 2)
        np.testing.assert_allclose(looked_up, TABLE[ids], atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind) == (0, "weight"), first
    assert "rolled by 1 row(s)" in first.note and "OOV index first" in first.note, first.note


class _RunningMean(tf.keras.layers.Layer):
    """A user's own layer whose running mean trains with the model (as a batch norm's moving mean does)."""

    def build(self, input_shape: tf.TensorShape) -> None:
        self.mean = self.add_weight(name="running_mean", shape=(input_shape[-1],), initializer="zeros", trainable=False)

    def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        if training:
            self.mean.assign(0.9 * self.mean + 0.1 * tf.reduce_mean(x, 0))
        return x - self.mean


def test_a_users_layer_in_a_package_named_preprocessing_keeps_its_state() -> None:
    """Only Keras's own preprocessing layers hold adapted constants: a user's layer from a package named
    ``myproject.layers.preprocessing`` whose running mean trains with the model was left out of the state
    (a port that updates it otherwise would agree), while an adapted Normalization stays out."""
    from tb_parity_plugin.shim.variables import model_variables

    user = type("Scaler", (_RunningMean,), {"__module__": "myproject.layers.preprocessing.scaler"})(name="scaler")
    norm = tf.keras.layers.Normalization(name="norm")
    norm.adapt(A)
    model = tf.keras.Sequential([tf.keras.Input((A.shape[1],)), user, norm, tf.keras.layers.Dense(1, name="out")])
    model(A, training=True)
    np.testing.assert_allclose(user.mean.numpy(), 0.1 * A.astype(np.float64).mean(0), rtol=1e-5)  # numpy
    recorded = {id(v) for v in model_variables(model)}
    assert id(user.mean) in recorded
    assert not any(id(v) in recorded for v in norm.non_trainable_variables)
