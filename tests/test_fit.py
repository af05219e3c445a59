"""Section 2 of issue 10: a Keras ``model.fit`` port logged by ``summary_v2.instrument``."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from shim_readback import tensors_by_step

from demo.bn_model import LR, STEPS, XS, YS, keras_model, train_tf1, train_tf2_fit
from tb_parity_plugin import compare, summary_v2


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_fit_port_agrees_with_the_tf1_session_loop(tmp_path, steps_per_execution: int) -> None:
    train_tf1(str(tmp_path / "tf1"))
    train_tf2_fit(str(tmp_path / "tf2"), steps_per_execution)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    assert report.steps_compared == STEPS
    kinds = {m["kind"] for m in report.to_dict()["mapping"]}
    assert kinds == {"lr", "weight", "state", "activation", "loss", "grad"}
    assert not any(report.to_dict()["unmatched"].values())


def test_fit_under_one_device_strategy_records_and_agrees(tmp_path) -> None:
    """``instrument`` accepts a model compiled under ``OneDeviceStrategy``; ``fit`` then runs the
    step inside ``strategy.run``, which the recorder refused as a replica context (a new user's port
    crashed at its first step). One device holds the whole step: the port agrees with the TF1 loop,
    and a learning rate 1 % off is still found at step 0."""
    train_tf1(str(tmp_path / "tf1"))
    train_tf2_fit(str(tmp_path / "tf2"), strategy=tf.distribute.OneDeviceStrategy("/cpu:0"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    assert report.steps_compared == STEPS
    train_tf2_fit(str(tmp_path / "off"), lr=LR * 1.01, strategy=tf.distribute.OneDeviceStrategy("/cpu:0"))
    first = compare(str(tmp_path), baseline="tf1", candidate="off").first_divergence
    assert first is not None and (first.step, first.kind) == (0, "lr"), first


def test_the_distributed_template_runs_under_one_device_strategy(tmp_path) -> None:
    """The README's custom loop for strategies, unchanged, under ``OneDeviceStrategy``: its
    ``strategy.run`` returns plain tensors, and ``rec.loss(loss, reduction="sum")`` raised
    "reduction= applies to per-replica values only", leaving the run empty. One replica's value
    is what every reduction gives; a reduction that is none of them still raises, and so does a
    tuple of the replicas' values, which the reviewer's ``experimental_local_results`` stacked
    (without ``reduction=`` too: ``tests/test_replicas.py``)."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, kernel_initializer="ones")])
        optimizer = tf.keras.optimizers.SGD(0.1)
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    x, y = np.arange(12, dtype=np.float32).reshape(4, 3) / 10, np.zeros((4, 2), np.float32)

    def step_fn(xb, yb):  # type: ignore[no-untyped-def]
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = tf.nn.compute_average_loss(tf.reduce_sum((logits - yb) ** 2, axis=1))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, grads, logits

    @tf.function
    def train_step(xb, yb):  # type: ignore[no-untyped-def]
        with rec.step(optimizer.iterations):
            rec.weights(model.trainable_variables)
            loss, grads, logits = strategy.run(step_fn, args=(xb, yb))
            rec.activation("logits", logits)
            rec.loss(loss, reduction="sum")
            rec.grads(grads, model.trainable_variables)

    train_step(x, y)
    with pytest.raises(ValueError, match="one of sum, mean, concat; got 'total'"):
        with rec.step(1):
            rec.loss(tf.constant(1.0), reduction="total")
    # experimental_local_results(loss): one value per replica, which stacked made a scalar loss a vector
    with pytest.raises(TypeError, match="got a tuple of 2, as from experimental_local_results"):
        with rec.step(2):
            rec.loss((tf.constant(1.0), tf.constant(2.0)), reduction="sum")
    rec.close()
    got = tensors_by_step(str(tmp_path / "tf2"))[0]
    logits = x @ np.ones((3, 2))  # numpy: the kernel of ones, a zero bias
    np.testing.assert_allclose(float(got[("loss", "loss")][2]), np.mean(np.sum(logits**2, axis=1)), rtol=1e-6)
    np.testing.assert_allclose(np.reshape(got[("activation", "logits")][2], (4, 2)), logits, rtol=1e-6)


def test_fit_records_a_schedule_step_by_step(tmp_path) -> None:
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    train_tf2_fit(str(tmp_path / "tf2"), lr=schedule, optimizer=tf.keras.optimizers.SGD(schedule))
    got = tensors_by_step(str(tmp_path / "tf2"))
    lrs = [float(got[s][("lr", "lr")][2]) for s in range(STEPS)]
    np.testing.assert_allclose(lrs, 0.1 * 0.5 ** np.arange(STEPS), rtol=1e-6)  # numbered 0, 1, ...


