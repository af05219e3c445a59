"""Alignment on ports written the way users write them, from two new users' trials.

* Keras numbers layers per process: a notebook that built a model earlier names the port's layers
  ``dense_1, dense_2, dense_3`` where TF1 has ``dense, dense_1, dense_2``. Renumbering fixes the
  variables' scopes, but a layer's output is recorded under the layer's own name, so TF1's
  ``dense_1`` (its second layer) was paired by name with the port's ``dense_1`` (its first) when
  the widths are equal: a false DIVERGE at step 0 of a faithful port. With ``[None, n]`` batches the
  outputs were not paired by shape at all (a dimension the graph does not know kept them out).
* A TF1 ``LSTMCell`` (one kernel ``[in + units, 4 units]``, gates i, j, f, o, forget bias added at
  run time) against Keras ``LSTM`` (kernel, recurrent kernel, gates i, f, c, o, forget bias folded
  into the bias): the two biases share a shape and nothing else, were paired by it, and diverged at
  step 0 of a faithful port.

Every expectation is checked against numpy.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import numpy as np
import pytest
import tensorflow as tf

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(8)
STEPS, BATCH = 4, 8
LR = 0.1
X = RNG.standard_normal((STEPS * BATCH, 4)).astype(np.float32)
Y = RNG.standard_normal((STEPS * BATCH, 6)).astype(np.float32)
KERNELS = [(RNG.standard_normal(shape) * 0.5).astype(np.float32) for shape in ((4, 6), (6, 6), (6, 6))]


def _mlp_tf1(run_dir: str) -> None:
    """Three tanh layers of width 6, TF1's default names, each output recorded under its layer name."""
    with _tf1_graph(run_dir, (None, 4), (None, 6)) as (rec, gs, x, y):
        h = x
        for i, kernel in enumerate(KERNELS):
            name = "dense" if i == 0 else f"dense_{i}"
            h = tf.compat.v1.layers.dense(h, 6, tf.tanh, kernel_initializer=tf.constant_initializer(kernel), name=name)
            rec.activation(name, h)
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, h))
        _train_with_sgd(rec, gs, loss, _batches(x, y, Y))


@contextlib.contextmanager
def _tf1_graph(
    run_dir: str, x_shape: tuple[Optional[int], ...], y_shape: tuple[Optional[int], ...]
) -> Iterator[tuple[summary_v1.Recorder, tf.Variable, tf.Tensor, tf.Tensor]]:
    """The opening every TF1 original here shares: a fresh graph, its recorder, the global step and
    the input and target placeholders, shaped as the user wrote them (``None`` batch and all)."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        yield rec, gs, tf.compat.v1.placeholder(tf.float32, x_shape), tf.compat.v1.placeholder(tf.float32, y_shape)


def _batches(x: tf.Tensor, y: tf.Tensor, targets: np.ndarray) -> list[dict]:
    """One feed per step: the step's ``BATCH`` rows of ``X`` and of ``targets``, in order."""
    rows = [slice(s * BATCH, (s + 1) * BATCH) for s in range(STEPS)]
    return [{x: X[r], y: targets[r]} for r in rows]


def _train_with_sgd(
    rec: summary_v1.Recorder, gs: tf.Variable, loss: tf.Tensor, feeds: list[dict], adam: bool = False
) -> None:
    """The TF1 training tail both originals share: the lr recorded, SGD built by the recorder, one
    ``sess.run`` per feed, then the recorder closed (``adam``: ``AdamOptimizer``, its slots recorded)."""
    rec.lr(tf.constant(LR))
    if adam:
        optimizer = tf.compat.v1.train.AdamOptimizer(LR)
        train_op = rec.minimize(optimizer, loss, global_step=gs)
        rec.variables(optimizer=optimizer)
    else:
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
    rec.set_step(gs)
    fetches = rec.fetches
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for feed in feeds:
            _, parity = sess.run([train_op, fetches], feed)
            rec.write(parity)
    rec.close()


def _mlp_port(run_dir: str, second_activation: str = "tanh") -> list[str]:
    """The Keras port after an earlier cell built a layer: its layers are ``dense_1..dense_3``;
    ``fit`` on a dataset whose batch dimension is unknown. Returns the layer names."""
    tf.keras.backend.clear_session()
    tf.keras.layers.Dense(1)  # a notebook's earlier cell
    activations = ["tanh", second_activation, "tanh"]
    model = tf.keras.Sequential(
        [tf.keras.Input((4,))]
        + [
            tf.keras.layers.Dense(6, act, kernel_initializer=tf.constant_initializer(k))
            for act, k in zip(activations, KERNELS)
        ]
    )
    model.compile(tf.keras.optimizers.SGD(LR), loss="mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=model.layers)
    model.fit(tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH), shuffle=False, verbose=0)
    rec.close()
    return [layer.name for layer in model.layers]


def _mlp_numpy(second: str = "tanh") -> list[np.ndarray]:
    """The three layers' outputs at step 0 (biases start at 0)."""
    h, out = X[:BATCH].astype(np.float64), []
    for i, kernel in enumerate(KERNELS):
        pre = h @ kernel
        h = np.maximum(pre, 0) if (i == 1 and second == "relu") else np.tanh(pre)
        out.append(h)
    return out


def test_layer_outputs_follow_their_layers_when_keras_numbered_them_differently(tmp_path) -> None:
    """Faithful port, names drifted by one: every output pairs with its own layer's, and it agrees
    (numpy: TF1's and the port's outputs are the same functions of the same weights)."""
    _mlp_tf1(str(tmp_path / "tf1"))
    names = _mlp_port(str(tmp_path / "tf2"))
    assert names == ["dense_1", "dense_2", "dense_3"]
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    paired = {m["baseline"]: m["candidate"] for m in report.to_dict()["mapping"] if m["kind"] == "activation"}
    assert paired == {"dense": "dense_1", "dense_1": "dense_2", "dense_2": "dense_3"}
    assert report.agree, report.first_divergence


def test_a_wrong_activation_is_blamed_on_its_layer_when_names_drifted(tmp_path) -> None:
    """The port's second layer uses relu: numpy says its first layer's output is the same and its
    second's differs at step 0; the tool names TF1's ``dense_1`` against the port's ``dense_2``."""
    want, got = _mlp_numpy("tanh"), _mlp_numpy("relu")
    assert np.array_equal(want[0], got[0]) and np.abs(want[1] - got[1]).max() > 1e-2
    _mlp_tf1(str(tmp_path / "tf1"))
    _mlp_port(str(tmp_path / "tf2"), second_activation="relu")
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None
    assert (first.step, first.kind, first.tensor, first.candidate_tensor) == (0, "activation", "dense_1", "dense_2")
    np.testing.assert_allclose(first.max_abs_diff, np.abs(want[1] - got[1]).max(), rtol=1e-4)


