"""FULL_HEALTH counts and moments as TensorFlow ops (graph, eager and tf.function).

Rows agree with :func:`tb_parity_plugin.records.health.health_numpy` (columns
``metadata.STATS_FIELDS``): counts of -inf, +inf, NaN, negative/zero/positive finite
elements, and min, max, mean, population std and L2 norm over the finite elements
(NaN when there are none).

Why two paths: the shim computes these for every weight, gradient and activation of
every step, so the cost is the number of passes over the data.

* Small tensors (at most ``SMALL_LIMIT`` elements, or of unknown size) are cast to
  float64 and batched into one vector; every statistic is one segment reduction, so
  many biases and scalars cost a constant number of ops, not ops per tensor.
* Large tensors take a fast path of six reductions and one elementwise pass:
  ``sum``, ``l2_loss`` (fused sum of squares), ``min``, ``max``, and ``sign`` followed
  by ``sum``/``l2_loss`` of the signs, which give ``pos - neg`` and ``pos + neg``. A
  finite sum of squares proves the tensor finite, so NaN/Inf counting runs (in a
  ``tf.cond`` branch, float64, masked) only when the tensor holds one. The variance
  ``E[x^2] - mean^2`` is recomputed with a second pass only when ``|mean| > std``,
  where that formula would lose precision.

Accepted dtypes: float16, bfloat16, float32, float64. Integer and bool tensors are
cast to float64 (their dtype column keeps the original dtype); complex and string
tensors raise ``TypeError``.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tb_parity_plugin.records import dtypes, metadata

#: Tensors up to this many elements go through the batched float64 path.
SMALL_LIMIT = metadata.STATS_F64_LIMIT  # the float64 path is what the record promises up to there
#: Sign sums in float32 are exact while every partial sum stays below 2**24.
_F32_EXACT_COUNT = 1 << 24

_FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def dtype_name(dtype: tf.DType) -> str:
    """numpy-style dtype name used in layouts (``tf.bfloat16`` -> ``"bfloat16"``)."""
    return tf.as_dtype(dtype).name


def check_dtype(dtype: tf.DType, what: str = "tensor") -> None:
    """Raise ``TypeError`` for dtypes that have no FULL_HEALTH statistics."""
    dtype = tf.as_dtype(dtype)
    if dtype in _FLOATS or dtype.is_integer or dtype == tf.bool:
        return
    raise TypeError(
        f"{what} has dtype {dtype.name}; tb_parity logs floating-point tensors "
        "(float16/bfloat16/float32/float64; integers and bool are cast to float64)"
    )


def _static_size(t: tf.Tensor) -> int | None:
    return t.shape.num_elements()


def _masked_columns(flats: Sequence[tf.Tensor]) -> tf.Tensor:
    """Counts and moments (11 columns, float64) of 1-D float64 tensors, batched.

    Handles NaN/Inf and empty tensors. Per-op overhead dominates small tensors, so
    all counts and sums are one sorted segment reduction over a stacked
    ``[elements, 9]`` matrix, and min/max one more over ``[elements, 2]``.
    """
    k = len(flats)
    sizes = tf.stack([tf.size(f) for f in flats] + [tf.constant(1)])
    # A one-element sentinel segment k keeps trailing empty tensors in the output.
    x = tf.concat([*flats, tf.zeros([1], tf.float64)], 0)
    seg = tf.repeat(tf.range(k + 1), sizes)
    finite = tf.math.is_finite(x)
    xf = tf.where(finite, x, tf.zeros_like(x))
    masks = tf.stack(
        [
            tf.equal(x, float("-inf")),
            tf.equal(x, float("inf")),
            tf.math.is_nan(x),
            finite & (x < 0),
            finite & tf.equal(x, 0.0),
            finite & (x > 0),
            finite,
        ],
        axis=1,
    )
    columns = tf.concat([tf.cast(masks, tf.float64), tf.stack([xf, xf * xf], axis=1)], axis=1)
    sums = tf.math.segment_sum(columns, seg)[:k]
    inf = tf.fill(tf.shape(x), tf.constant(float("inf"), tf.float64))
    extremes = tf.math.segment_min(tf.stack([tf.where(finite, x, inf), tf.where(finite, -x, inf)], axis=1), seg)[:k]
    n_fin = sums[:, 6]
    mean = sums[:, 7] / n_fin
    dev = tf.where(finite, x - tf.gather(tf.concat([mean, [0.0]], 0), seg), tf.zeros_like(x))
    var = tf.math.segment_sum(dev * dev, seg)[:k] / n_fin
    moments = tf.stack([extremes[:, 0], -extremes[:, 1], mean, tf.sqrt(var), tf.sqrt(sums[:, 8])], axis=1)
    moments = tf.where(tf.equal(n_fin, 0.0)[:, None], tf.constant(float("nan"), tf.float64), moments)
    return tf.concat([sums[:, :6], moments], axis=1)


def _large_columns(x: tf.Tensor) -> tf.Tensor:
    """Counts and moments (11 columns, float64) of one large 1-D float tensor."""
    if x.dtype in (tf.float16, tf.bfloat16):
        x = tf.cast(x, tf.float32)
    n_static = _static_size(x)
    n = tf.cast(tf.size(x, out_type=tf.int64), tf.float64)
    sumsq = 2.0 * tf.cast(tf.nn.l2_loss(x), tf.float64)
    fast_ok = tf.math.is_finite(sumsq) & (n > 0)

    def fast() -> tf.Tensor:
        total = tf.cast(tf.reduce_sum(x), tf.float64)
        mn = tf.cast(tf.reduce_min(x), tf.float64)
        mx = tf.cast(tf.reduce_max(x), tf.float64)
        sign = tf.sign(x)
        if x.dtype == tf.float32 and (n_static is None or n_static >= _F32_EXACT_COUNT):
            sign = tf.cast(sign, tf.float64)
        diff = tf.cast(tf.reduce_sum(sign), tf.float64)  # pos - neg
        nonzero = 2.0 * tf.cast(tf.nn.l2_loss(sign), tf.float64)  # pos + neg
        mean = total / n
        var_fast = tf.maximum(sumsq / n - mean * mean, 0.0)

        def two_pass() -> tf.Tensor:
            centred = tf.math.squared_difference(x, tf.cast(mean, x.dtype))
            return tf.cast(tf.reduce_mean(centred), tf.float64)

        var = tf.cond(mean * mean > var_fast, two_pass, lambda: var_fast)
        zero64 = tf.zeros([], tf.float64)
        return tf.stack(
            [
                zero64,
                zero64,
                zero64,
                (nonzero - diff) / 2.0,
                n - nonzero,
                (nonzero + diff) / 2.0,
                mn,
                mx,
                mean,
                tf.sqrt(var),
                tf.sqrt(sumsq),
            ]
        )

    def slow() -> tf.Tensor:
        return _masked_columns([tf.cast(x, tf.float64)])[0]

    return tf.cond(fast_ok, fast, slow)


def stats_block(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """Stats rows ``[len(tensors), N_STATS]`` float64, one per tensor, in order."""
    rows: list = [None] * len(tensors)
    small_idx: list[int] = []
    small_flats: list[tf.Tensor] = []
    heads = []
    for i, t in enumerate(tensors):
        t = tf.convert_to_tensor(t)
        check_dtype(t.dtype)
        enum = float(dtypes.TF_DTYPE_ENUM.get(dtype_name(t.dtype), 0))
        rank = t.shape.rank
        rank_t = tf.constant(float(rank), tf.float64) if rank is not None else tf.cast(tf.rank(t), tf.float64)
        size_t = tf.cast(tf.size(t, out_type=tf.int64), tf.float64)
        heads.append(tf.stack([tf.constant(enum, tf.float64), rank_t, size_t]))
        flat = tf.reshape(t, [-1])
        size = _static_size(t)
        if t.dtype in _FLOATS and size is not None and size > SMALL_LIMIT:
            rows[i] = _large_columns(flat)
        else:
            small_idx.append(i)
            small_flats.append(tf.cast(flat, tf.float64))
    if small_flats:
        small = tf.unstack(_masked_columns(small_flats), num=len(small_flats))
        for i, row in zip(small_idx, small):
            rows[i] = row
    if not tensors:
        return tf.zeros([0, metadata.N_STATS], tf.float64)
    return tf.stack([tf.concat([h, r], 0) for h, r in zip(heads, rows)])


def stats_row(tensor: tf.Tensor) -> tf.Tensor:
    """Stats row ``[N_STATS]`` float64 of one tensor."""
    return stats_block([tensor])[0]


def sample(tensor: tf.Tensor, count: int = metadata.SAMPLE_SIZE) -> tf.Tensor:
    """``count`` elements of ``tensor`` at :func:`metadata.sample_positions` of its runtime size
    (one gather: no pass over the tensor, no copy of it), in its dtype; an empty tensor gives zeros."""
    flat = tf.reshape(tensor, [-1])
    size = tf.size(flat, out_type=tf.int64)
    j = tf.range(count, dtype=tf.float64)
    pos = tf.cast(
        tf.floor((j + tf.math.floormod(j * metadata.SAMPLE_JITTER, 1.0)) * tf.cast(size, tf.float64) / count), tf.int64
    )
    pos = tf.minimum(pos, tf.maximum(size - 1, 0))
    if flat.shape.num_elements():  # a known, non-zero size
        return tf.gather(flat, pos)
    return tf.cond(size > 0, lambda: tf.gather(flat, pos), lambda: tf.zeros([count], flat.dtype))
