"""A siamese port that builds its tower once per input with one function, ``tf.keras.Sequential`` of
layers it names (``hidden``, ``embed``): tf_keras names a variable after its layer alone, so the two
towers hold two ``hidden/kernel:0`` each, and their momentum slots two ``m/hidden/kernel``. An
instrumented ``fit`` failed at its first step with "weight/'hidden/kernel:0' is logged twice in one
step", which the user cannot rename, and the slots of a variable were looked up by name, each weight
given both towers' slots. The second copy is now recorded as TF1's graph would name it,
``hidden/kernel_1:0`` (its gradient and slot ``m/hidden/kernel_1`` alike), each with its own slot:
checked against numpy's gradients of each use."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step
from test_shared_layer_outputs import BATCH, INIT, LR, XA, XB, D, E, H, Y, _tf1

from tb_parity_plugin import compare, summary_v2


def _numpy_use_gradients() -> dict[str, np.ndarray]:
    """float64, step 0: each use's gradient of the tower's kernels (biases start at 0), the mean sigmoid
    cross-entropy of ``head(|tower(xa) - tower(xb)|)``."""
    w1, w2, head = (INIT[k].astype(np.float64) for k in ("hidden", "embed", "head"))
    xa, xb, y = XA[:BATCH].astype(np.float64), XB[:BATCH].astype(np.float64), Y[:BATCH].astype(np.float64)
    za, zb = xa @ w1, xb @ w1
    ha, hb = np.maximum(za, 0), np.maximum(zb, 0)
    diff = ha @ w2 - hb @ w2
    p = 1 / (1 + np.exp(-(np.abs(diff) @ head)))
    d_abs = ((p - y) / BATCH) @ head.T
    out: dict[str, np.ndarray] = {}
    for use, (x, z, h, d_e) in enumerate(((xa, za, ha, d_abs * np.sign(diff)), (xb, zb, hb, -d_abs * np.sign(diff)))):
        suffix = "_1" if use else ""
        out[f"embed/kernel{suffix}"] = h.T @ d_e
        out[f"hidden/kernel{suffix}"] = x.T @ ((d_e @ w2.T) * (z > 0))
    return out


def test_two_towers_whose_layers_share_names_are_recorded_apart(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))

    def tower() -> tf.keras.Model:
        return tf.keras.Sequential(
            [
                tf.keras.Input((D,)),
                tf.keras.layers.Dense(H, activation="relu", name="hidden"),
                tf.keras.layers.Dense(E, name="embed"),
            ]
        )

    xa, xb = tf.keras.Input((D,)), tf.keras.Input((D,))
    towers = [tower(), tower()]
    for t in towers:  # the converter copied the one TF1 tower into both
        t.get_layer("hidden").kernel.assign(INIT["hidden"])
        t.get_layer("embed").kernel.assign(INIT["embed"])
    diff = tf.keras.layers.Lambda(lambda t: tf.abs(t[0] - t[1]))([towers[0](xa), towers[1](xb)])
    model = tf.keras.Model([xa, xb], tf.keras.layers.Dense(1, name="head")(diff))
    model.get_layer("head").kernel.assign(INIT["head"])
    assert [v.name for v in towers[1].trainable_variables] == [v.name for v in towers[0].trainable_variables]
    model.compile(tf.keras.optimizers.SGD(LR, momentum=0.9), tf.keras.losses.BinaryCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    summary_v2.instrument(model, rec)
    model.fit([XA, XB], Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # raised "logged twice"
    rec.close()
    logged = tensors_by_step(str(tmp_path / "tf2"))
    for name, grad in _numpy_use_gradients().items():
        stem, _, leaf = name.partition("/")
        np.testing.assert_allclose(logged[0][("grad", f"{name}:0")][2], grad, atol=1e-6)
        # each copy's own momentum slot (lr units, as TF1's accumulator): its gradient after one step
        np.testing.assert_allclose(logged[1][("slot", f"m/{name}")][2], grad, atol=1e-6)
    assert np.abs(_numpy_use_gradients()["embed/kernel"] - _numpy_use_gradients()["embed/kernel_1"]).max() > 1e-3
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["lr/*", "activation/*", "slot/*"])
    lines = {(d.kind, d.candidate_tensor): d.note for d in report.divergences_at_first_step if d.reason == "structure"}
    for layer in ("hidden", "embed"):
        note = lines[("weight", f"{layer}/kernel_1:0")]
        assert f"it and this run's weight/{layer}/kernel:0 start alike" in note and "a copy per use" in note, note


def test_a_model_rebuilt_to_resume_keeps_its_variables_names(tmp_path) -> None:
    """A fit resumed on a fresh model of the same layers, restored from a checkpoint of the first (model and
    optimizer) and instrumented on the same recorder: its variables are the first model's under TF1's one
    graph, and keep their names. The first model's variables, recorded in the steps before, held
    ``dense/kernel:0``, and the resumed steps were recorded as ``dense/kernel_1:0``: a faithful port's
    structure DIVERGE. Checked against a float64 numpy replay of the four SGD steps."""
    from test_fit_recompile import BATCH, W, X, Y, _tf1, numpy_replay

    def build() -> tf.keras.Model:
        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, use_bias=False, name="dense")])
        model.get_layer("dense").kernel.assign(W)
        model.compile(tf.keras.optimizers.SGD(0.1), "mse")
        return model

    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    model = build()
    summary_v2.instrument(model, rec)
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(tmp_path / "ckpt" / "c"))
    model = build()  # the job restarted: a new model, restored
    model.optimizer.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(path).assert_consumed()
    summary_v2.instrument(model, rec)
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()
    logged = tensors_by_step(str(tmp_path / "tf2"))
    replay = numpy_replay(((0.1, 2),))
    assert sorted(logged) == list(range(len(replay)))
    for step, truth in enumerate(replay):
        assert sorted(name for kind, name in logged[step] if kind == "weight") == ["dense/kernel:0"], logged[step]
        np.testing.assert_allclose(logged[step][("weight", "dense/kernel:0")][2], truth["kernel"], atol=1e-6)
    _tf1(str(tmp_path / "tf1"), ((0.1, 2),))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.verdict == "agree", report.verdict_text


def test_two_towers_of_one_name_trained_in_turn_keep_their_own_names(tmp_path) -> None:
    """Two towers built by one function (layers named ``hidden``), each trained by its own ``tf.function`` in
    alternate steps on one recorder. The second tower, first recorded at step 1 while the first was not, took
    ``hidden/kernel:0`` from it (a name was held only within a step, for a model rebuilt to resume), and the
    first tower's function, traced at step 0, went on writing that name: one series held two variables'
    values in turn. A copy of equal value (a restored model) still takes the name: the test above. Checked
    against a float64 numpy replay of each tower's SGD steps."""
    x = np.linspace(-1.0, 1.0, 12).reshape(4, 3).astype(np.float32)
    inits = [(RNG_TOWERS.normal(size=(3, 2)), RNG_TOWERS.normal(size=2)) for _ in range(2)]

    def tower(kernel: np.ndarray, bias: np.ndarray) -> tf.keras.Model:
        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, name="hidden")])
        model.set_weights([kernel.astype(np.float32), bias.astype(np.float32)])
        return model

    rec = summary_v2.Recorder(str(tmp_path / "tf2"))

    def train_step(model: tf.keras.Model) -> tf.types.experimental.GenericFunction:
        opt = tf.keras.optimizers.SGD(0.1)

        @tf.function
        def step(it: tf.Tensor) -> None:
            with rec.step(it, variables=model):
                with tf.GradientTape() as tape:
                    loss = rec.loss(tf.reduce_mean(tf.square(model(x))))
                rec.minimize(opt, loss, model.trainable_variables, tape)

        return step

    steps = [train_step(tower(*init)) for init in inits]
    for it in range(4):
        steps[it % 2](tf.constant(it, tf.int64))
    rec.close()
    logged = tensors_by_step(str(tmp_path / "tf2"))
    params = [[p.astype(np.float64) for p in init] for init in inits]
    x64 = x.astype(np.float64)
    for it in range(4):
        k, b = params[it % 2]
        suffix = "_1" if it % 2 else ""
        weights = {name: value[2] for (kind, name), value in logged[it].items() if kind == "weight"}
        assert sorted(weights) == [f"hidden/bias{suffix}:0", f"hidden/kernel{suffix}:0"], (it, sorted(weights))
        np.testing.assert_allclose(weights[f"hidden/kernel{suffix}:0"], k, atol=1e-6)
        np.testing.assert_allclose(weights[f"hidden/bias{suffix}:0"], b, atol=1e-6)
        d_y = 2 * (x64 @ k + b) / (x64.shape[0] * 2)
        params[it % 2] = [k - 0.1 * x64.T @ d_y, b - 0.1 * d_y.sum(0)]


RNG_TOWERS = np.random.default_rng(11)