# -- a TF1 LSTMCell and its Keras LSTM port ---------------------------------------------------

IN, UNITS, CLASSES, T = 3, 4, 2, 5
LSTM_KERNEL = (RNG.uniform(-1, 1, (IN + UNITS, 4 * UNITS)) * 0.6).astype(np.float32)
DENSE = (RNG.standard_normal((UNITS, CLASSES)) * 0.5).astype(np.float32)
SEQS = RNG.standard_normal((STEPS, BATCH, T, IN)).astype(np.float32)
LABELS = np.eye(CLASSES, dtype=np.float32)[RNG.integers(0, CLASSES, (STEPS, BATCH))]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


def _lstm_numpy(x: np.ndarray) -> np.ndarray:
    """TF1 ``LSTMCell`` outputs, written out: ``[x, h] @ W`` split into i, j, f, o; forget bias 1."""
    h, c, out = np.zeros((len(x), UNITS)), np.zeros((len(x), UNITS)), []
    for t in range(x.shape[1]):
        z = np.concatenate([x[:, t], h], 1) @ LSTM_KERNEL.astype(np.float64)
        i, j, f, o = (z[:, k * UNITS : (k + 1) * UNITS] for k in range(4))
        c = _sigmoid(f + 1.0) * c + _sigmoid(i) * np.tanh(j)
        h = _sigmoid(o) * np.tanh(c)
        out.append(h)
    return np.stack(out, 1)


def _keras_weights(gate_order_right: bool) -> list[np.ndarray]:
    """TF1's LSTM weights for Keras: gates reordered to i, f, c, o and the forget bias folded in
    (``gate_order_right=False``: the classic slip, TF1's columns copied as they are)."""
    i, j, f, o = (LSTM_KERNEL[:, k * UNITS : (k + 1) * UNITS] for k in range(4))
    kernel = np.concatenate([i, f, j, o], 1) if gate_order_right else LSTM_KERNEL
    bias = np.zeros(4 * UNITS, np.float32)
    bias[UNITS : 2 * UNITS] = 1.0 if gate_order_right else 0.0
    if not gate_order_right:
        bias[2 * UNITS : 3 * UNITS] = 1.0  # TF1's forget columns sit where Keras reads c
    return [kernel[:IN], kernel[IN:], bias]


def _lstm_tf1(run_dir: str, scope: Optional[str] = None, adam: bool = False, peepholes: bool = False) -> None:
    """``scope``: ``dynamic_rnn``'s (``rnn`` by default; ``lstm`` names its variables as Keras does);
    ``adam``: trained by ``AdamOptimizer`` instead of SGD; ``peepholes``: ``use_peepholes=True``, the
    three peephole weights ``PEEPHOLE``."""
    with _tf1_graph(run_dir, (None, None, IN), (None, CLASSES)) as (rec, gs, x, y):

        def init(shape, dtype=None, partition_info=None):  # type: ignore[no-untyped-def]
            return tf.constant(LSTM_KERNEL if len(shape) == 2 else PEEPHOLE)

        cell = tf.compat.v1.nn.rnn_cell.LSTMCell(UNITS, use_peepholes=peepholes, initializer=init)
        outputs, _ = tf.compat.v1.nn.dynamic_rnn(cell, x, dtype=tf.float32, scope=scope)
        rec.activation("lstm", outputs)
        logits = tf.compat.v1.layers.dense(outputs[:, -1], CLASSES, kernel_initializer=tf.constant_initializer(DENSE))
        rec.activation("dense", logits)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        _train_with_sgd(rec, gs, loss, [{x: SEQS[s], y: LABELS[s]} for s in range(STEPS)], adam)


def _lstm_port(
    run_dir: str, gate_order_right: bool, weights: Optional[list[np.ndarray]] = None, adam: bool = False
) -> np.ndarray:
    """Keras ``LSTM`` + ``Dense`` under ``fit``; returns the LSTM's outputs at step 0 before training.
    ``weights``: the LSTM's, instead of TF1's converted (:func:`_keras_weights`); ``adam``: Keras
    ``Adam`` with TF1's epsilon instead of SGD."""
    tf.keras.backend.clear_session()
    lstm = tf.keras.layers.LSTM(UNITS, return_sequences=True, name="lstm")
    dense = tf.keras.layers.Dense(CLASSES, kernel_initializer=tf.constant_initializer(DENSE))
    inputs = tf.keras.Input((None, IN))
    hidden = lstm(inputs)
    model = tf.keras.Model(inputs, dense(tf.keras.layers.Lambda(lambda s: s[:, -1])(hidden)))
    lstm.set_weights(_keras_weights(gate_order_right) if weights is None else weights)
    before = tf.keras.Model(inputs, hidden)(SEQS[0]).numpy()
    optimizer = tf.keras.optimizers.Adam(LR, epsilon=1e-8) if adam else tf.keras.optimizers.SGD(LR)
    model.compile(optimizer, loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=[lstm, dense])
    data = tf.data.Dataset.from_tensor_slices((SEQS.reshape(-1, T, IN), LABELS.reshape(-1, CLASSES))).batch(BATCH)
    model.fit(data, verbose=0, shuffle=False)
    rec.close()
    return before


def _lstm_report(tmp_path, gate_order_right: bool, allow: Optional[list[str]] = None):  # type: ignore[no-untyped-def]
    _lstm_tf1(str(tmp_path / "tf1"))
    before = _lstm_port(str(tmp_path / "tf2"), gate_order_right)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=allow or [])
    return before, report


def test_a_faithful_lstm_port_has_no_value_divergence(tmp_path) -> None:
    """The converted weights give TF1's outputs (numpy, to float32 rounding). The cells' variables
    cannot be paired (another parametrisation): they are a structure difference, said with a warning,
    and nothing diverges at any step; declared expected, the port agrees."""
    before, report = _lstm_report(tmp_path, gate_order_right=True)
    np.testing.assert_allclose(before, _lstm_numpy(SEQS[0].astype(np.float64)), atol=1e-6)
    assert report.first_step_divergence is None, report.first_step_divergence
    unmatched = set(report.unmatched["tf1"])
    assert {"weight/rnn/lstm_cell/bias:0", "grad/rnn/lstm_cell/bias:0"} <= unmatched
    assert any("another parametrisation" in w and "--allow-unmatched '*lstm_cell*'" in w for w in report.warnings)
    allowed = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*lstm_cell*"])
    assert allowed.agree, allowed.first_divergence
    # A new user followed the warning's --map for the kernel alone: the bias, declared and of one
    # shape on both sides (i,j,f,o against i,f,c,o, the forget bias folded in), was then paired by its
    # scope and diverged at step 0 by exactly that 1 (numpy: 25% of it). Declared stays unpaired.
    mapped = compare(
        str(tmp_path),
        baseline="tf1",
        candidate="tf2",
        allow_unmatched=["*lstm_cell*"],
        mapping=["rnn/lstm_cell/kernel=lstm/lstm_cell/kernel"],
    )
    biases = [m for m in mapped.to_dict()["mapping"] if "bias" in m["baseline"] and "lstm" in m["baseline"]]
    assert biases == [], biases
    first = mapped.first_divergence
    assert first is not None and first.reason == "shape" and "kernel" in first.tensor, first


