"""Full values at some steps only: a ``[None, n]`` tensor whose partial last batch fits within
``full_values_limit`` while its full batches do not.

Such a tensor keeps its full values at the small steps and statistics (with an element sample, when
the graph does not know the size) at the others. The engine used to compare it by statistics at
every step, so the values it had recorded at the small steps were never read: a difference there
that the statistics cannot prove (the same elements in another order keep every statistic) and that
no sample covers (a ``tf.function`` traced per batch shape samples only its large steps) was
silently dropped. Those steps are now compared element-wise. Written the way users write it: TF1
with a ``placeholder([None, 64])``, the port a ``tf.function`` called per batch (traced per shape),
batches of 80, 80 and a partial 30; every expectation checked against numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from engine_helpers import Watch, write_run

from tb_parity_plugin import compare, summary_v1, summary_v2
from tb_parity_plugin.engine import Comparison, batch
from tb_parity_plugin.logdir.reader import LogdirReader

LR = 0.05
RNG = np.random.default_rng(5)
X = RNG.standard_normal((190, 64)).astype(np.float32)
Y = np.eye(4, dtype=np.float32)[RNG.integers(0, 4, 190)]
W1 = (RNG.standard_normal((64, 64)) * 0.2).astype(np.float32)  # 4096 elements: full values
W2 = (RNG.standard_normal((64, 4)) * 0.2).astype(np.float32)
#: One epoch in order: 80 x 64 = 5120 elements of "hidden" (above the limit), then 30 x 64 = 1920.
BATCHES = [(0, 80), (80, 160), (160, 190)]
STEPS = 2 * len(BATCHES)
PARTIAL = [2, 5]  # the steps of the partial batch


def _batch(step: int, reverse_partial: bool = False) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = BATCHES[step % len(BATCHES)]
    x, y = X[lo:hi], Y[lo:hi]
    if reverse_partial and step in PARTIAL:  # the same examples in another order
        x, y = x[::-1], y[::-1]
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def _train_tf1(run_dir: str, reverse_partial: bool = False) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        x = tf.compat.v1.placeholder(tf.float32, (None, 64))
        y = tf.compat.v1.placeholder(tf.float32, (None, 4))
        dense = tf.compat.v1.layers.dense(x, 64, use_bias=False, kernel_initializer=tf.constant_initializer(W1))
        h = rec.activation("hidden", tf.nn.relu(dense))
        logits = tf.compat.v1.layers.dense(h, 4, use_bias=False, kernel_initializer=tf.constant_initializer(W2))
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, logits))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(rec.lr(tf.constant(LR))), loss)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(STEPS):
                xb, yb = _batch(step, reverse_partial)
                _, parity = sess.run([train_op, fetches], {x: xb, y: yb})
                rec.write(parity, step=step)
        rec.close()


def _train_tf2(run_dir: str, reverse_partial: bool = False, between: object = None) -> None:
    """The port: a ``tf.function`` called with each batch as it comes, so traced once per batch shape
    (80 and 30): static shapes, full values at the partial steps and no sample there. ``between``:
    called after step 2 (a refresh while the port is still training)."""
    tf.keras.backend.clear_session()
    layers = [
        tf.keras.layers.Dense(64, use_bias=False, activation="relu", kernel_initializer=tf.constant_initializer(W1)),
        tf.keras.layers.Dense(4, use_bias=False, kernel_initializer=tf.constant_initializer(W2)),
    ]
    model = tf.keras.Sequential([tf.keras.Input((64,)), *layers])
    opt = tf.keras.optimizers.SGD(LR)
    ce = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            rec.lr(opt.learning_rate)
            with tf.GradientTape() as tape:
                loss = rec.loss(ce(y, layers[1](rec.activation("hidden", layers[0](x)))))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for step in range(STEPS):
        train_step(*(tf.constant(a) for a in _batch(step, reverse_partial)))
        if step == 2 and callable(between):
            rec.flush()
            between()
    rec.close()


def _hidden_numpy(step: int, reverse_partial: bool) -> np.ndarray:
    """``hidden`` at ``step`` in float64: the weights after ``step`` SGD steps on the batches (the
    softmax cross-entropy's gradient written out), then the forward pass of that step's batch."""
    w1, w2 = W1.astype(np.float64), W2.astype(np.float64)
    for s in range(step):
        x, y = (a.astype(np.float64) for a in _batch(s, reverse_partial))
        pre = x @ w1
        h = np.maximum(pre, 0)
        logits = h @ w2
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        d_logits = (p - y) / len(x)
        d_h = d_logits @ w2.T * (pre > 0)
        w2, w1 = w2 - LR * h.T @ d_logits, w1 - LR * x.T @ d_h
    x, _ = _batch(step, reverse_partial)
    return np.maximum(x.astype(np.float64) @ w1, 0)


def test_a_faithful_port_is_compared_element_wise_at_its_partial_batches(tmp_path) -> None:
    """Both runs keep ``hidden``'s full values at the partial steps only (numpy: they are the
    activations of that batch); the faithful port agrees, and those steps' verdicts rest on the
    values (the evidence says so), the other steps' on statistics."""
    _train_tf1(str(tmp_path / "tf1"))
    _train_tf2(str(tmp_path / "tf2"))
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    base, cand = reader.run("tf1"), reader.run("tf2")
    for run in (base, cand):
        series = run.tensors[("activation", "hidden")]
        assert series.values is None  # not at every step
        assert series.steps[series.value_rows].tolist() == PARTIAL
        np.testing.assert_allclose(
            series.partial_values[0][: 30 * 64], _hidden_numpy(2, False).ravel(), rtol=1e-4, atol=1e-5
        )
    cmp = Comparison(base, cand)
    report = cmp.report()
    assert report.agree, report.first_divergence
    # listed as compared by statistics at some steps, and named for the steps its values decided
    assert "activation/hidden" in report.statistics_only
    assert report.partly_values["activation/hidden"] == [len(PARTIAL), STEPS]
    from tb_parity_plugin import api

    assert f"activation/hidden (element-wise at {len(PARTIAL)} of {STEPS} steps)" in api.statistics_only_line(report)
    for step in range(STEPS):
        figures = cmp.detail("activation/hidden", step=step).figures
        assert figures["evidence"] == ("values" if step in PARTIAL else "statistics"), (step, figures)
        if step in PARTIAL:
            assert figures["max_abs_diff"] <= 1e-5
    detail = cmp.detail("activation/hidden", step=2)
    assert detail.base_values is not None and detail.base_values.shape == (30, 64)
    assert detail.diff is not None and np.abs(detail.diff).max() <= 1e-5  # the tab's difference view
    assert cmp.detail("activation/hidden", step=1).diff is None  # statistics there
    # the heat map and the detail mark the steps statistics decided, not the column (a review: a
    # partial column's statistics steps were drawn as proven agreements)
    col = cmp.matrix().tensors.index("activation/hidden")
    by_stats = [step not in PARTIAL for step in range(STEPS)]
    assert cmp.matrix().statistics[:, col].tolist() == by_stats
    assert cmp.detail("activation/hidden").by_statistics.tolist() == by_stats
    assert cmp.matrix().evidence[col] == "partial"
    from tb_parity_plugin.engine import colour_scale

    m = cmp.matrix()
    rgb = colour_scale.cell_colours(m.error_ratio, m.reason, statistics=m.statistics)
    unproven = colour_scale.PALETTES["light"]["unproven"]
    assert [tuple(rgb[s, col]) == unproven for s in range(STEPS)] == by_stats
    assert m.bucketed(2).statistics[:, col].tolist() == [True, True]  # a bucket with any such step
    reader.close()


