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