PEEPHOLE = np.random.default_rng(52).uniform(-1, 1, UNITS).astype(np.float32)


def _lstm_numpy_peepholes(x: np.ndarray) -> np.ndarray:
    """TF1 ``LSTMCell(use_peepholes=True)`` written out: ``PEEPHOLE`` times the previous cell state added
    to i and f, times the new one to o."""
    h, c, out = np.zeros((len(x), UNITS)), np.zeros((len(x), UNITS)), []
    for t in range(x.shape[1]):
        z = np.concatenate([x[:, t], h], 1) @ LSTM_KERNEL.astype(np.float64)
        i, j, f, o = (z[:, k * UNITS : (k + 1) * UNITS] for k in range(4))
        c = _sigmoid(f + 1.0 + PEEPHOLE * c) * c + _sigmoid(i + PEEPHOLE * c) * np.tanh(j)
        h = _sigmoid(o + PEEPHOLE * c) * np.tanh(c)
        out.append(h)
    return np.stack(out, 1)


def test_an_lstm_port_dropping_tf1s_peepholes_is_told_so(tmp_path) -> None:
    """TF1's ``LSTMCell(use_peepholes=True)`` ported to Keras ``LSTM``, gate order, forget bias and kernel
    split all converted right: numpy says its outputs differ at step 0 by the peepholes alone. The note
    listed the three conversions only, each right here; it now says Keras LSTM has no peepholes."""
    _lstm_tf1(str(tmp_path / "tf1"), peepholes=True)
    before = _lstm_port(str(tmp_path / "tf2"), gate_order_right=True)
    np.testing.assert_allclose(before, _lstm_numpy(SEQS[0].astype(np.float64)), atol=1e-6)
    want = _lstm_numpy_peepholes(SEQS[0].astype(np.float64))
    assert np.abs(before - want).max() > 1e-2
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*lstm_cell*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "lstm"), first
    np.testing.assert_allclose(first.max_abs_diff, np.abs(before - want).max(), rtol=1e-3)
    note = first.note or ""
    assert "'tf1''s cell has peephole connections (TF1 LSTMCell(use_peepholes=True): rnn/lstm_cell/w_f_diag:0" in note
    assert "Keras LSTM has none" in note, note


def test_a_wrong_gate_order_is_found_on_the_lstm_output(tmp_path) -> None:
    """TF1's columns copied as they are: numpy says the LSTM's outputs differ at step 0; the tool
    names them (not the unpairable biases)."""
    before, report = _lstm_report(tmp_path, gate_order_right=False, allow=["*lstm_cell*"])
    want = _lstm_numpy(SEQS[0].astype(np.float64))
    assert np.abs(before - want).max() > 1e-2
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "lstm"), first
    np.testing.assert_allclose(first.max_abs_diff, np.abs(before - want).max(), rtol=1e-3)


def test_the_lstm_notes_name_what_was_never_compared_and_what_to_convert(tmp_path) -> None:
    """Gate order and forget bias, each as a new user slipped: the output diverges at step 0 by what
    numpy gives, and the note says the cells' variables were never compared (declared) and what a
    TF1 LSTMCell's port must convert; it had no note, and the model has no batch norm to blame."""
    for slip in ("gates", "forget bias"):
        weights = _keras_weights(gate_order_right=slip != "gates")
        if slip == "forget bias":
            weights[2] = np.zeros_like(weights[2])  # TF1's bias copied, its run-time forget_bias lost
        tf1, tf2 = tmp_path / slip / "tf1", tmp_path / slip / "tf2"
        _lstm_tf1(str(tf1))
        before = _lstm_port(str(tf2), True, weights)
        report = compare(str(tmp_path / slip), baseline="tf1", candidate="tf2", allow_unmatched=["*lstm_cell*"])
        want = _lstm_numpy(SEQS[0].astype(np.float64))
        first = report.first_divergence
        assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "lstm"), first
        np.testing.assert_allclose(first.max_abs_diff, np.abs(before - want).max(), rtol=1e-3)
        note = first.note or ""
        assert "recorded by one run only were never compared" in note and "rnn/lstm_cell/kernel:0" in note, note
        assert "gate order (TF1 i, j, f, o; Keras i, f, c, o)" in note and "forget_bias=1.0" in note, note
        assert "every recorded weight agrees" not in note and "batch normalization" not in note, note


def test_an_lstm_cell_named_as_keras_names_its_lstm_is_not_paired_by_name(tmp_path) -> None:
    """TF1's ``dynamic_rnn(..., scope="lstm")`` names its cell ``lstm/lstm_cell/kernel:0`` and
    ``/bias:0``, as Keras names its ``LSTM(name="lstm")``'s, beside Keras's ``recurrent_kernel``:
    the kernels ([in + units, 4 units] against [in, 4 units]) were paired by name as a shape
    divergence and the biases (i, j, f, o against i, f, c, o, the forget bias folded in) as a value
    one, max_abs_diff exactly the folded 1, so a faithful port (numpy: its outputs are TF1's) got
    DIVERGE at step 0, with or without ``--allow-unmatched '*lstm_cell*'``. One layer holding other
    variable names in each run, some of them of other sizes, is parametrised otherwise: left
    unpaired, said, and judged by its output, as when the scopes differ; so are its Adam slots
    (TF1's ``lstm/lstm_cell/bias/Adam:0`` and Keras's ``m/lstm/lstm_cell/bias`` share a canonical
    name: once the biases were unpaired, the slots still diverged at step 1). A wrong gate order is
    still found on the output at step 0 by what numpy gives."""
    for gate_order_right in (True, False):
        run = tmp_path / str(gate_order_right)
        _lstm_tf1(str(run / "tf1"), scope="lstm", adam=True)
        before = _lstm_port(str(run / "tf2"), gate_order_right, adam=True)
        want = _lstm_numpy(SEQS[0].astype(np.float64))
        report = compare(str(run), baseline="tf1", candidate="tf2")
        allowed = compare(str(run), baseline="tf1", candidate="tf2", allow_unmatched=["*lstm_cell*"])
        if gate_order_right:
            np.testing.assert_allclose(before, want, atol=1e-6)
            assert report.first_step_divergence is None, report.first_step_divergence
            assert {"weight/lstm/lstm_cell/kernel:0", "weight/lstm/lstm_cell/bias:0"} <= set(report.unmatched["tf1"])
            assert "weight/lstm/lstm_cell/recurrent_kernel:0" in report.unmatched["tf2"]
            assert "slot/lstm/lstm_cell/bias/Adam:0" in allowed.unmatched["tf1"], allowed.to_dict()["mapping"]
            assert not report.to_dict()["structure"].get("shape_mismatches"), report.to_dict()["structure"]
            hints = [w for w in report.warnings if "another parametrisation" in w]
            assert len(hints) == 1 and "--allow-unmatched '*lstm_cell*'" in hints[0], report.warnings
            assert allowed.agree, allowed.first_divergence
        else:
            assert np.abs(before - want).max() > 1e-2
            first = allowed.first_divergence
            assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "lstm"), first
            np.testing.assert_allclose(first.max_abs_diff, np.abs(before - want).max(), rtol=1e-3)


