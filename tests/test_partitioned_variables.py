"""A TF1 partitioned embedding (``get_variable(..., partitioner=fixed_size_partitioner(4))``) against
its Keras port's one ``Embedding``, from a new user's recommender trial.

TF1 keeps the table as parts ``item_emb/part_0:0`` ... with their own gradients and Adam slots; the
port has ``item_embedding/embeddings:0``. Part by part, nothing paired: 28 structure lines and no
comparison of the tables. The recorder now records the parts of each kind as the whole variable,
its rows as the model looks them up: ``embedding_lookup``'s default ``partition_strategy="mod"``
keeps row ``r`` in part ``r % 4``, ``"div"`` in order. A checkpoint converter that concatenates
``"mod"`` parts gives the port another table, which is found at step 0. Expectations come from a
float64 numpy replay of the model (mean-pooled lookup, a linear head, sigmoid cross-entropy, Adam).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2
from tb_parity_plugin.shim import partitions

V, E, F, B, STEPS, N, LR = 50, 8, 3, 16, 6, 4, 0.05
RNG = np.random.default_rng(0)
IDS = RNG.integers(0, V, (STEPS * B, F))
Y = RNG.integers(0, 2, (STEPS * B, 1)).astype(np.float32)
TABLE = (RNG.standard_normal((V, E)) * 0.1).astype(np.float32)
HEAD = (RNG.standard_normal((E, 1)) * 0.1).astype(np.float32)


def _parts(strategy: str) -> list[np.ndarray]:
    """The four parts holding TABLE as ``embedding_lookup`` reads them under ``strategy``."""
    if strategy == "mod":
        return [TABLE[k::N] for k in range(N)]
    bounds = np.cumsum([0] + [V // N + (1 if k < V % N else 0) for k in range(N)])
    return [TABLE[bounds[k] : bounds[k + 1]] for k in range(N)]


def _tf1(run_dir: str, strategy: str, lookup_name: Any = None, scope: str = "") -> None:
    scoped = tf.compat.v1.variable_scope(scope) if scope else contextlib.nullcontext()
    with tf.Graph().as_default(), scoped:
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, F])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        stored = np.concatenate(_parts(strategy))  # the parts one after the other, as a checkpoint holds them

        def restored(shape: Any, dtype: Any = None, partition_info: Any = None) -> np.ndarray:
            start = partition_info.var_offset[0] if partition_info is not None else 0
            return stored[start : start + shape[0]]

        emb = tf.compat.v1.get_variable(
            "item_emb", [V, E], initializer=restored, partitioner=tf.compat.v1.fixed_size_partitioner(N)
        )
        pooled = tf.reduce_mean(
            tf.compat.v1.nn.embedding_lookup(emb, ids, partition_strategy=strategy, name=lookup_name), axis=1
        )
        logits = tf.compat.v1.layers.dense(
            pooled, 1, use_bias=False, kernel_initializer=tf.constant_initializer(HEAD), name="head"
        )
        loss = rec.loss(tf.compat.v1.losses.sigmoid_cross_entropy(y, logits))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.AdamOptimizer(LR)
        train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train_op, (ids, y), (IDS, Y), STEPS, B)


def _keras(run_dir: str, table: np.ndarray) -> None:
    inp = tf.keras.Input((F,), dtype=tf.int64)
    pooled = tf.keras.layers.GlobalAveragePooling1D(name="pool")(
        tf.keras.layers.Embedding(V, E, name="item_embedding")(inp)
    )
    model = tf.keras.Model(inp, tf.keras.layers.Dense(1, use_bias=False, name="head")(pooled))
    model.get_layer("item_embedding").set_weights([table])
    model.get_layer("head").set_weights([HEAD])
    model.compile(tf.keras.optimizers.Adam(LR, epsilon=1e-8), tf.keras.losses.BinaryCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    model.fit(IDS, Y, batch_size=B, shuffle=False, verbose=0)
    rec.close()


def _replay(steps: int) -> list[np.ndarray]:
    """float64 numpy: the table at the start of each step under Adam (TF1's, epsilon 1e-8)."""
    table, head = TABLE.astype(np.float64), HEAD.astype(np.float64)
    m = [np.zeros_like(table), np.zeros_like(head)]
    v = [np.zeros_like(table), np.zeros_like(head)]
    out = []
    for s in range(steps):
        out.append(table.copy())
        ids, y = IDS[s * B : (s + 1) * B], Y[s * B : (s + 1) * B].astype(np.float64)
        pooled = table[ids].mean(axis=1)
        dlogits = (1 / (1 + np.exp(-(pooled @ head))) - y) / B
        g_head = pooled.T @ dlogits
        g_pooled = dlogits @ head.T / F
        g_table = np.zeros_like(table)
        for j in range(F):
            np.add.at(g_table, ids[:, j], g_pooled)
        t = s + 1
        lr_t = LR * np.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        for i, (var, g) in enumerate(((table, g_table), (head, g_head))):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            var -= lr_t * m[i] / (np.sqrt(v[i]) + 1e-8)
    return out


def _recorded(run_dir: str, kind: str, name: str) -> list[np.ndarray]:
    logged = tensors_by_step(run_dir)
    return [np.asarray(logged[s][(kind, name)][2], np.float64) for s in sorted(logged)]


@pytest.mark.parametrize("strategy", ["mod", "div"])
def test_a_partitioned_table_is_recorded_whole_and_a_faithful_port_agrees(tmp_path, strategy: str) -> None:
    _tf1(str(tmp_path / "tf1"), strategy)
    _keras(str(tmp_path / "tf2"), TABLE)
    logged = tensors_by_step(str(tmp_path / "tf1"))
    names = {name for kind, name in logged[0] if "item_emb" in name}
    assert names == {"item_emb:0", "item_emb/Adam:0", "item_emb/Adam_1:0"}, names  # no part_k left
    # numpy: the recorded table is the one the model looks up, at every step of the replay
    for s, (got, want) in enumerate(zip(_recorded(str(tmp_path / "tf1"), "weight", "item_emb:0"), _replay(STEPS))):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=f"step {s}")
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.warnings)