def test_a_difference_only_the_partial_batch_values_show_is_found(tmp_path) -> None:
    """The port feeds the partial batch's examples in another order. The mean loss and the summed
    gradients are the same up to rounding, the statistics of ``hidden`` hold the same elements, and
    the port's ``tf.function`` traced for 30 rows takes no sample: only the values recorded at step 2
    show it (numpy: the rows of ``hidden`` reversed). The old engine compared ``hidden`` by
    statistics at every step and called the port AGREE."""
    _train_tf1(str(tmp_path / "tf1"))
    _train_tf2(str(tmp_path / "tf2"), reverse_partial=True)
    want = _hidden_numpy(2, False)
    worst = np.abs(want[::-1] - want).max()
    assert worst > 1e-2  # numpy: far beyond atol 1e-5
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (2, "activation", "hidden"), first
    assert first.evidence == "values" and first.reason == "value"
    np.testing.assert_allclose(first.max_abs_diff, worst, rtol=1e-4)


def test_a_refresh_while_the_port_trains_matches_a_fresh_comparison(tmp_path) -> None:
    """The dashboard's refresh: after step 2 (the first partial batch) and at the end, the refreshed
    comparison says what a fresh one says (``Watch`` asserts it), and finds the partial batch."""
    _train_tf1(str(tmp_path / "tf1"))
    watch = Watch(str(tmp_path))
    _train_tf2(str(tmp_path / "tf2"), reverse_partial=True, between=watch)
    watch()
    watch.close()
    first = [r.first_divergence for r in watch.reports]
    assert all(f is not None and (f.step, f.tensor) == (2, "hidden") for f in first), first