# -- a masked LSTM: dynamic_rnn(sequence_length) against Keras LSTM(mask) -----------------------

LENGTHS = RNG.integers(2, T + 1, (STEPS, BATCH)).astype(np.int32)
LENGTHS[:, 0] = 2  # at least one sequence padded at every step


def _lstm_numpy_masked(x: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(outputs with zeros past each length, the last real step's h): ``dynamic_rnn`` written out."""
    h, c, out = np.zeros((len(x), UNITS)), np.zeros((len(x), UNITS)), []
    for t in range(x.shape[1]):
        z = np.concatenate([x[:, t], h], 1) @ LSTM_KERNEL.astype(np.float64)
        i, j, f, o = (z[:, k * UNITS : (k + 1) * UNITS] for k in range(4))
        live = (t < lengths)[:, None]
        c = np.where(live, _sigmoid(f + 1.0) * c + _sigmoid(i) * np.tanh(j), c)
        h = np.where(live, _sigmoid(o) * np.tanh(c), h)
        out.append(np.where(live, h, 0.0))
    return np.stack(out, 1), h


def _masked_tf1(run_dir: str) -> None:
    """TF1: ``dynamic_rnn`` with ``sequence_length`` (zeros past it), logits from the final state."""
    with _tf1_graph(run_dir, (None, None, IN), (None, CLASSES)) as (rec, gs, x, y):
        lengths = tf.compat.v1.placeholder(tf.int32, [None])
        cell = tf.compat.v1.nn.rnn_cell.LSTMCell(UNITS, initializer=tf.constant_initializer(LSTM_KERNEL))
        outputs, state = tf.compat.v1.nn.dynamic_rnn(cell, x, sequence_length=lengths, dtype=tf.float32)
        rec.activation("lstm", outputs)
        logits = tf.compat.v1.layers.dense(state.h, CLASSES, kernel_initializer=tf.constant_initializer(DENSE))
        rec.activation("dense", logits)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        _train_with_sgd(rec, gs, loss, [{x: SEQS[s], y: LABELS[s], lengths: LENGTHS[s]} for s in range(STEPS)])


def _masked_port(run_dir: str, zero_output_for_mask: bool, masked: bool = True, last_step: bool = False) -> np.ndarray:
    """Keras ``LSTM(return_sequences=True, return_state=True)`` called with the mask, in a
    ``tf.function`` loop; returns its sequence output at step 0 before training. ``last_step``: the
    dense layer reads the sequence's last time step (``seq[:, -1]``) instead of the final state."""
    tf.keras.backend.clear_session()
    lstm = tf.keras.layers.LSTM(
        UNITS, return_sequences=True, return_state=True, zero_output_for_mask=zero_output_for_mask
    )
    dense = tf.keras.layers.Dense(CLASSES, kernel_initializer=tf.constant_initializer(DENSE))
    lstm.build((None, None, IN))
    lstm.set_weights(_keras_weights(gate_order_right=True))
    optimizer = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor, lengths: tf.Tensor) -> None:
        with rec.step(optimizer.iterations):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                seq, h, _ = lstm(x, mask=tf.sequence_mask(lengths, tf.shape(x)[1]) if masked else None)
                rec.activation("lstm", seq)
                h = seq[:, -1] if last_step else h
                logits = rec.activation("dense", dense(h))
                loss = rec.loss(tf.keras.losses.CategoricalCrossentropy(from_logits=True)(y, logits))
            rec.minimize(optimizer, loss, lstm.trainable_variables + dense.trainable_variables, tape)

    mask = tf.sequence_mask(LENGTHS[0], T)
    before = lstm(SEQS[0], mask=mask if masked else None)[0].numpy()
    for s in range(STEPS):
        train_step(SEQS[s], LABELS[s], LENGTHS[s])
    rec.close()
    return before


@pytest.mark.parametrize("zero_output_for_mask", [True, False])
def test_padded_time_steps_of_a_masked_lstm_are_named(tmp_path, zero_output_for_mask: bool) -> None:
    """Keras's masked LSTM repeats the last state at padded steps (its default), ``dynamic_rnn``
    writes zeros: numpy says the outputs differ only there, at step 0, and the note says padded time
    steps (it had none); with ``zero_output_for_mask=True`` the port agrees."""
    _masked_tf1(str(tmp_path / "tf1"))
    before = _masked_port(str(tmp_path / "tf2"), zero_output_for_mask)
    want, _ = _lstm_numpy_masked(SEQS[0].astype(np.float64), LENGTHS[0])
    padded = np.arange(T)[None, :] >= LENGTHS[0][:, None]
    np.testing.assert_allclose(before[~padded], want[~padded], atol=1e-6)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*lstm_cell*"])
    if zero_output_for_mask:
        np.testing.assert_allclose(before, want, atol=1e-6)
        assert report.agree, report.first_divergence
        return
    assert np.abs(before[padded]).min() > 0  # the last state, repeated
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "lstm"), first
    np.testing.assert_allclose(first.max_abs_diff, np.abs(before - want).max(), rtol=1e-3)
    note = first.note or ""
    assert f"each of its {int(padded.sum()) * UNITS} elements out of tolerance is 0 in one run" in note, note
    assert "in the candidate, the same element one time step earlier: padded time steps" in note, note


