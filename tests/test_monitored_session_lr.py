"""TF1 ``MonitoredTrainingSession`` code with a ``ParityHook``: an lr held in a ``tf.Variable`` that a
plateau rule assigns from Python between epochs, and a hook that runs the train op once more.

The lr variable, recorded with ``rec.lr(lr_var)``, made the README's ``rec.variables(optimizer=opt)``
raise (it was taken for state, already recorded as lr), and the hook counted the plateau rule's
``sess.run(lr_assign, {lr_in: new})`` as a training step (it writes a recorded variable): it added
the recorder's fetches, and a ``feed_dict`` model's run failed for want of its placeholders. An
update a hook ran outside the recorded runs (its step never written) was told to compare the
optimizers' epsilon and clipping. Expectations come from numpy SGD on the same batches.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1

RNG = np.random.default_rng(64)
X = RNG.standard_normal((12, 3)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, 12)]
W0 = (RNG.standard_normal((3, 3)) * 0.5).astype(np.float32)
BATCH, PER_EPOCH, EPOCHS = 4, 3, 3
LRS = [0.5, 0.25, 0.25]  # the lr each epoch trains with: a cut after the first


def _softmax_grad(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    z = x @ w
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return x.T @ (p - y) / len(x)


def _numpy_weights(extra_after: tuple[int, ...] = ()) -> dict[int, np.ndarray]:
    """The kernel before each global step's update; ``extra_after``: global steps after whose run the
    same batch trains once more (taking the next global step)."""
    w, gs, out = W0.astype(np.float64), 0, {}
    for epoch in range(EPOCHS):
        for i in range(PER_EPOCH):
            if gs >= EPOCHS * PER_EPOCH:  # StopAtStepHook(last_step)
                return out
            x, y = X[i * BATCH : (i + 1) * BATCH].astype(np.float64), Y[i * BATCH : (i + 1) * BATCH]
            out[gs] = w
            w = w - LRS[epoch] * _softmax_grad(x, y, w)
            if gs in extra_after:
                w = w - LRS[epoch] * _softmax_grad(x, y, w)
                gs += 1
            gs += 1
    return out


def _train(run_dir: str, rerun_at: tuple[int, ...] = (), variables: str = "default") -> None:
    """Placeholders with a ``None`` batch, the lr a variable the loop assigns after epoch 0 (the
    plateau rule's cut); ``rerun_at``: global steps after which a logging hook runs the train op
    again on the run's feed through ``run_context.session`` (which no hook sees)."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 3])
        lr_var = tf.compat.v1.get_variable("learning_rate", initializer=LRS[0], trainable=False)
        lr_in = tf.compat.v1.placeholder(tf.float32, [])
        lr_assign = lr_var.assign(lr_in)
        w = tf.compat.v1.get_variable("w", initializer=W0)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, tf.matmul(x, w)))
        opt = tf.compat.v1.train.GradientDescentOptimizer(rec.lr(lr_var))
        train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt) if variables == "default" else rec.variables([w], optimizer=opt)

        class Rerun(tf.compat.v1.train.SessionRunHook):
            def before_run(self, run_context):
                return tf.compat.v1.train.SessionRunArgs(gs)

            def after_run(self, run_context, run_values):
                feed = run_context.original_args.feed_dict
                if run_values.results in rerun_at and feed and x in feed:
                    run_context.session.run(train_op, feed)

        steps = EPOCHS * PER_EPOCH
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=steps), summary_v1.ParityHook(rec), Rerun()]
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
            for epoch in range(EPOCHS):
                for i in range(PER_EPOCH):
                    if sess.should_stop():
                        break
                    sess.run(train_op, {x: X[i * BATCH : (i + 1) * BATCH], y: Y[i * BATCH : (i + 1) * BATCH]})
                if sess.should_stop():
                    break
                if LRS[epoch + 1] != LRS[epoch]:
                    sess.run(lr_assign, {lr_in: LRS[epoch + 1]})  # the rule's cut, between epochs
        rec.close()


def test_an_lr_variable_assigned_between_epochs_is_no_state_and_its_assign_no_step(tmp_path) -> None:
    _train(str(tmp_path / "tf1"))
    got = tensors_by_step(str(tmp_path / "tf1"))
    want = _numpy_weights()
    assert sorted(got) == sorted(want)  # each training run once, the assign run not at all
    for step, w in want.items():
        kinds = {kind for kind, _ in got[step]}
        assert "state" not in kinds, got[step].keys()  # the lr is recorded as lr only
        assert float(got[step][("lr", "lr")][2].ravel()[0]) == np.float32(LRS[step // PER_EPOCH])
        np.testing.assert_allclose(got[step][("weight", "w:0")][2].reshape(3, 3), w, rtol=1e-5, atol=1e-6)


def test_an_update_a_hook_ran_outside_the_recorded_runs_is_named(tmp_path) -> None:
    """The baseline's hook trains once more after global step 0 (same batch): its step 1 is never
    recorded, and at step 2 its kernel holds an update the candidate's does not (numpy)."""
    _train(str(tmp_path / "logs" / "original"), rerun_at=(0,), variables="list")
    _train(str(tmp_path / "logs" / "port"), variables="list")
    extra, plain = _numpy_weights(extra_after=(0,)), _numpy_weights()
    assert sorted(extra) == [0, *range(2, EPOCHS * PER_EPOCH)]
    assert np.allclose(extra[0], plain[0]) and not np.allclose(extra[2], plain[2], rtol=1e-3)
    got = tensors_by_step(str(tmp_path / "logs" / "original"))
    np.testing.assert_allclose(got[2][("weight", "w:0")][2].reshape(3, 3), extra[2], rtol=1e-5, atol=1e-6)
    report = compare(str(tmp_path / "logs"), baseline="original", candidate="port")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (2, "weight", "w:0")
    assert "'original' did not record step 1, which 'port' did" in first.note
    assert "a hook that fetches the train op" in first.note
