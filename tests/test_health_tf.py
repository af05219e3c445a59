"""health_tf agrees with the numpy reference, in eager, tf.function and TF1 graph mode."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tb_parity_plugin.records import health, metadata
from tb_parity_plugin.shim import health_tf

RNG = np.random.default_rng(0)
COUNTS = slice(0, metadata.STAT_INDEX["min"])  # dtype, rank, size and the six counts


def _cases() -> dict[str, np.ndarray]:
    big = RNG.standard_normal(300_000).astype(np.float32)
    big[::7] = 0.0
    big_nonfinite = big.copy()
    big_nonfinite[[3, 10, 99]] = [np.nan, np.inf, -np.inf]
    offset = (1000.0 + 1e-3 * RNG.standard_normal((400, 400))).astype(np.float32)
    mixed = np.array([1.0, -2.0, 0.0, np.nan, np.inf, -np.inf, -0.0, 3.5], np.float32)
    return {
        "scalar": np.float32(0.25),
        "small": RNG.standard_normal((3, 4)).astype(np.float32),
        "mixed": mixed,
        "all_nan": np.full((5,), np.nan, np.float32),
        "all_inf": np.array([np.inf, -np.inf], np.float64),
        "empty": np.zeros((0, 3), np.float32),
        "zeros": np.zeros((2, 2), np.float64),
        "f64": RNG.standard_normal((50, 7)),
        "f16": (RNG.standard_normal(100) * 100).astype(np.float16),
        "f16_overflow": np.array([np.inf, 65504, -1, 0], np.float16),
        "big": big,
        "big_nonfinite": big_nonfinite,
        "big_relu": np.maximum(RNG.standard_normal((512, 256)), 0).astype(np.float32),
        "big_offset": offset,
        "big_f64": RNG.standard_normal(100_000),
        "big_f16": RNG.standard_normal(70_000).astype(np.float16),
        "ints": np.arange(-3, 5, dtype=np.int32),
    }


CASES = _cases()


def _check(got: np.ndarray, arrays: list[np.ndarray]) -> None:
    assert got.shape == (len(arrays), metadata.N_STATS)
    for row, a in zip(got, arrays):
        want = health.health_numpy(a)
        np.testing.assert_array_equal(row[COUNTS], want[COUNTS])
        # float32 reductions vs numpy's float64: relative 1e-5 is ample for these sizes.
        np.testing.assert_allclose(row[COUNTS.stop :], want[COUNTS.stop :], rtol=1e-5, atol=1e-12)


def test_eager_matches_numpy() -> None:
    arrays = list(CASES.values())
    _check(health_tf.stats_block([tf.constant(a) for a in arrays]).numpy(), arrays)


def test_tf_function_matches_numpy() -> None:
    arrays = list(CASES.values())
    fn = tf.function(lambda *ts: health_tf.stats_block(ts))
    _check(fn(*[tf.constant(a) for a in arrays]).numpy(), arrays)


def test_each_case_alone() -> None:
    for a in CASES.values():
        _check(health_tf.stats_row(tf.constant(a)).numpy()[None], [a])


def test_bfloat16() -> None:
    a = np.array([1.5, -2.0, 0.0, np.inf], np.float32)
    big = RNG.standard_normal(70_000).astype(np.float32)
    rows = health_tf.stats_block([tf.cast(a, tf.bfloat16), tf.cast(big, tf.bfloat16)]).numpy()
    assert rows[0, 0] == 14 and rows[1, 0] == 14
    np.testing.assert_array_equal(rows[0, 3:9], health.health_numpy(a)[3:9])
    exact = tf.cast(tf.cast(big, tf.bfloat16), tf.float32).numpy()
    np.testing.assert_allclose(rows[1, 3:], health.health_numpy(exact)[3:], rtol=1e-5)


def test_tf1_graph_with_unknown_shapes() -> None:
    with tf.Graph().as_default():
        ph = tf.compat.v1.placeholder(tf.float32, [None, None])
        ph_big = tf.compat.v1.placeholder(tf.float32, [None])
        stats = health_tf.stats_block([ph, ph_big])
        with tf.compat.v1.Session() as sess:
            for small, big in [(CASES["small"], CASES["big"]), (np.zeros((0, 2), np.float32), CASES["big_nonfinite"])]:
                got = sess.run(stats, {ph: small, ph_big: big})
                _check(got, [small, big])


def test_large_tensor_counts_are_exact() -> None:
    a = np.zeros(1 << 22, np.float32)
    a[: 1 << 21] = 1.0
    a[-5:] = -3.0
    row = health_tf.stats_row(tf.constant(a)).numpy()
    assert row[metadata.STAT_INDEX["pos_finite"]] == 1 << 21
    assert row[metadata.STAT_INDEX["neg_finite"]] == 5
    assert row[metadata.STAT_INDEX["zero"]] == (1 << 21) - 5


def test_rejects_strings_and_complex() -> None:
    with pytest.raises(TypeError, match="complex64"):
        health_tf.stats_block([tf.constant([1 + 2j], tf.complex64)])
    with pytest.raises(TypeError, match="string"):
        health_tf.stats_block([tf.constant(["a"])])


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

_FLOAT_ARRAYS = hnp.arrays(
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
    elements=st.floats(allow_nan=True, allow_infinity=True, width=16),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(_FLOAT_ARRAYS, min_size=1, max_size=4))
def test_random_small_arrays_match_numpy(arrays) -> None:
    _check(health_tf.stats_block([tf.constant(a) for a in arrays]).numpy(), arrays)


@pytest.mark.parametrize("rows", [0, 1, 3, 4000])
def test_sample_holds_the_elements_at_the_stated_positions_of_the_runtime_size(rows: int) -> None:
    """``health_tf.sample`` in a ``tf.function`` traced for ``[None, 7]`` (the size known only at run
    time), and eagerly on a tensor of known size: the elements at ``metadata.sample_positions`` of the
    runtime size, as numpy indexes them; zeros for an empty batch (nothing to index)."""
    x = RNG.standard_normal((rows, 7)).astype(np.float32)
    want = x.ravel()[metadata.sample_positions(x.size)] if x.size else np.zeros(metadata.SAMPLE_SIZE, np.float32)
    traced = tf.function(health_tf.sample, input_signature=[tf.TensorSpec((None, 7), tf.float32)])
    np.testing.assert_array_equal(traced(tf.constant(x)).numpy(), want)
    if x.size:
        np.testing.assert_array_equal(health_tf.sample(tf.constant(x)).numpy(), want)
    positions = metadata.sample_positions(x.size)
    assert (positions >= 0).all() and (positions <= max(x.size - 1, 0)).all()
    if x.size >= metadata.SAMPLE_SIZE:  # one element per stratum: all distinct, in order
        assert (np.diff(positions) > 0).all()
