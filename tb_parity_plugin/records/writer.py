"""Writes tb-parity step blocks to an event file, in pure Python.

The TF1 shim fetches already-computed blocks from ``sess.run`` and hands them here;
tests and benchmarks use :meth:`BlockWriter.write_arrays` to synthesise runs from
numpy arrays without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Collection, Iterable, Mapping, Optional, Sequence

import numpy as np
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util import tensor_util

from tb_parity_plugin.records import event_file, health, metadata

DEFAULT_FULL_VALUES_LIMIT = 4096


def build_layout(
    entries: Sequence[tuple[str, str, str, Sequence[Optional[int]]]],
    full_values_limit: int = DEFAULT_FULL_VALUES_LIMIT,
) -> metadata.Layout:
    """Layout for ``(kind, name, dtype, shape)`` entries in call sequence.

    Tensors with a fully known shape of at most ``full_values_limit`` elements keep
    their full values, packed per dtype in entry order.
    """
    keys = [(kind, name) for kind, name, _, _ in entries]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"tensor {dup[0]}/{dup[1]!r} is logged twice in one step; give each a distinct name")
    order = metadata.order_specs(keys)
    offsets: dict[str, int] = {}
    specs = []
    for (kind, name, dtype, shape), position in zip(entries, order):
        shape = tuple(None if d is None else int(d) for d in shape)
        known = [d for d in shape if d is not None]
        values = None
        if len(known) == len(shape):
            size = int(np.prod(known, dtype=np.int64)) if known else 1
            if size <= full_values_limit:
                start = offsets.get(dtype, 0)
                values = (dtype, start, size)
                offsets[dtype] = start + size
        specs.append(metadata.TensorSpec(kind, name, position, dtype, shape, values))
    return metadata.Layout(tensors=tuple(specs))


def resolve_layout(
    layout: metadata.Layout,
    runtime: Mapping[int, Sequence[int]],
    full_values_limit: int,
    valued: Collection[int] = (),
) -> metadata.Layout:
    """``layout`` with the runtime shapes of its tensors of unknown static shape filled in.

    ``runtime``: tensor index -> its shape at this step. A tensor in ``valued`` whose runtime
    size is within ``full_values_limit`` keeps its full values at this step (its values were
    packed by the writer, in layout order among the dtype's other kept tensors, so the
    offsets here are recomputed in that order). Its static shape stays, as ``static``.
    Each distinct set of runtime shapes gives its own layout (a partial last batch is one).
    """
    offsets: dict[str, int] = {}
    specs = []
    for i, spec in enumerate(layout.tensors):
        shape, static, values = spec.shape, spec.static, None
        if i in runtime:
            dims = tuple(int(d) for d in runtime[i])
            shape, static = dims, spec.shape
        if spec.values is not None:
            length = int(spec.values[2])
        elif i in valued and i in runtime:
            length = int(np.prod(dims, dtype=np.int64)) if dims else 1
            length = length if length <= full_values_limit else -1
        else:
            length = -1
        if length >= 0:
            start = offsets.get(spec.dtype, 0)
            values, offsets[spec.dtype] = (spec.dtype, start, length), start + length
        specs.append(dataclasses.replace(spec, shape=shape, values=values, static=static))
    return metadata.Layout(tensors=tuple(specs))


def _tensor_value(tag: str, array: np.ndarray, block: str, layout_hash: str) -> summary_pb2.Summary.Value:
    return summary_pb2.Summary.Value(
        tag=tag,
        metadata=metadata.create_summary_metadata(block, layout_hash),
        tensor=tensor_util.make_tensor_proto(array),
    )


class BlockWriter:
    """One run's writer: layout once, then one event per step."""

    def __init__(self, run_dir: str, side: str = "", mode: str = "", tensorflow: str = "") -> None:
        self._file = event_file.EventFileWriter(run_dir)
        self.path = self._file.path
        self._layouts_written: set[str] = set()
        info = {"version": metadata.FORMAT_VERSION, "side": side, "mode": mode, "tensorflow": tensorflow}
        summary = summary_pb2.Summary()
        summary.value.append(
            _tensor_value(
                metadata.RUN_INFO_TAG,
                np.array(json.dumps(info, sort_keys=True).encode("utf-8"), dtype=object),
                "run_info",
                "",
            )
        )
        self._file.write_summary(0, summary)

    def write_step(
        self,
        step: int,
        layout: metadata.Layout,
        stats: np.ndarray,
        values_blocks: Mapping[str, np.ndarray] = {},
        scalars: Mapping[str, float] = {},
    ) -> None:
        """Write one step: ``stats`` is ``[len(layout.tensors), N_STATS]`` float64."""
        layout_hash = layout.hash
        summary = summary_pb2.Summary()
        if layout_hash not in self._layouts_written:
            summary.value.append(
                _tensor_value(
                    metadata.layout_tag(layout_hash),
                    np.array(layout.to_json_bytes(), dtype=object),
                    "layout",
                    layout_hash,
                )
            )
            self._layouts_written.add(layout_hash)
        stats = np.asarray(stats, dtype=np.float64)
        if stats.shape != (len(layout.tensors), metadata.N_STATS):
            raise ValueError(f"stats block shape {stats.shape} does not match the layout")
        summary.value.append(_tensor_value(metadata.stats_tag(layout_hash), stats, "stats", layout_hash))
        for dtype, block in sorted(values_blocks.items()):
            summary.value.append(
                _tensor_value(
                    metadata.values_tag(layout_hash, dtype),
                    np.ascontiguousarray(block).reshape(-1),
                    "values",
                    layout_hash,
                )
            )
        for key, value in scalars.items():
            summary.value.append(
                summary_pb2.Summary.Value(
                    tag=metadata.SCALAR_TAGS[key],
                    metadata=scalar_metadata.create_summary_metadata(display_name=key, description=""),
                    tensor=tensor_util.make_tensor_proto(np.float32(value)),
                )
            )
        self._file.write_summary(step, summary)

    def write_arrays(
        self,
        step: int,
        tensors: Iterable[tuple[str, str, np.ndarray]],
        full_values_limit: int = DEFAULT_FULL_VALUES_LIMIT,
    ) -> metadata.Layout:
        """Write ``(kind, name, array)`` tensors of one step, stats computed in numpy.

        ``lr`` and ``loss`` kinds are also written as ordinary scalars.
        """
        tensors = [(k, n, np.asarray(a)) for k, n, a in tensors]
        layout = build_layout([(k, n, a.dtype.name, a.shape) for k, n, a in tensors], full_values_limit)
        stats = (
            np.stack([health.health_numpy(a) for _, _, a in tensors]) if tensors else np.zeros((0, metadata.N_STATS))
        )
        blocks: dict[str, list[np.ndarray]] = {}
        for spec, (_, _, array) in zip(layout.tensors, tensors):
            if spec.values is not None:
                blocks.setdefault(spec.dtype, []).append(array.reshape(-1))
        values = {dtype: np.concatenate(parts) for dtype, parts in blocks.items()}
        scalars = {k: float(a.reshape(-1)[0]) for k, _, a in tensors if k in metadata.SCALAR_TAGS and a.size == 1}
        self.write_step(step, layout, stats, values, scalars)
        return layout

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
