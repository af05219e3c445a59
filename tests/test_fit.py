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
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = keras_model()
        model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="MirroredStrategy is not supported"):
        summary_v2.instrument(model, rec)
    model = keras_model()
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile"):
        summary_v2.instrument(model, rec)
