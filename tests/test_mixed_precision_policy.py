"""A port under Keras's ``mixed_float16`` global policy is said to compute in float16.

A new user's faithful mixed-precision port (activations recorded cast to float32, as the README says)
diverged at step 0 on a layer's output and was told the layer "computes another function of its
input", with no word of float16. The TF2 shim now records the Keras global policy in its run info,
and a value divergence between a mixed run and one that is not names the policy (and the report
warns of it once). numpy says how far float16 moves the output: past the default atol, within
float16's resolution.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from tf1_session import train

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(30)
STEPS, BATCH, LR = 2, 8, 0.05
X = RNG.standard_normal((STEPS * BATCH, 6)).astype(np.float32)
Y = RNG.standard_normal((STEPS * BATCH, 1)).astype(np.float32)
K = (RNG.standard_normal((6, 5)) * 0.7).astype(np.float32)
K2 = (RNG.standard_normal((5, 1)) * 0.7).astype(np.float32)


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 6])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        h = rec.activation("dense", tf.compat.v1.layers.dense(x, 5, kernel_initializer=tf.constant_initializer(K)))
        out = tf.compat.v1.layers.dense(h, 1, kernel_initializer=tf.constant_initializer(K2))
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        train(rec, train_op, [x, y], [X, Y], STEPS, BATCH)


def _port(run_dir: str, policy: Optional[str], kernel: np.ndarray = K) -> None:
    """The port in a custom step as the README's mixed-precision section records it."""
    if policy:
        tf.keras.mixed_precision.set_global_policy(policy)
    try:
        dense = tf.keras.layers.Dense(5, kernel_initializer=tf.constant_initializer(kernel), name="dense")
        head = tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(K2), dtype="float32", name="head")
        inputs = tf.keras.Input((6,))
        model = tf.keras.Model(inputs, head(dense(inputs)))
        opt = tf.keras.optimizers.SGD(LR)
        rec = summary_v2.Recorder(run_dir)
        for s in range(STEPS):
            rows = slice(s * BATCH, (s + 1) * BATCH)
            with rec.step(opt.iterations, variables=model, optimizer=opt):
                with tf.GradientTape() as tape:
                    h = dense(X[rows])
                    rec.activation("dense", tf.cast(h, tf.float32))
                    loss = rec.loss(tf.reduce_mean(tf.square(head(h) - Y[rows])))
                rec.minimize(opt, loss, model.trainable_variables, tape)
        rec.close()
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def _said_float16(tmp_path: Any) -> Any:
    """The ``mixed`` run against ``tf1``: numpy says float16 moved the step-0 output past the default
    atol (1e-5), within float16's resolution, and the first divergence there says float16. The report."""
    recorded = np.asarray(tensors_by_step(str(tmp_path / "mixed"))[0][("activation", "dense")][2], np.float64)
    exact = X[:BATCH].astype(np.float64) @ K.astype(np.float64)
    gap = np.abs(recorded.reshape(exact.shape) - exact).max()
    assert 1e-5 < gap < 4 * 2.0**-11 * np.abs(exact).max(), gap
    report = compare(str(tmp_path), baseline="tf1", candidate="mixed", allow_unmatched=["lr/*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "dense"), first
    assert "'mixed' computed under the Keras mixed_float16 policy (float16 compute" in (first.note or ""), first.note
    return report


def test_a_mixed_float16_port_is_said_to_compute_in_float16(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "mixed"), "mixed_float16")
    report = _said_float16(tmp_path)
    assert sum("mixed_float16 policy" in w for w in report.warnings) == 1, report.warnings


def test_a_bfloat16_port_against_a_float16_one_is_said_to_compute_coarser(tmp_path) -> None:
    """Both runs mixed, of other precisions (a review found no clause once both counted as mixed)."""
    _port(str(tmp_path / "half"), "mixed_float16")
    _port(str(tmp_path / "brain"), "mixed_bfloat16")
    half, brain = (
        np.asarray(tensors_by_step(str(tmp_path / run))[0][("activation", "dense")][2], np.float64)
        for run in ("half", "brain")
    )
    exact = (X[:BATCH].astype(np.float64) @ K.astype(np.float64)).reshape(half.shape)
    # numpy: bfloat16 (8 significant bits) lands further from the exact output than float16 (11)
    assert np.abs(brain - exact).max() > np.abs(half - exact).max() and np.abs(brain - half).max() > 1e-5
    report = compare(str(tmp_path), baseline="half", candidate="brain", allow_unmatched=["lr/*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.tensor) == (0, "dense"), first
    assert "'brain' computed under the Keras mixed_bfloat16 policy (bfloat16 compute, 8 significant bits" in (
        first.note or ""
    ), first.note
    assert "'half' computed under mixed_float16 (float16 compute)" in (first.note or ""), first.note


def test_a_float32_port_is_not_told_of_a_policy(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "plain"), None)
    report = compare(str(tmp_path), baseline="tf1", candidate="plain", allow_unmatched=["lr/*"])
    assert report.agree, report.first_divergence
    assert not any("policy" in w for w in report.warnings), report.warnings


def test_a_mixed_ports_kernel_apart_at_step_0_is_not_blamed_on_float16(tmp_path) -> None:
    """A kernel initialised otherwise is apart before anything is computed, and the policy keeps
    variables in float32: its note was float16's rounding alone. The warning still names the policy."""
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "mixed"), "mixed_float16", kernel=K * 1.1)
    recorded = tensors_by_step(str(tmp_path / "mixed"))[0][("weight", "dense/kernel:0")]
    assert recorded[0].dtype == "float32", recorded[0]
    gap = np.abs(np.asarray(recorded[2], np.float64).reshape(K.shape) - K).max()
    np.testing.assert_allclose(gap, 0.1 * np.abs(K).max(), rtol=1e-6)  # far past float16 rounding of K
    report = compare(str(tmp_path), baseline="tf1", candidate="mixed", allow_unmatched=["lr/*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "weight", "dense/kernel:0"), first
    assert "mixed_float16" not in (first.note or ""), first.note
    assert sum("mixed_float16 policy" in w for w in report.warnings) == 1, report.warnings


def test_a_keras_3_port_beside_tf_keras_is_said_to_compute_in_float16(tmp_path) -> None:
    """``import keras`` (Keras 3) with ``TF_USE_LEGACY_KERAS=1`` set, as the README asks for TF1's
    layers: ``tf.keras`` is tf_keras, whose policy stayed float32, and the run was recorded so."""
    import keras

    assert not keras.__version__.startswith("2.") and tf.keras.__name__ != keras.__name__
    _tf1(str(tmp_path / "tf1"))
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        dense = keras.layers.Dense(5, kernel_initializer=keras.initializers.Constant(K), name="dense")
        head = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(K2), dtype="float32", name="head")
        inputs = keras.Input((6,))
        model = keras.Model(inputs, head(dense(inputs)))
        opt = keras.optimizers.SGD(LR)
        rec = summary_v2.Recorder(str(tmp_path / "mixed"))
        for s in range(STEPS):
            rows = slice(s * BATCH, (s + 1) * BATCH)
            with rec.step(opt.iterations, variables=model, optimizer=opt):
                with tf.GradientTape() as tape:
                    h = dense(X[rows])
                    assert h.dtype == tf.float16
                    rec.activation("dense", tf.cast(h, tf.float32))
                    loss = rec.loss(tf.reduce_mean(tf.square(head(h) - Y[rows])))
                rec.minimize(opt, loss, model.trainable_variables, tape)
        rec.close()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    _said_float16(tmp_path)
