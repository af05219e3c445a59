"""An instrumented ``model.fit`` beside Keras's ``TensorBoard(update_freq=N)`` callback.

The callback wraps ``fit`` in ``tf.summary.record_if(step % N == 0)`` for its own batch-level
summaries; the recorder's ``tf.summary.write`` obeyed it, so a new user's port recorded every
5th step only: a faithful port AGREEd on 7 of 32 steps (exit 0), and a learning rate changed one
epoch late (step 12) was found at step 15. The recorder now writes every step it records.
Checked against a float64 numpy replay of the training (plain SGD, an lr set per epoch).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v2

RNG = np.random.default_rng(11)
X = RNG.standard_normal((32, 3)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, 32)]
W = (RNG.standard_normal((3, 3)) * 0.5).astype(np.float32)
BATCH, EPOCHS, UPDATE_FREQ = 8, 3, 5
STEPS_PER_EPOCH = len(X) // BATCH


def lr_of_epoch(epoch: int, change_at: int) -> float:
    return 0.1 if epoch < change_at else 0.05


def fit(run_dir: str, keras_dir: str, change_at: int) -> None:
    model = tf.keras.Sequential(
        [tf.keras.Input((3,)), tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(W), name="dense")]
    )
    model.compile(
        optimizer=tf.keras.optimizers.SGD(lr_of_epoch(0, change_at)),
        loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True),
    )
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["dense"])
    # a static batch size: the recorder's own tf.summary.write path (not the per-shape writer)
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH, drop_remainder=True)
    model.fit(
        data,
        epochs=EPOCHS,
        verbose=0,
        callbacks=[
            tf.keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr_of_epoch(epoch, change_at)),
            tf.keras.callbacks.TensorBoard(log_dir=keras_dir, update_freq=UPDATE_FREQ),
        ],
    )
    rec.close()


def numpy_replay(change_at: int) -> list[dict]:
    """lr, kernel and bias as read at each step's start, and the step's loss, in float64."""
    w, b = W.astype(np.float64), np.zeros(3)
    out = []
    for epoch in range(EPOCHS):
        lr = lr_of_epoch(epoch, change_at)
        for i in range(STEPS_PER_EPOCH):
            x, y = X[i * BATCH : (i + 1) * BATCH].astype(np.float64), Y[i * BATCH : (i + 1) * BATCH]
            z = x @ w + b
            z = z - z.max(1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
            loss = -(y * np.log(p)).sum(1).mean()
            out.append({"lr": lr, "kernel": w.copy(), "bias": b.copy(), "loss": loss})
            dz = (p - y) / len(x)
            w, b = w - lr * x.T @ dz, b - lr * dz.sum(0)
    return out


def test_every_step_is_recorded_beside_a_tensorboard_callback(tmp_path) -> None:
    fit(str(tmp_path / "runs" / "tf2"), str(tmp_path / "keras"), change_at=2)
    recorded = tensors_by_step(str(tmp_path / "runs" / "tf2"))
    reference = numpy_replay(change_at=2)
    assert sorted(recorded) == list(range(len(reference)))  # was [0, 5, 10]
    for step, ref in enumerate(reference):
        got = {
            (kind, name.split("/")[-1].split(":")[0]): values for (kind, name), (_, _, values) in recorded[step].items()
        }
        np.testing.assert_allclose(got[("lr", "lr")], ref["lr"], rtol=1e-6)
        np.testing.assert_allclose(got[("loss", "loss")], ref["loss"], rtol=1e-5)
        np.testing.assert_allclose(got[("weight", "kernel")], ref["kernel"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[("weight", "bias")], ref["bias"], rtol=1e-5, atol=1e-6)


def test_an_lr_changed_an_epoch_late_is_found_at_its_step_beside_a_tensorboard_callback(tmp_path) -> None:
    fit(str(tmp_path / "runs" / "faithful"), str(tmp_path / "keras_faithful"), change_at=1)
    fit(str(tmp_path / "runs" / "late"), str(tmp_path / "keras_late"), change_at=2)
    faithful, late = numpy_replay(change_at=1), numpy_replay(change_at=2)
    first = next(s for s, (a, b) in enumerate(zip(faithful, late)) if a["lr"] != b["lr"])
    assert first == STEPS_PER_EPOCH  # 4, which update_freq=5 skipped: found at step 5 before
    report = compare(str(tmp_path / "runs"), baseline="faithful", candidate="late")
    assert report.steps_compared == len(faithful)
    d = report.first_divergence
    assert d is not None and (d.step, d.kind) == (first, "lr"), d