def test_a_dense_layer_reading_a_padded_last_step_is_told_so(tmp_path) -> None:
    """A port that takes ``seq[:, -1]`` of a masked LSTM under ``zero_output_for_mask=True`` where TF1
    takes ``dynamic_rnn``'s final state: numpy says the LSTM's outputs agree and the logits of every
    padded sample are 0 in the port only, at step 0. Its note spoke of a dropout mask drawn otherwise
    (neither run draws any) or a ReLU; it names the samples and the padded last time step they read."""
    _masked_tf1(str(tmp_path / "tf1"))
    before = _masked_port(str(tmp_path / "tf2"), zero_output_for_mask=True, last_step=True)
    want, h = _lstm_numpy_masked(SEQS[0].astype(np.float64), LENGTHS[0])
    np.testing.assert_allclose(before, want, atol=1e-6)
    padded = LENGTHS[0] < T
    assert padded.any()
    logits = h @ DENSE.astype(np.float64)
    port = np.where(padded[:, None], 0.0, logits)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*lstm_cell*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "dense"), first
    np.testing.assert_allclose(first.max_abs_diff, np.abs(port - logits).max(), rtol=1e-3)
    note = first.note or ""
    assert "random mask" not in note and "ReLU" not in note, note
    assert f"in 'tf2' every element of {int(padded.sum())} of its {BATCH} samples is 0" in note, note
    assert "the samples whose last time step of lstm is 0 in both runs (padding)" in note, note


# -- two parallel branches of one width, built in another order --------------------------------

KA = (RNG.standard_normal((4, 6)) * 0.5).astype(np.float32)
KB = (RNG.standard_normal((4, 6)) * 0.5).astype(np.float32)
KO = (RNG.standard_normal((12, 1)) * 0.5).astype(np.float32)
YB = RNG.standard_normal((STEPS * BATCH, 1)).astype(np.float32)


def _branches_tf1(run_dir: str, batch: Optional[int]) -> None:
    """TF1 builds branch b (tanh) before branch a (relu) and names their outputs itself."""
    with _tf1_graph(run_dir, (batch, 4), (batch, 1)) as (rec, gs, x, y):
        hb = rec.activation(
            "branch_b", tf.compat.v1.layers.dense(x, 6, tf.tanh, kernel_initializer=tf.constant_initializer(KB))
        )
        ha = rec.activation(
            "branch_a", tf.compat.v1.layers.dense(x, 6, tf.nn.relu, kernel_initializer=tf.constant_initializer(KA))
        )
        out = tf.compat.v1.layers.dense(tf.concat([ha, hb], 1), 1, kernel_initializer=tf.constant_initializer(KO))
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        _train_with_sgd(rec, gs, loss, _batches(x, y, YB))


def _branches_port(run_dir: str, batch: Optional[int], bias_a: float = 0.0) -> None:
    """The port builds branch a first; its outputs are recorded under the Keras layers' names.
    ``bias_a``: branch a's bias initialiser (0 is faithful)."""
    tf.keras.backend.clear_session()
    inputs = tf.keras.Input((4,))
    la = tf.keras.layers.Dense(
        6, "relu", kernel_initializer=tf.constant_initializer(KA), bias_initializer=tf.constant_initializer(bias_a)
    )
    lb = tf.keras.layers.Dense(6, "tanh", kernel_initializer=tf.constant_initializer(KB))
    lo = tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(KO))
    model = tf.keras.Model(inputs, lo(tf.keras.layers.Concatenate()([la(inputs), lb(inputs)])))
    model.compile(tf.keras.optimizers.SGD(LR), loss="mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=[la, lb])
    data = tf.data.Dataset.from_tensor_slices((X, YB)).batch(BATCH, drop_remainder=batch is not None)
    model.fit(data, shuffle=False, verbose=0)
    rec.close()


@pytest.mark.parametrize("batch", [None, BATCH])
def test_parallel_branches_built_in_another_order_pair_by_their_values(tmp_path, batch: Optional[int]) -> None:
    """A reviewer's faithful port: execution order crossed the branches (static batch: a false
    DIVERGE at step 0, an older defect) or left them unmatched (``None`` batch). At step 0 each
    branch's output is the same function of the same input on both sides (numpy: the branches
    differ by 2.7), so their values pair them: it agrees."""
    xb = X[:BATCH].astype(np.float64)
    assert np.abs(np.maximum(xb @ KA, 0) - np.tanh(xb @ KB)).max() > 1
    _branches_tf1(str(tmp_path / "tf1"), batch)
    _branches_port(str(tmp_path / "tf2"), batch)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    paired = {m["baseline"]: m["candidate"] for m in report.to_dict()["mapping"] if m["kind"] == "activation"}
    assert paired == {"branch_a": "dense", "branch_b": "dense_1"}
    assert report.agree, report.first_divergence


def test_a_bug_in_one_branch_is_blamed_on_that_branch(tmp_path) -> None:
    """The port's branch a starts with bias 0.01: the first divergence is that bias at step 0 (TF1's
    ``dense_1``, built second, against the port's ``dense``, built first: the layers are paired by
    their first values), by 0.01 as numpy says, and nothing of branch b diverges at step 0."""
    _branches_tf1(str(tmp_path / "tf1"), None)
    _branches_port(str(tmp_path / "tf2"), None, bias_a=0.01)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_step_divergence
    assert first is not None
    assert (first.step, first.kind, first.tensor, first.candidate_tensor) == (
        0,
        "weight",
        "dense_1/bias:0",
        "dense/bias:0",
    )
    np.testing.assert_allclose(first.max_abs_diff, 0.01, rtol=1e-6)
    m = report.matrix()
    for tag in ("weight/dense/kernel:0", "weight/dense/bias:0"):  # TF1's branch b
        assert m.reason[0, m.tensors.index(tag)] == 0, tag


def _n_branches(tf1_dir: str, port_dir: str, acts: list[str], port_acts: list[str], zero: bool = False) -> None:
    """TF1 builds ``len(acts)`` branches of width 6 in reverse order and names them ``branch_i``; the
    port builds them in order (static batch); ``zero``: every branch kernel starts at 0."""
    r = np.random.default_rng(11)
    kernels = [
        np.zeros((4, 6), np.float32) if zero else (r.standard_normal((4, 6)) * 0.5).astype(np.float32) for _ in acts
    ]
    head = (r.standard_normal((6 * len(acts), 1)) * 0.5).astype(np.float32)
    with _tf1_graph(tf1_dir, (BATCH, 4), (BATCH, 1)) as (rec, gs, x, y):
        hs: list = [None] * len(acts)
        for i in reversed(range(len(acts))):
            act = None if acts[i] == "linear" else getattr(tf.nn, acts[i])
            dense = tf.compat.v1.layers.dense(x, 6, act, kernel_initializer=tf.constant_initializer(kernels[i]))
            hs[i] = rec.activation(f"branch_{i}", dense)
        out = tf.compat.v1.layers.dense(tf.concat(hs, 1), 1, kernel_initializer=tf.constant_initializer(head))
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        _train_with_sgd(rec, gs, loss, _batches(x, y, YB))
    tf.keras.backend.clear_session()
    inputs = tf.keras.Input((4,))
    layers = [
        tf.keras.layers.Dense(6, a, kernel_initializer=tf.constant_initializer(k)) for a, k in zip(port_acts, kernels)
    ]
    out_layer = tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(head))
    model = tf.keras.Model(inputs, out_layer(tf.keras.layers.Concatenate()([layer(inputs) for layer in layers])))
    model.compile(tf.keras.optimizers.SGD(LR), loss="mse")
    rec2 = summary_v2.Recorder(port_dir)
    summary_v2.instrument(model, rec2, layers=layers)
    model.fit(tf.data.Dataset.from_tensor_slices((X, YB)).batch(BATCH, drop_remainder=True), shuffle=False, verbose=0)
    rec2.close()


