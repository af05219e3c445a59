"""Reads a shim-written run back, twice: TensorBoard's EventFileLoader and our LogdirReader.

Returns what both agree on, so shim tests check the on-disk contract, not just our
own reader.
"""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict

import numpy as np
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import summary_pb2
from tensorboard.util import tensor_util

from tb_parity_plugin.records import metadata


def load_with_tensorboard(run_dir: str) -> dict:
    """{"layouts": {hash: Layout}, "steps": {step: {tag: ndarray}}, "info": dict, "plugins": {tag: name}}."""
    layouts: dict = {}
    steps: dict = defaultdict(dict)
    plugins: dict = {}
    info: dict = {}
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    assert files, f"no event file in {run_dir}"
    for path in files:
        for event in EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name:
                    plugins.setdefault(value.tag, value.metadata.plugin_data.plugin_name)
                    if (
                        value.tag.startswith(metadata.TAG_PREFIX)
                        and value.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME
                    ):
                        assert value.metadata.data_class == summary_pb2.DATA_CLASS_TENSOR
                array = tensor_util.make_ndarray(value.tensor)
                if value.tag.startswith(metadata.LAYOUT_PREFIX):
                    layout = metadata.Layout.from_json_bytes(array.item())
                    assert value.tag == metadata.layout_tag(layout.hash)
                    layouts[layout.hash] = layout
                elif value.tag == metadata.RUN_INFO_TAG:
                    info = json.loads(array.item())
                else:
                    steps[event.step][value.tag] = array
    return {"layouts": layouts, "steps": dict(steps), "info": info, "plugins": plugins}


def tensors_by_step(run_dir: str) -> dict:
    """{step: {(kind, name): (spec, stats_row, values or None)}} from the TensorBoard loader."""
    data = load_with_tensorboard(run_dir)
    out: dict = {}
    for step, tags in data["steps"].items():
        for h, layout in data["layouts"].items():
            stats = tags.get(metadata.stats_tag(h))
            if stats is None:
                continue
            assert stats.shape == (len(layout.tensors), metadata.N_STATS)
            row_map = out.setdefault(step, {})
            for i, spec in enumerate(layout.tensors):
                values = None
                if spec.values is not None:
                    dtype, offset, length = spec.values
                    block = tags[metadata.values_tag(h, dtype)]
                    values = block[offset : offset + length].reshape(spec.shape)
                row_map[(spec.kind, spec.name)] = (spec, stats[i], values)
    return out


def logged_value(logged: dict, step: int, kind: str, needle: str) -> np.ndarray:
    """The one tensor of ``kind`` whose name holds ``needle`` (its element sample left out) at ``step`` of
    :func:`tensors_by_step`'s result, float64."""
    (found,) = [v[2] for (k, name), v in logged[step].items() if k == kind and needle in name and "#" not in name]
    return np.asarray(found, dtype=np.float64)


def check_with_reader(logdir: str, run: str, expected: dict) -> None:
    """Our LogdirReader sees the same stats and values as the TensorBoard loader."""
    from tb_parity_plugin.logdir.reader import LogdirReader

    reader = LogdirReader(logdir)
    reader.reload()
    data = reader.run(run)
    assert not data.problems
    for step, tensors in expected.items():
        for key, (_spec, row, values) in tensors.items():
            series = data.tensors[key]
            i = int(np.searchsorted(series.steps, step))
            assert series.steps[i] == step
            np.testing.assert_array_equal(series.stats[i], row)
            if values is not None:
                assert series.values is not None, key
                np.testing.assert_array_equal(series.values[i].reshape(values.shape), values)