def test_values_at_some_steps_decide_those_steps_and_only_those(tmp_path) -> None:
    """Engine level, written with the project's writer (no samples, no training): a tensor of 80 or
    30 rows, its full values at the 30-row steps only. The candidate's 30-row step 5 holds the same
    elements reversed (every statistic the same): found at step 5 by its values. The same reversal
    at a large step (4) is invisible to the statistics and stays AGREE there, as documented (what
    was not recorded cannot be compared). A refresh after step 4 and one after step 8 match fresh
    comparisons of the batched and the per-pair engine."""
    rng = np.random.default_rng(0)
    acts = {s: rng.standard_normal((30 if s % 3 == 2 else 80, 64)).astype(np.float32) for s in range(9)}

    def cand(s: int) -> np.ndarray:
        return acts[s][::-1] if s in (4, 5) else acts[s]

    logdir = str(tmp_path)
    reader = LogdirReader(logdir)
    cmp = None
    for steps in (range(5), range(5, 9)):
        write_run(logdir, "b", steps, lambda s: [("activation", "h", acts[s]), ("loss", "loss", np.float32(s))])
        write_run(logdir, "c", steps, lambda s: [("activation", "h", cand(s)), ("loss", "loss", np.float32(s))])
        reader.reload()
        b, c = reader.run("b"), reader.run("c")
        if cmp is None:
            cmp = Comparison(b, c)
        else:
            cmp.update(b, c)
        report = cmp.report()
        fresh = Comparison(b, c).report()
        assert report.to_dict() == fresh.to_dict()
        np.testing.assert_array_equal(cmp.matrix().reason, Comparison(b, c).matrix().reason)
        np.testing.assert_array_equal(cmp.matrix().error_ratio, Comparison(b, c).matrix().error_ratio)
    assert report.first_divergence is not None
    assert (report.first_divergence.step, report.first_divergence.evidence) == (5, "values")
    worst = float(np.abs(acts[5][::-1] - acts[5]).max())
    np.testing.assert_allclose(report.first_divergence.max_abs_diff, worst, rtol=1e-6)
    m = cmp.matrix()
    column = m.reason[:, m.tensors.index("activation/h")]
    assert column.tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0]
    batch.ENABLED = False  # the per-pair engine (before layouts were settled together) says the same
    try:
        plain = Comparison(b, c).matrix()
    finally:
        batch.ENABLED = True
    np.testing.assert_array_equal(plain.reason, m.reason)
    np.testing.assert_array_equal(plain.error_ratio, m.error_ratio)
    reader.close()


def test_values_at_every_step_on_one_side_meet_values_at_some_steps_on_the_other(tmp_path) -> None:
    """A reviewer's case: the baseline kept full values at every step (a higher
    ``full_values_limit``), the candidate at its 30-row steps only. Both used to be left unread
    (``values`` on one side only): the steps both kept are now compared element-wise, so the
    30-row step 2 reversed is found there, by values."""
    rng = np.random.default_rng(1)
    acts = {s: rng.standard_normal((30 if s % 3 == 2 else 80, 64)).astype(np.float32) for s in range(6)}
    logdir = str(tmp_path)
    write_run(logdir, "b", range(6), lambda s: [("activation", "h", acts[s])], limit=10**6)
    write_run(logdir, "c", range(6), lambda s: [("activation", "h", acts[s][::-1] if s == 2 else acts[s])])
    reader = LogdirReader(logdir)
    reader.reload()
    b, c = reader.run("b"), reader.run("c")
    assert b.tensors[("activation", "h")].values is not None and c.tensors[("activation", "h")].values is None
    report = Comparison(b, c).report()
    first = report.first_divergence
    assert first is not None and (first.step, first.evidence, first.reason) == (2, "values", "value")
    np.testing.assert_allclose(first.max_abs_diff, np.abs(acts[2][::-1] - acts[2]).max(), rtol=1e-6)
    reader.close()


def test_a_run_rewritten_with_a_resized_tensor_draws_its_heat_map(tmp_path) -> None:
    """A reviewer's candidate was rewritten from step 0 with a kernel of another size, its old rows
    still in the run: the report named the shape at step 0, but the heat map's ratio subtracted the
    two runs' values element-wise and raised a broadcast error, fresh or refreshed."""
    from tb_parity_plugin.engine.pair import SHAPE

    def at(shape: tuple[int, int]) -> Any:
        return lambda s: [
            ("weight", "dense/kernel:0", np.ones(shape, np.float32) * (1 + 0.01 * s)),
            ("slot", "dense/kernel/Momentum:0", np.full(shape, 0.1 * s, np.float32)),
        ]

    root = str(tmp_path)
    write_run(root, "tf1", range(5), at((2, 2)))
    write_run(root, "tf2", range(5), at((2, 2)))
    reader = LogdirReader(root)
    reader.reload()
    kept = Comparison(reader.run("tf1"), reader.run("tf2"))
    assert kept.report().agree
    kept.matrix()
    write_run(root, "tf2", range(5), at((3, 2)))
    reader.reload()
    b, c = reader.run("tf1"), reader.run("tf2")
    kept.update(b, c)
    for comparison in (Comparison(b, c), kept):
        first = comparison.report().first_divergence
        assert first is not None and (first.step, first.reason) == (0, "shape"), first
        m = comparison.matrix()
        col = m.tensors.index("weight/dense/kernel:0")
        assert m.reason[0, col] == SHAPE and m.first_divergence == (0, col)
