"""TF1 training recipes the README gives, shared by the tests that train TF1 programs."""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf


def recorded_update(rec: Any, opt: Any, loss: tf.Tensor, global_step: Any, clip: Optional[float] = None) -> tuple:
    """``(train_op, variables)``: gradients and weights recorded before an optional
    ``clip_by_global_norm``, the update built under ``rec.before_update`` (README: clipping)."""
    grads, variables = zip(*rec.grads_and_vars(opt.compute_gradients(loss)))
    if clip is not None:
        grads, _ = tf.clip_by_global_norm(list(grads), clip)
    with rec.before_update(global_step):
        return opt.apply_gradients(zip(grads, variables), global_step=global_step), variables


def dense_regression(
    run_dir: str, kernel: Any, xs: Any, ys: Any, make_opt: Any, watch: Any, clip: Optional[float] = None
) -> list:
    """A TF1 dense regression (placeholders ``[None, n]``, one ``dense`` layer from ``kernel``, mean
    squared error) trained one batch of ``xs``/``ys`` per step by ``make_opt(global_step, rec)``, with
    :func:`recorded_update`; returns, before each step, what ``watch(opt, variables)`` names,
    fetched from the session."""
    from tb_parity_plugin import summary_v1

    seen = []
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, xs.shape[-1]])
        y = tf.compat.v1.placeholder(tf.float32, [None, ys.shape[-1]])
        init = tf.constant_initializer(kernel)
        p = tf.compat.v1.layers.dense(x, ys.shape[-1], kernel_initializer=init, name="dense")
        loss = rec.loss(tf.reduce_mean(tf.square(p - y)))
        opt = make_opt(gs, rec)
        train, variables = recorded_update(rec, opt, loss, gs, clip)
        rec.variables(optimizer=opt)
        watched = watch(opt, list(variables))
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(len(xs)):
                seen.append(sess.run(watched))
                rec.write(sess.run([train, fetches], {x: xs[s], y: ys[s]})[1])
        rec.close()
    return seen