def test_instrumented_layers_work_outside_a_recorded_step(tmp_path) -> None:
    model = train_tf2_fit(str(tmp_path / "tf2"), optimizer=tf.keras.optimizers.Adam(LR))
    before = tensors_by_step(str(tmp_path / "tf2"))
    assert {k for k in before[0] if k[0] == "slot"}, sorted(before[0])
    model.predict(XS[0], verbose=0)
    model.evaluate(XS[0], YS[0], verbose=0)
    model.save(str(tmp_path / "saved.keras"))
    tf.saved_model.save(model, str(tmp_path / "savedmodel"))
    assert tensors_by_step(str(tmp_path / "tf2")).keys() == before.keys()


def test_unsupported_fit_settings_raise_clearly(tmp_path) -> None:
    rec = summary_v2.Recorder(str(tmp_path / "bad"))
    with tf.distribute.experimental.CentralStorageStrategy(["/cpu:0"]).scope():
        model = keras_model()
        model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="CentralStorageStrategy is not supported"):
        summary_v2.instrument(model, rec)
    model = keras_model()
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile"):
        summary_v2.instrument(model, rec)


class _ClippingModel(tf.keras.Model):
    """The standard TF2 pattern ("customize what happens in fit"): its own train_step, here one that
    clips the gradients by value before applying them."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = tf.keras.layers.Dense(2, kernel_initializer="ones")

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return self.dense(x)

    def train_step(self, data):  # type: ignore[no-untyped-def]
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(y, self(x, training=True))
        grads = [tf.clip_by_value(g, -0.01, 0.01) for g in tape.gradient(loss, self.trainable_variables)]
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def test_a_model_with_its_own_train_step_is_refused_and_left_as_it_was(tmp_path) -> None:
    """A new user's subclass clipped its gradients in its own train_step; instrument replaced that
    step with Keras's default one, so what was recorded was another program: a faithful port
    diverged, and one against an unclipped original agreed. It is refused now, naming the class, and
    the model still trains its own way (numpy: every gradient element clipped to 0.01)."""
    model = _ClippingModel()
    model.compile(optimizer=tf.keras.optimizers.SGD(1.0), loss="mse")
    rec = summary_v2.Recorder(str(tmp_path / "own"))
    with pytest.raises(ValueError, match=r"test_fit\._ClippingModel overrides train_step"):
        summary_v2.instrument(model, rec)
    rec.close()
    x, y = np.ones((4, 3), np.float32), np.full((4, 2), 100.0, np.float32)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    # numpy: the MSE gradient of every kernel element is far beyond 0.01, so each moved by 0.01 exactly
    np.testing.assert_allclose(model.dense.kernel.numpy(), np.full((3, 2), 1.01), rtol=1e-6)


def test_a_model_without_a_loss_raises_clearly_when_fit_starts(tmp_path) -> None:
    model = keras_model()
    model.compile(optimizer="sgd")
    summary_v2.instrument(model, summary_v2.Recorder(str(tmp_path / "noloss")))
    with pytest.raises(ValueError, match="computes no loss"):
        model.fit(XS[0], YS[0], verbose=0)


def test_a_custom_train_step_records_itself_as_docs_shim_shows(tmp_path) -> None:
    """docs/shim.md's recipe for such a model: ``rec.step`` inside its own train_step, under ``fit``.
    It records the clipped gradients the step applies (numpy: the MSE gradient of every element is
    far beyond the clip, so each recorded element is exactly -0.01) and the weights before each update."""
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))

    class Recorded(_ClippingModel):
        def train_step(self, data):  # type: ignore[no-untyped-def]
            x, y = data
            with rec.step(self.optimizer.iterations, variables=self, optimizer=self.optimizer):
                with tf.GradientTape() as tape:
                    loss = rec.loss(self.compiled_loss(y, self(x, training=True)))
                grads = [tf.clip_by_value(g, -0.01, 0.01) for g in tape.gradient(loss, self.trainable_variables)]
                rec.grads(grads, self.trainable_variables)
                self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {"loss": loss}

    model = Recorded()
    model.build((None, 3))  # its variables must exist when the step starts, to be read there
    model.compile(optimizer=tf.keras.optimizers.SGD(1.0), loss="mse")
    x, y = np.ones((8, 3), np.float32), np.full((8, 2), 100.0, np.float32)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    rec.close()
    steps = tensors_by_step(str(tmp_path / "tf2"))
    assert sorted(steps) == [0, 1]
    kernel = model.dense.kernel.name  # Keras numbers layers per process
    for step, tensors in steps.items():
        np.testing.assert_array_equal(tensors[("grad", kernel)][2], np.full((3, 2), -0.01, np.float32))
        np.testing.assert_allclose(tensors[("weight", kernel)][2], np.full((3, 2), 1 + 0.01 * step), rtol=1e-6)


def test_a_custom_train_step_with_a_loss_tracker_records_no_metric_as_state(tmp_path) -> None:
    """Keras's "customize what happens in fit" keeps ``self.loss_tracker = Mean(name="loss")`` on the
    model, and tf_keras lists a metric held as an attribute among the model's non-trainable variables:
    docs/shim.md's ``variables=self`` recorded its ``total:0`` and ``count:0`` as ``state``, which a TF1
    original (whose ``tf.compat.v1.metrics`` are local variables) never has, so a new user's faithful
    port was a structure DIVERGE. Only the Dense's weights are recorded now; the tracker still tracks
    (numpy: the mean of the two steps' MSE losses)."""
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))

    class Tracked(tf.keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = tf.keras.layers.Dense(2, kernel_initializer="ones")
            self.loss_tracker = tf.keras.metrics.Mean(name="loss")

        def call(self, x: tf.Tensor) -> tf.Tensor:
            return self.dense(x)

        def train_step(self, data):  # type: ignore[no-untyped-def]
            x, y = data
            with rec.step(self.optimizer.iterations, variables=self, optimizer=self.optimizer):
                with tf.GradientTape() as tape:
                    loss = rec.loss(tf.reduce_mean(tf.square(y - self(x, training=True))))
                rec.minimize(self.optimizer, loss, self.trainable_variables, tape)
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    model = Tracked()
    model.build((None, 3))
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01))
    assert len(model.non_trainable_variables) == 2  # tf_keras: the tracker's total and count
    x, y = np.ones((8, 3), np.float32), np.full((8, 2), 10.0, np.float32)
    history = model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    rec.close()
    steps = tensors_by_step(str(tmp_path / "tf2"))
    kernel, bias = model.dense.kernel.name, model.dense.bias.name
    expected = {("weight", kernel), ("weight", bias), ("grad", kernel), ("grad", bias), ("loss", "loss")}
    assert {step: set(tensors) for step, tensors in steps.items()} == {0: expected, 1: expected}
    # numpy: out = 3 (kernel ones, bias 0); the mean over 4 x 2 elements has d loss/d out = -2 (10 - 3) / 8
    # per element, so every kernel and bias element's gradient sums 4 rows: -7; SGD 0.01 moves each by +0.07
    losses = [49.0, (10 - (3 * 1.07 + 0.07)) ** 2]
    for step, want in enumerate(losses):
        np.testing.assert_allclose(steps[step][("loss", "loss")][2], want, rtol=1e-5)
    np.testing.assert_allclose(history.history["loss"], [np.mean(losses)], rtol=1e-5)


