"""Element samples of tensors too large for full values (``<name>#sample``).

Above ``full_values_limit`` (4096 elements by default: most kernels of real models) a tensor is
recorded as statistics, which prove only differences larger than the rounding of a sum over every
element. A kernel loaded transposed keeps every statistic, so the verdict used to rest on the
tensors downstream. Each such tensor now carries 256 of its elements at fixed positions, compared
element-wise. Written the way users write it: a ``None`` batch dimension, TF1 layers and optimizer,
a Keras port in a ``tf.function`` loop; every expectation checked against numpy.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tb_parity_plugin import compare, summary_v1, summary_v2
from tb_parity_plugin.logdir.reader import LogdirReader

STEPS = 3
LR = 0.1
RNG = np.random.default_rng(21)
W1 = (RNG.standard_normal((128, 128)) * 0.1).astype(np.float32)  # square: it can be loaded transposed
W2 = (RNG.standard_normal((128, 512)) * 0.1).astype(np.float32)
XS = RNG.standard_normal((STEPS, 16, 128)).astype(np.float32)
YS = np.eye(512, dtype=np.float32)[RNG.integers(0, 512, (STEPS, 16))]


def positions(size: int) -> np.ndarray:
    """The sample's positions as the README states them, written out here independently."""
    out = []
    for j in range(256):
        frac = (j * 0.6180339887498949) % 1.0
        out.append(min(math.floor((j + frac) * size / 256), size - 1))
    return np.array(out)


def _train_tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        x = tf.compat.v1.placeholder(tf.float32, (None, 128))
        y = tf.compat.v1.placeholder(tf.float32, (None, 512))
        h = rec.activation(
            "hidden",
            tf.nn.relu(
                tf.compat.v1.layers.dense(x, 128, use_bias=False, kernel_initializer=tf.constant_initializer(W1))
            ),
        )
        logits = rec.activation(
            "logits", tf.compat.v1.layers.dense(h, 512, use_bias=False, kernel_initializer=tf.constant_initializer(W2))
        )
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(rec.lr(tf.constant(LR))), loss)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(STEPS):
                _, parity = sess.run([train_op, fetches], {x: XS[step], y: YS[step]})
                rec.write(parity, step=step)
        rec.close()


def _train_tf2(run_dir: str, first_kernel: np.ndarray) -> None:
    tf.keras.backend.clear_session()
    layers = [
        tf.keras.layers.Dense(
            128, use_bias=False, activation="relu", kernel_initializer=tf.constant_initializer(first_kernel)
        ),
        tf.keras.layers.Dense(512, use_bias=False, kernel_initializer=tf.constant_initializer(W2)),
    ]
    model = tf.keras.Sequential([tf.keras.Input((128,)), *layers])
    opt = tf.keras.optimizers.SGD(LR)
    ce = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(opt.learning_rate)
            with tf.GradientTape() as tape:
                hidden = rec.activation("hidden", layers[0](x))
                loss = rec.loss(ce(y, rec.activation("logits", layers[1](hidden))))
            grads = tape.gradient(loss, model.trainable_variables)
            rec.grads(grads, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

    for step in range(STEPS):
        train_step(tf.constant(XS[step]), tf.constant(YS[step]))
    rec.close()


def test_a_faithful_port_agrees_and_its_samples_hold_the_elements_numpy_computes(tmp_path) -> None:
    """The samples hold the tensor's elements at the stated positions: the TF1 kernel as initialised,
    the logits of a ``[None, 512]`` tensor (positions from its runtime size) and the port's
    gradient of the second kernel, each computed here with numpy. The faithful port agrees, every
    large tensor with its sample compared element-wise."""
    _train_tf1(str(tmp_path / "tf1"))
    _train_tf2(str(tmp_path / "tf2"), W1)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    assert report.evidence["sampled"] == report.evidence["statistics"] > 0
    assert "with a sample of 256 elements that agrees element-wise" in report.verdict_text
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    tf1, tf2 = reader.run("tf1"), reader.run("tf2")
    h = np.maximum(XS[0].astype(np.float64) @ W1, 0)
    logits = h @ W2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    grad_w2 = h.T @ (p - YS[0]) / len(h)
    checks = [
        (tf1, ("weight", "dense/kernel:0#sample"), W1),
        (tf1, ("activation", "logits#sample"), logits),
        (tf2, ("grad", "dense_1/kernel:0#sample"), grad_w2),
    ]
    for run, key, want in checks:
        got = run.tensors[key].values[0]
        np.testing.assert_allclose(got, want.ravel()[positions(want.size)], rtol=1e-4, atol=1e-6, err_msg=str(key))
    # [None, 128] at batch 16 is 2048 elements: full values at every step, so its sample (recorded in
    # case the batch runs large) is not compared: only the large tensors' samples are.
    assert ("activation", "hidden#sample") in tf1.tensors and tf1.tensors[("activation", "hidden")].values is not None
    compared = {m["baseline"] for m in report.to_dict()["mapping"] if m["baseline"].endswith("#sample")}
    assert compared == {"dense/kernel:0#sample", "dense_1/kernel:0#sample", "logits#sample"}


def test_a_square_kernel_loaded_transposed_diverges_on_its_sample_at_step_0(tmp_path) -> None:
    """A checkpoint converter's slip: the port's first kernel is TF1's transposed. numpy: every
    statistic is the same (the same elements), so statistics prove nothing; at the sample's
    positions the elements differ far beyond tolerance. The first divergence is that kernel's
    sample at step 0, before anything downstream."""
    flat, flat_t = W1.ravel(), W1.T.ravel()
    assert np.array_equal(np.sort(flat), np.sort(flat_t))  # the same elements: the same statistics
    pos = positions(W1.size)
    assert not np.allclose(flat_t[pos], flat[pos], rtol=0.05, atol=1e-5)  # the default tolerance
    _train_tf1(str(tmp_path / "tf1"))
    _train_tf2(str(tmp_path / "tf2"), W1.T)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor, first.evidence) == (0, "weight", "dense/kernel:0#sample", "sample")
    np.testing.assert_allclose(first.max_abs_diff, np.abs(flat_t[pos] - flat[pos]).max(), rtol=1e-6)
    from tb_parity_plugin import api

    assert "(of its 256 sampled elements)" in api.describe(first)  # not the whole tensor's figures


