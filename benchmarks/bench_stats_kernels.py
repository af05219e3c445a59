"""Candidates for the shim's statistics kernel, side by side on one 1M-element float32 tensor.

Issue 13 asked for fewer passes per large tensor. Measured here, in one process:

* the shim's own path (``health_tf.stats_block``, stock TF ops, both cores);
* one ``reduce_sum`` (the floor: a single read of the tensor);
* numba single-pass kernels (float64 accumulation), called the way ``tf.numpy_function`` would
  call them: on the tensor's host memory without a copy. numba is not a dependency of
  tb-parity; ``pip install numba`` to run this part, else it says it is skipped.

A candidate is worth wiring into the shim only if it beats the shim's path here by more than
the ``tf.numpy_function`` round trip costs (measured too).

    .venv/bin/python benchmarks/bench_stats_kernels.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tb_parity_plugin.shim import health_tf

N = 1 << 20


def median_ms(fn: Callable[[], Any], reps: int = 30) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        if isinstance(out, tf.Tensor):
            out.numpy()  # wait for the result
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def numba_kernels() -> dict[str, Callable[[np.ndarray], Any]]:
    """Single-pass kernels: everything in one loop, and the vectorisable sums alone plus min/max."""
    import numba  # not a dependency: ImportError means "skipped"

    @numba.njit(nogil=True, fastmath={"reassoc", "contract"})
    def one_pass(x: np.ndarray) -> tuple:
        s = ss = 0.0
        mn, mx = np.inf, -np.inf
        neg = pos = 0
        for i in range(x.size):
            d = np.float64(x[i])
            s += d
            ss += d * d
            mn = d if d < mn else mn
            mx = d if d > mx else mx
            neg += d < 0.0
            pos += d > 0.0
        return s, ss, mn, mx, neg, pos

    @numba.njit(nogil=True, fastmath={"reassoc", "contract"})
    def sums_and_signs(x: np.ndarray) -> tuple:
        s = ss = a = b = 0.0
        for i in range(x.size):
            d = np.float64(x[i])
            s += d
            ss += d * d
            sg = np.sign(d)
            a += sg
            b += sg * sg
        return s, ss, a, b

    @numba.njit(nogil=True)
    def min_max(x: np.ndarray) -> tuple:
        mn, mx = np.inf, -np.inf
        for i in range(x.size):
            d = np.float64(x[i])
            mn = min(mn, d)
            mx = max(mx, d)
        return mn, mx

    return {
        "numba: one loop, every statistic": one_pass,
        "numba: sums + sign sums, then min/max": lambda x: (sums_and_signs(x), min_max(x)),
    }


def count_kernels() -> dict[str, Callable[[tf.Tensor], Any]]:
    """Stock TensorFlow ways to count the negative, zero and positive elements (session 16): the
    shim's (``sign``, then its sum and sum of squares), and single ops that might replace the three:
    Debugger V2's own FULL_HEALTH kernel (``DebugNumericSummaryV2``, a serial loop over the
    elements), ``Bucketize`` at 0 and the smallest positive float then a ``bincount``, and ``sign``
    cast to indices for a ``bincount``. Each is the counts alone, to set beside the shim's kernel."""
    tiny = float(np.nextafter(np.float32(0), np.float32(1)))

    def shim_signs(t: tf.Tensor) -> tf.Tensor:
        sign = tf.sign(t)
        return tf.stack([tf.reduce_sum(sign), tf.nn.l2_loss(sign)])

    def full_health(t: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.DebugNumericSummaryV2(input=t, output_dtype=tf.float64, tensor_debug_mode=4, tensor_id=0)

    def bucketize(t: tf.Tensor) -> tf.Tensor:
        return tf.math.bincount(tf.raw_ops.Bucketize(input=t, boundaries=[0.0, tiny]), minlength=3, maxlength=3)

    def sign_bincount(t: tf.Tensor) -> tf.Tensor:
        return tf.math.bincount(tf.cast(tf.sign(t), tf.int32) + 1, minlength=3, maxlength=3)

    kernels = {
        "sign, sum, sum of squares (the shim's)": shim_signs,
        "DebugNumericSummaryV2 FULL_HEALTH": full_health,
        "Bucketize + bincount": bucketize,
        "sign as index + bincount": sign_bincount,
    }
    return {name: tf.function(fn) for name, fn in kernels.items()}


def main() -> int:
    x_np = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    x = tf.constant(x_np)
    stats = tf.function(lambda t: health_tf.stats_block([t]))
    read = tf.function(lambda t: tf.reduce_sum(t))
    round_trip = tf.function(lambda t: tf.numpy_function(lambda a: np.float32(a[0]), [t], tf.float32))
    rows = {
        "shim: health_tf.stats_block (TF ops)": median_ms(lambda: stats(x)),
        "floor: one reduce_sum": median_ms(lambda: read(x)),
        **{f"counts: {name}": median_ms(lambda fn=fn: fn(x)) for name, fn in count_kernels().items()},
        "tf.numpy_function round trip (no work)": median_ms(lambda: round_trip(x)),
        "numpy: sum, dot, min, max (4 passes, 1 core)": median_ms(
            lambda: (x_np.sum(dtype=np.float64), np.dot(x_np, x_np), x_np.min(), x_np.max())
        ),
    }
    try:
        for name, kernel in numba_kernels().items():
            rows[name] = median_ms(lambda kernel=kernel: kernel(x_np))
    except ImportError:
        rows["numba: not installed (pip install numba), skipped"] = float("nan")
    shim = rows["shim: health_tf.stats_block (TF ops)"]
    print(f"statistics of one {N // 1024}k-element float32 tensor, medians of 30")
    for name, ms in rows.items():
        print(f"  {name:<48} {ms:7.3f} ms   vs shim {ms / shim:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
