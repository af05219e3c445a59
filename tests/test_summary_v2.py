"""TF2 shim: eager and tf.function training steps, read back from disk."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from shim_readback import check_with_reader, load_with_tensorboard, tensors_by_step

from tb_parity_plugin import summary_v2
from tb_parity_plugin.records import health, metadata

X = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1, 2, 0, 1]]
W0 = np.random.default_rng(2).standard_normal((3, 3)).astype(np.float32)
LR = 0.5
SCRIPT = "<script>alert(1)</script>"


class Model(tf.keras.Model):
    def __init__(self) -> None:
        super().__init__(name="m")
        self.dense = tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(W0))

    def call(self, x):
        return self.dense(x)


def _setup(run_dir: str, limit: int = 4096):
    model = Model()
    model.build((None, 3))
    opt = tf.keras.optimizers.SGD(LR)
    opt.build(model.trainable_variables)
    rec = summary_v2.Recorder(run_dir, full_values_limit=limit)
    traces = []

    def train_step(x, y):
        traces.append(1)
        with rec.step(opt.iterations):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                logits = rec.activation(SCRIPT, model(x))
                loss = rec.loss(tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(y, logits)))
            rec.minimize(opt, loss, model.trainable_variables, tape)
        return loss

    return model, rec, train_step, traces


def _check_run(run_dir: str, kernel_name: str, final_kernel: np.ndarray, steps: int) -> dict:
    got = tensors_by_step(run_dir)
    assert sorted(got) == list(range(steps))
    np.testing.assert_array_equal(got[0][("weight", kernel_name)][2], W0)
    for k in range(steps):
        wk, gk = got[k][("weight", kernel_name)][2], got[k][("grad", kernel_name)][2]
        nxt = got[k + 1][("weight", kernel_name)][2] if k + 1 < steps else final_kernel
        np.testing.assert_allclose(nxt, wk - LR * gk, rtol=1e-6, atol=1e-7)
        for _spec, row, values in got[k].values():
            if values is not None:
                np.testing.assert_allclose(row, health.health_numpy(values), rtol=1e-6, atol=1e-7)
    assert ("activation", SCRIPT) in got[0]
    return got


def test_tf_function_traces_once_and_logs_weights_before_update(tmp_path) -> None:
    run = str(tmp_path / "fn")
    model, rec, step_fn, traces = _setup(run)
    fn = tf.function(step_fn)
    for _ in range(5):
        fn(tf.constant(X), tf.constant(Y))
    assert len(traces) == 1
    rec.close()
    kernel = model.dense.kernel
    got = _check_run(run, kernel.name, kernel.numpy(), 5)
    data = load_with_tensorboard(run)
    assert data["info"]["side"] == "tf2" and data["info"]["mode"] == "function"
    assert len(data["layouts"]) == 1
    assert data["plugins"][metadata.SCALAR_TAGS["loss"]] == "scalars"
    np.testing.assert_allclose(
        float(data["steps"][3][metadata.SCALAR_TAGS["loss"]]), float(got[3][("loss", "loss")][2]), rtol=1e-6
    )
    kinds = [s.kind for s in sorted((v[0] for v in got[0].values()), key=lambda s: s.order)]
    assert kinds == ["lr", "weight", "weight", "activation", "loss", "grad", "grad"]
    check_with_reader(str(tmp_path), "fn", got)


def test_eager_and_stats_only_limit(tmp_path) -> None:
    run = str(tmp_path / "eager")
    model, rec, step_fn, _ = _setup(run, limit=3)
    for _ in range(3):
        step_fn(tf.constant(X), tf.constant(Y))
    rec.close()
    got = tensors_by_step(run)
    assert sorted(got) == [0, 1, 2]
    spec, row, values = got[1][("weight", model.dense.kernel.name)]
    assert values is None and spec.values is None  # 9 elements > 3
    assert got[1][("weight", model.dense.bias.name)][2] is not None  # 3 elements
    assert load_with_tensorboard(run)["info"]["mode"] == "eager"
    np.testing.assert_allclose(got[0][("weight", model.dense.kernel.name)][1], health.health_numpy(W0), rtol=1e-6)


def test_bad_use_gives_clear_errors(tmp_path) -> None:
    rec = summary_v2.Recorder(str(tmp_path / "bad"))
    with pytest.raises(RuntimeError, match="inside `with recorder.step"):
        rec.loss(tf.constant(1.0))

    @tf.function
    def twice(x):
        with rec.step(0):
            rec.activation("h", x)
            rec.activation("h", x * 2)

    with pytest.raises(ValueError, match="logged twice in one step"):
        twice(tf.constant([1.0]))
    with rec.step(1):
        with pytest.raises(TypeError, match="string"):
            rec.metric("s", tf.constant("x"))
        rec.metric("ok", tf.constant(1, tf.int32))
    rec.close()
    got = tensors_by_step(str(tmp_path / "bad"))
    assert list(got) == [1] and got[1][("metric", "ok")][1][metadata.STAT_INDEX["dtype"]] == 3


def test_a_partial_batch_file_opened_a_second_later_keeps_every_step_of_the_run(tmp_path) -> None:
    """A user's ``tf.function(reduce_retracing=True)`` loop over ``None``-batch data with a partial
    batch at step 4: the Recorder writes that step's relaxed shapes to a second file, opened here in
    a later second than its first. The reader took it for a restart and cut the first file's steps
    5-9, so a planted lr x2 at step 7 was never compared (a reviewer's false AGREE). Every step must
    be read, each lr as numpy computes it."""
    import time

    from tb_parity_plugin.logdir.reader import LogdirReader

    run_dir = tmp_path / "tf2"
    model = Model()
    model(X)
    opt = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(str(run_dir))
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True)

    @tf.function(reduce_retracing=True)
    def step(x: tf.Tensor, y: tf.Tensor, factor: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(tf.constant(LR) * factor)
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(y, rec.activation("logits", model(x))))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients([(g * factor, v) for g, v in zip(grads, model.trainable_variables)])

    for s in range(10):
        if s == 4:
            time.sleep(1.1)  # the second file is opened now: in a later second than the first
        n = 5 if s == 4 else len(X)
        step(tf.constant(X[:n]), tf.constant(Y[:n]), tf.constant(2.0 if s == 7 else 1.0))
    rec.close()
    files = sorted(p.name for p in run_dir.iterdir())
    assert len(files) == 2 and len({name.split(".")[3] for name in files}) == 2, files  # two seconds
    run = LogdirReader(str(tmp_path)).run("tf2")
    steps, lrs = run.scalars["lr"]
    np.testing.assert_array_equal(steps, np.arange(10))
    np.testing.assert_allclose(lrs, [LR * (2.0 if s == 7 else 1.0) for s in range(10)], rtol=1e-7)
    np.testing.assert_array_equal(run.tensors[("activation", "logits")].steps, np.arange(10))
    assert run.notices == []


_AUTOGRAPH_SCRIPT = """
import os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
from tb_parity_plugin import summary_v2
rec = summary_v2.Recorder(sys.argv[1])
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2), tf.keras.layers.Dense(2)])
opt = tf.keras.optimizers.Adam(0.1)
def forward(x):
    h = x
    for layer in model.layers:
        h = layer(h)
        if rec is not None:
            rec.activation(layer.name, h)
    return tf.reduce_sum(h)
@tf.function
def step(x):
    with rec.step(opt.iterations, variables=model, optimizer=opt):
        rec.lr(opt.learning_rate)  # a variable: read through the hook
        with tf.GradientTape() as tape:
            loss = rec.loss(forward(x))
        rec.minimize(opt, loss, model.trainable_variables, tape)
step(tf.ones((4, 3)))
rec.close()
"""


def test_recording_inside_python_control_flow_gives_no_autograph_warning(tmp_path) -> None:
    """A tf.function that records the optimizer's learning-rate variable and, in a Python loop
    under an ``if``, each layer's output (a user's helper, and bench_p1's) had AutoGraph print
    "could not transform ... _after_read ... Please report this to the TensorFlow team" (a
    docstring-only hook). Run as a script file, as users run training."""
    import subprocess
    import sys

    script = tmp_path / "train.py"  # a file: AutoGraph converts only functions whose source it can read
    script.write_text(_AUTOGRAPH_SCRIPT)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "could not transform" not in done.stdout + done.stderr, done.stderr[-2000:]
    assert tensors_by_step(str(tmp_path / "run"))[0]  # it recorded
