"""Layers that start identical (batch norm: gamma 1, beta 0) created in another order by the port.

Keras names layers of one type by creation order, so a port that creates its batch-norm layers in
another order than the TF1 graph calls them gets their names swapped, and every batch-norm layer
starts from the same values: first values cannot tell them apart (a reviewer's Dense+BatchNorm
port got a false DIVERGE on ``grad/batch_normalization/gamma``). The first step where they differ
(here the gradients at step 0) does. Written the way users write it: a ``None`` batch dimension,
``UPDATE_OPS`` on the TF1 side, Keras defaults for batch norm, momentum on both sides. Every
expectation is checked against numpy.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import pytest
import tensorflow as tf

from tb_parity_plugin import compare, summary_v1, summary_v2
from tb_parity_plugin.engine import Comparison
from tb_parity_plugin.logdir.reader import LogdirReader

STEPS = 3
LR, MOMENTUM = 0.1, 0.9
RNG = np.random.default_rng(11)
XS = (RNG.standard_normal((STEPS, 16, 3)) * 2.0 + 1.0).astype(np.float32)
YS = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, (STEPS, 16))]
#: dense kernels by role: 3 -> 4 -> 4 -> 3; roles 0 and 1 are each followed by batch norm
KERNELS = [RNG.standard_normal(shape).astype(np.float32) for shape in ((3, 4), (4, 4), (4, 3))]


def _train_tf1(run_dir: str) -> None:
    """The TF1 original: dense -> batch norm -> relu, twice, then dense; batch norm updated through
    ``UPDATE_OPS``; activations named by role."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, (None, 3))
        y = tf.compat.v1.placeholder(tf.float32, (None, 3))
        h = x
        for role in range(2):
            h = tf.compat.v1.layers.dense(
                h, 4, use_bias=False, kernel_initializer=tf.constant_initializer(KERNELS[role])
            )
            h = rec.activation(f"bn{role}", tf.compat.v1.layers.batch_normalization(h, training=True))
            h = tf.nn.relu(h)
        logits = tf.compat.v1.layers.dense(h, 3, kernel_initializer=tf.constant_initializer(KERNELS[2]))
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM)
        grads_and_vars = opt.compute_gradients(loss)
        rec.grads(*zip(*grads_and_vars))
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = opt.apply_gradients(grads_and_vars, global_step=gs)
        rec.set_step(gs)
        rec.variables(optimizer=opt)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(STEPS):
                _, parity = sess.run([train_op, fetches], {x: XS[step], y: YS[step]})
                rec.write(parity)
        rec.close()


def _train_tf2(
    run_dir: str,
    bn_order: tuple[int, ...],
    epsilon: Optional[dict[int, float]] = None,
    phases: Sequence[range] = (range(STEPS),),
    after_phase: Callable[[], None] = lambda: None,
) -> dict[int, str]:
    """The Keras port, its batch-norm layers created in ``bn_order`` (so named in that order), each
    with Keras' defaults unless ``epsilon`` gives a role another one, trained in ``phases`` (each a
    session of its own into the run, ``after_phase`` called after each). Returns each role's
    batch-norm layer name."""
    tf.keras.backend.clear_session()  # Keras numbers layers per process: start from `dense` as a fresh port would
    dense = [
        tf.keras.layers.Dense(k.shape[1], use_bias=role == 2, kernel_initializer=tf.constant_initializer(k))
        for role, k in enumerate(KERNELS)
    ]
    bn = {role: tf.keras.layers.BatchNormalization(epsilon=(epsilon or {}).get(role, 1e-3)) for role in bn_order}
    inputs = tf.keras.Input((3,))
    h = inputs
    for role in range(2):
        h = tf.keras.layers.ReLU()(bn[role](dense[role](h)))
    model = tf.keras.Model(inputs, dense[2](h))
    opt = tf.keras.optimizers.SGD(LR, momentum=MOMENTUM)
    ce = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    for phase in phases:
        _train_phase(summary_v2.Recorder(run_dir), phase, dense, bn, model, opt, ce)
        after_phase()
    return {role: bn[role].name for role in bn}


