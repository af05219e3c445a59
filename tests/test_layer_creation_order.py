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
from engine_helpers import Watch

from tb_parity_plugin import compare, summary_v1, summary_v2

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
        _train_with_momentum(rec, gs, loss, {x: XS, y: YS}, grads=True)


def _train_with_momentum(rec: Any, gs: Any, loss: Any, feeds: dict, grads: bool) -> None:
    """The TF1 training tail both originals share: Momentum, the train op waiting for ``UPDATE_OPS``,
    every variable and slot recorded (gradients when ``grads``), one ``sess.run`` per batch of
    ``feeds`` (placeholder -> batches), then the recorder closed."""
    opt = tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM)
    grads_and_vars = opt.compute_gradients(loss)
    if grads:
        rec.grads(*zip(*grads_and_vars))
    with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
        train_op = opt.apply_gradients(grads_and_vars, global_step=gs)
    rec.set_step(gs)
    rec.variables(optimizer=opt)
    fetches = rec.fetches
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(len(next(iter(feeds.values())))):
            _, parity = sess.run([train_op, fetches], {p: batches[step] for p, batches in feeds.items()})
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
    watch = Watch(str(tmp_path))
    _train_tf2(
        str(tmp_path / "tf2"), bn_order=(1, 0), epsilon={1: 0.1}, phases=(range(1), range(1, STEPS)), after_phase=watch
    )
    watch.close()
    mappings = [{(m["kind"], m["baseline"]): m["candidate"] for m in r.to_dict()["mapping"]} for r in watch.reports]
    gamma = ("weight", "batch_normalization/gamma:0")
    assert [m[gamma] for m in mappings] == ["batch_normalization/gamma:0", "batch_normalization_1/gamma:0"]