def test_keras_own_models_with_their_own_step_and_instance_steps_are_refused(tmp_path) -> None:
    """A reviewer's cases: Keras's SharpnessAwareMinimization has its own train_step (in a tf_keras
    module, which the first check let through): instrumented, it trained as plain SGD. A train_step
    assigned on the instance is another program too. Instrumenting a model twice is allowed."""
    rec = summary_v2.Recorder(str(tmp_path / "sam"))
    sam = tf.keras.models.experimental.SharpnessAwareMinimization(keras_model())
    sam.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="SharpnessAwareMinimization overrides train_step"):
        summary_v2.instrument(sam, rec)
    model = keras_model()
    model.compile(optimizer="sgd", loss="mse")
    summary_v2.instrument(model, rec)
    summary_v2.instrument(model, rec)  # ours: allowed again
    other = keras_model()
    other.compile(optimizer="sgd", loss="mse")
    other.train_step = lambda data: {}
    with pytest.raises(ValueError, match="train_step assigned on it"):
        summary_v2.instrument(other, rec)
    rec.close()


def test_a_layer_with_several_outputs_records_each_as_layer_slash_index(tmp_path) -> None:
    """``LSTM(return_state=True)`` returns ``[output, h, c]``: recorded as ``lstm/0``, ``lstm/1`` and
    ``lstm/2`` (the README's naming), each the value the layer returned at the step, before the
    update (checked against the layer called on the initial weights)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 5, 3)).astype(np.float32)
    y = rng.standard_normal((8, 1)).astype(np.float32)
    inputs = tf.keras.Input((None, 3))
    out, h, c = tf.keras.layers.LSTM(4, return_state=True, name="lstm")(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()([out, h, c])))
    model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    lstm = model.get_layer("lstm")
    expected = [t.numpy() for t in lstm(tf.constant(x))]  # the initial weights' outputs on the one batch
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    with pytest.raises(ValueError, match="no_such_layer"):  # a name the model lacks, named
        summary_v2.instrument(model, rec, layers=["no_such_layer"])
    summary_v2.instrument(model, rec, layers=["lstm"])  # by name, as outputs are named (a new user's)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    rec.close()
    got = tensors_by_step(str(tmp_path / "tf2"))[0]
    assert sorted(n for k, n in got if k == "activation") == ["lstm/0", "lstm/1", "lstm/2"]
    for i, want in enumerate(expected):
        np.testing.assert_allclose(np.asarray(got[("activation", f"lstm/{i}")][2]).reshape(want.shape), want, rtol=1e-5)
    np.testing.assert_allclose(expected[0], expected[1])  # output is h (return_sequences=False): same values
    assert not np.allclose(expected[1], expected[2])  # c differs: the order is call's
