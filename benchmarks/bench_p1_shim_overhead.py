"""P1: training-step overhead of the tb-parity shim vs no logging and vs Debugger V2.

Model: MLP 1024 -> 4 x 1024 -> 10 (4.2 M parameters), batch 256, Adam, CPU.
Variants are timed side by side in one process with interleaved repetitions
(medians of per-step times):

* TF2 ``tf.function``: no logging; the shim recording every weight, gradient and
  activation plus lr and loss each step (statistics only: small values limit).
* Debugger V2 (``enable_dump_debug_info(..., "FULL_HEALTH", circular_buffer_size=-1)``)
  in a child process: once enabled it instruments every later trace and cannot be
  cleanly undone, so the child times its own no-logging baseline (traced before
  enabling) interleaved with an instrumented copy (traced after).
* TF2 with state and slots: the same, plus every variable and Adam's two slots read on
  entering the step (``rec.step(..., variables=model, optimizer=opt)``).
* Keras ``fit``: plain vs ``summary_v2.instrument`` (per step, over ``--steps`` batches).
* TF1 Session: no logging vs the shim's ``minimize`` + ``fetches``.

* a roofline: the statistics of the step's logged tensors alone, against one ``reduce_sum`` of
  each (the floor: one read), and the bytes involved at this machine's measured bandwidth.
* ``--breakdown``: where the shim's own CPU time goes in the TF2 step, from variants of the
  large-tensor kernel timed side by side in process CPU time (robust to a busy machine): one read
  per tensor, the four moments (sum, sum of squares, min, max), and the shim's whole kernel, whose
  rest is the sign counts (neg/zero/pos). The variants compute wrong statistics: timing only.

Target: shim overhead (ratio - 1) <= 1/20 of Debugger V2's overhead.

Usage: ``python benchmarks/bench_p1_shim_overhead.py [--steps 5 --reps 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tb_parity_plugin import summary_v1, summary_v2

WIDTH, DEPTH, CLASSES = 1024, 4, 10


def _data(batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, WIDTH)).astype(np.float32)
    y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, batch)]
    return x, y


def _model() -> tf.keras.Model:
    layers = [tf.keras.layers.Dense(WIDTH, activation="relu") for _ in range(DEPTH)]
    model = tf.keras.Sequential([tf.keras.Input((WIDTH,)), *layers, tf.keras.layers.Dense(CLASSES)])
    return model


def _tf2_step(model: tf.keras.Model, opt, rec=None, state: bool = False) -> Callable:
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True)

    def forward(x, y):
        h = x
        for layer in model.layers:
            h = layer(h)
            if rec is not None:
                rec.activation(layer.name, h)
        return loss_fn(y, h)

    @tf.function
    def plain(x, y):
        with tf.GradientTape() as tape:
            loss = forward(x, y)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def logged(x, y):
        # state=True: every variable and Adam's two slots read on entry (3x the variables logged)
        with rec.step(opt.iterations, variables=model if state else None, optimizer=opt if state else None):
            rec.lr(opt.learning_rate)
            with tf.GradientTape() as tape:
                loss = rec.loss(forward(x, y))
            rec.minimize(opt, loss, model.trainable_variables, tape)
        return loss

    return plain if rec is None else logged


def _time(fn: Callable, steps: int) -> float:
    """Mean seconds per step over ``steps`` calls (results forced to host)."""
    start = time.perf_counter()
    for _ in range(steps):
        out = fn()
    np.asarray(out)
    return (time.perf_counter() - start) / steps


def _interleave(variants: dict, steps: int, reps: int) -> dict:
    for fn in variants.values():  # trace and warm up
        _time(fn, 2)
    times: dict = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            times[name].append(_time(fn, steps))
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_tf2(args, logdir: str) -> dict:
    x, y = (tf.constant(a) for a in _data(args.batch))
    model = _model()
    opt = tf.keras.optimizers.Adam(1e-4)
    plain = _tf2_step(model, opt)
    rec = summary_v2.Recorder(os.path.join(logdir, "tf2"), full_values_limit=args.values_limit)
    logged = _tf2_step(model, opt, rec)
    rec_state = summary_v2.Recorder(os.path.join(logdir, "tf2_state"), full_values_limit=args.values_limit)
    logged_state = _tf2_step(model, opt, rec_state, state=True)
    variants = {"none": lambda: plain(x, y), "shim": lambda: logged(x, y), "state": lambda: logged_state(x, y)}
    out = _interleave(variants, args.steps, args.reps)
    rec.close()
    rec_state.close()
    return out


class _BatchClock(tf.keras.callbacks.Callback):
    """Wall time at the end of each training batch: a step's cost is the interval between two, so
    what ``fit`` does once per call (building the data iterator, callbacks, a once-per-call wait
    that made whole-call timings bimodal here: 70 or 127 ms per step) is not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.intervals: list[float] = []  # within each fit call
        self._last: float | None = None

    def on_train_begin(self, logs: object = None) -> None:
        self._last = None

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.intervals.append(now - self._last)
        self._last = now


