"""The TF1 training loop the shim tests' originals share: one ``sess.run`` per step, as users write it."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf


def train(
    rec: Any, train_op: Any, placeholders: Sequence[Any], arrays: Sequence[np.ndarray], steps: int, batch: int
) -> None:
    """Initialise, run ``train_op`` with ``rec.fetches`` on batch ``s`` of each array at step ``s``,
    write each step's records, close the recorder (call it inside the graph, after recording)."""
    fetches = rec.fetches
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for s in range(steps):
            rows = slice(s * batch, (s + 1) * batch)
            rec.write(sess.run([train_op, fetches], {p: a[rows] for p, a in zip(placeholders, arrays)})[1])
    rec.close()