def test_a_size_crossing_the_limit_is_no_divergence_where_one_run_sampled_it_only(tmp_path) -> None:
    """A reviewer's faithful port diverged on ``activation/h#sample`` (missing): TF1 feeds
    ``placeholder([None, 64])``, so its ``h`` is sampled at every step; the port's ``tf.function``
    is traced per batch shape, so [64, 64] (4096 elements, full values) is not sampled and only
    [65, 64] is. numpy: the two runs hold identical values at every step, so they agree; and the
    last step's sample is compared (a planted difference there diverges, as numpy says)."""
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((rows, 64)).astype(np.float32) for rows in (64, 64, 65)]

    def record(root: str, cand: list[np.ndarray]) -> None:
        with tf.Graph().as_default():
            rec = summary_v1.Recorder(f"{root}/tf1")
            x = tf.compat.v1.placeholder(tf.float32, [None, 64])
            rec.activation("h", tf.identity(x))
            fetches = rec.fetches
            with tf.compat.v1.Session() as sess:
                for s, b in enumerate(batches):
                    rec.write(sess.run(fetches, {x: b}), step=s)
            rec.close()
        rec2 = summary_v2.Recorder(f"{root}/tf2")

        @tf.function
        def step(s: tf.Tensor, x: tf.Tensor) -> None:
            with rec2.step(s):
                rec2.activation("h", tf.identity(x))

        for s, c in enumerate(cand):
            step(tf.constant(s, tf.int64), tf.constant(c))
        rec2.close()

    record(str(tmp_path / "same"), batches)
    report = compare(str(tmp_path / "same"), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    assert report.evidence["sampled"] == 1
    planted = [b.copy() for b in batches]
    pos = positions(planted[2].size)
    planted[2].ravel()[pos[100]] += np.float32(1e-3)  # a sampled element of the large step
    assert np.abs(planted[2] - batches[2]).max() > 1e-5  # out of atol (rtol 0 in the warm-up)
    record(str(tmp_path / "planted"), planted)
    first = compare(str(tmp_path / "planted"), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.tensor, first.reason, first.evidence) == (2, "h#sample", "value", "sample")


def test_a_sample_of_a_tensor_of_another_shape_gives_no_figure(tmp_path) -> None:
    """A new user's port padded a conv 'same' where TF1 had 'valid': the output was [16, 20, 32]
    against [16, 18, 32], a shape divergence, and its sample beside it was "73% apart", though
    sample positions follow a tensor's size, so the two runs sampled unrelated elements (numpy:
    the positions differ). The sample's line now gives no figure and says why."""
    from tb_parity_plugin.records import metadata

    assert not np.array_equal(metadata.sample_positions(16 * 18 * 32), metadata.sample_positions(16 * 20 * 32))
    for run, length in (("tf1", 18), ("tf2", 20)):
        rec = summary_v2.Recorder(str(tmp_path / run))
        for step in range(2):
            with rec.step(step):
                rec.activation("conv1d", tf.reshape(tf.range(16 * length * 32, dtype=tf.float32), (16, length, 32)))
        rec.close()
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.tensor, first.reason) == (0, "conv1d", "shape"), first
    (sample,) = [d for d in report.divergences_at_first_step if d.tensor == "conv1d#sample"]
    assert sample.max_abs_diff is None and sample.mismatch_fraction is None and sample.cosine is None, sample
    assert "sampled positions hold unrelated elements" in (sample.note or ""), sample.note


def test_the_heat_map_counts_tensors_and_element_samples_apart(tmp_path) -> None:
    """A sample is a column of the heat map of its own: the map was headed "5 tensors" under a
    headline counting fewer tensors compared (a helper's MobileNet pair: 832 against 776). numpy: the
    two kernels (128 x 128, 128 x 512), their gradients and the [16, 512] logits exceed 4096 elements
    and carry a sample each."""
    from tb_parity_plugin.dashboard.views import matrix_payload
    from tb_parity_plugin.report import page

    assert [n for n in (128 * 128, 128 * 512, 16 * 512, 16 * 128) if n > 4096] == [16384, 65536, 8192]
    _train_tf1(str(tmp_path / "tf1"))
    _train_tf2(str(tmp_path / "tf2"), W1)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    matrix = report.matrix()
    samples = [t for t in matrix.tensors if t.endswith("#sample")]
    assert len(samples) == 5, matrix.tensors
    # what the two runs record: lr, loss, two kernels, their gradients, hidden and logits
    assert report.to_dict()["tensors_compared"] == len(matrix.tensors) - 5 == 8, matrix.tensors
    text = "8 tensors and 5 element samples"
    assert matrix.columns_text() == text
    assert f"Divergence map: {text} (execution order)" in page.report_document(report)
    assert matrix_payload(matrix, report)["columns_text"] == text
