"""A segmentation model's spatial layers ported with Keras defaults: the notes name the resize's
convention and the pooling's padding.

A new user's TF1 U-Net upsampled with ``tf.compat.v1.image.resize_bilinear`` (``align_corners=False``
and, TF1's default, no half-pixel centres) and pooled with ``max_pooling2d(3, 2, padding="same")``.
Its Keras ports: ``UpSampling2D(interpolation="bilinear")``, which resizes with half-pixel centres, was
told at step 0 on the upsampled output only that "this layer computes another function of its input
(activation, padding, epsilon, a training flag)", or, with a larger output before it compared by
statistics, nothing at all; ``MaxPool2D(3, 2)`` at Keras's default ``padding="valid"`` (8x8 pooled to
3x3 against 4x4, the decoder's resize to the skip's size hiding it) was told the two shapes alone.
Written the way users write it (a ``None`` batch, ``tf.compat.v1.layers``, ``fit`` recorded by
``instrument``); the resizes and the pooled sizes are checked against numpy from their definitions.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from shim_readback import logged_value, tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

SIDE, CH, FILTERS, CLASSES, BATCH, STEPS, LR = 8, 2, 4, 3, 2, 2, 0.1
RNG = np.random.default_rng(100)
X = RNG.standard_normal((BATCH * STEPS, SIDE, SIDE, CH)).astype(np.float32)
Y = RNG.integers(0, CLASSES, (BATCH * STEPS, SIDE, SIDE)).astype(np.int32)
ENC = (RNG.standard_normal((3, 3, CH, FILTERS)) * 0.4).astype(np.float32)
HEAD = (RNG.standard_normal((1, 1, 2 * FILTERS, CLASSES)) * 0.3).astype(np.float32)
POOLED = math.ceil(SIDE / 2)  # max_pooling2d(3, 2, padding="same") of 8x8


def _tf1(run_dir: str) -> None:
    layers = tf.compat.v1.layers
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, SIDE, SIDE, CH])
        y = tf.compat.v1.placeholder(tf.int32, [None, SIDE, SIDE])
        enc = rec.activation(
            "enc",
            layers.conv2d(x, FILTERS, 3, padding="same", activation=tf.nn.relu, name="enc",
                          kernel_initializer=tf.constant_initializer(ENC)),
        )  # fmt: skip
        pool = rec.activation("pool", layers.max_pooling2d(enc, 3, 2, padding="same", name="pool"))
        up = rec.activation("up", tf.compat.v1.image.resize_bilinear(pool, tf.shape(enc)[1:3]))
        logits = layers.conv2d(tf.concat([up, enc], -1), CLASSES, 1, name="logits",
                               kernel_initializer=tf.constant_initializer(HEAD))  # fmt: skip
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        train_op = rec.minimize(
            tf.compat.v1.train.GradientDescentOptimizer(rec.lr(tf.constant(LR))), loss, global_step=gs
        )
        train(rec, train_op, [x, y], [X, Y], STEPS, BATCH)


def _fit(run_dir: str, port: str) -> None:
    tf.keras.backend.clear_session()
    L = tf.keras.layers
    inp = tf.keras.Input((SIDE, SIDE, CH))
    enc = L.Conv2D(FILTERS, 3, padding="same", activation="relu", name="enc")(inp)
    pool = L.MaxPool2D(3, 2, name="pool")(enc) if port == "valid" else L.MaxPool2D(3, 2, "same", name="pool")(enc)
    if port == "upsampling":
        up = L.UpSampling2D(2, interpolation="bilinear", name="up")(pool)
    else:  # TF1's resize, to the skip's size
        up = L.Lambda(lambda t: tf.compat.v1.image.resize_bilinear(t[0], tf.shape(t[1])[1:3]), name="up")([pool, enc])
    logits = L.Conv2D(CLASSES, 1, name="logits")(L.Concatenate()([up, enc]))
    model = tf.keras.Model(inp, logits)
    model.get_layer("enc").kernel.assign(ENC)
    model.get_layer("logits").kernel.assign(HEAD)
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["enc", "pool", "up"])
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def _bilinear(x: np.ndarray, size: int, half_pixel: bool) -> np.ndarray:
    """``x`` [n, h, w, c] resized to ``size`` x ``size``, pixel by pixel from the definition: TF1's
    ``resize_bilinear`` samples output ``o`` at ``o * in / out``, half-pixel centres at
    ``(o + 0.5) * in / out - 0.5``; neighbours clamped to the edge."""

    def taps(n_in: int, o: int) -> tuple[int, int, float]:
        src = (o + 0.5) * n_in / size - 0.5 if half_pixel else o * n_in / size
        low = math.floor(src)
        return min(max(low, 0), n_in - 1), min(max(low + 1, 0), n_in - 1), src - low

    out = np.zeros((x.shape[0], size, size, x.shape[3]))
    for i in range(size):
        i0, i1, ti = taps(x.shape[1], i)
        for j in range(size):
            j0, j1, tj = taps(x.shape[2], j)
            top = x[:, i0, j0] * (1 - tj) + x[:, i0, j1] * tj
            bottom = x[:, i1, j0] * (1 - tj) + x[:, i1, j1] * tj
            out[:, i, j] = top * (1 - ti) + bottom * ti
    return out


def test_faithful_port_agrees(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), "faithful")
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence


def test_an_upsampling_with_half_pixel_centres_is_named_from_its_input(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), "upsampling")
    # numpy: each run's upsampled output is its own pooled output resized by its own convention
    for run, half_pixel in (("tf1", False), ("tf2", True)):
        logged = tensors_by_step(str(tmp_path / run))
        pool = logged_value(logged, 0, "activation", "pool").reshape(BATCH, POOLED, POOLED, FILTERS)
        up = logged_value(logged, 0, "activation", "up").reshape(BATCH, SIDE, SIDE, FILTERS)
        np.testing.assert_allclose(up, _bilinear(pool, SIDE, half_pixel), atol=1e-5)
        assert np.abs(up - _bilinear(pool, SIDE, not half_pixel)).max() > 0.01  # the conventions part here
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor, first.reason) == (0, "activation", "up", "value"), first
    assert "'tf1''s is activation/pool" in first.note, first.note
    assert "align_corners=False and half_pixel_centers=False" in first.note, first.note
    assert "'tf2''s is that input resized to 8x8 by bilinear with half-pixel centres" in first.note, first.note
    assert "pixel-centre convention differs" in first.note, first.note


def test_a_pool_at_keras_default_padding_is_named_from_its_input(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _fit(str(tmp_path / "tf2"), "valid")
    valid = (SIDE - 3) // 2 + 1  # floor((8 - 3) / 2) + 1 = 3, where 'same' gives ceil(8 / 2) = 4
    logged = tensors_by_step(str(tmp_path / "tf2"))
    assert logged_value(logged, 0, "activation", "pool").size == BATCH * valid * valid * FILTERS
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor, first.reason) == (0, "activation", "pool", "shape"), first
    shapes = f"[{BATCH}, {POOLED}, {POOLED}, {FILTERS}] in baseline vs [{BATCH}, {valid}, {valid}, {FILTERS}]"
    assert shapes in first.note, first.note
    assert f"from the {SIDE}x{SIDE} of activation/enc" in first.note, first.note
    assert "padding 'same' in 'tf1' and 'valid' in 'tf2' (stride 2, a window of 3 to 4" in first.note, first.note


def test_the_resize_note_names_the_convention_on_a_large_image() -> None:
    """A 512x512 RGB image upsampled to 1024x1024, both kept with full values (a user who raised
    full_values_limit, as the marginal note advises): the note applied each convention as a dense
    [1024, 512] matrix product per axis, twelve of them, over a minute in all (33 s for the comparison, 1.7 s
    from the taps: measured by a review, not asserted, as no test asserts a time). Each run's output is its
    input resized from the definition (TF1's resize_bilinear samples output o at o / 2, half-pixel centres at
    (o + 0.5) / 2 - 0.5, neighbours clamped), computed here with numpy's own gather."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    side = 512
    x = np.random.default_rng(1).random((1, side, side, 3)).astype(np.float32)

    def bilinear(half_pixel: bool) -> np.ndarray:
        src = (np.arange(2 * side) + 0.5) / 2 - 0.5 if half_pixel else np.arange(2 * side) / 2
        low = np.floor(src).astype(int)
        t = src - low
        lo, hi = np.clip(low, 0, side - 1), np.clip(low + 1, 0, side - 1)
        rows = x[:, lo] * (1 - t)[None, :, None, None] + x[:, hi] * t[None, :, None, None]
        return (rows[:, :, lo] * (1 - t)[None, None, :, None] + rows[:, :, hi] * t[None, None, :, None]).astype(
            np.float32
        )

    ups = {"tf1": bilinear(False), "tf2": bilinear(True)}
    assert np.abs(ups["tf1"] - ups["tf2"]).max() > 0.01  # the conventions part
    runs = [
        run(
            name,
            [
                series("weight", "enc/kernel:0", [ENC], order=0),  # a weight both runs hold alike
                series("activation", "pool", [x], order=1),
                series("activation", "up", [up], order=2),
            ],
        )
        for name, up in ups.items()
    ]
    first = Comparison(*runs).report().first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "up"), first
    assert "'tf2''s is that input resized to 1024x1024 by bilinear with half-pixel centres" in first.note, first.note
    assert "align_corners=False and half_pixel_centers=False" in first.note, first.note