def bench_fit(args, logdir: str) -> dict:
    """Seconds per step of ``model.fit``: plain vs ``summary_v2.instrument`` (lr, loss, weights,
    Adam slots, gradients and every layer's output), the median interval between batch ends over
    ``--steps`` (at least 20) batches per call, ``--reps`` calls of each, interleaved."""
    x, y = _data(args.batch)
    # At least 20 batches per call: the first few of each instrumented call run slower (3 batches
    # per call measured 1.8x where 20 measure 1.3x), and a fit is many batches long.
    data = tf.data.Dataset.from_tensors((x, y)).repeat(max(args.steps, 20) + 1)
    fits, clocks = {}, {}
    for name in ("none", "fit"):
        model = _model()
        model.compile(tf.keras.optimizers.Adam(1e-4), tf.keras.losses.CategoricalCrossentropy(from_logits=True))
        if name == "fit":
            rec = summary_v2.Recorder(os.path.join(logdir, "fit"), full_values_limit=args.values_limit)
            summary_v2.instrument(model, rec, layers=model.layers)
        clocks[name] = clock = _BatchClock()
        fits[name] = (lambda m, c: lambda: m.fit(data, verbose=0, callbacks=[c]).history["loss"][-1])(model, clock)
    _interleave(fits, 1, args.reps)
    return {name: statistics.median(clock.intervals) for name, clock in clocks.items()}


def bench_debugger(args) -> dict:
    """Runs in a child process: baseline traced before enabling, then instrumented."""
    x, y = (tf.constant(a) for a in _data(args.batch))
    model = _model()
    opt = tf.keras.optimizers.Adam(1e-4)
    plain = _tf2_step(model, opt)
    _time(lambda: plain(x, y), 2)
    with tempfile.TemporaryDirectory() as dump_root:
        tf.debugging.experimental.enable_dump_debug_info(
            dump_root, tensor_debug_mode="FULL_HEALTH", circular_buffer_size=-1
        )
        debugged = _tf2_step(model, opt)
        out = _interleave({"none": lambda: plain(x, y), "debugger": lambda: debugged(x, y)}, args.steps, args.reps)
        tf.debugging.experimental.disable_dump_debug_info()
    return out


def bench_tf1(args, logdir: str) -> dict:
    x_np, y_np = _data(args.batch)
    with tf.Graph().as_default():
        x, y = tf.constant(x_np), tf.constant(y_np)
        rec = summary_v1.Recorder(os.path.join(logdir, "tf1"), full_values_limit=args.values_limit)
        gs = tf.compat.v1.train.get_or_create_global_step()
        h = x
        for i in range(DEPTH + 1):
            last = i == DEPTH
            h = tf.compat.v1.layers.dense(h, CLASSES if last else WIDTH, None if last else tf.nn.relu, name=f"d{i}")
            rec.activation(f"d{i}", h)
        loss = rec.loss(tf.compat.v1.losses.softmax_cross_entropy(y, h))
        rec.lr(tf.constant(1e-4))
        plain_op = tf.compat.v1.train.AdamOptimizer(1e-4).minimize(loss, global_step=gs)
        logged_op = rec.minimize(tf.compat.v1.train.AdamOptimizer(1e-4), loss, global_step=gs)
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())

            def logged():
                _, parity = sess.run([logged_op, fetches])
                rec.write(parity)
                return parity["stats"]

            out = _interleave({"none": lambda: sess.run([plain_op, loss])[1], "shim": logged}, args.steps, args.reps)
        rec.close()
    return out