def _bn_stack(
    root: str,
    widths: tuple[int, ...],
    bn_order: tuple[int, ...],
    bn_kw: Optional[dict] = None,
    grads: bool = True,
    port_every: int = 1,
    nested: bool = False,
) -> dict[int, str]:
    """TF1: per width, dense (no bias) -> batch norm (``bn_kw``) -> relu, then dense 3; Momentum,
    ``UPDATE_OPS``; every step logged. The port: the same in Keras, its batch-norm layers created in
    ``bn_order``, logging every ``port_every``-th step; ``nested``: each pair of roles inside a custom
    ``Layer`` (names ``block/batch_normalization...``), as a ResNet block is written. Gradients logged
    on both sides when ``grads``. Returns the port's batch-norm layer name (its variables' scope) by
    role: what each TF1 ``batch_normalization[_r]`` must be paired with."""
    rng = np.random.default_rng(len(widths) + sum(widths))
    xs = (rng.standard_normal((6, 16, 5)) * 2 + 0.5).astype(np.float32)
    ys = np.eye(3, dtype=np.float32)[rng.integers(0, 3, (6, 16))]
    dims = [5, *widths, 3]
    ks = [(rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32) for a, b in zip(dims, dims[1:])]
    bn_kw = bn_kw or {}
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(f"{root}/tf1")
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, (None, 5))
        y = tf.compat.v1.placeholder(tf.float32, (None, 3))
        h = x
        for k in ks[:-1]:
            h = tf.compat.v1.layers.dense(h, k.shape[1], use_bias=False, kernel_initializer=tf.constant_initializer(k))
            h = tf.nn.relu(tf.compat.v1.layers.batch_normalization(h, training=True, **bn_kw))
        logits = tf.compat.v1.layers.dense(h, 3, kernel_initializer=tf.constant_initializer(ks[-1]))
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        _train_with_momentum(rec, gs, loss, {x: xs, y: ys}, grads=grads)
    tf.keras.backend.clear_session()

    class Block(tf.keras.layers.Layer):
        def __init__(self, roles: tuple[int, ...]) -> None:
            super().__init__()
            self.roles = roles
            self.dense = {
                r: tf.keras.layers.Dense(
                    ks[r].shape[1], use_bias=False, kernel_initializer=tf.constant_initializer(ks[r])
                )
                for r in roles
            }
            self.bn = {r: tf.keras.layers.BatchNormalization(**bn_kw) for r in bn_order if r in roles}

        def call(self, h: tf.Tensor, training: Any = None) -> tf.Tensor:
            for r in self.roles:
                h = tf.nn.relu(self.bn[r](self.dense[r](h), training=training))
            return h

    roles = tuple(range(len(widths)))
    head = tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(ks[-1]))
    inputs = tf.keras.Input((5,))
    h = inputs
    if nested:
        blocks = [Block(roles[i : i + 2]) for i in range(0, len(roles), 2)]
        for block in blocks:
            h = block(h)
        found = {r: b.bn[r] for b in blocks for r in b.bn}
    else:  # a Functional model of plain layers: names without any scope
        dense = {
            r: tf.keras.layers.Dense(ks[r].shape[1], use_bias=False, kernel_initializer=tf.constant_initializer(ks[r]))
            for r in roles
        }
        found = {r: tf.keras.layers.BatchNormalization(**bn_kw) for r in bn_order}
        for r in roles:
            h = tf.keras.layers.ReLU()(found[r](dense[r](h)))
    model = tf.keras.Model(inputs, head(h))
    opt2 = tf.keras.optimizers.SGD(LR, momentum=MOMENTUM)
    ce = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    rec2 = summary_v2.Recorder(f"{root}/tf2")

    @tf.function
    def logged(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec2.step(opt2.iterations, variables=model, optimizer=opt2):
            with tf.GradientTape() as tape:
                loss = rec2.loss(ce(y, model(x, training=True)))
            g = tape.gradient(loss, model.trainable_variables)
            if grads:
                rec2.grads(g, model.trainable_variables)
            opt2.apply_gradients(zip(g, model.trainable_variables))

    @tf.function
    def silent(x: tf.Tensor, y: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            loss = ce(y, model(x, training=True))
        g = tape.gradient(loss, model.trainable_variables)
        opt2.apply_gradients(zip(g, model.trainable_variables))

    for step in range(len(xs)):
        (logged if step % port_every == 0 else silent)(tf.constant(xs[step]), tf.constant(ys[step]))
    rec2.close()
    return {r: layer.moving_mean.name.rsplit("/", 1)[0] for r, layer in found.items()}


@pytest.mark.parametrize(
    "case",
    ["port_logs_every_3rd_step", "batch_norm_without_gamma_and_beta", "layers_inside_a_custom_layer", "other_widths"],
)
def test_a_faithful_port_of_batch_norm_blocks_created_in_another_order_agrees(tmp_path, case: str) -> None:
    """A reviewer's faithful ports that still got a false DIVERGE: the port logs every 3rd step and
    records no gradients (the steps that tell the layers apart must be steps both runs logged);
    batch norm with ``center=False, scale=False`` (only moving statistics tell them apart); the
    port's layers inside a custom ``Layer`` (paired by creation order, not by name); batch-norm
    layers of widths 4 and 6 created in reverse order (the names pair a [4] with a [6]). Each role
    computes the same function from the same start on both sides, so the port agrees, and each TF1
    layer is paired with the port's layer of its role."""
    kwargs: dict[str, Any] = {
        "port_logs_every_3rd_step": dict(widths=(4, 4), bn_order=(1, 0), grads=False, port_every=3),
        "batch_norm_without_gamma_and_beta": dict(
            widths=(4, 4, 4), bn_order=(2, 1, 0), bn_kw={"center": False, "scale": False}
        ),
        "layers_inside_a_custom_layer": dict(widths=(4, 4, 4, 4), bn_order=(1, 0, 3, 2), nested=True),
        "other_widths": dict(widths=(4, 6), bn_order=(1, 0)),
    }[case]
    port = _bn_stack(str(tmp_path), **kwargs)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.warnings)
    paired = {m["baseline"]: m["candidate"] for m in report.to_dict()["mapping"] if m["kind"] == "state"}
    for role, scope in port.items():
        tf1_scope = "batch_normalization" + (f"_{role}" if role else "")
        assert paired[f"{tf1_scope}/moving_mean:0"] == f"{scope}/moving_mean:0"


def test_dense_layers_of_other_widths_created_in_another_order_pair_their_biases_with_their_kernels(tmp_path) -> None:
    """A reviewer's faithful Functional-model port (no model prefix) created its three Dense layers
    in another order: h1 (4->16), h2 (16->8) and out (8->8) are TF1's ``dense``, ``dense_1`` and
    ``dense_2`` but the port's ``dense_1``, ``dense_2`` and ``dense``. The exact-name stage paired
    TF1 ``dense_2/bias`` (out's) with the port's ``dense_2/bias`` (h2's, the same shape [8]) while the
    kernels went by shape: a false DIVERGE on a bias. Each layer's bias must follow its kernel; the
    port computes what TF1 does (each role starts from the same kernel and bias, drawn here with
    numpy, and sees the same batches)."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((3, 16, 4)).astype(np.float32)
    ys = np.eye(8, dtype=np.float32)[rng.integers(0, 8, (3, 16))]
    roles = {"h1": (4, 16), "h2": (16, 8), "out": (8, 8)}
    kernels = {r: (rng.standard_normal(shape) * 0.3).astype(np.float32) for r, shape in roles.items()}
    biases = {r: (rng.standard_normal(shape[1]) * 0.2).astype(np.float32) for r, shape in roles.items()}

    def dense(r: str, tf1: bool) -> Any:
        init = dict(
            kernel_initializer=tf.constant_initializer(kernels[r]), bias_initializer=tf.constant_initializer(biases[r])
        )
        return (
            (lambda h: tf.compat.v1.layers.dense(h, roles[r][1], **init))
            if tf1
            else tf.keras.layers.Dense(roles[r][1], **init)
        )

    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, (None, 4))
        y = tf.compat.v1.placeholder(tf.float32, (None, 8))
        h = x
        for r in roles:
            h = rec.activation(r, dense(r, tf1=True)(h))
            h = tf.nn.relu(h) if r != "out" else h
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, h))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(3):
                _, parity = sess.run([train_op, fetches], {x: xs[step], y: ys[step]})
                rec.write(parity)
        rec.close()
    tf.keras.backend.clear_session()
    layers = {r: dense(r, tf1=False) for r in ("out", "h1", "h2")}  # created in another order
    inputs = tf.keras.Input((4,))
    h = inputs
    for r in roles:
        h = layers[r](h)
        h = tf.nn.relu(h) if r != "out" else h
    model = tf.keras.Model(inputs, h)
    opt = tf.keras.optimizers.SGD(LR)
    ce = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    rec2 = summary_v2.Recorder(str(tmp_path / "tf2"))

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec2.step(opt.iterations, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                h = x
                for r in roles:
                    h = rec2.activation(r, layers[r](h))
                    h = tf.nn.relu(h) if r != "out" else h
                loss = rec2.loss(ce(y, h))
            grads = tape.gradient(loss, model.trainable_variables)
            rec2.grads(grads, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

    for step in range(3):
        train_step(tf.constant(xs[step]), tf.constant(ys[step]))
    rec2.close()
    port = {r: layers[r].bias.name for r in roles}
    assert port == {"h1": "dense_1/bias:0", "h2": "dense_2/bias:0", "out": "dense/bias:0"}  # the names did move
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.warnings)
    paired = {(m["kind"], m["baseline"]): m["candidate"] for m in report.to_dict()["mapping"]}
    for r, tf1_name in zip(roles, ("dense", "dense_1", "dense_2")):
        for kind in ("weight", "grad"):
            assert paired[(kind, f"{tf1_name}/bias:0")] == port[r]
            assert paired[(kind, f"{tf1_name}/kernel:0")] == port[r].replace("bias", "kernel")


def _two_layer_runs(port_outputs_in_name_order: bool, branches: bool = False) -> tuple:
    """Two same-shaped dense layers whose port holds each other's initial weights under each
    other's names. Created in another order, the port's ``dense_2`` runs first (its output is
    recorded first, like the baseline's ``dense_1``); with a checkpoint that loaded them crosswise,
    each runs where its name says."""
    from engine_helpers import run, series

    rng = np.random.default_rng(5)
    v1, v2 = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    base_out = [x @ v1, x @ v1 @ v2]
    base = run(
        "tf1",
        [
            series("weight", "dense_1/kernel:0", [v1], order=0),
            series("weight", "dense_2/kernel:0", [v2], order=1),
            series("activation", "dense_1", [base_out[0]], order=2),
            series("activation", "dense_2", [base_out[1]], order=3),
        ],
    )
    if branches:  # two towers on one input, run in either order: the port's dense_1 is tower 2
        base = run(
            "tf1",
            [
                series("weight", "dense_1/kernel:0", [v1], order=0),
                series("weight", "dense_2/kernel:0", [v2], order=1),
                series("activation", "dense_1", [x @ v1], order=2),
                series("activation", "dense_2", [x @ v2], order=3),
            ],
        )
        outs = {"dense_1": x @ v2, "dense_2": x @ v1}
        orders = {"dense_1": 2, "dense_2": 3}
    elif port_outputs_in_name_order:  # loaded crosswise: dense_1 (first) holds v2
        outs = {"dense_1": x @ v2, "dense_2": x @ v2 @ v1}
        orders = {"dense_1": 2, "dense_2": 3}
    else:  # created in another order: dense_2 (holding v1) runs first, as faithful as the baseline
        outs = {"dense_2": base_out[0], "dense_1": base_out[1]}
        orders = {"dense_2": 2, "dense_1": 3}
    cand = run(
        "tf2",
        [
            series("weight", "dense_1/kernel:0", [v2], order=0),
            series("weight", "dense_2/kernel:0", [v1], order=1),
            *(series("activation", n, [outs[n]], order=orders[n]) for n in ("dense_1", "dense_2")),
        ],
    )
    return base, cand


def test_layers_loaded_crosswise_diverge_on_their_weights_not_behind_an_output() -> None:
    """A new user's port restored a TF1 checkpoint with dense_1 and dense_2 swapped: the tool paired
    the layers by their first values, said every weight agreed and blamed the output. Their outputs
    run in the order of their names, which a port created in another order does not do."""
    from engine_helpers import series

    from tb_parity_plugin.engine import Comparison

    report = Comparison(*_two_layer_runs(port_outputs_in_name_order=True)).report()
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor, first.candidate_tensor) == (
        0,
        "weight",
        "dense_1/kernel:0",
        "dense_1/kernel:0",
    )
    assert any("dense_1 starts like the port's dense_2" in w and "paired by name" in w for w in report.warnings)
    # created in another order: re-paired by values, and faithful
    report = Comparison(*_two_layer_runs(port_outputs_in_name_order=False)).report()
    assert report.agree, report.first_divergence
    assert any("paired dense_1/* with dense_2/* by their first-step values" in w for w in report.warnings)
    # a review's two towers, created in the other order and run in the order of their names: their
    # outputs agree paired by values, so they are re-paired (the order of branches proves nothing)
    report = Comparison(*_two_layer_runs(port_outputs_in_name_order=True, branches=True)).report()
    assert report.agree, report.first_divergence
    # the next review's: a real bug in one tower (a relu the port adds) leaves the other agreeing,
    # which is evidence enough; the first divergence is that tower's output, not a weight
    base, cand = _two_layer_runs(port_outputs_in_name_order=True, branches=True)
    bent = cand.tensors[("activation", "dense_2")]
    cand.tensors[("activation", "dense_2")] = series(
        "activation", "dense_2", [np.maximum(bent.values[0].reshape(3, 4), 0)], order=bent.order
    )
    first = Comparison(base, cand).report().first_divergence
    assert (first.kind, first.tensor, first.candidate_tensor) == ("activation", "dense_1", "dense_2"), first


# -- a residual block whose projection the port creates last -------------------------------------

RES_X = RNG.standard_normal((2, 8, 8, 8, 3)).astype(np.float32)
RES_Y = np.eye(2, dtype=np.float32)[RNG.integers(0, 2, (2, 8))]
#: by role: the 1x1 projection, the main path's two 3x3 convs, the head
RES_K = {
    "proj": (RNG.standard_normal((1, 1, 3, 4)) * 0.5).astype(np.float32),
    "a": (RNG.standard_normal((3, 3, 3, 4)) * 0.3).astype(np.float32),
    "b": (RNG.standard_normal((3, 3, 4, 4)) * 0.3).astype(np.float32),
    "head": (RNG.standard_normal((64, 2)) * 0.2).astype(np.float32),
}


def _residual_tf1(run_dir: str) -> None:
    """TF1 creates the projection first (``conv2d``), then the main path (``conv2d_1``, stride 2,
    and ``conv2d_2``); each output recorded under its layer's name, as ``instrument`` names them."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, (None, 8, 8, 3))
        y = tf.compat.v1.placeholder(tf.float32, (None, 2))

        def conv(h: Any, role: str, size: int, stride: int, name: str) -> Any:
            out = tf.compat.v1.layers.conv2d(
                h,
                4,
                size,
                stride,
                "same",
                use_bias=False,
                kernel_initializer=tf.constant_initializer(RES_K[role]),
                name=name,
            )
            return rec.activation(name, out)

        shortcut = conv(x, "proj", 1, 2, "conv2d")
        main = conv(tf.nn.relu(conv(x, "a", 3, 2, "conv2d_1")), "b", 3, 1, "conv2d_2")
        flat = tf.compat.v1.layers.flatten(tf.nn.relu(shortcut + main))
        logits = tf.compat.v1.layers.dense(flat, 2, kernel_initializer=tf.constant_initializer(RES_K["head"]))
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        _train_with_momentum(rec, gs, loss, {x: RES_X, y: RES_Y}, grads=True)


def _residual_port(run_dir: str, stride_moved: bool) -> dict[str, np.ndarray]:
    """The Keras port creates the main path first (``conv2d``, ``conv2d_1``) and the projection last
    (``conv2d_2``); ``stride_moved``: the main path's stride on its second conv instead of its
    first (the block's output has the same shape). Returns each layer's output at step 0, by role."""
    tf.keras.backend.clear_session()
    a_stride, b_stride = (1, 2) if stride_moved else (2, 1)

    def conv(role: str, size: int, stride: int) -> Any:
        return tf.keras.layers.Conv2D(
            4, size, stride, "same", use_bias=False, kernel_initializer=tf.constant_initializer(RES_K[role])
        )

    a, b, proj = conv("a", 3, a_stride), conv("b", 3, b_stride), conv("proj", 1, 2)
    inputs = tf.keras.Input((8, 8, 3))
    main = b(tf.keras.layers.ReLU()(a(inputs)))
    joined = tf.keras.layers.ReLU()(tf.keras.layers.Add()([proj(inputs), main]))
    head = tf.keras.layers.Dense(2, kernel_initializer=tf.constant_initializer(RES_K["head"]))
    model = tf.keras.Model(inputs, head(tf.keras.layers.Flatten()(joined)))
    probe = tf.keras.Model(inputs, [proj(inputs), a(inputs), main])
    before = dict(zip(("proj", "a", "b"), (t.numpy() for t in probe(RES_X[0]))))
    model.compile(
        tf.keras.optimizers.SGD(LR, momentum=MOMENTUM), loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    )
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=[a, b, proj])
    model.fit(RES_X.reshape(-1, 8, 8, 3), RES_Y.reshape(-1, 2), batch_size=8, shuffle=False, verbose=0)
    rec.close()
    return before


def _conv_numpy(x: np.ndarray, k: np.ndarray, stride: int) -> np.ndarray:
    """A "same" convolution (odd kernel: symmetric padding, TF's for these sizes and strides 1, 2 on 8)."""
    pad = k.shape[0] // 2
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    n = (x.shape[1] + stride - 1) // stride
    out = np.zeros((len(x), n, n, k.shape[3]))
    for i in range(n):
        for j in range(n):
            patch = xp[:, i * stride : i * stride + k.shape[0], j * stride : j * stride + k.shape[1]]
            out[:, i, j] = np.tensordot(patch, k.astype(np.float64), axes=3)
    return out


@pytest.mark.parametrize("stride_moved", [False, True])
def test_layer_outputs_of_a_block_created_in_another_order_follow_their_layers(tmp_path, stride_moved: bool) -> None:
    """A new user's ResNet port created its projection last and moved a stride to the wrong conv:
    the verdict named TF1's projection (``conv2d``), which numpy says agrees, against the port's
    ``conv2d`` (the main path's first conv). Both runs have outputs named ``conv2d``, of other layers
    and shapes, and the check that an output may follow its layer read one run's shape for both."""
    _residual_tf1(str(tmp_path / "tf1"))
    before = _residual_port(str(tmp_path / "tf2"), stride_moved)
    x = RES_X[0]
    want_proj = _conv_numpy(x, RES_K["proj"], 2)
    np.testing.assert_allclose(before["proj"], want_proj, atol=1e-5)  # the projection agrees either way
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    pairs = {(m["baseline"], m["candidate"]) for m in report.to_dict()["mapping"] if m["kind"] == "activation"}
    assert {("conv2d", "conv2d_2"), ("conv2d_1", "conv2d"), ("conv2d_2", "conv2d_1")} <= pairs, pairs
    if not stride_moved:
        assert report.agree, report.first_divergence
        return
    want_a = _conv_numpy(x, RES_K["a"], 2)
    assert before["a"].shape == (8, 8, 8, 4) and want_a.shape == (8, 4, 4, 4)
    first = report.first_divergence
    assert first is not None and (first.step, first.tensor, first.candidate_tensor, first.reason) == (
        0,
        "conv2d_1",
        "conv2d",
        "shape",
    ), first


def test_outputs_of_layers_nothing_told_apart_keep_the_partner_of_their_shape() -> None:
    """The review of the change above: two convs starting from one kernel (nothing tells them
    apart, a warning says so), of other strides, created in another order by a faithful port whose
    every output is the baseline's. Their guessed pairing must not carry the outputs across shapes:
    a false shape DIVERGE. Paired by shape, each output is the baseline's (numpy: equal arrays)."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    rng = np.random.default_rng(0)
    k = rng.standard_normal((3, 3, 4, 4)).astype(np.float32)
    a = rng.standard_normal((2, 8, 8, 4)).astype(np.float32)  # the stride-1 conv's output
    b = rng.standard_normal((2, 4, 4, 4)).astype(np.float32)  # the stride-2 conv's

    def side(name: str, layers: tuple[str, str], ran: tuple[str, str]) -> Any:
        """Both kernels ``k`` (created in ``layers`` order); outputs ``a``, ``b`` from ``ran``."""
        kernels = [series("weight", f"{layer}/kernel:0", [k], order=i) for i, layer in enumerate(layers)]
        outputs = [series("activation", layer, [out], order=2 + i) for i, (layer, out) in enumerate(zip(ran, (a, b)))]
        return run(name, kernels + outputs)

    base = side("tf1", ("conv_s1", "conv_s2"), ("conv_s1", "conv_s2"))
    cand = side("tf2", ("conv2d", "conv2d_1"), ("conv2d_1", "conv2d"))  # Keras created the stride-2 one first
    report = Comparison(base, cand).report()
    assert report.agree, report.first_divergence
    assert any("cannot be told apart" in w for w in report.warnings)


def test_layers_re_paired_by_values_with_no_output_recorded_are_said_maybe_loaded_crosswise() -> None:
    """A helper's MobileNetV2 converter sorted its names and loaded two blocks' same-shaped kernels
    crosswise; none of their outputs was recorded, so the tool re-paired them by their values, they
    agreed, and the warning blamed Keras's numbering alone while the divergence showed downstream.
    numpy: the port's network (v2 then v1) computes another logit than the original's (v1 then v2)."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    rng = np.random.default_rng(6)
    v1, v2 = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    assert not np.allclose(x @ v1 @ v2, x @ v2 @ v1, atol=1e-3)
    base = run(
        "tf1",
        [
            series("weight", "dense_1/kernel:0", [v1], order=0),
            series("weight", "dense_2/kernel:0", [v2], order=1),
            series("activation", "logits", [x @ v1 @ v2], order=2),
        ],
    )
    cand = run(
        "tf2",
        [
            series("weight", "dense_1/kernel:0", [v2], order=0),
            series("weight", "dense_2/kernel:0", [v1], order=1),
            series("activation", "logits", [x @ v2 @ v1], order=2),
        ],
    )
    report = Comparison(base, cand).report()
    first = report.first_divergence
    assert first is not None and (first.step, first.tensor) == (0, "logits"), first
    repaired = [w for w in report.warnings if "paired dense_1/* with dense_2/* by their first-step values" in w]
    assert repaired and "loaded their weights into other layers" in repaired[0], report.warnings
    # with their outputs recorded in the order they ran (created in another order, faithful): no such clause
    base, cand = _two_layer_runs(port_outputs_in_name_order=False)
    report = Comparison(base, cand).report()
    assert report.agree and not any("loaded their weights into other layers" in w for w in report.warnings)
