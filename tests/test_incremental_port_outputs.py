"""The migration guide's incremental port (``guide/migrate/model_mapping``): the TF1 model code kept
in a Keras layer decorated with ``track_tf1_style_variables``, one of its layers already a native
Keras ``Dense`` created in ``__init__``. The ``tf.compat.v1.layers`` after it are then numbered
without it (TF1's ``dense_2`` is the port's ``model/dense_1``), while the user names each recorded
output by its TF1 role on both sides. A new user's faithful port had its outputs moved onto the
outputs of the layers their variables pair with, by the port's own layer names: the neighbours'
outputs, a false structure DIVERGE at step 0. Every expectation is checked against numpy.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS = 3
LR = 0.1
RNG = np.random.default_rng(40)
XS = RNG.standard_normal((STEPS, 8, 4)).astype(np.float32)
YS = RNG.integers(0, 3, (STEPS, 8))
#: dense kernels by TF1 role (dense, dense_1, dense_2, dense_3): 4 -> 8 -> 8 -> 8 -> 3, biases 0
KERNELS = [RNG.uniform(-0.7, 0.7, shape).astype(np.float32) for shape in ((4, 8), (8, 8), (8, 8), (8, 3))]
ROLES = ("dense", "dense_1", "dense_2", "dense_3")
ALL = ROLES
INNER = ("dense_1", "dense_2")


def _train_tf1(run_dir: str, recorded: Sequence[str]) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, (None, 4))
        y = tf.compat.v1.placeholder(tf.int64, (None,))
        h = x
        for role, k in zip(ROLES, KERNELS):
            relu = tf.nn.relu if role != "dense_3" else None
            h = tf.compat.v1.layers.dense(h, k.shape[1], activation=relu, kernel_initializer=tf.constant_initializer(k))
            if role in recorded:
                rec.activation(role, h)
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, h))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        rec.variables()
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for xs, ys in zip(XS, YS):
                rec.write(sess.run([train_op, fetches], {x: xs, y: ys})[1])
        rec.close()


def _train_port(run_dir: str, recorded: Sequence[str], first_relu: bool = True) -> None:
    """The incremental port: TF1's ``dense_1`` a Keras ``Dense`` (``compat_model/model/dense``), the
    others still ``tf.compat.v1.layers.dense`` (``model/dense``, ``model/dense_1``, ``model/dense_2``),
    the TF1 checkpoint loaded by role; outputs recorded under their TF1 role names. ``first_relu``
    False: the port's first layer lost its relu (a bug upstream of every recorded output)."""
    rec = summary_v2.Recorder(run_dir)
    recording = [False]

    def out(role: str, h: tf.Tensor) -> tf.Tensor:
        return rec.activation(role, h) if recording[0] and role in recorded else h

    class CompatModel(tf.keras.layers.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.dense_layer = tf.keras.layers.Dense(8, activation="relu")

        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x: tf.Tensor) -> tf.Tensor:
            with tf.compat.v1.variable_scope("model"):
                h = out("dense", tf.compat.v1.layers.dense(x, 8, activation=tf.nn.relu if first_relu else None))
                h = out("dense_1", self.dense_layer(h))
                h = out("dense_2", tf.compat.v1.layers.dense(h, 8, activation=tf.nn.relu))
                return out("dense_3", tf.compat.v1.layers.dense(h, 3))

    model = CompatModel()
    model(tf.zeros((1, 4)))
    keras = {v.ref() for v in model.dense_layer.variables}

    def number(scope: str) -> int:  # the v1 layers' numbering goes on across the tests of a process
        return int(scope.rpartition("_")[2]) if "_" in scope.rpartition("/")[2] else 0

    v1 = sorted({v.name.rsplit("/", 1)[0] for v in model.variables if v.ref() not in keras}, key=number)
    role_of = dict(zip(v1, (0, 2, 3)))  # the roles around the Keras layer's (1)
    for v in model.variables:
        scope, leaf = v.name[:-2].rsplit("/", 1)
        k = KERNELS[1 if v.ref() in keras else role_of[scope]]
        v.assign(k if leaf == "kernel" else np.zeros(k.shape[1], np.float32))
    opt = tf.keras.optimizers.SGD(LR)
    ce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            recording[0] = True
            with tf.GradientTape() as tape:
                loss = rec.loss(ce(y, model(x)))
            recording[0] = False
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for xs, ys in zip(XS, YS):
        step(tf.constant(xs), tf.constant(ys))
    rec.close()


def _numpy_outputs(x: np.ndarray) -> dict[str, np.ndarray]:
    """Each TF1 role's output at step 0 (the checkpoint's weights, biases 0)."""
    found, h = {}, x.astype(np.float64)
    for role, k in zip(ROLES, KERNELS):
        h = h @ k
        h = np.maximum(h, 0) if role != "dense_3" else h
        found[role] = h
    return found


@pytest.mark.parametrize("recorded", [ALL, INNER], ids=["every_output", "inner_outputs"])
def test_a_faithful_incremental_port_agrees(tmp_path, recorded: Sequence[str]) -> None:
    _train_tf1(str(tmp_path / "tf1"), recorded)
    _train_port(str(tmp_path / "tf2"), recorded)
    want = _numpy_outputs(XS[0])
    for run in ("tf1", "tf2"):  # the independent check: each output is its role's on both sides
        got = tensors_by_step(str(tmp_path / run))[0]
        for role in recorded:
            np.testing.assert_allclose(got[("activation", role)][2], want[role], rtol=1e-5, atol=1e-6)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.to_dict()["warnings"])
    outputs = {m["baseline"]: m["candidate"] for m in report.to_dict()["mapping"] if m["kind"] == "activation"}
    assert outputs == {role: role for role in recorded}


def test_a_bug_upstream_of_every_output_is_found_on_the_first_output(tmp_path) -> None:
    """The port's first layer lost its relu: every output differs from the first on, so values
    cannot pair them; the names the user gave do. numpy: the first output differs, nothing before."""
    _train_tf1(str(tmp_path / "tf1"), ALL)
    _train_port(str(tmp_path / "tf2"), ALL, first_relu=False)
    got = tensors_by_step(str(tmp_path / "tf2"))[0][("activation", "dense")][2]
    np.testing.assert_allclose(got, XS[0].astype(np.float64) @ KERNELS[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, _numpy_outputs(XS[0])["dense"], atol=1e-3)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor, first.reason) == (0, "activation", "dense", "value"), first
    assert not report.to_dict()["unmatched"]["tf1"] and not report.to_dict()["unmatched"]["tf2"]