def _logged_tensors(batch: int) -> list[tf.Tensor]:
    """Tensors of bench_tf2's logged step, by shape: every kernel and bias, their gradients,
    and each layer's output (the values are random: only sizes matter for the cost)."""
    rng = np.random.default_rng(1)
    shapes = [(WIDTH, WIDTH)] * DEPTH + [(WIDTH, CLASSES)] + [(WIDTH,)] * DEPTH + [(CLASSES,)]
    shapes = shapes * 2 + [(batch, WIDTH)] * DEPTH + [(batch, CLASSES)]  # weights, grads, activations
    return [tf.constant(rng.standard_normal(shape).astype(np.float32)) for shape in shapes]


def _bandwidth() -> tuple[float, float]:
    """This machine's (read, copy) memory bandwidth in GB/s: numpy sum and copy of 512 MB."""
    a = np.ones(128 << 20, dtype=np.float32)
    b = np.empty_like(a)
    read = min(timed_once(lambda: a.sum()) for _ in range(5))
    copy = min(timed_once(lambda: np.copyto(b, a)) for _ in range(5))
    return a.nbytes / read / 1e9, 2 * a.nbytes / copy / 1e9


def timed_once(fn: Callable) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def roofline(args, step_ms: float, shim_ms: float) -> None:
    """Where the floor is: the statistics' cost against one read of every logged tensor, and the
    bytes they move against the step's own, at this machine's measured bandwidth."""
    from tb_parity_plugin.shim import health_tf

    tensors = _logged_tensors(args.batch)
    logged = sum(int(np.prod(t.shape)) * 4 for t in tensors)
    stats = tf.function(lambda *xs: health_tf.stats_block(xs))
    one_read = tf.function(lambda *xs: tf.stack([tf.reduce_sum(x) for x in xs]))  # the floor: one pass each
    timed = _interleave({"stats": lambda: stats(*tensors), "read": lambda: one_read(*tensors)}, args.steps, args.reps)
    read_gbs, copy_gbs = _bandwidth()
    params = sum(int(np.prod(t.shape)) for t in tensors[: 2 * DEPTH + 2])
    adam_bytes = params * 4 * 7  # Adam reads variable, gradient, m, v and writes variable, m, v
    print(
        f"roofline: the step logs {logged / 1e6:.1f} MB of tensors; this machine reads {read_gbs:.1f} GB/s "
        f"(numpy sum) and copies {copy_gbs:.1f} GB/s (read + write)\n"
        f"  statistics of those tensors alone {timed['stats'] * 1e3:6.2f} ms   one read of each (the floor) "
        f"{timed['read'] * 1e3:6.2f} ms   ratio {timed['stats'] / timed['read']:.2f} "
        f"(= passes per tensor); one read at bandwidth {logged / read_gbs / 1e6:.2f} ms\n"
        f"  shim overhead per step {shim_ms - step_ms:6.2f} ms of a {step_ms:.1f} ms step; Adam alone moves "
        f"{adam_bytes / 1e6:.0f} MB ({adam_bytes / copy_gbs / 1e6:.1f} ms at copy bandwidth); the floor "
        f"(one read per logged tensor) is {timed['read'] / step_ms * 1e3:.1%} of the step"
    )


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def breakdown(args, logdir: str) -> None:
    """CPU ms per TF2 step of the shim with its large-tensor kernel cut down, side by side."""
    from tb_parity_plugin.shim import health_tf

    def f64(t: tf.Tensor) -> tf.Tensor:
        return tf.cast(t, tf.float64)

    def one_read(x: tf.Tensor) -> tf.Tensor:
        return tf.stack([f64(tf.reduce_sum(x))] * 11)

    def moments(x: tf.Tensor) -> tf.Tensor:
        parts = [f64(tf.nn.l2_loss(x)), f64(tf.reduce_sum(x)), f64(tf.reduce_min(x)), f64(tf.reduce_max(x))]
        return tf.stack(parts + parts[:1] * 7)

    x, y = (tf.constant(a) for a in _data(args.batch))
    model, opt = _model(), tf.keras.optimizers.Adam(1e-4)
    plain = _tf2_step(model, opt)
    variants: dict = {"none": lambda: plain(x, y)}
    kernel = health_tf._large_columns
    try:
        for name, cols in (("one read", one_read), ("moments", moments), ("shim", kernel)):
            health_tf._large_columns = cols
            step = _tf2_step(model, opt, summary_v2.Recorder(os.path.join(logdir, name), args.values_limit))
            step(x, y)  # traced with this kernel
            variants[name] = (lambda f: lambda: f(x, y))(step)
    finally:
        health_tf._large_columns = kernel
    cpu: dict = {name: [] for name in variants}
    for _ in range(args.reps):
        for name, fn in variants.items():
            start = _cpu_seconds()
            _time(fn, args.steps)
            cpu[name].append((_cpu_seconds() - start) / args.steps)
    ms = {name: statistics.median(ts) * 1e3 for name, ts in cpu.items()}
    over = ms["shim"] - ms["none"]
    parts = (
        ("one read per tensor", ms["one read"] - ms["none"]),
        ("+ the other three moments", ms["moments"] - ms["one read"]),
        ("+ the sign counts", ms["shim"] - ms["moments"]),
    )
    print(f"breakdown (process CPU ms per step, medians): none {ms['none']:.1f}, shim {ms['shim']:.1f} (+{over:.1f})")
    for what, extra in parts:
        print(f"  {what:<28} {extra:6.2f} ms  {extra / over:6.1%} of the shim's CPU overhead")


