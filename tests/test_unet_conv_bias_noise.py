"""A small U-Net from a new user's trial: TF1 ``tf.compat.v1.layers`` (``conv2d`` with its default
bias right before ``batch_normalization``, whose moving statistics ``UPDATE_OPS`` updates,
``separable_conv2d``, ``conv2d_transpose``, a skip ``concat``, ``MomentumOptimizer``) against its Keras
functional port under a custom ``tf.function`` loop, 30 steps on ``placeholder([None, 16, 16, 1])``.

The first conv's bias gets a gradient of float32 rounding (0 in exact math: batch norm removes any
shift), summed over 8 x 16 x 16 positions, and it grows as training goes: its gradients were 25-122
ulps of its layer's largest gradient element apart between the runs at their worst step, and 7-14
at step 0 (TF's CPU reductions are not deterministic, so each run differs). Under the 4 ulps that a
slot's allowance granted such a gradient until session 23, the faithful port was a false DIVERGE on
that bias's momentum slot in 3 of 11 runs (at steps 1, 2 and 27); the allowance now counts a
gradient's differences in full up to 1024 ulps of its layer's scale (``tolerance.SLOT_NOISE_OF_MAX``).
The deterministic guard of that rule is in ``test_cancelling_gradient_slots.py``; this one checks,
with numpy on the logged values, that the port is faithful and its bias gradient noise, and that
the tool agrees.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from shim_readback import logged_value, tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2
from tb_parity_plugin.engine import tolerance

STEPS, BATCH, H, LR, MU = 30, 8, 16, 0.05, 0.9
ACTS = ["enc1", "bn1", "pool1", "enc2", "pool2", "mid", "up1", "concat", "dec1", "up2", "logits"]


def _images() -> np.ndarray:
    """Smooth random blobs in [0, 1], ``[STEPS * BATCH, H, H, 1]``: the images and their own masks."""
    rng = np.random.default_rng(1234)
    yy, xx = np.mgrid[0:H, 0:H].astype(np.float64)
    out = np.zeros((STEPS * BATCH, H, H))
    for i in range(len(out)):
        for _ in range(3):
            cy, cx = rng.uniform(2, 14, 2)
            s = rng.uniform(1.5, 4.0)
            out[i] += rng.uniform(0.3, 1.0) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
    return np.clip(out, 0, 1)[..., None].astype(np.float32)


X = _images()


def _tf1(run_dir: str) -> dict[str, np.ndarray]:
    """The original; returns its initial variables by name (what a port loads from a checkpoint)."""
    layers = tf.compat.v1.layers
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        images = tf.compat.v1.placeholder(tf.float32, [None, H, H, 1], name="images")
        a = {"enc1": layers.conv2d(images, 4, 3, padding="same", name="enc1")}
        a["bn1"] = layers.batch_normalization(a["enc1"], training=True, name="bn1")
        a["pool1"] = layers.max_pooling2d(tf.nn.relu(a["bn1"]), 2, 2, name="pool1")
        a["enc2"] = layers.separable_conv2d(a["pool1"], 8, 3, padding="same", activation=tf.nn.relu, name="enc2")
        a["pool2"] = layers.max_pooling2d(a["enc2"], 2, 2, name="pool2")
        a["mid"] = layers.conv2d(a["pool2"], 8, 3, padding="same", activation=tf.nn.relu, name="mid")
        a["up1"] = layers.conv2d_transpose(a["mid"], 8, 3, strides=2, padding="same", activation=tf.nn.relu, name="up1")
        a["concat"] = tf.concat([a["up1"], a["enc2"]], axis=-1, name="concat")
        a["dec1"] = layers.conv2d(a["concat"], 4, 3, padding="same", activation=tf.nn.relu, name="dec1")
        a["up2"] = tf.compat.v1.image.resize_nearest_neighbor(a["dec1"], [H, H], name="up2")
        a["logits"] = layers.conv2d(a["up2"], 1, 3, padding="same", name="logits")
        for name in ACTS:
            rec.activation(name, a[name])
        loss = rec.loss(tf.compat.v1.losses.sigmoid_cross_entropy(images, a["logits"]))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.MomentumOptimizer(LR, MU)
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        model_vars = [v for v in tf.compat.v1.global_variables() if "global_step" not in v.name]
        model_vars = [v for v in model_vars if "Momentum" not in v.name]
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            init = sess.run({v.name: v for v in model_vars})
            for s in range(STEPS):
                rec.write(sess.run([train_op, fetches], {images: X[s * BATCH : (s + 1) * BATCH]})[1])
        rec.close()
    return init


def _keras(run_dir: str, init: dict[str, np.ndarray]) -> None:
    """The port: Keras layers with their defaults, TF1's initial values copied in by name."""
    k = tf.keras.layers
    inp = tf.keras.Input((H, H, 1), name="images")
    o: dict[str, Any] = {"enc1": k.Conv2D(4, 3, padding="same", name="enc1")(inp)}
    o["bn1"] = k.BatchNormalization(name="bn1")(o["enc1"])
    o["pool1"] = k.MaxPool2D(2, 2, name="pool1")(k.ReLU()(o["bn1"]))
    o["enc2"] = k.SeparableConv2D(8, 3, padding="same", activation="relu", name="enc2")(o["pool1"])
    o["pool2"] = k.MaxPool2D(2, 2, name="pool2")(o["enc2"])
    o["mid"] = k.Conv2D(8, 3, padding="same", activation="relu", name="mid")(o["pool2"])
    o["up1"] = k.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu", name="up1")(o["mid"])
    o["concat"] = k.Concatenate(name="concat")([o["up1"], o["enc2"]])
    o["dec1"] = k.Conv2D(4, 3, padding="same", activation="relu", name="dec1")(o["concat"])
    o["up2"] = k.UpSampling2D(2, name="up2")(o["dec1"])
    o["logits"] = k.Conv2D(1, 3, padding="same", name="logits")(o["up2"])
    model = tf.keras.Model(inp, [o[n] for n in ACTS])
    for v in model.variables:
        v.assign(init[v.name])
    rec = summary_v2.Recorder(run_dir)
    opt = tf.keras.optimizers.SGD(LR, momentum=MU)
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(xb: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                outs = model(xb, training=True)
                for name, t in zip(ACTS, outs):
                    rec.activation(name, t)
                loss = rec.loss(tf.reduce_mean(bce(xb, outs[-1])))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for s in range(STEPS):
        train_step(tf.constant(X[s * BATCH : (s + 1) * BATCH]))
    rec.close()


def test_a_faithful_unet_port_with_a_conv_bias_before_batch_norm_agrees_over_30_steps(tmp_path) -> None:
    """numpy holds the weights and gradients to the migration guide's tolerance: atol 1e-5 with numpy's
    rtol (1e-7) for the first 10 steps, rtol 0.05 after them. Held to rtol 1e-6 at every step, a run
    whose gradients a ReLU flip moved 1.8e-5 late in training failed here (1 of about 20), though the
    guide's check passes it. In a run where even the guide's tolerance is exceeded, float32 rounding
    made the runs part (a deep ReLU net's chaos, which the README says a faithful port can show): the
    truth is then a divergence, which the tool must find no later than numpy; every other run agrees."""
    _keras(str(tmp_path / "tf2"), _tf1(str(tmp_path / "tf1")))
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1")), tensors_by_step(str(tmp_path / "tf2"))
    ulps: list[float] = []
    apart = None  # numpy: the first step a checked weight or gradient is past the guide's tolerance
    for s in range(STEPS):
        for kind in ("weight", "grad"):  # numpy: the port agrees within the migration guide's tolerance
            for needle in ("enc1/kernel", "enc1/bias", "mid/kernel", "logits/kernel"):
                rtol = 1e-7 if s < 10 else 0.05
                if not np.allclose(
                    logged_value(tf2, s, kind, needle), logged_value(tf1, s, kind, needle), rtol=rtol, atol=1e-5
                ):
                    apart = s if apart is None else apart
        if apart is not None:
            break
        kernel = logged_value(tf1, s, "grad", "enc1/kernel")
        bias_b, bias_c = logged_value(tf1, s, "grad", "enc1/bias"), logged_value(tf2, s, "grad", "enc1/bias")
        ulp = max(np.abs(kernel).max(), np.abs(bias_b).max()) * 2.0**-23  # of the layer's gradient scale
        assert np.abs(bias_b).max() < 1e-4 * ulp * 2**23  # the bias's gradient is rounding noise
        ulps.append(np.abs(bias_c - bias_b).max() / ulp)
    # numpy: within the slot's allowance at every step before any real parting
    assert max(ulps, default=0) <= tolerance.SLOT_NOISE_OF_MAX * 2**23, ulps
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    if apart is not None:  # a unit flipped: a true divergence, found no later than numpy finds it
        first = report.first_divergence
        assert first is not None and first.step <= apart, (first, apart)
        return
    assert 4 < max(ulps), ulps  # apart past the old 4 ulps at some step
    assert report.agree, (report.first_divergence, report.tolerance_text)
