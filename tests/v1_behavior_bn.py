"""A TF1 script as users run it under ``disable_v2_behavior()`` (legacy ref variables and v1
control flow), or with only control flow v1 (``--control-flow-v1``): batch normalization with a
``training`` placeholder, updated through ``UPDATE_OPS``. Run in its own process (both switches
are process-wide) by ``test_summary_v1.py``; prints, as JSON, each step's logged moving mean and
the value this script read itself before the step."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shim_readback import tensors_by_step

from tb_parity_plugin import summary_v1

if "--control-flow-v1" in sys.argv:
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.disable_control_flow_v2()
else:
    tf.compat.v1.disable_v2_behavior()
out, steps = sys.argv[1], 12
rng = np.random.default_rng(0)
xs = rng.uniform(0, 1, (steps, 32, 28, 28, 1)).astype(np.float32)
rec = summary_v1.Recorder(out)
gs = tf.compat.v1.train.get_or_create_global_step()
x = tf.compat.v1.placeholder(tf.float32, [None, 28, 28, 1])
training = tf.compat.v1.placeholder(tf.bool, [])
h = tf.compat.v1.layers.flatten(tf.compat.v1.layers.conv2d(x, 32, 3, activation=tf.nn.relu))
h = tf.compat.v1.layers.dense(h, 64, activation=tf.nn.relu)
h = tf.compat.v1.layers.batch_normalization(h, training=training)
loss = rec.loss(tf.reduce_mean(tf.square(tf.compat.v1.layers.dense(h, 1))))
opt = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9)
with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
    train_op = rec.minimize(opt, loss, global_step=gs)
rec.variables(optimizer=opt)
fetches = rec.fetches
(moving_mean,) = [v for v in tf.compat.v1.global_variables() if "moving_mean" in v.name]


def closure(ops: list, step: object) -> set:
    seen: set = set()
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(step(op))  # type: ignore[operator]
    return seen


# the graph's own answer, apart from the shim: which ops update the moving mean, and is each one
# ordered after an op that reads the variable for the recorded fetches
feeding = closure(
    [t.op for t in tf.nest.flatten(fetches)], lambda op: [i.op for i in op.inputs] + list(op.control_inputs)
)
var_op = moving_mean.op if getattr(moving_mean, "handle", None) is None else moving_mean.handle.op
# every op of the fetches that reads the variable's buffer: directly, or through its aliasing
# ``read`` Identity (a ref variable's); the update must wait for all of them (a v1 cond's Switch
# only passes it on to the branch that reads it: the inference branch, not run while training)
aliases = {var_op} | {op for op in feeding if op.type == "Identity" and var_op in {i.op for i in op.inputs}}
reads = {op for op in feeding if {i.op for i in op.inputs} & aliases and op.type not in ("Switch", "RefSwitch")}


def source(t: tf.Tensor) -> tf.Operation:
    """The op whose output ``t`` forwards (through a v1 cond's switches and identities)."""
    while t.op.type in ("Switch", "RefSwitch", "Identity", "RefIdentity"):
        t = t.op.inputs[0]
    return t.op


updates = [
    op
    for op in tf.compat.v1.get_default_graph().get_operations()
    if op.type in ("AssignSub", "AssignSubVariableOp") and source(op.inputs[0]) is var_op
]
ordered = [
    bool(reads) and reads <= closure([op], lambda o: [i.op for i in o.inputs] + list(o.control_inputs))
    for op in updates
]
mine = []
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)  # one thread: the race shows more often
with tf.compat.v1.Session(config=config) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    for i in range(steps):
        mine.append(sess.run(moving_mean).tolist())
        rec.write(sess.run([train_op, loss, h, fetches], {x: xs[i], training: True})[-1])
rec.close()
logged = tensors_by_step(out)
print(
    json.dumps(
        {
            "resource": bool(getattr(moving_mean, "handle", None) is not None),
            "updates_ordered_after_the_read": ordered,
            "logged": [np.asarray(logged[s][("state", moving_mean.name)][2]).tolist() for s in range(steps)],
            "read": mine,
        }
    )
)
