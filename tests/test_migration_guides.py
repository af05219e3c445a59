"""Section 4 of issue 10: the model of TensorFlow's guide ``guide/migrate/validate_correctness``
(input 3 -> dense 2 -> dense 2 -> dense 3, softmax cross-entropy, SGD with polynomial decay,
an L2 kernel regularizer), retyped here, logged through the shim as the README says: the
faithful port agrees, and each difference the guides discuss, planted in the port, is found
at the step and tensor an independent numpy computation says.

Batch-norm ``scale`` and random initial weights have their cases at the end of this file;
batch-norm updates, dropout and the training flag, and optimizer slots have theirs in
test_state_slots.py, test_forward_pass.py and test_fit.py.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import pytest
import tensorflow as tf
from engine_helpers import Watch

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS = 3
RNG = np.random.default_rng(3)
X = RNG.standard_normal((STEPS, 8, 3)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, (STEPS, 8))]
UNITS = (2, 2, 3)
NAMES = ("dense", "dense_1", "dense_2")
INIT = [(RNG.uniform(-1, 1, (i, o)).astype(np.float32), np.full(o, 0.1, np.float32)) for i, o in zip((3, 2, 2), UNITS)]
LR0, LR_END, DECAY = 0.5, 0.05, 10
L2 = 0.01
CLIP = 0.05


def lr_at(step: int) -> float:
    """numpy reference of polynomial_decay (power 1)."""
    return (LR0 - LR_END) * (1 - min(step, DECAY) / DECAY) + LR_END


def train_tf1(run_dir: str, steps: int = STEPS) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, (8, 3))
        y = tf.compat.v1.placeholder(tf.float32, (8, 3))
        h = x
        for units, name, (k, b) in zip(UNITS, NAMES, INIT):
            h = tf.compat.v1.layers.dense(
                h,
                units,
                kernel_initializer=tf.constant_initializer(k),
                bias_initializer=tf.constant_initializer(b),
                kernel_regularizer=tf.keras.regularizers.l2(L2),
                name=name,
            )
            rec.activation(name, h)
        loss = tf.compat.v1.losses.softmax_cross_entropy(y, h) + tf.compat.v1.losses.get_regularization_loss()
        rec.loss(loss)
        lr = rec.lr(tf.compat.v1.train.polynomial_decay(LR0, gs, DECAY, LR_END))
        opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
        grads, variables = zip(*opt.compute_gradients(loss))
        rec.grads(grads, variables)
        clipped, _ = tf.clip_by_global_norm(grads, CLIP)
        train_op = opt.apply_gradients(zip(clipped, variables), global_step=gs)
        rec.set_step(gs)
        rec.variables(optimizer=opt)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(steps):
                _, parity = sess.run([train_op, rec.fetches], {x: X[step % STEPS], y: Y[step % STEPS]})
                rec.write(parity)
        rec.close()


class Shifted(tf.keras.optimizers.schedules.LearningRateSchedule):
    """A schedule counting steps from ``shift`` (the guides' off-by-one when 1), from step ``start`` on."""

    def __init__(
        self, schedule: tf.keras.optimizers.schedules.LearningRateSchedule, shift: int, start: int = 0
    ) -> None:
        self.schedule, self.shift, self.start = schedule, shift, start

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        return self.schedule(step + self.shift * tf.cast(step >= self.start, step.dtype))

    def get_config(self) -> dict:
        return {"shift": self.shift, "start": self.start}


def train_tf2(
    run_dir: str,
    plant: Optional[str] = None,
    phases: Sequence[range] = (range(STEPS),),
    after_phase: Callable[[], None] = lambda: None,
    plant_from: int = 0,
) -> None:
    """The port. ``phases``: training sessions into one run (a job resumed: one event file each),
    ``after_phase`` called after each; ``plant_from``: the first step an lr plant affects."""
    init = [(k.copy(), b) for k, b in INIT]
    if plant == "initializer":
        init[1] = (tf.keras.initializers.GlorotUniform(seed=1)((2, 2)).numpy(), init[1][1])
    layers = [
        tf.keras.layers.Dense(
            units,
            kernel_initializer=tf.constant_initializer(k),
            bias_initializer=tf.constant_initializer(b),
            kernel_regularizer=tf.keras.regularizers.l2(L2),
        )
        for units, (k, b) in zip(UNITS, init)
    ]
    h_in = tf.keras.Input((3,))
    order = [2, 0, 1] if plant == "creation_order" else [0, 1, 2]
    for i in order:  # layers built (and so named) in another order
        layers[i](tf.zeros((1, (3, 2, 2)[i])))
    model = tf.keras.Model(h_in, layers[2](layers[1](layers[0](h_in))), name="simple_model")
    shift = 1 if plant == "lr_offbyone" else 0
    schedule = Shifted(tf.keras.optimizers.schedules.PolynomialDecay(LR0, DECAY, LR_END), shift, plant_from)
    opt = tf.keras.optimizers.SGD(schedule)
    ce = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    for phase in phases:
        _train_phase(run_dir, plant, phase, layers, model, schedule, opt, ce)
        after_phase()


def _train_phase(
    run_dir: str, plant: Optional[str], steps: range, layers: list, model: Any, schedule: Any, opt: Any, ce: Any
) -> None:
    """One training session of the port, recorded into ``run_dir`` (a new event file)."""
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(schedule(opt.iterations))
            with tf.GradientTape() as tape:
                h = x
                for layer in layers:
                    h = rec.activation(layer.name, layer(h))
                loss = ce(y, h) + (0.0 if plant == "no_regularization" else tf.add_n(model.losses))
                rec.loss(loss)
            grads = tape.gradient(loss, model.trainable_variables)
            rec.grads(grads, model.trainable_variables)
            if plant != "no_clipping":
                grads, _ = tf.clip_by_global_norm(grads, CLIP)
            opt.apply_gradients(zip(grads, model.trainable_variables))

    for s in steps:
        step(tf.constant(X[s % STEPS]), tf.constant(Y[s % STEPS]))
    rec.close()


def _forward0() -> tuple[float, float]:
    """numpy reference at step 0: (cross-entropy, L2 regularization loss), and the grad norm."""
    h = X[0].astype(np.float64)
    for k, b in INIT:
        h = h @ k + b
    logp = h - np.log(np.exp(h).sum(1, keepdims=True))
    return float(-(Y[0] * logp).sum(1).mean()), float(L2 * sum((k.astype(np.float64) ** 2).sum() for k, _ in INIT))


def test_faithful_port_agrees(tmp_path) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_tf2(str(tmp_path / "tf2"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    ce, reg = _forward0()
    from shim_readback import tensors_by_step

    got = tensors_by_step(str(tmp_path / "tf1"))
    np.testing.assert_allclose(float(got[0][("loss", "loss")][2]), ce + reg, rtol=1e-5)
    np.testing.assert_allclose(
        [float(got[s][("lr", "lr")][2]) for s in range(STEPS)], [lr_at(s) for s in range(STEPS)], rtol=1e-6
    )


@pytest.mark.parametrize(
    "plant, step, kind, tensor",
    [
        ("lr_offbyone", 0, "lr", "lr"),  # lr_at(1) != lr_at(0)
        ("initializer", 0, "weight", "dense_1/kernel:0"),
        ("no_regularization", 0, "loss", "loss"),  # off by the L2 term
        ("no_clipping", 1, "weight", "dense/kernel:0"),  # step 0's update was clipped in TF1 only
        ("creation_order", None, None, None),  # Keras names swap; shapes pair them: agree
    ],
)
def test_planted_difference_is_found_where_numpy_says(tmp_path, plant, step, kind, tensor) -> None:
    ce, reg = _forward0()
    # the independent reasons each expectation holds
    assert lr_at(1) != lr_at(0) and reg > 1e-4  # lr and regularization differ beyond tolerance
    train_tf1(str(tmp_path / "tf1"))
    train_tf2(str(tmp_path / "tf2"), plant)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    if step is None:
        assert report.agree, report.first_divergence
        return
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (step, kind, tensor)
    if plant == "no_regularization":
        np.testing.assert_allclose(first.max_abs_diff, reg, rtol=1e-4)


def test_a_port_watched_while_it_trains_is_judged_anew_at_each_refresh(tmp_path) -> None:
    """The dashboard's workflow: the TF1 run is done, the port is still training (two sessions into
    one run, as a resumed job writes them), and one comparison is refreshed after each. Each refresh
    says what a fresh comparison says, and what numpy says: the faithful first session has no
    divergence but is incomplete (the port has steps to go: it ended early, so far); the
    schedule counting one step ahead from step 3 on diverges at step 3, on the learning rate first,
    by lr_at(4) - lr_at(3)."""
    steps = 2 * STEPS
    assert abs(lr_at(STEPS + 1) - lr_at(STEPS)) > 1e-3 * lr_at(STEPS)  # beyond any default tolerance
    train_tf1(str(tmp_path / "tf1"), steps)
    watch = Watch(str(tmp_path))
    phases = (range(STEPS), range(STEPS, steps))
    train_tf2(str(tmp_path / "tf2"), "lr_offbyone", phases=phases, after_phase=watch, plant_from=STEPS)
    watch.close()
    first, second = watch.reports
    # the port still training: no divergence in the steps both logged, but not an agreement yet
    assert first.first_divergence is None and first.steps_compared == STEPS, first.first_divergence
    assert first.verdict == "incomplete" and first.ended_early == {
        "tf2": {"last": STEPS - 1, "other_last": steps - 1, "steps": STEPS}
    }
    found = second.first_divergence
    assert second.steps_compared == steps and (found.step, found.kind, found.tensor) == (STEPS, "lr", "lr")
    np.testing.assert_allclose(found.max_abs_diff, abs(lr_at(STEPS + 1) - lr_at(STEPS)), rtol=1e-5)


def test_batch_norm_without_scale_is_a_structure_divergence_naming_gamma(tmp_path) -> None:
    """The guides' batch-norm ``scale`` difference: the port lacks every gamma variable."""
    from demo import bn_model

    bn_model.train_tf1(str(tmp_path / "tf1"), steps=2)
    bn_model.train_tf2_loop(str(tmp_path / "tf2"), steps=2, bn_scale=False)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and first.reason == "structure"
    only = {e["tag"] for e in report.structure["only_in"]["tf1"]}
    assert "weight/batch_normalization/gamma:0" in only and not report.structure["only_in"]["tf2"]


def _random_init_runs(root) -> None:
    """TF1 and TF2 models with random (Glorot) initial weights drawn on each side: the guides'
    "random numbers" difference when the port neither copies the TF1 weights nor shares its
    random stream."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(1)
        rec = summary_v1.Recorder(str(root / "tf1"))
        x = tf.constant(X[0])
        h = tf.compat.v1.layers.dense(x, 2, name="dense")
        out = rec.activation("out", tf.compat.v1.layers.dense(h, 3, name="dense_1"))
        loss = rec.loss(tf.reduce_mean(tf.square(out)))
        rec.lr(tf.constant(0.1))
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):
                _, parity = sess.run([train, rec.fetches])
                rec.write(parity)
        rec.close()
    tf.random.set_seed(2)
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, name="dense"), tf.keras.layers.Dense(3, name="dense_1")])
    model.build((None, 3))
    opt = tf.keras.optimizers.SGD(0.1)
    rec2 = summary_v2.Recorder(str(root / "tf2"))
    for _ in range(2):
        with rec2.step(opt.iterations, variables=model):
            rec2.lr(tf.constant(0.1))
            with tf.GradientTape() as tape:
                out = rec2.activation("out", model(tf.constant(X[0])))
                loss = rec2.loss(tf.reduce_mean(tf.square(out)))
            grads = tape.gradient(loss, model.trainable_variables)
            rec2.grads(grads, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
    rec2.close()


def test_random_initial_weights_not_shared_diverge_on_the_weight_at_step_0(tmp_path) -> None:
    _random_init_runs(tmp_path)
    from tb_parity_plugin.logdir.reader import LogdirReader

    with LogdirReader(str(tmp_path)) as reader:
        w1 = reader.run("tf1").tensors[("weight", "dense/kernel:0")].values[0]
        w2 = next(
            s for (k, n), s in reader.run("tf2").tensors.items() if k == "weight" and n.endswith("dense/kernel:0")
        )
        assert not np.allclose(w1, w2.values[0], atol=1e-5)  # the independent check: other initial kernels
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind) == (0, "weight"), first


def _same_shape_layers(
    root, tf2_order: Sequence[int], wrong_init: Optional[int] = None, by_layer_name: bool = False
) -> dict[int, str]:
    """TF1: three unnamed dense layers 4 -> 4 -> 4 -> 3 (``dense``, ``dense_1``, ``dense_2``);
    the port: Keras layers created in ``tf2_order`` (so auto-named in that order), the initial
    weights copied by role (role ``wrong_init`` from another initializer). Returns each role's
    Keras kernel name. Plain SGD, 3 steps, ``None`` batch dimension on both sides. Activations
    are named by role, or ``by_layer_name`` (each side's own layer name, as instrument_layer does)."""
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((STEPS, 8, 4)).astype(np.float32)
    ys = np.eye(3, dtype=np.float32)[rng.integers(0, 3, (STEPS, 8))]
    init = [(rng.uniform(-1, 1, (4, o)).astype(np.float32), np.full(o, 0.1, np.float32)) for o in (4, 4, 3)]
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(root / "tf1"))
        x = tf.compat.v1.placeholder(tf.float32, (None, 4))
        y = tf.compat.v1.placeholder(tf.float32, (None, 3))
        h = x
        for role, (k, b) in enumerate(init):
            h = tf.compat.v1.layers.dense(
                h,
                k.shape[1],
                activation=tf.nn.relu if role < 2 else None,
                kernel_initializer=tf.constant_initializer(k),
                bias_initializer=tf.constant_initializer(b),
            )
            rec.activation(h.name.split("/")[0] if by_layer_name else f"h{role}", h)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, h))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(rec.lr(tf.constant(0.1))), loss)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(STEPS):
                _, parity = sess.run([train_op, fetches], {x: xs[step], y: ys[step]})
                rec.write(parity, step=step)
        rec.close()
    tf.keras.backend.clear_session()  # Keras numbers layers per process: start from `dense` as a fresh port would
    layers: dict[int, Any] = {}
    for role in tf2_order:
        k, b = init[role]
        if role == wrong_init:
            k = tf.keras.initializers.GlorotUniform(seed=1)(k.shape).numpy()
        layers[role] = tf.keras.layers.Dense(
            k.shape[1],
            activation="relu" if role < 2 else None,
            kernel_initializer=tf.constant_initializer(k),
            bias_initializer=tf.constant_initializer(b),
        )
        layers[role](tf.zeros((1, 4)))  # built (and so named) in this order
    rec2 = summary_v2.Recorder(str(root / "tf2"))
    opt = tf.keras.optimizers.SGD(0.1)
    ce = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    variables = [v for role in range(3) for v in layers[role].trainable_variables]

    @tf.function
    def step_fn(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec2.step(opt.iterations, variables=variables, optimizer=opt):
            rec2.lr(opt.learning_rate)
            with tf.GradientTape() as tape:
                h = x
                for role in range(3):
                    h = rec2.activation(layers[role].name if by_layer_name else f"h{role}", layers[role](h))
                loss = rec2.loss(ce(y, h))
            grads = tape.gradient(loss, variables)
            rec2.grads(grads, variables)
            opt.apply_gradients(zip(grads, variables))

    for step in range(STEPS):
        step_fn(tf.constant(xs[step]), tf.constant(ys[step]))
    rec2.close()
    return {role: layers[role].kernel.name for role in range(3)}


@pytest.mark.parametrize("by_layer_name", [False, True], ids=["activations_by_role", "activations_by_layer_name"])
def test_same_shaped_layers_created_in_another_order_are_paired_by_their_initial_weights(
    tmp_path, by_layer_name: bool
) -> None:
    """The two 4x4 layers of the port are created in the other order, so Keras names them the other
    way round: pairing by name compared each with the other's weights, a false divergence at step 0.
    Their initial weights (copied by role, as ports do) pair them, and the outputs named after the
    layers follow them (a reviewer's port named activations as instrument_layer does: DIVERGE on
    activation/dense before). numpy's reason it agrees: every role computes the same function from
    the same weights on both sides."""
    names = _same_shape_layers(tmp_path, tf2_order=(1, 0, 2), by_layer_name=by_layer_name)
    assert names[0].startswith("dense_1/") and names[1].startswith("dense/")  # the names did swap
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    paired = {(m["kind"], m["baseline"]): (m["candidate"], m["how"]) for m in report.to_dict()["mapping"]}
    assert paired[("weight", "dense/kernel:0")] == (names[0], "first values")
    assert paired[("grad", "dense_1/bias:0")] == (names[1].replace("kernel", "bias"), "first values")
    assert any("by their first-step values" in w for w in report.warnings)


def test_same_shaped_layers_in_another_order_with_one_wrong_initializer_diverge_on_that_layer(tmp_path) -> None:
    """As above, but the port initialises role 1 otherwise: numpy says its kernel differs at step 0
    (another initializer), and the other layers start equal: the divergence is role 1's kernel,
    TF1's ``dense_1``, not a layer paired with the wrong one."""
    names = _same_shape_layers(tmp_path, tf2_order=(1, 0, 2), wrong_init=1)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor, first.candidate_tensor) == (0, "weight", "dense_1/kernel:0", names[1])
