"""The TF1 training loop the shim tests' originals share: one ``sess.run`` per step, as users write it."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf


def train(
    rec: Any,
    train_op: Any,
    placeholders: Sequence[Any],
    arrays: Sequence[np.ndarray],
    steps: int,
    batch: int,
    fixed: Optional[Mapping[Any, Any]] = None,
) -> None:
    """Initialise (variables and lookup tables), run ``train_op`` with ``rec.fetches`` on batch ``s`` of each array at step ``s``
    (and ``fixed``'s values, fed at every step: a ``keep_prob`` of 1.0), write each step's records,
    close the recorder (call it inside the graph, after recording)."""
    fetches = rec.fetches
    with tf.compat.v1.Session() as sess:
        # and the lookup tables, as MonitoredTrainingSession's scaffold does (a no-op without any)
        sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()])
        for s in range(steps):
            rows = slice(s * batch, (s + 1) * batch)
            feed = {p: a[rows] for p, a in zip(placeholders, arrays)} | dict(fixed or {})
            rec.write(sess.run([train_op, fetches], feed)[1])
    rec.close()