def test_a_bug_in_one_of_three_branches_is_blamed_on_it(tmp_path) -> None:
    """A reviewer's case: the port's branch 1 uses relu where TF1 uses tanh. The other two branches
    pair clearly by their values, branch 1 takes the one left over, and the divergence is found on
    it at step 0 (numpy: branch 1 differs, the others are the same functions of the same input)."""
    _n_branches(str(tmp_path / "tf1"), str(tmp_path / "tf2"), ["tanh"] * 3, ["tanh", "relu", "tanh"])
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    paired = {m["baseline"]: m["candidate"] for m in report.to_dict()["mapping"] if m["kind"] == "activation"}
    assert paired == {"branch_0": "dense", "branch_1": "dense_1", "branch_2": "dense_2"}
    first = report.first_step_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "branch_1"), first


def test_zero_initialised_branches_pair_where_they_first_differ(tmp_path) -> None:
    """A reviewer's faithful port: both branches start at 0, so their outputs are equal at step 0 and
    only step 1 tells them apart (numpy: tanh and linear of the same updated weights differ there).
    They are paired at step 1; it agrees (the execution order crossed them: a false DIVERGE)."""
    _n_branches(str(tmp_path / "tf1"), str(tmp_path / "tf2"), ["tanh", "linear"], ["tanh", "linear"], zero=True)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    paired = {m["baseline"]: m["candidate"] for m in report.to_dict()["mapping"] if m["kind"] == "activation"}
    assert paired == {"branch_0": "dense", "branch_1": "dense_1"}
    assert report.agree, report.first_divergence


# -- a TF1 GRUCell and a layer norm, against Keras GRU and LayerNormalization -----------------
# The README's recipe for a cell parametrised otherwise is ``--allow-unmatched '*gru_cell*'``. TF1's
# ``candidate/bias`` is ``[units]``, like the layer norm's ``gamma`` and ``beta``: three against two of
# that shape, so the layer norm stayed unmatched, a false structure DIVERGE (new user 5).

GRU_GATES = (RNG.uniform(-1, 1, (IN + UNITS, 2 * UNITS)) * 0.6).astype(np.float32)  # r, u
GRU_CAND = (RNG.uniform(-1, 1, (IN + UNITS, UNITS)) * 0.6).astype(np.float32)
GAMMA = (1 + RNG.standard_normal(UNITS) * 0.1).astype(np.float32)
BETA = (RNG.standard_normal(UNITS) * 0.1).astype(np.float32)
LN_EPS = 1e-6


def _gru_ln_numpy(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """TF1 ``GRUCell``'s last state (gates r, u from ``[x, h]``; candidate from ``[x, r*h]``; biases
    1 for the gates, 0 for the candidate) and the layer norm of it, written out."""
    h = np.zeros((len(x), UNITS))
    for t in range(x.shape[1]):
        g = _sigmoid(np.concatenate([x[:, t], h], 1) @ GRU_GATES.astype(np.float64) + 1.0)
        r, u = g[:, :UNITS], g[:, UNITS:]
        c = np.tanh(np.concatenate([x[:, t], r * h], 1) @ GRU_CAND.astype(np.float64))
        h = u * h + (1 - u) * c
    mean, var = h.mean(1, keepdims=True), h.var(1, keepdims=True)
    return h, (h - mean) / np.sqrt(var + eps) * GAMMA + BETA


def _gru_ln_tf1(run_dir: str) -> None:
    with _tf1_graph(run_dir, (None, None, IN), (None, CLASSES)) as (rec, gs, x, y):

        def kernel(shape, dtype=None, partition_info=None):  # type: ignore[no-untyped-def]
            return tf.constant(GRU_GATES if shape[1] == 2 * UNITS else GRU_CAND)

        cell = tf.compat.v1.nn.rnn_cell.GRUCell(UNITS, kernel_initializer=kernel)
        _, state = tf.compat.v1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
        rec.activation("gru", state)
        with tf.compat.v1.variable_scope("LayerNorm"):
            mean, var = tf.nn.moments(state, [-1], keepdims=True)
            gamma = tf.compat.v1.get_variable("gamma", initializer=GAMMA)
            beta = tf.compat.v1.get_variable("beta", initializer=BETA)
            normed = rec.activation("layer_normalization", (state - mean) * tf.math.rsqrt(var + LN_EPS) * gamma + beta)
        logits = tf.compat.v1.layers.dense(normed, CLASSES, kernel_initializer=tf.constant_initializer(DENSE))
        rec.activation("dense", logits)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        _train_with_sgd(rec, gs, loss, [{x: SEQS[s], y: LABELS[s]} for s in range(STEPS)])


def _gru_ln_port(run_dir: str, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Keras ``GRU(reset_after=False)`` + ``LayerNormalization(epsilon=eps)`` + ``Dense`` under ``fit``,
    TF1's weights converted (gates reordered to z, r, h; the gates' bias 1 as TF1's); returns the GRU's
    and the layer norm's outputs at step 0 before training."""
    tf.keras.backend.clear_session()
    gru = tf.keras.layers.GRU(UNITS, reset_after=False, name="gru")
    norm = tf.keras.layers.LayerNormalization(epsilon=eps, name="layer_normalization")
    dense = tf.keras.layers.Dense(CLASSES, kernel_initializer=tf.constant_initializer(DENSE))
    inputs = tf.keras.Input((None, IN))
    hidden = gru(inputs)
    normed = norm(hidden)
    model = tf.keras.Model(inputs, dense(normed))
    full = np.concatenate([GRU_GATES[:, UNITS:], GRU_GATES[:, :UNITS], GRU_CAND], 1)
    gru.set_weights([full[:IN], full[IN:], np.concatenate([np.ones(2 * UNITS), np.zeros(UNITS)]).astype(np.float32)])
    norm.set_weights([GAMMA, BETA])
    before = [o.numpy() for o in tf.keras.Model(inputs, [hidden, normed])(SEQS[0])]
    model.compile(tf.keras.optimizers.SGD(LR), loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True))
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=[gru, norm, dense])
    data = tf.data.Dataset.from_tensor_slices((SEQS.reshape(-1, T, IN), LABELS.reshape(-1, CLASSES))).batch(BATCH)
    model.fit(data, verbose=0, shuffle=False)
    rec.close()
    return before[0], before[1]


