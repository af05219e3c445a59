"""End to end under ``disable_v2_behavior()``: a TF1 script with ref variables and v1 control flow
(batch norm behind a ``training`` placeholder, updated through ``UPDATE_OPS``: its update is an
``AssignSub`` on a ``RefSwitch``) against its Keras ``fit`` port, written with Keras defaults. The
faithful port must agree at every step on every kind, and a port with batch norm's momentum wrong
must diverge on the moving mean at step 1, where numpy's own forward pass puts the first
difference. (That the update waits for the recorder's read is proven on the graph itself by
``test_summary_v1.py``: the race it closed does not show on every machine, so no run here could
prove it.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tb_parity_plugin import compare, summary_v2

STEPS, BATCH, LR = 8, 32, 0.05


def _data(path: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    data = {
        "w1": rng.standard_normal((8, 16)).astype(np.float32) * 0.5,
        "b1": rng.standard_normal(16).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((16, 1)).astype(np.float32) * 0.5,
        "b2": np.zeros(1, np.float32),
        "xs": rng.standard_normal((STEPS, BATCH, 8)).astype(np.float32),
        "ys": rng.standard_normal((STEPS, BATCH, 1)).astype(np.float32),
        "lr": np.float32(LR),
    }
    np.savez(path, **data)
    return data


@pytest.fixture(scope="module")
def tf1_run(tmp_path_factory) -> tuple[str, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("v1_behavior")
    data = _data(str(root / "data.npz"))
    script = os.path.join(os.path.dirname(__file__), "v1_behavior_port.py")
    done = subprocess.run(
        [sys.executable, script, str(root / "tf1"), str(root / "data.npz")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return str(root / "tf1"), data


def _fit_port(run_dir: str, data: dict[str, np.ndarray], bn_momentum: float = 0.99) -> None:
    """The port as the migration guide writes one: Keras layers with their defaults, ``fit``."""
    init = tf.keras.initializers.Constant
    model = tf.keras.Sequential(
        [
            tf.keras.Input((8,)),
            tf.keras.layers.Dense(
                16, "relu", kernel_initializer=init(data["w1"]), bias_initializer=init(data["b1"]), name="dense"
            ),
            tf.keras.layers.BatchNormalization(momentum=bn_momentum, name="batch_normalization"),
            tf.keras.layers.Dense(
                1, kernel_initializer=init(data["w2"]), bias_initializer=init(data["b2"]), name="dense_1"
            ),
        ]
    )
    model.compile(optimizer=tf.keras.optimizers.SGD(LR, momentum=0.9), loss="mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    xs, ys = data["xs"].reshape(-1, 8), data["ys"].reshape(-1, 1)
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    rec.close()


def _numpy_moving_mean_at_step_1(data: dict[str, np.ndarray], momentum: float) -> np.ndarray:
    """The moving mean as read at step 1's start: one update from 0 with step 0's batch mean of the
    first layer's output (float64, independent of both frameworks)."""
    h = np.maximum(data["xs"][0].astype(np.float64) @ data["w1"] + data["b1"], 0.0)
    return (1 - momentum) * h.mean(axis=0)


def test_the_faithful_fit_port_of_a_disable_v2_behavior_script_agrees(tf1_run, tmp_path) -> None:
    tf1_dir, data = tf1_run
    _fit_port(str(tmp_path / "tf2"), data)
    shutil.copytree(tf1_dir, tmp_path / "tf1")
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.tolerance_text)
    assert report.steps_compared == STEPS
    kinds = {m["kind"] for m in report.to_dict()["mapping"]}
    assert {"state", "slot", "grad", "weight", "loss"} <= kinds, kinds
    assert not any(report.to_dict()["unmatched"].values()), report.to_dict()["unmatched"]


def test_a_port_with_batch_norms_momentum_wrong_diverges_on_the_moving_mean_at_step_1(tf1_run, tmp_path) -> None:
    tf1_dir, data = tf1_run
    right, wrong = (_numpy_moving_mean_at_step_1(data, m) for m in (0.99, 0.9))
    assert np.abs(wrong - right).max() > 1e-3  # far past atol 1e-5 + rtol 1e-7 |right| (the warm-up)
    _fit_port(str(tmp_path / "tf2"), data, bn_momentum=0.9)
    shutil.copytree(tf1_dir, tmp_path / "tf1")
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None
    assert (first.step, first.kind, first.reason) == (1, "state", "value"), first
    assert "moving_mean" in first.tensor, first
    np.testing.assert_allclose(first.max_abs_diff, np.abs(wrong - right).max(), rtol=1e-3)
