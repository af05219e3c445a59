"""TF2's ``ShardedVariable``s (``ParameterServerStrategy(..., variable_partitioner=...)``) against a TF1
original's partitioned embedding (``tests/test_partitioned_variables.py``'s recommender).

A port trained under ``ParameterServerStrategy`` with ``FixedShardsPartitioner(2)`` keeps each
variable as shards ``item_embedding/embeddings/part_0:0`` ..., which a Keras model's
``trainable_variables`` lists, each with its own gradient and Adam slots (a tf_keras ``Optimizer``
keeps those in ``variables`` only inside a ``ShardedVariable`` named ``ShardedVariable``). Recorded
shard by shard, a faithful port of a new user's recommender was a structure DIVERGE (40 tensors
recorded by one run only) and its slots went unrecorded. The recorder now records the shards of each
kind as the whole variable, one shard after the other along axis 0 as TF2's ``tf.nn.embedding_lookup``
(Keras ``Embedding``) reads them, so the port's tables, gradients and slots pair with TF1's whole ones
(laid out as the TF1 lookup reads them) whatever either side's part count. Expectations come from
the float64 numpy replay of ``test_partitioned_variables`` (mean-pooled lookup, linear head, Adam).

The port runs in a subprocess on an in-process cluster on loopback (1 worker, 2 parameter servers):
``ClusterCoordinator`` connects the whole process to the cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import test_partitioned_variables as t
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v2

_PORT = """
import os, socket, sys
import numpy as np
import tensorflow as tf
sys.path.insert(0, {tests!r})
import test_partitioned_variables as t
from tb_parity_plugin import summary_v2

def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

spec = {{"worker": ["127.0.0.1:%d" % port()], "ps": ["127.0.0.1:%d" % port(), "127.0.0.1:%d" % port()]}}
cluster = tf.train.ClusterSpec(spec)
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
servers = [tf.distribute.Server(cluster, job_name=j, task_index=k, config=config) for j in spec for k in range(len(spec[j]))]
strategy = tf.distribute.experimental.ParameterServerStrategy(
    tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc"),
    variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    inp = tf.keras.Input((t.F,), dtype=tf.int64)
    pooled = tf.keras.layers.GlobalAveragePooling1D()(tf.keras.layers.Embedding(t.V, t.E, name="item_embedding")(inp))
    model = tf.keras.Model(inp, tf.keras.layers.Dense(1, use_bias=False, name="head")(pooled))
    model.get_layer("item_embedding").embeddings.assign(np.load({table!r}))
    model.get_layer("head").kernel.assign(t.HEAD)
    opt = {optimizer}(t.LR, epsilon=1e-8)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
rec = summary_v2.Recorder({run_dir!r})
batches = iter(coordinator.create_per_worker_dataset(lambda: tf.data.Dataset.from_tensor_slices((t.IDS, t.Y)).batch(t.B)))

@tf.function
def train_step(iterator):
    ids, y = next(iterator)
    with rec.step(opt.iterations, variables=model, optimizer=opt):
        rec.lr(opt.learning_rate)

        def replica_fn(ids, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(ids, training=True)), global_batch_size=t.B)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss, grads

        loss, grads = strategy.run(replica_fn, args=(ids, y))
        rec.loss(loss, reduction="sum")
        rec.grads(grads, model.trainable_variables)

for _ in range(t.STEPS):
    coordinator.schedule(train_step, args=(batches,))
coordinator.join()
rec.close()
assert [v.name for v in model.trainable_variables][:2] == [
    "item_embedding/embeddings/part_0:0", "item_embedding/embeddings/part_1:0"]
