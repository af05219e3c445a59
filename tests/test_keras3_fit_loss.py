"""The loss an instrumented Keras 3 ``fit`` reports, on one device and under ``MirroredStrategy``.

Keras 3's ``train_step`` feeds its loss tracker itself (``compute_loss`` does not), and ``fit``
reports that tracker's mean as ``loss``: in its History and in the logs its callbacks monitor.
``instrument``'s step did not feed it, so a new user's instrumented Keras 3 port reported a loss of
0.0 every epoch, and a ``ReduceLROnPlateau(monitor="loss")`` beside it, seeing no improvement,
halved the learning rate: the recorded run trained otherwise than the user's program. Expected
values from a float64 numpy replay (SGD on a softmax layer, the loss falling every epoch, so the
callback leaves the lr alone). The port runs in its own process without ``TF_USE_LEGACY_KERAS``
(the suite sets it), on two logical CPUs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from keras3_process import run_keras3

RNG = np.random.default_rng(5)
X = RNG.standard_normal((16, 3)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, 16)]
W = (RNG.standard_normal((3, 3)) * 0.5).astype(np.float32)
BATCH, EPOCHS, LR = 4, 3, 0.1


def numpy_replay() -> tuple[list[float], np.ndarray]:
    """Each epoch's mean loss (the mean of its batches' losses: equal batches) and the final kernel."""
    w, epochs = W.astype(np.float64), []
    for _ in range(EPOCHS):
        losses = []
        for i in range(0, len(X), BATCH):
            x, y = X[i : i + BATCH].astype(np.float64), Y[i : i + BATCH].astype(np.float64)
            z = x @ w
            z -= z.max(1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
            losses.append(float(-(y * np.log(p)).sum(1).mean()))
            w = w - LR * x.T @ (p - y) / len(x)
        epochs.append(float(np.mean(losses)))
    return epochs, w


_KERAS3_PORT = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import numpy as np
import keras
assert keras.__version__.startswith("3"), keras.__version__
from tb_parity_plugin import summary_v2
data = np.load(sys.argv[2])
out = {}
for name, strategy in [("one", tf.distribute.OneDeviceStrategy("/cpu:0")),
                       ("mirrored", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))]:
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, use_bias=False, name="dense")])
        model.get_layer("dense").kernel.assign(data["W"])
        model.compile(optimizer=keras.optimizers.SGD(float(sys.argv[3])),
                      loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(sys.argv[1] + "/" + name)
    summary_v2.instrument(model, rec, layers=["dense"])
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=0.0)
    history = model.fit(data["X"], data["Y"], batch_size=int(sys.argv[4]), epochs=int(sys.argv[5]),
                        shuffle=False, verbose=0, callbacks=[plateau])
    rec.close()
    out[name] = {"loss": history.history["loss"], "kernel": np.asarray(model.get_layer("dense").kernel).tolist()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("keras3_fit_loss")
    script, arrays = tmp / "port.py", tmp / "data.npz"
    script.write_text(_KERAS3_PORT)
    np.savez(arrays, X=X, Y=Y, W=W)
    done = run_keras3([str(script), str(tmp / "logs"), str(arrays), str(LR), str(BATCH), str(EPOCHS)])
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("strategy", ["one", "mirrored"])
def test_an_instrumented_keras_3_fit_reports_the_loss_it_minimises(fitted: dict, strategy: str) -> None:
    losses, _ = numpy_replay()
    assert all(b < a for a, b in zip(losses, losses[1:]))  # falling: the plateau callback never fires
    np.testing.assert_allclose(fitted[strategy]["loss"], losses, rtol=1e-5)


@pytest.mark.parametrize("strategy", ["one", "mirrored"])
def test_a_callback_monitoring_the_loss_leaves_the_instrumented_training_alone(fitted: dict, strategy: str) -> None:
    _, kernel = numpy_replay()
    np.testing.assert_allclose(np.array(fitted[strategy]["kernel"]), kernel, rtol=1e-5, atol=1e-6)
