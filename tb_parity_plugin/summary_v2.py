"""TF2 eager / ``tf.function`` logging shim (same vocabulary as ``summary_v1``).

Record a training step's tensors inside ``with recorder.step(step):``; on exit the
statistics are computed as ops of the same step and written with ``tf.summary``::

    rec = summary_v2.Recorder("logs/tf2")

    @tf.function
    def train_step(x, y):
        with rec.step(optimizer.iterations):
            rec.lr(lr_schedule(optimizer.iterations))
            with tf.GradientTape() as tape:
                logits = rec.activation("logits", model(x))
                loss = rec.loss(loss_fn(y, logits))
            grads = tape.gradient(loss, model.trainable_variables)
            rec.apply_gradients(optimizer, zip(grads, model.trainable_variables))

Why it stays cheap: the layout (names, shapes, offsets) is static, so it is built at
trace time and written once from outside the graph (``tf.init_scope``); each step
only runs the statistics ops and ``tf.summary.write`` of one ``[n, 14]`` float64
block (plus the full values of tensors under ``full_values_limit``). Nothing depends
on Python values of the step, so the function is traced once.

Values as read at the start of the step: ``with rec.step(step, variables=model,
optimizer=opt)`` reads every variable of ``model`` (trainable ones as ``weight``, the
others, such as batch-norm moving statistics, as ``state``) and ``opt``'s slots (``slot``)
on entry, before the forward pass (Keras updates the moving statistics inside it) and the
update. Inside ``tf.function``, automatic control dependencies run those reads before any
later write (and resource variables copy on write). ``weight``/``grads_and_vars`` called
later return the entry read of a variable read there, or read it where they are called;
a variable whose write was already built in the traced step raises instead of logging
the updated value.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Iterable, Iterator, Optional

import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata

from tb_parity_plugin.records import metadata
from tb_parity_plugin.shim import ordering
from tb_parity_plugin.shim.fit import forward_pass, instrument, instrument_layer
from tb_parity_plugin.shim.recorder import DEFAULT_FULL_VALUES_LIMIT, BaseRecorder, Entry, build_blocks

__all__ = ["Recorder", "forward_pass", "instrument", "instrument_layer"]


class Recorder(BaseRecorder):
    """Collects one training step's tensors and writes them as ``tf.summary`` events.

    Args:
      logdir: the run directory (one per run, e.g. ``logs/tf2``).
      full_values_limit: tensors with at most this many elements keep full values;
        larger ones keep statistics only.
    """

    def __init__(self, logdir: str, full_values_limit: int = DEFAULT_FULL_VALUES_LIMIT) -> None:
        super().__init__(full_values_limit)
        self.logdir = logdir
        with tf.init_scope():
            self._writer = tf.summary.create_file_writer(logdir)
        self._step: Optional[tf.Tensor] = None
        self._written_once: set[str] = set()

    # -- BaseRecorder hooks -------------------------------------------------------
    def _check_open(self) -> None:
        if self._step is None:
            raise RuntimeError("record tensors inside `with recorder.step(step):`")

    def _snapshot(self, var: Any, tag: str) -> tf.Tensor:
        if tf.inside_function() and isinstance(var, tf.Variable) and hasattr(var, "handle"):
            # Stateful ops of a tf.function run in program order: a write built before this
            # read runs before it, and the value logged would be the updated one.
            written = ordering.writers(var, calls=False)
            if written:
                raise ValueError(
                    f"tb_parity: {tag} is recorded after {written[0].name!r} wrote it in this step; "
                    "record it at the step's start: `with rec.step(step, variables=model, optimizer=opt)`"
                )
        value = var.read_value() if hasattr(var, "read_value") else tf.convert_to_tensor(var)
        return tf.identity(value)

    @property
    def recording(self) -> bool:
        """Whether a step is open (instrumented layers record only then)."""
        return self._step is not None

    # -- steps --------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, step: Any, variables: Any = None, optimizer: Any = None) -> Iterator[Recorder]:
        """Records everything inside as step ``step`` (int, tensor or variable such as
        ``optimizer.iterations``, read on entry) and writes it on exit.

        ``variables`` (a Keras model or layer, a ``tf.Module`` or a list) are read on entry,
        before the forward pass updates batch-norm statistics and before the optimizer
        updates anything: trainable ones as ``weight``, the others as ``state``; with
        ``optimizer``, its slots too (built now if Keras has not built them yet).
        """
        if self._step is not None:
            raise RuntimeError("recorder.step() does not nest")
        self._step = tf.cast(tf.convert_to_tensor(step), tf.int64)
        self._take_entries()
        ok = False
        try:
            if variables is not None:
                self.variables(variables, optimizer)
            elif optimizer is not None:
                raise ValueError("step(optimizer=...) needs variables= (whose slots to record)")
            yield self
            ok = True
        finally:
            step_t, self._step = self._step, None
            entries = self._take_entries()
        if ok and entries:
            self._write(step_t, entries)

    def apply_gradients(self, optimizer: Any, grads_and_vars: Iterable[tuple], name: Optional[str] = None) -> Any:
        """Records each gradient and weight (read now), then ``optimizer.apply_gradients``."""
        pairs = self.grads_and_vars(grads_and_vars)
        kwargs = {"name": name} if name else {}
        return optimizer.apply_gradients(pairs, **kwargs)

    def minimize(self, optimizer: Any, loss: tf.Tensor, var_list: list, tape: tf.GradientTape) -> Any:
        """``tape.gradient`` then :meth:`apply_gradients`."""
        grads = tape.gradient(loss, var_list)
        return self.apply_gradients(optimizer, zip(grads, var_list))

    # -- writing ------------------------------------------------------------------
    def _write_once(self, key: str, tag: str, payload: bytes, block: str, layout_hash: str) -> None:
        """Writes a static string record once per recorder, eagerly even while tracing."""
        if key in self._written_once:
            return
        with tf.init_scope(), self._writer.as_default():
            tf.summary.write(
                tag,
                tf.constant(payload),
                step=0,
                metadata=metadata.create_summary_metadata(block, layout_hash),
            )
        self._written_once.add(key)

    def _write(self, step: tf.Tensor, entries: list[Entry]) -> None:
        mode = "function" if tf.inside_function() else "eager"
        info = {"version": metadata.FORMAT_VERSION, "side": "tf2", "mode": mode, "tensorflow": tf.__version__}
        self._write_once("run_info", metadata.RUN_INFO_TAG, json.dumps(info, sort_keys=True).encode(), "run_info", "")
        blocks = build_blocks(entries, self.full_values_limit)
        h = blocks.layout.hash
        self._write_once("layout/" + h, metadata.layout_tag(h), blocks.layout.to_json_bytes(), "layout", h)
        with self._writer.as_default():
            tf.summary.write(
                metadata.stats_tag(h), blocks.stats, step=step, metadata=metadata.create_summary_metadata("stats", h)
            )
            for dtype, values in sorted(blocks.values.items()):
                tf.summary.write(
                    metadata.values_tag(h, dtype),
                    values,
                    step=step,
                    metadata=metadata.create_summary_metadata("values", h),
                )
            for kind, value in blocks.scalars.items():
                tf.summary.write(
                    metadata.SCALAR_TAGS[kind],
                    value,
                    step=step,
                    metadata=scalar_metadata.create_summary_metadata(display_name=kind, description=""),
                )

    def flush(self) -> None:
        with tf.init_scope():
            self._writer.flush()

    def close(self) -> None:
        with tf.init_scope():
            self._writer.close()