def main() -> int:
    parser = argparse.ArgumentParser(description="P1: shim overhead vs no logging and Debugger V2")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed repetition")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--values-limit", type=int, default=16, help="full_values_limit for the shim")
    parser.add_argument("--skip-debugger", action="store_true")
    parser.add_argument("--skip-tf1", action="store_true")
    parser.add_argument("--breakdown", action="store_true", help="only the CPU breakdown of the TF2 shim's kernel")
    parser.add_argument("--debugger-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.debugger_child:
        print(json.dumps(bench_debugger(args)))
        return 0

    params = sum(int(np.prod(v.shape)) for v in _model().trainable_variables)
    print(
        f"P1: MLP {WIDTH}->{DEPTH}x{WIDTH}->{CLASSES} ({params / 1e6:.2f} M params), batch {args.batch}, Adam, "
        f"{args.reps} reps x {args.steps} steps, medians"
    )
    if args.breakdown:
        with tempfile.TemporaryDirectory() as logdir:
            breakdown(args, logdir)
        return 0
    with tempfile.TemporaryDirectory() as logdir:
        tf2 = bench_tf2(args, logdir)
        fit = bench_fit(args, logdir)
        tf1 = None if args.skip_tf1 else bench_tf1(args, logdir)
    shim_over = tf2["shim"] / tf2["none"] - 1
    print(
        f"TF2 tf.function  none {tf2['none'] * 1e3:7.1f} ms   shim {tf2['shim'] * 1e3:7.1f} ms   "
        f"ratio {tf2['shim'] / tf2['none']:.3f}"
    )
    print(
        f"TF2 + state/slots none {tf2['none'] * 1e3:6.1f} ms   shim {tf2['state'] * 1e3:7.1f} ms   "
        f"ratio {tf2['state'] / tf2['none']:.3f}   (weights, Adam m and v read at the step's start)"
    )
    print(
        f"Keras fit        none {fit['none'] * 1e3:7.1f} ms   inst {fit['fit'] * 1e3:7.1f} ms   "
        f"ratio {fit['fit'] / fit['none']:.3f}   (per step; instrument(model, rec, layers=all))"
    )
    roofline(args, tf2["none"] * 1e3, tf2["shim"] * 1e3)
    if tf1 is not None:
        print(
            f"TF1 Session      none {tf1['none'] * 1e3:7.1f} ms   shim {tf1['shim'] * 1e3:7.1f} ms   "
            f"ratio {tf1['shim'] / tf1['none']:.3f}"
        )
    if not args.skip_debugger:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--debugger-child",
                "--steps",
                str(args.steps),
                "--reps",
                str(args.reps),
                "--batch",
                str(args.batch),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        dbg = json.loads(child.stdout.strip().splitlines()[-1])
        dbg_over = dbg["debugger"] / dbg["none"] - 1
        print(
            f"Debugger V2      none {dbg['none'] * 1e3:7.1f} ms   dbg  {dbg['debugger'] * 1e3:7.1f} ms   "
            f"ratio {dbg['debugger'] / dbg['none']:.3f}   (child process)"
        )
        verdict = "meets" if shim_over <= dbg_over / 20 else "misses"
        print(
            f"shim overhead {shim_over:.1%} = 1/{dbg_over / max(shim_over, 1e-9):.1f} of Debugger V2's "
            f"{dbg_over:.1%}; target <= 1/20 ({dbg_over / 20:.1%}): {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
