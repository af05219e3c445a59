"""A TF2 custom-loop port (Keras Dense layers, Adam, ``tf.train.Checkpoint``) trained in one process
or, as a preempted job is, in two: ``python resumed_port.py RUN_DIR CKPT_DIR PHASE BUG`` trains steps
``[0, SPLIT)`` (phase 1, then saves) or restores and trains ``[SPLIT, STEPS)`` (phase 2), recording
into RUN_DIR with ``summary_v2.Recorder``. ``BUG``: ``none``; ``input`` (phase 2's ``tf.data``
pipeline starts again from its first batch); ``optimizer`` (the checkpoint holds the model and a step
counter, not the optimizer: Adam's slots start again); ``counter`` (the same checkpoint, and the
steps recorded by ``optimizer.iterations``, which starts again at 0). ``batch_of`` and :func:`replay` are the numpy
truth the tests check against."""

from __future__ import annotations

import os
import sys

import numpy as np

B, STEPS, SPLIT, LR = 8, 8, 4, 0.05
_RNG = np.random.RandomState(0)
X = _RNG.randn(STEPS * B, 4).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[_RNG.randint(0, 3, STEPS * B)]
INIT = [
    (_RNG.randn(4, 6) * 0.5).astype(np.float32),
    np.full(6, 0.1, np.float32),
    (_RNG.randn(6, 3) * 0.5).astype(np.float32),
    np.zeros(3, np.float32),
]


def batch_of(step: int, bug: str) -> int:
    """The batch the port feeds at ``step``: the input bug's pipeline is back at batch 0 at SPLIT."""
    return step - SPLIT if bug == "input" and step >= SPLIT else step


def replay(bug: str) -> list[dict]:
    """float64 numpy replay of the run (TF1's and Keras's Adam, epsilon 1e-7): per step, the first
    layer's output and Adam's first moments as read before the update."""
    w = [a.astype(np.float64) for a in INIT]
    m, v, t, out = [np.zeros_like(a) for a in w], [np.zeros_like(a) for a in w], 0, []
    for step in range(STEPS):
        if bug in ("optimizer", "counter") and step == SPLIT:
            m, v, t = [np.zeros_like(a) for a in w], [np.zeros_like(a) for a in w], 0
        i = batch_of(step, bug)
        x, y = X[i * B : (i + 1) * B].astype(np.float64), Y[i * B : (i + 1) * B].astype(np.float64)
        z = x @ w[0] + w[1]
        h = np.maximum(z, 0)
        logits = h @ w[2] + w[3]
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        d = (p - y) / B
        dh = d @ w[2].T * (z > 0)
        g = [x.T @ dh, dh.sum(0), h.T @ d, d.sum(0)]
        out.append({"dense": h, "m": [a.copy() for a in m]})
        t += 1
        lr_t = LR * np.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        for j in range(4):
            m[j] = 0.9 * m[j] + 0.1 * g[j]
            v[j] = 0.999 * v[j] + 0.001 * g[j] ** 2
            w[j] = w[j] - lr_t * m[j] / (np.sqrt(v[j]) + 1e-7)
    return out


def train(run_dir: str, ckpt_dir: str, phase: int, bug: str) -> None:
    """Phase 0: all STEPS in this process; 1: up to SPLIT, then save; 2: restore, then the rest."""
    import tensorflow as tf

    from tb_parity_plugin import summary_v2

    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(6, activation="relu", name="dense"),
            tf.keras.layers.Dense(3, name="dense_1"),
        ]
    )
    model.build((None, 4))
    model.set_weights(INIT)
    opt = tf.keras.optimizers.Adam(LR)
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
    if bug in ("optimizer", "counter"):
        ckpt = tf.train.Checkpoint(step=step, model=model)
    else:
        ckpt = tf.train.Checkpoint(step=step, model=model, optimizer=opt)
    manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=1)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations if bug == "counter" else step, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                h = rec.activation("dense", model.layers[0](x))
                loss = rec.loss(loss_fn(y, rec.activation("dense_1", model.layers[1](h))))
            rec.minimize(opt, loss, model.trainable_variables, tape)
        step.assign_add(1)

    if phase == 2:
        ckpt.restore(manager.latest_checkpoint).expect_partial()
    start, stop = int(step.numpy()), SPLIT if phase == 1 else STEPS
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(B)
    if bug != "input":
        ds = ds.skip(start)  # the pipeline goes on from the restored step
    for x, y in ds.take(stop - start):
        train_step(x, y)
    if phase == 1:
        manager.save()
    rec.close()


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
    os._exit(0)