def test_a_users_scope_named_like_a_part_stays_in_the_name(tmp_path) -> None:
    """A scope of the user's called ``part_0`` above a partitioned table, the optimizer built in it
    too: the name's first ``/part_<k>`` was taken for the partitioner's, so each part kept its own
    name (``tower/item_emb/part_2:0``), and TF's names for the slots' wholes (one per part, when the
    slots are named ``tower/part_0/tower/part_0/item_emb/part_2/Adam``) kept the slots in parts."""
    run = str(tmp_path / "tf1")
    _tf1(run, "mod", scope="tower/part_0")
    names = {name for kind, name in tensors_by_step(run)[0] if "item_emb" in name}
    slot = "tower/part_0/tower/part_0/item_emb"  # TF's name of a slot created in the variable's scope
    assert names == {"tower/part_0/item_emb:0", f"{slot}/Adam:0", f"{slot}/Adam_1:0"}, names
    for s, (got, want) in enumerate(zip(_recorded(run, "weight", "tower/part_0/item_emb:0"), _replay(STEPS))):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=f"step {s}")
    # the first moment after step 0 is non-zero exactly at the rows step 0 looked up: "mod"'s row order
    m = _recorded(run, "slot", f"{slot}/Adam:0")[1]
    assert set(np.flatnonzero(np.abs(m).sum(axis=1) > 0)) == set(np.unique(IDS[:B]).tolist())


def test_a_named_mod_lookup_is_laid_out_as_looked_up(tmp_path) -> None:
    """TF1 code often names its lookups (``embedding_lookup(emb, ids, name="item_lookup")``): the
    lookup's ops are then under ``item_lookup/``, not ``embedding_lookup/``, and its "mod" layout was
    read as "div": the parts were recorded one after the other, rows the model does not look up (a
    faithful port's false DIVERGE at step 0 on ``weight/item_emb:0``). numpy: the recorded table is
    the replay's at every step, and the faithful port agrees."""
    _tf1(str(tmp_path / "tf1"), "mod", lookup_name="item_lookup")
    _keras(str(tmp_path / "tf2"), TABLE)
    for s, (got, want) in enumerate(zip(_recorded(str(tmp_path / "tf1"), "weight", "item_emb:0"), _replay(STEPS))):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=f"step {s}")
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, (report.first_divergence, report.warnings)


def test_mod_parts_concatenated_by_a_converter_are_found_at_step_0(tmp_path) -> None:
    """The port loads the parts one after the other, where "mod" interleaves them: numpy says its
    table's rows are others than TF1 looks up, apart at step 0."""
    concatenated = np.concatenate(_parts("mod"))
    assert not np.array_equal(concatenated, TABLE)
    _tf1(str(tmp_path / "tf1"), "mod")
    _keras(str(tmp_path / "tf2"), concatenated)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "weight", "item_emb:0"), first


_REFERENCE_VARIABLES = """
import sys
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()  # as migrating TF1 code often starts: reference variables
sys.path.insert(0, {tests!r})
import test_partitioned_variables as t
from shim_readback import tensors_by_step
t._tf1({run_dir!r}, {strategy!r})
table = np.asarray(tensors_by_step({run_dir!r})[1][("weight", "item_emb:0")][2], np.float64)
np.testing.assert_allclose(table, t._replay(2)[1], rtol=1e-4, atol=1e-6)
print("laid out as looked up")
"""


@pytest.mark.parametrize("strategy", ["mod", "div"])
def test_reference_variables_under_disable_v2_behavior_are_laid_out_as_looked_up(tmp_path, strategy: str) -> None:
    """TF1 code run after ``tf.compat.v1.disable_v2_behavior()`` makes reference variables, whose
    lookups read them through an ``Identity``, not a resource handle: the "mod" layout went unseen
    and the parts were recorded one after the other, rows the model does not look up (a faithful
    port's false DIVERGE at step 0). numpy: the recorded table after one Adam step is the replay's.
    In a subprocess: the v2 behavior cannot be switched off in a process that ran eager code."""
    script = _REFERENCE_VARIABLES.format(
        tests=os.path.dirname(os.path.abspath(__file__)), run_dir=str(tmp_path / "tf1"), strategy=strategy
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "laid out as looked up" in done.stdout, done.stderr[-3000:]


def test_a_slot_follows_its_own_variables_layout_not_an_enclosing_ones() -> None:
    """A review's case: partitioned ``emb`` looked up as "mod" and partitioned ``emb/x`` read in
    order; ``emb/x`` and its slots took ``emb``'s interleaving by name prefix."""
    mod = {"emb": True, "emb/x": False}
    assert partitions.interleaves("emb/Adam", mod) and partitions.interleaves("emb", mod)
    assert not partitions.interleaves("emb/x", mod) and not partitions.interleaves("emb/x/Adam", mod)
    assert not partitions.interleaves("other/Adam", mod)
