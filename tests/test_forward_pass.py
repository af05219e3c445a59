"""Section 3 of issue 10: one forward pass each side, inference and training mode, no optimizer."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from capture_models import W1, W2, XS, keras_model
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

X = XS[0]


def _tf1(run_dir: str, dropout: bool = False) -> None:
    """The TF1 model built once per mode (shared variables), fetched in one ``sess.run``."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        x = tf.constant(X)
        for mode in ("inference", "training"):
            training = mode == "training"
            with rec.mode(mode), tf.compat.v1.variable_scope("", reuse=tf.compat.v1.AUTO_REUSE):
                h = tf.compat.v1.layers.dense(
                    x, 4, use_bias=False, kernel_initializer=tf.constant_initializer(W1), name="dense"
                )
                h = rec.activation("bn", tf.compat.v1.layers.batch_normalization(h, training=training))
                h = tf.nn.relu(h)
                if dropout:
                    h = rec.activation("dropout", tf.compat.v1.layers.dropout(h, 0.5, training=training))
                out = tf.compat.v1.layers.dense(h, 3, kernel_initializer=tf.constant_initializer(W2), name="dense_1")
                rec.output("output", out)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            rec.write(sess.run(rec.fetches), step=0)
        rec.close()


def _tf2(run_dir: str, bn_training=None, dropout_training=None, modes=("inference", "training")) -> None:
    model = keras_model()
    layers = model.layers
    if dropout_training is not None:
        layers = [*layers[:3], tf.keras.layers.Dropout(0.5, name="dropout"), layers[3]]
    rec = summary_v2.Recorder(run_dir)
    bn = layers[1]
    summary_v2.instrument_layer(rec, bn, "bn")
    if dropout_training is not None:
        summary_v2.instrument_layer(rec, layers[3], "dropout")

    class Port(tf.keras.Model):
        def call(self, x, training=None):
            h = bn(layers[0](x), training=training if bn_training is None else bn_training)
            h = layers[2](h)
            if dropout_training is not None:
                h = layers[3](h, training=dropout_training)
            return layers[-1](h)

    summary_v2.forward_pass(rec, Port(), tf.constant(X), modes=modes)
    rec.close()


def test_faithful_port_agrees_in_both_modes_with_a_numpy_reference(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _tf2(str(tmp_path / "tf2"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    got = tensors_by_step(str(tmp_path / "tf1"))[0]
    h = X.astype(np.float64) @ W1
    bn_inf = h / np.sqrt(1 + 1e-3)  # moving mean 0, variance 1
    bn_train = (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-3)
    np.testing.assert_allclose(got[("activation", "inference/bn")][2], bn_inf, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[("activation", "training/bn")][2], bn_train, rtol=1e-4, atol=1e-4)
    want = np.maximum(bn_train, 0) @ W2
    np.testing.assert_allclose(got[("output", "training/output")][2], want, rtol=1e-4, atol=1e-4)


def test_batch_norm_stuck_in_inference_diverges_in_training_mode_on_it(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _tf2(str(tmp_path / "tf2"), bn_training=False)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "training/bn")
    assert {d.tensor for d in report.divergences_at_first_step} == {"training/bn", "training/output"}


def test_dropout_left_on_diverges_in_inference_mode_on_it(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"), dropout=True)
    _tf2(str(tmp_path / "tf2"), dropout_training=True, modes=("inference",))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*/training/*"])
    first = report.first_divergence
    assert (first.kind, first.tensor) == ("activation", "inference/dropout")
