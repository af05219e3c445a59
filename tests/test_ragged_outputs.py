"""A port whose ids are a RaggedTensor: its Embedding's output is recorded, padded with 0.

From a helper's trial: a TF1 text model (padded ids through a ``[None, None]`` placeholder,
``embedding_lookup``, the lookup recorded with ``mask=`` and a masked mean, Adagrad) against a Keras
``fit`` port fed ``tf.RaggedTensor`` ids (``Input(ragged=True)``, ``Embedding`` on them, a ragged
mean), the ``Embedding`` instrumented as the README says. ``fit`` failed at its first step with
"Failed to convert elements of tf.RaggedTensor ... to Tensor": the recorder converted what it
records with ``tf.convert_to_tensor``, which refuses a ragged tensor. It is now recorded dense, its
missing positions 0, as padded positions recorded with ``mask=`` are, so the faithful port agrees
element-wise and a port that shifts its ids by one (a reserved OOV index) is found on the lookup.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Optional

import numpy as np
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v2

V, D, B, L, C, STEPS, LR = 300, 8, 8, 6, 3, 3, 0.3
RNG = np.random.default_rng(71)
IDS = np.minimum(RNG.zipf(1.3, size=(STEPS * B, L)), V - 2).astype(np.int32)  # 0 is padding
IDS[np.arange(L)[None, :] >= RNG.integers(1, L + 1, size=(STEPS * B, 1))] = 0
IDS[:, 0] = np.maximum(IDS[:, 0], 1)
IDS[B - 1] = np.arange(1, L + 1)  # one row of every batch at full length: the padded width is L
IDS[2 * B - 1], IDS[3 * B - 1] = IDS[B - 1], IDS[B - 1]
LABELS = RNG.integers(0, C, size=STEPS * B).astype(np.int32)
E0 = RNG.normal(size=(V, D)).astype(np.float32) * 0.3
W0 = RNG.normal(size=(D, C)).astype(np.float32) * 0.3


def _tf1(run_dir: str, width: int = L) -> None:
    """Fed ids padded to ``width`` (every batch has a row of ``L``)."""
    from tb_parity_plugin import summary_v1

    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int32, [None, None])
        labels = tf.compat.v1.placeholder(tf.int32, [None])
        with tf.compat.v1.variable_scope("embedding"):
            table = tf.compat.v1.get_variable("embeddings", initializer=E0)
        real = tf.cast(ids > 0, tf.float32)
        looked_up = rec.activation("embedding", tf.nn.embedding_lookup(table, ids), mask=real)
        pooled = tf.reduce_sum(looked_up * real[..., None], 1) / tf.reduce_sum(real, 1, keepdims=True)
        logits = tf.compat.v1.layers.dense(
            rec.activation("pooled", pooled), C, kernel_initializer=tf.constant_initializer(W0), name="logits"
        )
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, rec.activation("logits", logits)))
        rec.lr(tf.constant(LR))
        opt = tf.compat.v1.train.AdagradOptimizer(LR)
        train_op = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        padded = np.pad(IDS, ((0, 0), (0, width - L)))
        tf1_session.train(rec, train_op, (ids, labels), (padded, LABELS), STEPS, B)


def _ragged_fit(
    run_dir: str, shifted: bool = False, summed: bool = False, strategy: Optional[tf.distribute.Strategy] = None
) -> None:
    """``summed``: the port pools its lookup with a sum where the original averages it (a bug); ``strategy``:
    the model built and fitted under it."""
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        inputs = tf.keras.Input((None,), dtype=tf.int32, ragged=True)
        ids = inputs
        if shifted:  # a vocabulary with an OOV index before the TF1 ids, the TF1 table copied as it is
            ids = tf.keras.layers.Lambda(lambda t: tf.ragged.map_flat_values(lambda v: v + 1, t), name="shift")(ids)
        looked_up = tf.keras.layers.Embedding(
            V, D, embeddings_initializer=tf.constant_initializer(E0), name="embedding"
        )(ids)
        pool = tf.reduce_sum if summed else tf.reduce_mean
        pooled = tf.keras.layers.Lambda(lambda e: pool(e, axis=1), name="pooled")(looked_up)
        logits = tf.keras.layers.Dense(C, kernel_initializer=tf.constant_initializer(W0), name="logits")(pooled)
        model = tf.keras.Model(inputs, logits)
        model.compile(tf.keras.optimizers.Adagrad(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["embedding", "pooled", "logits"])
    batches = [(IDS[s * B : (s + 1) * B], LABELS[s * B : (s + 1) * B]) for s in range(STEPS)]
    data = tf.data.Dataset.from_generator(
        lambda: ((tf.RaggedTensor.from_tensor(x, padding=0), y) for x, y in batches),
        output_signature=(tf.RaggedTensorSpec([None, None], tf.int32, 1), tf.TensorSpec([None], tf.int32)),
    )
    model.fit(data, epochs=1, verbose=0)
    rec.close()


def _lookups(shift: int = 0) -> list:
    """numpy, float64: each step's lookup as a padded batch records it (padding 0), and the pooled
    mean, for a port whose ids are shifted by ``shift``; Adagrad as both runs apply it (accumulator
    0.1; TF1 without epsilon, Keras with 1e-7 inside the root, 3e-7 of it here)."""
    table, w, b = E0.astype(np.float64), W0.astype(np.float64), np.zeros(C)
    acc = [np.full(table.shape, 0.1), np.full(w.shape, 0.1), np.full(C, 0.1)]
    out = []
    for s in range(STEPS):
        ids, y = IDS[s * B : (s + 1) * B], LABELS[s * B : (s + 1) * B]
        real = (ids > 0)[..., None]
        rows = np.where(real[..., 0], ids + shift, 0)
        e = table[rows] * real
        n = real.sum(1)
        pooled = e.sum(1) / n
        logits = pooled @ w + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        dl = p.copy()
        dl[np.arange(B), y] -= 1
        dl /= B
        gt = np.zeros_like(table)
        np.add.at(gt, rows[real[..., 0]], np.broadcast_to((dl @ w.T / n)[:, None, :], e.shape)[real[..., 0]])
        out.append((e, pooled))
        for v, g, a in zip((table, w, b), (gt, pooled.T @ dl, dl.sum(0)), acc):
            a += g * g
            v -= LR * g / np.sqrt(a)
    return out


def test_a_ragged_embedding_output_is_recorded_padded_and_a_faithful_port_agrees(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _ragged_fit(str(tmp_path / "tf2"))  # failed at its first step: the ragged output could not be recorded
    recorded = tensors_by_step(str(tmp_path / "tf2"))
    for s, (e, pooled) in enumerate(_lookups()):  # numpy: the lookup padded with 0 to the batch's longest row
        assert np.allclose(recorded[s][("activation", "embedding")][2], e, atol=1e-6), s
        assert np.allclose(recorded[s][("activation", "pooled")][2], pooled, atol=1e-6), s
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.first_divergence is None, report.first_divergence
    assert report.tensors_compared >= 3 and "activation/embedding" not in report.statistics_only


def test_a_ragged_port_with_its_ids_shifted_diverges_on_the_lookup_at_step_0(tmp_path) -> None:
    faithful, shifted = _lookups(), _lookups(shift=1)
    assert np.abs(faithful[0][0] - shifted[0][0]).max() > 0.1  # numpy: the rows looked up differ at step 0
    _tf1(str(tmp_path / "tf1"))
    _ragged_fit(str(tmp_path / "tf2"), shifted=True)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "embedding"), first
    # a lookup holds no attention: its real positions apart were put down to attention masks alone (a trial's)
    assert "ids shifted by one" in (first.note or ""), first.note


def test_recording_a_ragged_tensor_returns_it_for_the_model_to_go_on_with(tmp_path) -> None:
    rec = summary_v2.Recorder(str(tmp_path / "run"))
    ragged = tf.ragged.constant([[1.0, 2.0], [3.0]])
    with rec.step(0):
        assert rec.activation("x", ragged) is ragged
        assert rec.activation("y", ragged, mask=tf.constant([[True, False], [True, False]])) is ragged
    rec.close()
    values = tensors_by_step(str(tmp_path / "run"))[0]
    assert values[("activation", "x")][2].tolist() == [[1.0, 2.0], [3.0, 0.0]]
    assert values[("activation", "y")][2].tolist() == [[1.0, 0.0], [3.0, 0.0]]


def test_a_fixed_width_original_against_a_ragged_port_is_told_the_widths_differ(tmp_path) -> None:
    """The original padded to a fixed width of L + 2 records its lookup as [B, L + 2, D] where the ragged
    port records [B, L, D] (each batch's longest row): a shape divergence, whose note said only the two
    shapes. numpy: the extra positions are padding (0 as recorded with mask=) and the first L are the
    same lookup; a port with its ids shifted differs there too, and is not told of padding widths."""
    padded = [np.pad(e, ((0, 0), (0, 2), (0, 0))) for e, _ in _lookups()]
    assert all(np.array_equal(p[:, :L], e) and not p[:, L:].any() for p, (e, _) in zip(padded, _lookups()))
    widths = "the runs pad their sequences to other widths"
    for shifted, told in ((False, True), (True, False)):
        logdir = tmp_path / str(shifted)
        _tf1(str(logdir / "tf1"), width=L + 2)
        _ragged_fit(str(logdir / "tf2"), shifted=shifted)
        first = compare(str(logdir), baseline="tf1", candidate="tf2").first_divergence
        assert first is not None and (first.step, first.tensor, first.reason) == (0, "embedding", "shape"), first
        assert (widths in (first.note or "")) == told, first.note
        if told:
            assert f"'tf1' holds 0 at every position past {L}" in first.note, first.note
            assert "all 3 outputs and losses recorded after it agree at this step" in first.note, first.note


def test_a_fixed_width_original_against_a_ragged_port_that_sums_its_lookup_is_told_what_differs_after_it(
    tmp_path,
) -> None:
    """The same widths, and a port that sums its lookup where the original averages it: the lookup is told
    the runs pad to other widths, as a faithful port's is, and was told no more, though the pooled output,
    the logits and the loss differ at step 0 (numpy: a sum of up to L rows against their mean)."""
    lengths = (IDS[:B] > 0).sum(1)
    pooled = _lookups()[0][1]
    assert lengths.max() > 1 and np.abs(pooled * lengths[:, None] - pooled).max() > 0.1
    _tf1(str(tmp_path / "tf1"), width=L + 2)
    _ragged_fit(str(tmp_path / "tf2"), summed=True)
    np.testing.assert_allclose(
        tensors_by_step(str(tmp_path / "tf2"))[0][("activation", "pooled")][2], pooled * lengths[:, None], atol=1e-5
    )
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.tensor, first.reason) == (0, "embedding", "shape"), first
    note = first.note or ""
    assert "the runs pad their sequences to other widths" in note, note
    assert (
        "but 3 of the 3 outputs and losses recorded after it differ in value at this step, activation/pooled first"
        in note
    ), note


def test_a_shape_step_has_no_error_ratio_in_the_heat_map_or_the_detail(tmp_path) -> None:
    """At a step whose shapes differ the elements do not correspond, so no error ratio means anything:
    the summary said n/a while the heat map's cell and the detail's figures carried one computed from the
    statistics (2037, "proves an element out of tolerance": a helper's check of the front ends). numpy:
    the two lookups have other shapes at every step ([B, L + 2, D] against [B, L, D])."""
    from tb_parity_plugin.engine import Comparison
    from tb_parity_plugin.engine.matrix import SHAPE
    from tb_parity_plugin.logdir.reader import LogdirReader

    assert all(np.pad(e, ((0, 0), (0, 2), (0, 0))).shape != e.shape for e, _ in _lookups())
    _tf1(str(tmp_path / "tf1"), width=L + 2)
    _ragged_fit(str(tmp_path / "tf2"))
    with LogdirReader(str(tmp_path)) as reader:
        comparison = Comparison(reader.run("tf1"), reader.run("tf2"))
        first = comparison.report().first_divergence
        assert first is not None and first.reason == "shape" and first.error_ratio is None, first
        matrix = comparison.matrix()
        col = matrix.tensors.index("activation/embedding")
        shape_rows = matrix.reason[:, col] == SHAPE
        assert shape_rows.all(), matrix.reason[:, col]
        assert np.isnan(matrix.error_ratio[shape_rows, col]).all(), matrix.error_ratio[:, col]
        detail = comparison.detail("activation/embedding", step=0)
        assert np.isnan(detail.error_ratio).all(), detail.error_ratio
        assert detail.figures is not None and detail.figures["error_ratio"] is None, detail.figures


def test_a_sparse_adjacency_built_from_an_unsorted_edge_list_is_recorded_summed_and_the_step_runs(tmp_path) -> None:
    """A graph convolution's adjacency built from its edge list as it comes (not in row-major order, an
    edge given twice): ``sparse_dense_matmul`` reads it as it is, summing the duplicate, and the step
    failed where it was recorded ("indices[1] = [0,2] is out of order": ``tf.sparse.to_dense`` refuses
    it). numpy: the dense adjacency with the duplicate edge summed, and the product it gives."""
    edges = np.array([[2, 0], [0, 2], [1, 1], [0, 1], [0, 2]], np.int64)  # out of order, [0, 2] twice
    weights = np.array([0.5, 1.0, 2.0, 3.0, 0.25], np.float32)
    dense = np.zeros((3, 3))
    np.add.at(dense, (edges[:, 0], edges[:, 1]), weights)
    feats = RNG.normal(size=(3, 2)).astype(np.float32)
    rec = summary_v2.Recorder(str(tmp_path / "run"))
    adjacency = tf.SparseTensor(edges, weights, [3, 3])

    @tf.function
    def step() -> tf.Tensor:
        with rec.step(0):
            recorded = rec.activation("adjacency", adjacency)
            return rec.activation("aggregated", tf.sparse.sparse_dense_matmul(recorded, feats))

    out = step().numpy()
    rec.close()
    np.testing.assert_allclose(out, dense @ feats, rtol=1e-6)
    values = tensors_by_step(str(tmp_path / "run"))[0]
    np.testing.assert_allclose(values[("activation", "adjacency")][2], dense, rtol=1e-6)
    np.testing.assert_allclose(values[("activation", "aggregated")][2], dense @ feats, rtol=1e-6)


def test_a_ragged_fit_port_under_mirrored_strategy_records_its_lookup_padded_to_the_batchs_longest_row(
    tmp_path,
) -> None:
    """The same fit port under MirroredStrategy on two CPUs, its Embedding instrumented: each replica's
    lookup is a RaggedTensor, and fit failed at its first step with "Failed to convert elements of
    tf.RaggedTensor" (the per-replica path converted each part as the one-device path no longer does);
    each replica's longest row is its own, so the parts are joined before they are padded. numpy: the
    lookup padded with 0 to the batch's longest row, as on one device; the port agrees with the original."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path / "tf2")], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = tensors_by_step(str(tmp_path / "tf2"))
    assert IDS[: B // 2].astype(bool).sum(1).max() < L  # numpy: the first replica's rows are all shorter than L
    for s, (e, pooled) in enumerate(_lookups()):
        assert np.allclose(recorded[s][("activation", "embedding")][2], e, atol=1e-6), s
        assert np.allclose(recorded[s][("activation", "pooled")][2], pooled, atol=1e-6), s
    _tf1(str(tmp_path / "tf1"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.first_divergence is None, report.first_divergence


if __name__ == "__main__":  # the fit port under MirroredStrategy on two CPUs: logical devices need a fresh process
    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    _ragged_fit(sys.argv[1], strategy=tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