def _train_phase(rec: Any, steps: range, dense: list, bn: dict, model: Any, opt: Any, ce: Any) -> None:
    """One training session of the port, recorded by ``rec`` (closed at the end)."""

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(opt.learning_rate)
            with tf.GradientTape() as tape:
                h = x
                for role in range(2):
                    h = tf.nn.relu(rec.activation(f"bn{role}", bn[role](dense[role](h), training=True)))
                loss = rec.loss(ce(y, dense[2](h)))
            grads = tape.gradient(loss, model.trainable_variables)
            rec.grads(grads, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

    for step in steps:
        train_step(tf.constant(XS[step]), tf.constant(YS[step]))
    rec.close()


def _numpy_bn0(epsilon: dict[int, float]) -> list[np.ndarray]:
    """Independent reference of step 0's batch-norm outputs by role (training mode: the batch's own
    mean and population variance; gamma 1, beta 0)."""
    h, out = XS[0].astype(np.float64), []
    for role in range(2):
        z = h @ KERNELS[role]
        bn = (z - z.mean(0)) / np.sqrt(z.var(0) + epsilon.get(role, 1e-3))
        out.append(bn)
        h = np.maximum(bn, 0)
    return out


def test_batch_norm_layers_created_in_another_order_are_paired_by_where_they_first_differ(tmp_path) -> None:
    """numpy's reason it agrees: each role computes the same function from the same start on both
    sides; only the names of the batch-norm layers are swapped."""
    _train_tf1(str(tmp_path / "tf1"))
    names = _train_tf2(str(tmp_path / "tf2"), bn_order=(1, 0))
    assert names == {1: "batch_normalization", 0: "batch_normalization_1"}  # the names did swap
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.warnings)
    paired = {(m["kind"], m["baseline"]): (m["candidate"], m["how"]) for m in report.to_dict()["mapping"]}
    assert paired[("weight", "batch_normalization/gamma:0")] == ("batch_normalization_1/gamma:0", "first values")
    assert paired[("grad", "batch_normalization_1/beta:0")] == ("batch_normalization/beta:0", "first values")
    assert paired[("state", "batch_normalization/moving_mean:0")][0] == "batch_normalization_1/moving_mean:0"
    assert any("batch_normalization/* with batch_normalization_1/*" in w for w in report.warnings)


@pytest.mark.parametrize("bn_order", [(0, 1), (1, 0)], ids=["same_order", "another_order"])
def test_a_wrong_epsilon_on_one_batch_norm_diverges_on_that_layer_whatever_the_creation_order(
    tmp_path, bn_order: tuple[int, ...]
) -> None:
    """The port gives role 1's batch norm epsilon 0.1: numpy says role 0's output agrees at step 0
    and role 1's does not, so the first divergence is ``activation/bn1`` at step 0, and the layer
    it is blamed on in the mapping is role 1's, not the other one."""
    _train_tf1(str(tmp_path / "tf1"))
    eps = {1: 0.1}
    _train_tf2(str(tmp_path / "tf2"), bn_order=bn_order, epsilon=eps)
    want, faithful = _numpy_bn0(eps), _numpy_bn0({})
    np.testing.assert_allclose(want[0], faithful[0])
    assert np.abs(want[1] - faithful[1]).max() > 1e-2
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "bn1")
    paired = {(m["kind"], m["baseline"]): m["candidate"] for m in report.to_dict()["mapping"]}
    role1 = "batch_normalization_1" if bn_order == (0, 1) else "batch_normalization"
    assert paired[("weight", "batch_normalization_1/gamma:0")] == f"{role1}/gamma:0"


def test_a_refresh_pairs_them_anew_when_the_step_that_tells_them_apart_arrives(tmp_path) -> None:
    """The port with role 1's epsilon wrong, watched while it trains. After step 0 nothing tells the
    batch-norm layers apart (the wrong epsilon spreads to both layers' gradients; their state still
    starts at 0 and 1), so they stay paired by name; step 1's moving statistics (which numpy says
    differ by layer, and which the wrong epsilon does not touch: it acts after them) pair them by
    role. Each refresh says what a fresh comparison says: the mapping included."""
    _train_tf1(str(tmp_path / "tf1"))
    z0 = XS[1].astype(np.float64) @ KERNELS[0]  # role 0's batch input at step 1, before any update
    assert np.abs(z0.mean(0)).max() > 1e-2  # so step 1's moving mean of role 0 is not its start
    reader = LogdirReader(str(tmp_path))
    comparisons: list[Comparison] = []
    mappings = []

    def refresh() -> None:
        reader.reload()
        b, c = reader.run("tf1"), reader.run("tf2")
        if comparisons:
            comparisons[0].update(b, c)
        else:
            comparisons.append(Comparison(b, c))
        report = comparisons[0].report()
        comparisons[0].matrix()
        assert report.to_dict() == Comparison(b, c).report().to_dict()
        mappings.append({(m["kind"], m["baseline"]): m["candidate"] for m in report.to_dict()["mapping"]})

    _train_tf2(
        str(tmp_path / "tf2"),
        bn_order=(1, 0),
        epsilon={1: 0.1},
        phases=(range(1), range(1, STEPS)),
        after_phase=refresh,
    )
    reader.close()
    gamma = ("weight", "batch_normalization/gamma:0")
    assert [m[gamma] for m in mappings] == ["batch_normalization/gamma:0", "batch_normalization_1/gamma:0"]