def test_a_faithful_gru_and_layer_norm_port_agrees_with_the_cells_declared(tmp_path) -> None:
    """numpy: the port's GRU and layer norm give TF1's outputs; declared as the README says, the
    cells' variables are expected, the layer norms' pair with each other, and the port agrees."""
    _gru_ln_tf1(str(tmp_path / "tf1"))
    hidden, normed = _gru_ln_port(str(tmp_path / "tf2"), LN_EPS)
    want_h, want_n = _gru_ln_numpy(SEQS[0].astype(np.float64), LN_EPS)
    np.testing.assert_allclose(hidden, want_h, atol=1e-6)
    np.testing.assert_allclose(normed, want_n, atol=1e-5)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*gru_cell*"])
    assert report.agree, report.first_divergence
    pairs = {(m["kind"], m["baseline"]): m["candidate"] for m in report.to_dict()["mapping"]}
    assert pairs[("weight", "LayerNorm/gamma:0")].endswith("layer_normalization/gamma:0")
    assert pairs[("weight", "LayerNorm/beta:0")].endswith("layer_normalization/beta:0")


def test_keras_default_layer_norm_epsilon_is_found_on_its_output(tmp_path) -> None:
    """LayerNormalization's default epsilon (1e-3) where TF1 used 1e-6: numpy's difference at step 0,
    on the layer norm's output (the GRU's agrees)."""
    _gru_ln_tf1(str(tmp_path / "tf1"))
    _, normed = _gru_ln_port(str(tmp_path / "tf2"), 1e-3)
    _, want = _gru_ln_numpy(SEQS[0].astype(np.float64), LN_EPS)
    assert np.abs(normed - want).max() > 1e-3
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*gru_cell*"]).first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "layer_normalization")
    np.testing.assert_allclose(first.max_abs_diff, np.abs(normed - want).max(), rtol=1e-3)


# -- outputs TF1 names itself on a [None, n] placeholder, against the port's layer outputs -----
# ``rec.activation("hidden", h)`` on ``placeholder([None, 4])`` is ``[None, 5]``; the port's
# ``instrument(layers=...)`` records ``dense`` as ``[8, 5]`` under ``fit``: no shared name, no shared
# static shape, so they stayed unmatched, a false structure DIVERGE on the README's usage (new user 6).

K5 = (RNG.standard_normal((4, 5)) * 0.5).astype(np.float32)
K3 = (RNG.standard_normal((5, 3)) * 0.5).astype(np.float32)
Y3 = RNG.standard_normal((STEPS * BATCH, 3)).astype(np.float32)


def _named_tf1(run_dir: str) -> None:
    with _tf1_graph(run_dir, (None, 4), (None, 3)) as (rec, gs, x, y):
        h = rec.activation(
            "hidden", tf.compat.v1.layers.dense(x, 5, tf.tanh, kernel_initializer=tf.constant_initializer(K5))
        )
        out = rec.activation("logits", tf.compat.v1.layers.dense(h, 3, kernel_initializer=tf.constant_initializer(K3)))
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        _train_with_sgd(rec, gs, loss, _batches(x, y, Y3))


def _named_port(run_dir: str, hidden_activation: str) -> np.ndarray:
    """Keras Dense(5) + Dense(3) under ``fit``, its layers instrumented; returns the hidden output at step 0."""
    tf.keras.backend.clear_session()
    hidden = tf.keras.layers.Dense(5, hidden_activation, kernel_initializer=tf.constant_initializer(K5))
    out = tf.keras.layers.Dense(3, kernel_initializer=tf.constant_initializer(K3))
    model = tf.keras.Sequential([tf.keras.Input((4,)), hidden, out])
    model.compile(tf.keras.optimizers.SGD(LR), loss="mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=[hidden, out])
    model.fit(X, Y3, batch_size=BATCH, shuffle=False, verbose=0)
    rec.close()
    return np.tanh(X[:BATCH].astype(np.float64) @ K5) if hidden_activation == "tanh" else np.maximum(X[:BATCH] @ K5, 0)


def test_outputs_named_by_tf1_pair_with_the_ports_layer_outputs_of_the_one_fitting_shape(tmp_path) -> None:
    _named_tf1(str(tmp_path / "tf1"))
    _named_port(str(tmp_path / "tf2"), "tanh")
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    pairs = {(m["kind"], m["baseline"]): m["candidate"] for m in report.to_dict()["mapping"]}
    assert (pairs[("activation", "hidden")], pairs[("activation", "logits")]) == ("dense", "dense_1")


def test_a_wrong_activation_is_found_on_the_output_tf1_named(tmp_path) -> None:
    """relu where TF1 has tanh: numpy's difference at step 0, on TF1's ``hidden``."""
    _named_tf1(str(tmp_path / "tf1"))
    got = _named_port(str(tmp_path / "tf2"), "relu")
    want = np.tanh(X[:BATCH].astype(np.float64) @ K5)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "hidden"), first
    np.testing.assert_allclose(first.max_abs_diff, np.abs(got - want).max(), rtol=1e-4)


def test_an_lstm_port_fed_its_padded_steps_is_told_which_positions_differ(tmp_path) -> None:
    """A helper's GRU port without a mask ran its padded steps through the cell, where TF1's
    dynamic_rnn writes zeros; with the cells declared, the note named only the cells. numpy: the
    outputs differ exactly at the padded positions, 0 in TF1; the note says so, cells after."""
    _masked_tf1(str(tmp_path / "tf1"))
    before = _masked_port(str(tmp_path / "tf2"), zero_output_for_mask=False, masked=False)
    want, _ = _lstm_numpy_masked(SEQS[0].astype(np.float64), LENGTHS[0])
    padded = np.arange(T)[None, :] >= LENGTHS[0][:, None]
    np.testing.assert_allclose(before[~padded], want[~padded], atol=1e-6)
    assert np.abs(before[padded]).min() > 0 and not want[padded].any()
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*lstm_cell*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.tensor) == (0, "lstm"), first
    note = first.note or ""
    assert f"each of its {int(padded.sum()) * UNITS} elements out of tolerance is exactly 0 in one run only" in note
    assert f"lie at {int(padded.sum())} of its {BATCH * T} (batch, time) positions, in each sample a run" in note
    assert note.index("positions") < note.index("never compared"), note


