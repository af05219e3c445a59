"""Recording inside a function XLA compiles is refused, naming the setting.

A new user's Keras 3 port recorded in a ``tf.function(jit_compile=True)`` step (and a ``train_step``
override under ``compile(jit_compile=True)``, which Keras 3's default ``'auto'`` picks on a GPU): the
run failed at its first step with XLA's "Detected unsupported operations ... SegmentSum", naming
neither the recorder nor ``jit_compile``, and the run held no records.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from tb_parity_plugin import summary_v2


def test_a_jit_compiled_step_is_refused_naming_jit_compile(tmp_path) -> None:
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    w = tf.Variable(tf.ones((3, 2)))
    step = tf.Variable(0, dtype=tf.int64)

    @tf.function(jit_compile=True)
    def train_step(x: tf.Tensor) -> None:
        with rec.step(step, variables=[w]):
            rec.loss(tf.reduce_sum(x @ w))
        step.assign_add(1)

    with pytest.raises(ValueError, match="jit_compile=False"):
        train_step(tf.ones((4, 3)))

    @tf.function  # the same step without XLA records
    def plain_step(x: tf.Tensor) -> None:
        with rec.step(step, variables=[w]):
            rec.loss(tf.reduce_sum(x @ w))

    plain_step(tf.ones((4, 3)))
    rec.close()
