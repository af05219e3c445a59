"""A siamese port whose second use of the shared tower goes through ``tf.stop_gradient``: every
weight, both calls' outputs and the loss agree at step 0, and the tower's gradients differ (the
shared weight's gradient is the sum over its uses; the port keeps one). A new user's such port, and
a tied embedding whose output use was stopped, diverged at step 0 on a gradient with no note."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from test_shared_layer_outputs import BATCH, INIT, LR, XA, XB, D, E, H, Y, _tf1

from tb_parity_plugin import compare, summary_v2


def _stopped_port(run_dir: str) -> None:
    xa, xb = tf.keras.Input((D,)), tf.keras.Input((D,))
    hidden = tf.keras.layers.Dense(H, activation="relu", name="hidden")
    embed = tf.keras.layers.Dense(E, name="embed")
    ea, eb = embed(hidden(xa)), tf.keras.layers.Lambda(tf.stop_gradient)(embed(hidden(xb)))
    logits = tf.keras.layers.Dense(1, name="head")(tf.keras.layers.Lambda(lambda t: tf.abs(t[0] - t[1]))([ea, eb]))
    model = tf.keras.Model([xa, xb], logits)
    for name, kernel in INIT.items():
        model.get_layer(name).kernel.assign(kernel)
    model.compile(tf.keras.optimizers.SGD(LR), tf.keras.losses.BinaryCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["embed"])
    model.fit([XA, XB], Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def test_a_gradient_that_differs_under_an_agreeing_forward_pass_is_told_so(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _stopped_port(str(tmp_path / "tf2"))
    tf1, port = (tensors_by_step(str(tmp_path / run))[0] for run in ("tf1", "tf2"))
    # numpy on the recorded step 0: the loss and both calls' outputs equal, the tower's gradient not
    for key in (("loss", "loss"), ("activation", "embed"), ("activation", "embed/call_1")):
        np.testing.assert_allclose(np.asarray(tf1[key][2]).ravel(), np.asarray(port[key][2]).ravel(), atol=1e-6)
    grad = np.asarray(tf1[("grad", "tower/embed/kernel:0")][2])
    assert np.abs(grad - np.asarray(port[("grad", "embed/kernel:0")][2])).max() > 100 * 1e-5
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (0, "grad"), first
    assert first.note and "the forward pass agrees and the backward pass does not" in first.note, first.note
    assert "stop_gradient" in first.note and "sum over them" in first.note, first.note
