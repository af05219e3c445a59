"""A triplet port whose hinge is written ``max(0, d_ap - d_an - m)`` for TF1's ``max(0, d_ap - d_an + m)``:
no triplet passes the port's hinge at step 0, so its loss is exactly 0 there while TF1's is not (numpy),
every weight and embedding agreeing. The note said "units a ReLU switched off in one run ... or padding one
run masks", of a scalar loss; it now names a hinge or margin of another sign or size."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from test_shared_use_gradient_notes import BATCH, LR, MARGIN, NAMES, STEPS, W1, W2, XA, XN, XP, D, E, H, _tf1

from tb_parity_plugin import compare, summary_v2


def _numpy_hinges() -> tuple[float, float]:
    """float64, step 0: the mean of TF1's hinge and of the port's."""
    a, p, n = (np.maximum(x[:BATCH].astype(np.float64) @ W1, 0) @ W2 for x in (XA, XP, XN))
    gap = np.sum((a - p) ** 2, 1) - np.sum((a - n) ** 2, 1)
    return float(np.maximum(gap + MARGIN, 0).mean()), float(np.maximum(gap - MARGIN, 0).mean())


def _port_with_the_margin_subtracted(run_dir: str) -> None:
    tower = tf.keras.Sequential(
        [
            tf.keras.Input((D,)),
            tf.keras.layers.Dense(H, activation="relu", name="hidden"),
            tf.keras.layers.Dense(E, name="embed"),
        ]
    )
    tower.get_layer("hidden").kernel.assign(W1)
    tower.get_layer("embed").kernel.assign(W2)
    opt = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(xa: tf.Tensor, xp: tf.Tensor, xn: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=tower):
            with tf.GradientTape() as tape:
                a, p, n = (rec.activation(name, tower(x)) for name, x in zip(NAMES, (xa, xp, xn)))
                gap = tf.reduce_sum(tf.square(a - p), 1) - tf.reduce_sum(tf.square(a - n), 1)
                loss = rec.loss(tf.reduce_mean(tf.maximum(gap - MARGIN, 0.0)))
            rec.minimize(opt, loss, tower.trainable_variables, tape)

    for s in range(STEPS):
        rows = slice(s * BATCH, (s + 1) * BATCH)
        step(tf.constant(XA[rows]), tf.constant(XP[rows]), tf.constant(XN[rows]))
    rec.close()


def test_a_hinge_with_its_margin_flipped_is_named_as_such(tmp_path) -> None:
    tf1_loss, port_loss = _numpy_hinges()
    assert port_loss == 0.0 and tf1_loss > 0.01
    _tf1(str(tmp_path / "tf1"))
    _port_with_the_margin_subtracted(str(tmp_path / "tf2"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (0, "loss"), first
    assert abs(first.max_abs_diff - tf1_loss) < 1e-5, (first.max_abs_diff, tf1_loss)
    note = first.note or ""
    assert "exactly 0 in one run only: a hinge or margin loss" in note and "ReLU" not in note, note