# -- a bidirectional GRU: bidirectional_dynamic_rnn(GRUCell) against Keras Bidirectional(GRU) ---
# The output a user records is the wrapper's, ``bidirectional``: the note's hint on what a TF1
# GRUCell's port converts keyed on the output's name only, so a helper's bi-GRU port with the gate
# order copied as it was (or reset_after=True) was told only "another function of its input".

DENSE_BI = (RNG.standard_normal((2 * UNITS, CLASSES)) * 0.5).astype(np.float32)


def _bigru_numpy(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """TF1 ``GRUCell`` both ways over each sample's real steps (the backward one reversed, as
    ``bidirectional_dynamic_rnn`` reverses by ``sequence_length``), final states concatenated."""
    gates, cand = GRU_GATES.astype(np.float64), GRU_CAND.astype(np.float64)
    out = np.zeros((len(x), 2 * UNITS))
    for b, n in enumerate(lengths):
        for half, seq in enumerate((x[b, :n], x[b, :n][::-1])):
            h = np.zeros(UNITS)
            for xt in seq:
                g = _sigmoid(np.concatenate([xt, h]) @ gates + 1.0)
                r, u = g[:UNITS], g[UNITS:]
                h = u * h + (1 - u) * np.tanh(np.concatenate([xt, r * h]) @ cand)
            out[b, half * UNITS : (half + 1) * UNITS] = h
    return out


def _bigru_tf1(run_dir: str) -> None:
    with _tf1_graph(run_dir, (None, None, IN), (None, CLASSES)) as (rec, gs, x, y):
        lengths = tf.compat.v1.placeholder(tf.int32, [None])

        def kernel(shape, dtype=None, partition_info=None):  # type: ignore[no-untyped-def]
            return tf.constant(GRU_GATES if shape[1] == 2 * UNITS else GRU_CAND)

        cells = [tf.compat.v1.nn.rnn_cell.GRUCell(UNITS, kernel_initializer=kernel) for _ in range(2)]
        _, (fw, bw) = tf.compat.v1.nn.bidirectional_dynamic_rnn(*cells, x, sequence_length=lengths, dtype=tf.float32)
        state = rec.activation("bidirectional", tf.concat([fw, bw], 1))
        logits = tf.compat.v1.layers.dense(state, CLASSES, kernel_initializer=tf.constant_initializer(DENSE_BI))
        rec.activation("dense", logits)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        _train_with_sgd(rec, gs, loss, [{x: SEQS[s], y: LABELS[s], lengths: LENGTHS[s]} for s in range(STEPS)])


def _bigru_port(run_dir: str, slip: str) -> np.ndarray:
    """Keras ``Bidirectional(GRU)`` under the lengths' mask in a ``tf.function`` loop, TF1's weights
    converted but for ``slip``; returns its output at step 0 before training."""
    tf.keras.backend.clear_session()
    bi = tf.keras.layers.Bidirectional(
        tf.keras.layers.GRU(UNITS, reset_after=slip == "reset_after"), name="bidirectional"
    )
    dense = tf.keras.layers.Dense(CLASSES, kernel_initializer=tf.constant_initializer(DENSE_BI))
    tf.keras.Sequential([tf.keras.Input((None, IN)), bi])  # built in a model: its cells under bidirectional/
    order = (
        [GRU_GATES[:, :UNITS], GRU_GATES[:, UNITS:]]
        if slip == "gate order"
        else [GRU_GATES[:, UNITS:], GRU_GATES[:, :UNITS]]
    )
    full = np.concatenate([*order, GRU_CAND], 1)
    bias = np.concatenate([np.ones(2 * UNITS), np.zeros(UNITS)]).astype(np.float32)
    if slip == "reset_after":
        bias = np.stack([bias, np.zeros_like(bias)])  # the input bias; no recurrent bias
    for direction in (bi.forward_layer, bi.backward_layer):
        direction.set_weights([full[:IN], full[IN:], bias])
    optimizer = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor, lengths: tf.Tensor) -> None:
        with rec.step(optimizer.iterations):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                state = rec.activation("bidirectional", bi(x, mask=tf.sequence_mask(lengths, tf.shape(x)[1])))
                logits = rec.activation("dense", dense(state))
                loss = rec.loss(tf.keras.losses.CategoricalCrossentropy(from_logits=True)(y, logits))
            rec.minimize(optimizer, loss, bi.trainable_variables + dense.trainable_variables, tape)

    before = bi(SEQS[0], mask=tf.sequence_mask(LENGTHS[0], T)).numpy()
    for s in range(STEPS):
        train_step(SEQS[s], LABELS[s], LENGTHS[s])
    rec.close()
    return before


@pytest.mark.parametrize("slip", ["gate order", "reset_after"])
def test_a_bidirectional_gru_port_is_told_what_a_gru_port_converts(tmp_path, slip: str) -> None:
    """numpy: the port's bidirectional output differs from TF1's at step 0 by what the tool reports;
    its note names the cells never compared and what a TF1 GRUCell's port converts, direction by
    direction, though the output is the wrapper's ``bidirectional``."""
    _bigru_tf1(str(tmp_path / "tf1"))
    before = _bigru_port(str(tmp_path / "tf2"), slip)
    want = _bigru_numpy(SEQS[0].astype(np.float64), LENGTHS[0])
    assert np.abs(before - want).max() > 1e-3
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*gru_cell*"])
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "bidirectional"), first
    np.testing.assert_allclose(first.max_abs_diff, np.abs(before - want).max(), rtol=1e-3)
    note = first.note or ""
    assert "recorded by one run only were never compared" in note and "gru_cell/gates/kernel:0" in note, note
    assert "a GRU converted from TF1 GRUCell to Keras GRU: Keras's default reset_after=True" in note, note
    assert "gate order (TF1 gates r, u; Keras z, r, h)" in note, note
    assert "TF1's fw cell into forward_layer, bw into backward_layer" in note, note


def test_a_faithful_bidirectional_gru_port_agrees(tmp_path) -> None:
    """The same port converted right gives numpy's output (1e-6) and agrees."""
    _bigru_tf1(str(tmp_path / "tf1"))
    before = _bigru_port(str(tmp_path / "tf2"), "none")
    np.testing.assert_allclose(before, _bigru_numpy(SEQS[0].astype(np.float64), LENGTHS[0]), atol=1e-6)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*gru_cell*"])
    assert report.agree, report.first_divergence