print("trained on shards")
"""


def _port(tmp_path, table: np.ndarray, optimizer: str = "tf.keras.optimizers.Adam") -> None:
    np.save(str(tmp_path / "table.npy"), table)
    script = _PORT.format(
        tests=os.path.dirname(os.path.abspath(__file__)),
        table=str(tmp_path / "table.npy"),
        run_dir=str(tmp_path / "tf2"),
        optimizer=optimizer,
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "trained on shards" in done.stdout, done.stderr[-3000:]


def _step0_gradient() -> np.ndarray:
    """float64 numpy: the table's gradient at step 0 (the replay's model, first batch)."""
    ids, y = t.IDS[: t.B], t.Y[: t.B].astype(np.float64)
    table, head = t.TABLE.astype(np.float64), t.HEAD.astype(np.float64)
    pooled = table[ids].mean(axis=1)
    g_pooled = (1 / (1 + np.exp(-(pooled @ head))) - y) / t.B @ head.T / t.F
    g_table = np.zeros_like(table)
    for j in range(t.F):
        np.add.at(g_table, ids[:, j], g_pooled)
    return g_table


@pytest.mark.parametrize("strategy", ["mod", "div"])
def test_sharded_tables_are_recorded_whole_and_a_faithful_port_agrees(tmp_path, strategy: str) -> None:
    t._tf1(str(tmp_path / "tf1"), strategy)  # 4 parts, looked up as `strategy` reads them
    _port(tmp_path, t.TABLE)  # 2 shards, the whole table in lookup order
    logged = tensors_by_step(str(tmp_path / "tf2"))
    names = {name for _, name in logged[0]}
    assert not [n for n in names if "part_" in n], names  # no shard left
    table = "item_embedding/embeddings:0"
    assert {"m/item_embedding/embeddings", "v/item_embedding/embeddings", "head/kernel:0"} <= names, names
    replay = t._replay(t.STEPS)
    for s in sorted(logged):  # numpy: the recorded whole table is the one the port looks up
        got = np.asarray(logged[s][("weight", table)][2], np.float64)
        np.testing.assert_allclose(got, replay[s], rtol=1e-4, atol=1e-5, err_msg=f"step {s}")  # float32 Adam
    g0 = _step0_gradient()
    np.testing.assert_allclose(logged[0][("grad", table)][2], g0, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(logged[1][("slot", "m/item_embedding/embeddings")][2], 0.1 * g0, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(
        logged[1][("slot", "v/item_embedding/embeddings")][2], 1e-3 * g0**2, rtol=1e-3, atol=1e-12
    )
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.warnings)


def test_mod_parts_loaded_into_the_shards_in_checkpoint_order_are_found_at_step_0(tmp_path) -> None:
    """The port's converter assigns the TF1 checkpoint's ``item_emb`` (the "mod" parts one after the
    other) to its ``ShardedVariable``: numpy says the port looks up other rows than TF1, from step 0."""
    concatenated = np.concatenate(t._parts("mod"))
    assert not np.array_equal(concatenated, t.TABLE)
    t._tf1(str(tmp_path / "tf1"), "mod")
    _port(tmp_path, concatenated)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "weight", "item_emb:0"), first


def test_a_legacy_optimizers_slots_of_shards_are_built_on_the_parameter_servers(tmp_path) -> None:
    """A port with ``tf.keras.optimizers.legacy.Adam`` (TF1's update rule, a common migration choice):
    the recorder built its slots inside the step ``ClusterCoordinator`` schedules, where the strategy's
    variable creator is not in force, so they were made on the coordinator and the step failed ("Cannot
    place the graph ... /job:chief ... vs /job:ps"), where the port alone ran. Its slots of the shards
    (``item_embedding/embeddings/part_0/m:0``) are plain variables: recorded whole, as their shard is."""
    t._tf1(str(tmp_path / "tf1"), "mod")
    _port(tmp_path, t.TABLE, "tf.keras.optimizers.legacy.Adam")
    logged = tensors_by_step(str(tmp_path / "tf2"))
    m = np.asarray(logged[1][("slot", "item_embedding/embeddings/m:0")][2], np.float64)
    np.testing.assert_allclose(m, 0.1 * _step0_gradient(), rtol=1e-4, atol=1e-8)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.warnings)


def test_a_sharded_variable_recorded_itself_is_named_after_its_shards(tmp_path) -> None:
    """``rec.weight(layer.embeddings)`` of a ``ShardedVariable`` recorded its value (the shards one after
    the other) under its name, which ``ParameterServerStrategy`` leaves at ``ShardedVariable``: a second
    table raised "logged twice". Now it is named as its shards are recorded whole, and given as a list
    (``rec.variables([...])``) its shards are recorded whole too. Shards made without a cluster, as
    ``ParameterServerStrategy`` makes them (``<name>/part_k``)."""
    sharded = tf.__internal__.distribute.ShardedVariable
    item = sharded([tf.Variable(t.TABLE[:25], name="item/part_0"), tf.Variable(t.TABLE[25:], name="item/part_1")])
    user = sharded([tf.Variable(t.TABLE[:5], name="user/part_0"), tf.Variable(t.TABLE[5:10], name="user/part_1")])
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    with rec.step(0):
        rec.weight(item)
        rec.weight(user)
    with rec.step(1):
        rec.variables([item])
    rec.close()
    logged = tensors_by_step(str(tmp_path / "tf2"))
    assert set(logged[0]) == {("weight", "item:0"), ("weight", "user:0")} and set(logged[1]) == {("weight", "item:0")}
    np.testing.assert_array_equal(logged[0][("weight", "item:0")][2], t.TABLE)
    np.testing.assert_array_equal(logged[0][("weight", "user:0")][2], t.TABLE[:10])
    np.testing.assert_array_equal(logged[1][("weight", "item:0")][2], t.TABLE)


def test_a_compat_v1_lookup_of_shards_in_a_function_is_laid_out_as_it_reads_them(tmp_path) -> None:
    """A port that keeps TF1's ``tf.compat.v1.nn.embedding_lookup`` over a ``ShardedVariable`` reads it
    as TF1's default ``"mod"`` inside a ``tf.function`` (row ``r`` from shard ``r % 2``), where the
    shards, eager variables, have no op to find the lookup from: the whole was recorded one shard
    after the other, rows the model does not look up (a port filled for that lookup: a false
    DIVERGE). numpy: the recorded table is row ``r`` of shard ``r % 2`` at row ``r // 2``."""
    halves = [t.TABLE[:25], t.TABLE[25:]]
    table = tf.__internal__.distribute.ShardedVariable(
        [tf.Variable(h, name=f"item/part_{k}") for k, h in enumerate(halves)]
    )
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))

    @tf.function
    def step(ids: tf.Tensor) -> None:
        with rec.step(0, variables=[table]):
            rec.activation("rows", tf.compat.v1.nn.embedding_lookup(table, ids))

    step(tf.range(t.V))
    rec.close()
    logged = tensors_by_step(str(tmp_path / "tf2"))[0]
    looked_up = np.stack([halves[r % 2][r // 2] for r in range(t.V)])
    np.testing.assert_array_equal(logged[("activation", "rows")][2], looked_up)  # what the lookup read
    np.testing.assert_array_equal(logged[("weight", "item:0")][2], looked_up)
