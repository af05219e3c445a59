"""A TF1 CNN fed through ``placeholder(tf.float32, [None, 4, 4, 1])`` records its features after
the flatten (``[None, 48]``); the Keras port records them before its ``Flatten`` (``[5, 4, 4, 3]``
in a ``tf.function``, as a new user's port that applied dropout before flattening did). The same
elements in row-major order: it used to be a shape divergence at step 0 while every weight agreed.
Each expectation is checked against the tensors the frameworks computed, with numpy."""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, BATCH, FILTERS, CLASSES = 3, 5, 3, 2
RNG = np.random.default_rng(5)
X = RNG.standard_normal((STEPS, BATCH, 4, 4, 1)).astype(np.float32)
Y = RNG.integers(0, CLASSES, (STEPS, BATCH))
CONV = (RNG.standard_normal((3, 3, 1, FILTERS)) * 0.5).astype(np.float32)
HEAD = (RNG.standard_normal((16 * FILTERS, CLASSES)) * 0.2).astype(np.float32)
LR = 0.1
LAST = 3  # the last step's batch: a partial batch, a new runtime shape on both sides


def _batch(step: int, size: Optional[int] = None) -> slice:
    return slice(0, size or (LAST if step == STEPS - 1 else BATCH))


def _tf1(run_dir: str) -> list[np.ndarray]:
    """The original; returns the flattened features the session computed at each step."""
    seen = []
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4, 4, 1])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        conv = tf.compat.v1.layers.conv2d(
            x, FILTERS, 3, padding="same", activation=tf.nn.relu, kernel_initializer=tf.constant_initializer(CONV)
        )
        features = rec.activation("features", tf.compat.v1.layers.flatten(conv))
        logits = tf.compat.v1.layers.dense(features, CLASSES, kernel_initializer=tf.constant_initializer(HEAD))
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        train = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                feed = {x: X[s, _batch(s)], y: Y[s, _batch(s)]}
                seen.append(sess.run(features, feed))
                rec.write(sess.run([train, fetches], feed)[1])
        rec.close()
    return seen


def _keras(run_dir: str, channels_first: bool = False, sizes: Optional[dict[int, int]] = None) -> list[np.ndarray]:
    """The port: records its features before ``Flatten`` (``channels_first``: transposed to
    ``[batch, filters, 4, 4]`` first, the same elements in another order); ``sizes``: a step fed
    another batch size than the original's. Returns the features it recorded at each step."""
    conv = tf.keras.layers.Conv2D(FILTERS, 3, padding="same", activation="relu")
    head = tf.keras.layers.Dense(CLASSES)
    flatten = tf.keras.layers.Flatten()
    head(flatten(conv(tf.zeros((1, 4, 4, 1)))))  # built in their name scopes: conv2d/kernel, dense/kernel
    conv.kernel.assign(CONV)
    head.kernel.assign(HEAD)
    variables = [conv.kernel, conv.bias, head.kernel, head.bias]
    opt = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with rec.step(opt.iterations):
            with tf.GradientTape() as tape:
                maps = conv(x)
                recorded = tf.transpose(maps, [0, 3, 1, 2]) if channels_first else maps
                rec.activation("features", recorded)
                loss = rec.loss(loss_fn(y, head(flatten(maps))))
            rec.minimize(opt, loss, variables, tape)
        return recorded

    seen = []
    for s in range(STEPS):
        part = _batch(s, (sizes or {}).get(s))
        seen.append(step(tf.constant(X[s, part]), tf.constant(Y[s, part])).numpy())
    rec.close()
    return seen


def test_features_recorded_before_and_after_a_flatten_agree(tmp_path) -> None:
    tf1, port = _tf1(str(tmp_path / "tf1")), _keras(str(tmp_path / "tf2"))
    for a, b in zip(tf1, port):  # the same elements in row-major order, step by step
        np.testing.assert_allclose(b.reshape(a.shape), a, rtol=1e-6, atol=1e-6)
    assert [a.shape for a in port] == [(BATCH, 4, 4, FILTERS)] * (STEPS - 1) + [(LAST, 4, 4, FILTERS)]
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    (warning,) = [w for w in report.warnings if "in row-major order" in w]
    assert "activation/features [None, 48] ~ [3, 4, 4, 3]" in warning  # the port's last trace: the partial batch
    detail = report.comparison.detail("features", step=0)
    assert detail.diff is not None and detail.diff.shape == (BATCH, 16 * FILTERS)
    np.testing.assert_allclose(detail.diff, port[0].reshape(BATCH, -1) - tf1[0], atol=1e-6)


def test_features_recorded_channels_first_diverge_on_their_values_at_step_0(tmp_path) -> None:
    """The same elements in another layout: compared element for element, they differ."""
    tf1, port = _tf1(str(tmp_path / "tf1")), _keras(str(tmp_path / "tf2"), channels_first=True)
    assert np.abs(port[0].reshape(tf1[0].shape) - tf1[0]).max() > 0.1  # numpy: apart in row-major order
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor, first.reason, first.evidence) == (
        0,
        "activation",
        "features",
        "value",
        "values",
    )


def test_another_batch_size_at_run_time_is_a_shape_divergence_at_that_step(tmp_path) -> None:
    """Fed 4 examples where the original took 5 at step 1: the leading dimension the two shapes
    share is compared at run time (the first step agrees: the features are the same elements)."""
    tf1, port = _tf1(str(tmp_path / "tf1")), _keras(str(tmp_path / "tf2"), sizes={1: 4})
    np.testing.assert_allclose(port[0].reshape(tf1[0].shape), tf1[0], rtol=1e-6, atol=1e-6)
    assert port[1].shape[0] != tf1[1].shape[0]
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor, first.reason) == (1, "activation", "features", "shape"), first
