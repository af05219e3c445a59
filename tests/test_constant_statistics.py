"""A tensor whose statistics say every element is one value in both runs (min == max, equal) is
proven equal element for element: it is no place a difference could hide upstream of a divergence.

A new user's transformer port, recorded with ``full_values_limit`` below its FFN kernel's size,
diverged at step 0 on an attention output, and the report said the divergence "may start upstream"
in the kernel's Adam slots: all zeros at step 0 in both runs, which min == max == 0 proves. Real
TensorFlow (two ``summary_v2`` runs of Keras Adam), numpy for what each run held."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tb_parity_plugin import compare, summary_v2
from tb_parity_plugin.engine.notes.context import _one_value
from tb_parity_plugin.records import health

WIDE = 70  # 70 x 70 = 4900 elements > full_values_limit 4096: statistics (and a sample) only


def _train(run_dir: str, kernel: np.ndarray, scales: tuple[float, ...]) -> dict:
    """Dense(WIDE) under Adam, a step per scale; the candidate scales the recorded activation (a real
    difference). Returns each step's kernel-shaped slots as held before the step."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, WIDE)).astype(np.float32)
    layer = tf.keras.layers.Dense(WIDE, name="wide")
    layer.build((None, WIDE))
    layer.kernel.assign(kernel)
    layer.bias.assign(np.zeros(WIDE, np.float32))
    opt = tf.keras.optimizers.Adam(1e-3)
    opt.build(layer.trainable_variables)
    rec = summary_v2.Recorder(run_dir)
    held = {}
    for s, scale in enumerate(scales):
        held[s] = [v.numpy() for v in opt.variables() if v.shape == (WIDE, WIDE)]
        with rec.step(opt.iterations, variables=layer.trainable_variables, optimizer=opt):
            with tf.GradientTape() as tape:
                h = rec.activation("wide", layer(x) * scale)
                loss = rec.loss(tf.reduce_mean(tf.square(h)))
            rec.minimize(opt, loss, layer.trainable_variables, tape)
    rec.close()
    return held


def test_zero_slots_are_not_named_as_hiding_a_difference_upstream(tmp_path) -> None:
    kernel = np.random.default_rng(1).standard_normal((WIDE, WIDE)).astype(np.float32) * 0.1
    base = _train(str(tmp_path / "a"), kernel, (1.0,) * 3)
    cand = _train(str(tmp_path / "b"), kernel, (1.5,) * 3)
    # numpy: at step 0 each kernel slot is all zeros in both runs, so no element can differ there
    assert len(base[0]) == 2 and all(not np.any(m) for m in base[0] + cand[0])
    report = compare(str(tmp_path), baseline="a", candidate="b")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "wide"), first
    unproven = report.unproven_before_first
    # the kernel itself is not constant: statistics cannot prove its elements, so it stays named
    assert any(t.startswith("weight/") and "kernel" in t for t in unproven), unproven
    assert not any(t.startswith("slot/") for t in unproven), unproven


def test_a_slot_constant_only_at_earlier_steps_is_not_named_as_predating_the_divergence(tmp_path) -> None:
    kernel = np.random.default_rng(2).standard_normal((WIDE, WIDE)).astype(np.float32) * 0.1
    # the candidate differs from step 1 on: its activation is the same at step 0, then scaled
    base = _train(str(tmp_path / "a"), kernel, (1.0,) * 3)
    _train(str(tmp_path / "b"), kernel, (1.0, 1.5, 1.5))
    assert all(not np.any(m) for m in base[0])  # numpy: the slots are zeros at step 0
    report = compare(str(tmp_path), baseline="a", candidate="b")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "activation", "wide"), first
    earlier = report.unproven_earlier
    assert any(t.startswith("weight/") and "kernel" in t for t in earlier), earlier  # not constant at 0
    assert not any(t.startswith("slot/") for t in earlier), earlier  # zeros at step 0, proven equal


def test_an_int64_tensor_past_2_53_is_not_one_value_by_its_float64_min_and_max() -> None:
    """Two unequal int64 elements past 2**53 have one float64 min and max: no proof of one value."""
    unequal = np.array([2**53, 2**53 + 1], np.int64)
    assert len(set(unequal.tolist())) == 2 and float(unequal.min()) == float(unequal.max())
    assert _one_value(health.health_numpy(unequal)) is None
    assert _one_value(health.health_numpy(np.full(3, 7, np.int64))) == 7.0
    assert _one_value(health.health_numpy(np.zeros(4, np.float32))) == 0.0


def test_one_constant_at_every_step_is_the_rule_at_each_step() -> None:
    """The report asks, for every tensor compared by statistics, whether each earlier step proves it
    equal (one and the same finite value in both runs); asked step by step it made a warm first
    divergence at step 1500 of 2x2000x200 take 0.19 s, so it is one array operation. Against the rule
    written out here per row (numpy rows of real tensors: constant, not, NaN, empty, past 2**53)."""
    from types import SimpleNamespace

    from tb_parity_plugin.engine.comparison import _one_constant_at

    rng = np.random.default_rng(4)
    tensors = [
        np.full(3, 2.5, np.float32),
        np.full(3, 2.5, np.float32),
        np.array([1.0, 2.0], np.float32),
        np.array([np.nan, np.nan], np.float32),
        np.zeros(0, np.float32),
        np.full(2, 2**60, np.int64),
        np.full(4, -1.0, np.float32),
        np.full(3, 7.0, np.float32),
    ]
    rows = np.stack([health.health_numpy(t) for t in tensors])
    ib = rng.integers(-1, len(rows), 200)
    ic = rng.integers(-1, len(rows), 200)

    def rule(b: np.ndarray, c: np.ndarray) -> bool:
        if b.size != c.size:
            return False
        if b.size == 0:
            return True
        both = (b, c)
        if any(not np.all(np.isfinite(t.astype(np.float64))) or abs(float(t.flat[0])) >= 2.0**53 for t in both):
            return False
        return bool(len(np.unique(b)) == 1 and len(np.unique(c)) == 1 and b.flat[0] == c.flat[0])

    pair = SimpleNamespace(ib=ib, ic=ic, base=SimpleNamespace(stats=rows), cand=SimpleNamespace(stats=rows))
    got = _one_constant_at(pair, np.arange(len(ib)))
    want = [i >= 0 and j >= 0 and rule(tensors[i], tensors[j]) for i, j in zip(ib, ic)]
    assert got.tolist() == want
    assert any(want) and not all(want)
