"""Reader tests on real event files (BlockWriter, raw framing, and real tf.summary.write)."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from tensorboard.compat.proto import summary_pb2
from tensorboard.util import tensor_util

from tb_parity_plugin import compare
from tb_parity_plugin.logdir.reader import LogdirReader, ReadProblem
from tb_parity_plugin.records import event_file, health, metadata
from tb_parity_plugin.records.writer import BlockWriter, build_layout

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_tensors(step: int, name: str = "dense/kernel:0") -> list:
    """A small step: lr, one weight with values, a big grad (stats only), loss."""
    rng = np.random.default_rng(abs(step))
    return [
        ("lr", "lr", np.float32(0.1 / (abs(step) + 1))),
        ("weight", name, rng.standard_normal((3, 4)).astype(np.float32)),
        ("grad", "big", rng.standard_normal(5000).astype(np.float32)),
        ("loss", "loss", np.float32(1.0 / (abs(step) + 1))),
    ]


def write_run(run_dir: str, steps, side: str = "tf1", **kwargs) -> BlockWriter:
    writer = BlockWriter(run_dir, side=side, mode="graph", tensorflow="2.21")
    for step in steps:
        writer.write_arrays(step, step_tensors(step, **kwargs))
    writer.flush()
    return writer


def record_offsets(path: str) -> list[int]:
    """Start offset of every record of a well-formed event file."""
    data, offsets, pos = open(path, "rb").read(), [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    return offsets


def the_file(run_dir: str) -> str:
    (name,) = [f for f in os.listdir(run_dir) if "tfevents" in f]
    return os.path.join(run_dir, name)


def test_round_trip_stats_values_scalars_info(tmp_path):
    write_run(str(tmp_path / "tf1"), range(4)).close()
    reader = LogdirReader(str(tmp_path))
    assert reader.reload() is True
    assert reader.run_names() == ["tf1"]
    run = reader.run("tf1")
    assert run.name == "tf1" and run.problems == [] and reader.problems == []
    assert run.info == {"version": 1, "side": "tf1", "mode": "graph", "tensorflow": "2.21"}
    np.testing.assert_array_equal(run.steps, np.arange(4))
    assert set(run.tensors) == {("lr", "lr"), ("weight", "dense/kernel:0"), ("grad", "big"), ("loss", "loss")}
    weight = run.tensors[("weight", "dense/kernel:0")]
    assert (weight.tag, weight.order, weight.dtype, weight.shape) == ("weight/dense/kernel:0", 1, "float32", (3, 4))
    assert weight.steps.dtype == np.int64 and weight.stats.shape == (4, metadata.N_STATS)
    assert weight.values.shape == (4, 12) and weight.values.dtype == np.float32
    for i in range(4):
        array = step_tensors(i)[1][2]
        np.testing.assert_array_equal(weight.values[i], array.reshape(-1))
        np.testing.assert_array_equal(weight.stats[i], health.health_numpy(array))
    big = run.tensors[("grad", "big")]
    assert big.values is None and big.stats[0, metadata.STAT_INDEX["size"]] == 5000
    steps, lr = run.scalars["lr"]
    np.testing.assert_array_equal(steps, np.arange(4))
    np.testing.assert_allclose(lr, [np.float32(0.1 / (i + 1)) for i in range(4)])
    assert set(run.scalars) == {"lr", "loss"}
    assert reader.reload() is False and reader.run("tf1") is run  # cached snapshot


def test_incremental_reload_reads_only_appended_bytes(tmp_path):
    writer = write_run(str(tmp_path / "tf2"), range(3), side="tf2")
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    first = reader.run("tf2")
    size_before = os.path.getsize(writer.path)
    assert reader.bytes_read == size_before
    for step in range(3, 5):
        writer.write_arrays(step, step_tensors(step))
    writer.flush()
    assert reader.reload() is True
    assert reader.bytes_read == os.path.getsize(writer.path)  # only the appended bytes were added
    second = reader.run("tf2")
    assert second.generation > first.generation
    np.testing.assert_array_equal(second.steps, np.arange(5))
    np.testing.assert_array_equal(first.steps, np.arange(3))  # old snapshot unchanged
    assert first.tensors[("weight", "dense/kernel:0")].values.shape == (3, 12)
    # a new file in the run and a new run are picked up
    write_run(str(tmp_path / "tf2"), range(5, 7), side="tf2").close()
    write_run(str(tmp_path / "pair" / "tf1"), range(2)).close()
    assert reader.reload() is True
    assert reader.run_names() == ["pair/tf1", "tf2"]
    np.testing.assert_array_equal(reader.run("tf2").steps, np.arange(7))


def test_truncated_tail_is_retried(tmp_path):
    path = write_run(str(tmp_path / "run"), range(4)).path
    data = open(path, "rb").read()
    last = record_offsets(path)[-1]
    cut = last + (len(data) - last) // 2
    with open(path, "wb") as f:
        f.write(data[:cut])
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    np.testing.assert_array_equal(reader.run("run").steps, np.arange(3))
    assert reader.problems == []
    with open(path, "ab") as f:
        f.write(data[cut:])
    assert reader.reload() is True
    np.testing.assert_array_equal(reader.run("run").steps, np.arange(4))
    assert reader.problems == []


def test_bit_flip_reports_path_offset_and_keeps_earlier_data(tmp_path):
    path = write_run(str(tmp_path / "run"), range(5)).path
    bad = record_offsets(path)[4]  # records: file_version, run_info, steps 0, 1, 2, ...
    with open(path, "r+b") as f:
        f.seek(bad + 40)
        byte = f.read(1)
        f.seek(bad + 40)
        f.write(bytes([byte[0] ^ 0x10]))
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    rel = os.path.relpath(path, tmp_path)
    assert reader.problems == [ReadProblem(rel, bad, "data CRC mismatch (corrupt record)")]
    run = reader.run("run")
    assert run.problems == reader.problems
    np.testing.assert_array_equal(run.steps, [0, 1])
    assert reader.reload() is False  # the file stays stopped


def test_corrupt_length_header_is_a_problem(tmp_path):
    path = write_run(str(tmp_path / "run"), range(3)).path
    bad = record_offsets(path)[3]
    with open(path, "r+b") as f:
        f.seek(bad + 2)
        f.write(b"\x7f")
    reader = LogdirReader(str(tmp_path))
    (problem,) = reader.problems
    assert problem.offset == bad and "length CRC" in problem.message
    np.testing.assert_array_equal(reader.run("run").steps, [0])


def test_missing_logdir_and_missing_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LogdirReader(str(tmp_path / "nope"))
    write_run(str(tmp_path / "tf1"), range(1)).close()
    reader = LogdirReader(str(tmp_path))
    with pytest.raises(KeyError, match="no run 'tf2' in"):
        reader.run("tf2")


def test_empty_run(tmp_path):
    event_file.EventFileWriter(str(tmp_path / "empty")).close()
    reader = LogdirReader(str(tmp_path))
    assert reader.run_names() == ["empty"]
    run = reader.run("empty")
    assert run.tensors == {} and run.scalars == {} and run.info == {} and len(run.steps) == 0


def test_runs_with_different_step_sets_and_logdir_as_run(tmp_path):
    write_run(str(tmp_path), range(3)).close()
    write_run(str(tmp_path / "sparse"), [0, 5, 10]).close()
    reader = LogdirReader(str(tmp_path))
    assert reader.run_names() == [".", "sparse"]
    np.testing.assert_array_equal(reader.run(".").steps, [0, 1, 2])
    sparse = reader.run("sparse")
    np.testing.assert_array_equal(sparse.tensors[("grad", "big")].steps, [0, 5, 10])
    np.testing.assert_array_equal(sparse.scalars["loss"][0], [0, 5, 10])


def test_duplicate_steps_last_write_wins_and_a_restart_supersedes_the_later_steps(tmp_path):
    """Within a file the later record of a step wins. A file created later that starts at step 5
    restarts the run there (a run resumed from a checkpoint): steps 5-7 are its, and the older
    file's 8 and 9 belong to the abandoned run, left out as TensorBoard does, and said so."""
    run_dir = str(tmp_path / "run")
    first = write_run(run_dir, range(10))
    first.write_arrays(3, step_tensors(103))  # same file: the later record wins
    first.close()
    os.rename(first.path, os.path.join(run_dir, "events.out.tfevents.0000000001.a"))
    restart = write_run(run_dir, range(5, 8), name="dense/kernel:0")  # restarted run re-writes 5..7
    for step in range(5, 8):
        restart.write_arrays(step, step_tensors(step + 100))
    restart.close()
    os.rename(restart.path, os.path.join(run_dir, "events.out.tfevents.0000000002.a"))
    run = LogdirReader(str(tmp_path)).run("run")
    weight = run.tensors[("weight", "dense/kernel:0")]
    np.testing.assert_array_equal(weight.steps, np.arange(8))
    expected = {3: 103, 5: 105, 6: 106, 7: 107}
    for step in range(8):
        array = step_tensors(expected.get(step, step))[1][2].reshape(-1)
        np.testing.assert_array_equal(weight.values[step], array)
    np.testing.assert_allclose(run.scalars["lr"][1][5], np.float32(0.1 / 106))
    np.testing.assert_array_equal(run.scalars["lr"][0], np.arange(8))
    (notice, *again) = run.notices
    assert "run/events.out.tfevents.0000000002.a restarts the run at step 5" in notice
    assert "the steps from 5 to 9 of run/events.out.tfevents.0000000001.a (created earlier" in notice
    # step 3 written twice by the first file, 5-7 by the second (each its own): named, not as two writers
    assert again and all("4 step(s) from step 3 written again by run/" in n for n in again), again
    assert all("more than one file" not in n for n in again)


def test_a_rerun_from_step_0_into_a_used_directory_is_compared_alone(tmp_path):
    """A new user's wrong port (steps 0-37) and its fixed rerun (0-14) in one run directory: the
    comparison stitched the old run's steps 15-37 onto the rerun and reported a divergence at step
    15 that the rerun never had. The rerun now stands alone, and the report says what was left out:
    the whole run restarts, not each layout (the old run's partial-batch layout of step 18 would
    otherwise survive)."""
    for side, drift_from in (("tf1", None), ("tf2", 10)):
        writer = BlockWriter(str(tmp_path / side), side=side)
        for step in range(38):
            off = drift_from is not None and step >= drift_from
            size = 3 if step == 18 else 4  # a partial batch: its own layout, which the shorter rerun never writes
            writer.write_arrays(step, [("weight", "w", np.full(size, step + (0.5 if off else 0.0), np.float32))])
        writer.close()
        if side == "tf2":
            os.rename(writer.path, os.path.join(str(tmp_path / side), "events.out.tfevents.0000000001.old"))
    rerun = BlockWriter(str(tmp_path / "tf2"), side="tf2")
    for step in range(15):
        rerun.write_arrays(step, [("weight", "w", np.full(4, step, np.float32))])
    rerun.close()
    os.rename(rerun.path, os.path.join(str(tmp_path / "tf2"), "events.out.tfevents.0000000002.new"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", accept_fewer_steps=True)
    assert report.agree and report.steps_compared == 15, report.first_divergence
    assert any("restarts the run at step 0: the steps from 0 to 37" in w for w in report.warnings), report.warnings


def test_script_name_nan_inf_and_float16_half_val(tmp_path):
    values = np.array([np.nan, np.inf, -np.inf, 0.0, -1.5, 2.0], dtype=np.float16)
    writer = BlockWriter(str(tmp_path / "run"))
    writer.write_arrays(0, [("activation", "<script>alert(1)</script>", values), ("weight", "w64", np.arange(3.0))])
    writer.close()
    run = LogdirReader(str(tmp_path)).run("run")
    series = run.tensors[("activation", "<script>alert(1)</script>")]
    assert series.dtype == "float16" and series.values.dtype == np.float16
    np.testing.assert_array_equal(series.values[0], values)  # NaN compares equal in assert_array_equal
    idx = metadata.STAT_INDEX
    assert [series.stats[0, idx[k]] for k in ("nan", "pos_inf", "neg_inf", "zero")] == [1, 1, 1, 1]
    np.testing.assert_array_equal(run.tensors[("weight", "w64")].values[0], np.arange(3.0))


def _summary_value(tag: str, array, plugin: str = "tb_parity", content: bytes = b"") -> summary_pb2.Summary.Value:
    if plugin == "tb_parity" and not content:  # our tags carry their block and layout in the metadata
        block, _, rest = tag[len("tb_parity/") :].partition("/")
        content = json.dumps({"version": 1, "block": block, "layout": rest.partition("/")[0]}).encode()
    plugin_data = summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin, content=content)
    meta = summary_pb2.SummaryMetadata(plugin_data=plugin_data)
    return summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor_util.make_tensor_proto(array))


def test_blocks_before_layout_are_held_and_other_tags_ignored(tmp_path):
    layout = build_layout([("weight", "w", "float32", (2,))])
    h = layout.hash
    out = event_file.EventFileWriter(str(tmp_path / "run"))
    stats = np.stack([health.health_numpy(np.array([1.0, 2.0], np.float32))])
    for step in range(2):
        out.write_summary(
            step,
            summary_pb2.Summary(
                value=[
                    _summary_value(metadata.stats_tag(h), stats),
                    _summary_value(metadata.values_tag(h, "float32"), np.array([step, 2.0], np.float32)),
                    _summary_value("accuracy", np.float32(0.5), plugin="scalars"),
                    _summary_value("tb_parity/future_block/x", np.float32(1)),
                ]
            ),
        )
    out.write_summary(
        1,
        summary_pb2.Summary(
            value=[
                summary_pb2.Summary.Value(tag="other/simple", simple_value=3.0),
                _summary_value(metadata.layout_tag(h), np.array(layout.to_json_bytes(), dtype=object)),
            ]
        ),
    )
    out.close()
    run = LogdirReader(str(tmp_path)).run("run")
    assert run.problems == [] and list(run.tensors) == [("weight", "w")]
    np.testing.assert_array_equal(run.tensors[("weight", "w")].values, [[0, 2], [1, 2]])


def test_symlinks_leaving_the_logdir_are_not_followed(tmp_path):
    outside, logdir = tmp_path / "outside", tmp_path / "logdir"
    write_run(str(outside / "secret"), range(2)).close()
    write_run(str(logdir / "inside"), range(2)).close()
    os.symlink(outside / "secret", logdir / "escape_dir")
    os.makedirs(logdir / "run2")
    os.symlink(the_file(str(outside / "secret")), logdir / "run2" / "events.out.tfevents.1.x")
    os.symlink(logdir / "inside", logdir / "alias_inside")  # inside the logdir: allowed, read once
    reader = LogdirReader(str(logdir))
    assert reader.run_names() in (["inside"], ["alias_inside"])
    # not silently: a new user's pair with tf1 linked to another pair's folder showed one run
    assert reader.listing_errors == [
        f"escape_dir -> {os.path.realpath(outside / 'secret')}: a link out of the logdir, not followed",
        f"run2/events.out.tfevents.1.x -> {os.path.realpath(the_file(str(outside / 'secret')))}: a link out of the "
        "logdir, not followed",
    ]


def test_a_run_linked_from_outside_the_logdir_is_named_in_the_pair_error(tmp_path):
    from tb_parity_plugin import api

    write_run(str(tmp_path / "faithful" / "tf1"), range(2)).close()
    write_run(str(tmp_path / "eps7" / "tf2"), range(2)).close()
    os.symlink(tmp_path / "faithful" / "tf1", tmp_path / "eps7" / "tf1")
    with pytest.raises(api.ParityInputError) as err:
        api.compare(str(tmp_path / "eps7"))
    assert "holds 1 runs (tf2)" in str(err.value)
    assert f"tf1 -> {os.path.realpath(tmp_path / 'faithful' / 'tf1')}: a link out of the logdir, not followed" in str(
        err.value
    )
    # and what to do: the message's own advice, --baseline and --candidate, then failed with "no run 'tf1'"
    assert "point it at a common parent of both runs and name them" in str(err.value), str(err.value)
    with pytest.raises(api.ParityInputError) as err:
        api.compare(str(tmp_path / "eps7"), baseline="tf1", candidate="tf2")
    assert "no run 'tf1'" in str(err.value) and "point it at a common parent" in str(err.value), str(err.value)
    # the remedy works (the run linked inside the common parent is read once, under the first name listed)
    report = api.compare(str(tmp_path), baseline="eps7/tf1", candidate="eps7/tf2")
    assert report.steps_compared == 2
    # a link to a run folder moved away is named too (a review: os.walk lists it as a file)
    os.rename(tmp_path / "faithful", tmp_path / "moved")
    with pytest.raises(api.ParityInputError) as err:
        api.compare(str(tmp_path / "eps7"))
    assert f"tf1 -> {tmp_path / 'faithful' / 'tf1'}: a link to nothing" in str(err.value), str(err.value)


def test_reload_on_a_thread_while_reading_snapshots(tmp_path):
    writer = write_run(str(tmp_path / "run"), range(1))
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    done = threading.Event()

    def reload_loop() -> None:
        while not done.is_set():
            reader.reload()

    thread = threading.Thread(target=reload_loop)
    thread.start()
    try:
        for step in range(1, 30):
            writer.write_arrays(step, step_tensors(step))
            writer.flush()
            run = reader.run("run")
            for series in run.tensors.values():
                assert len(series.steps) == len(series.stats)
                assert series.values is None or len(series.values) == len(series.steps)
    finally:
        done.set()
        thread.join()
    reader.reload()
    np.testing.assert_array_equal(reader.run("run").steps, np.arange(30))


def _summarise(logdir: str) -> dict:
    """A JSON-able digest of everything the reader returns for ``logdir``."""
    reader = LogdirReader(logdir)
    out = {}
    for name in reader.run_names():
        run = reader.run(name)
        out[name] = {
            "info": run.info,
            "steps": run.steps.tolist(),
            "scalars": {k: [s.tolist(), v.tolist()] for k, (s, v) in run.scalars.items()},
            "tensors": {
                t.tag: [
                    t.order,
                    t.dtype,
                    list(t.shape),
                    t.stats.tolist(),
                    None if t.values is None else t.values.tolist(),
                ]
                for t in run.tensors.values()
            },
        }
    return json.loads(json.dumps(out))


BLOCK_TF = """
import importlib.abc, sys
class _NoTF(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("tensorflow is blocked for this test")
        return None
sys.meta_path.insert(0, _NoTF())
"""


def test_works_without_tensorflow_and_never_imports_it(tmp_path):
    write_run(str(tmp_path / "logs" / "tf1"), range(3)).close()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_TF)
    script = textwrap.dedent(
        f"""
        import json, sys
        try:
            import tensorflow
            raise SystemExit("tensorflow import was not blocked")
        except ImportError:
            pass
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_reader import _summarise
        digest = _summarise({str(tmp_path / "logs")!r})
        assert not [m for m in sys.modules if m.split(".")[0] == "tensorflow"]
        print(json.dumps(digest))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), REPO]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == _summarise(str(tmp_path / "logs"))


def test_reader_import_does_not_import_tensorflow():
    code = "import sys, tb_parity_plugin.logdir.reader; print(sorted(m for m in sys.modules if m.startswith('tensorflow')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_real_tf_summary_write(tmp_path, monkeypatch):
    tf = pytest.importorskip("tensorflow")

    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    half = np.array([1.5, np.nan, -np.inf], dtype=np.float16)
    layout = build_layout(
        [("lr", "lr", "float32", ()), ("weight", "w", "float32", (2, 3)), ("activation", "h", "float16", (3,))]
    )
    h = layout.hash
    writer = tf.summary.create_file_writer(str(tmp_path / "tf2"))
    with writer.as_default():
        meta = lambda block: metadata.create_summary_metadata(block, h).SerializeToString()  # noqa: E731
        tf.summary.write(
            metadata.RUN_INFO_TAG, tf.constant(json.dumps({"side": "tf2"})), step=0, metadata=meta("run_info")
        )
        for step in range(3):
            if step == 0:
                tf.summary.write(
                    metadata.layout_tag(h), tf.constant(layout.to_json_bytes()), step=step, metadata=meta("layout")
                )
            arrays = [np.float32(0.5 * step), weight + step, half]
            stats = np.stack([health.health_numpy(a) for a in arrays])
            tf.summary.write(metadata.stats_tag(h), tf.constant(stats), step=step, metadata=meta("stats"))
            tf.summary.write(
                metadata.values_tag(h, "float32"),
                tf.constant(np.concatenate([[arrays[0]], arrays[1].ravel()])),
                step=step,
                metadata=meta("values"),
            )
            tf.summary.write(metadata.values_tag(h, "float16"), tf.constant(half), step=step, metadata=meta("values"))
            tf.summary.scalar(metadata.SCALAR_TAGS["lr"], 0.5 * step, step=step)
    writer.close()
    run = LogdirReader(str(tmp_path)).run("tf2")
    assert run.problems == [] and run.info == {"side": "tf2"}
    np.testing.assert_array_equal(run.steps, [0, 1, 2])
    np.testing.assert_array_equal(run.tensors[("weight", "w")].values[2], (weight + 2).ravel())
    np.testing.assert_array_equal(run.tensors[("activation", "h")].values[1], half)
    np.testing.assert_array_equal(run.tensors[("lr", "lr")].values[:, 0], [0, 0.5, 1.0])
    np.testing.assert_array_equal(run.scalars["lr"][1], [0, 0.5, 1.0])
    _both_paths(str(tmp_path), monkeypatch)  # TF's own framing of each value takes the fast path too


def _both_paths(logdir: str, monkeypatch) -> dict:
    """_summarise (plus problems) via event_scan templates and via protobuf only; they must agree."""
    from tb_parity_plugin.logdir import decode as reader_module

    def digest() -> dict:
        reader = LogdirReader(logdir)
        return {
            "runs": _summarise(logdir),
            "problems": [list(map(str, dataclasses.astuple(p))) for p in reader.problems],
        }

    calls = []
    real = reader_module._parse_event
    monkeypatch.setattr(reader_module, "_parse_event", lambda *a: calls.append(a[1]) or real(*a))
    fast = digest()
    fast_calls = len(calls)
    monkeypatch.setattr(reader_module, "FAST_PATH", False)
    calls.clear()
    assert digest() == fast
    assert fast_calls < len(calls) or not calls
    return fast


def test_fast_path_matches_protobuf_big_and_small_records(tmp_path, monkeypatch):
    """Uniform runs of records are cut out by template; protobuf must give the same result."""
    writer = BlockWriter(str(tmp_path / "run"))
    rng = np.random.default_rng(1)
    for step in range(3):
        big = rng.standard_normal(20000).astype(np.float32)
        big[step] = np.nan
        writer.write_arrays(
            step,
            [("lr", "lr", np.float32(0.1)), ("weight", "big", big), ("grad", "half", big[:100].astype(np.float16))],
            full_values_limit=20000,
        )
    writer.close()
    write_run(str(tmp_path / "long"), range(300)).close()  # step varint grows from 1 to 2 bytes at 128
    write_run(str(tmp_path / "neg"), [-3, 0, 1, 2, 1 << 40], name="w").close()  # negative: a 10-byte varint
    _both_paths(str(tmp_path), monkeypatch)
    run = LogdirReader(str(tmp_path)).run("run")
    assert np.isnan(run.tensors[("weight", "big")].values[2, 2])
    np.testing.assert_array_equal(LogdirReader(str(tmp_path)).run("neg").steps, [-3, 0, 1, 2, 1 << 40])


def test_fast_path_falls_back_on_odd_records(tmp_path, monkeypatch):
    """Equal-length records that differ in structure, other tools' varying values, typed
    fields, name scopes and a bad block all give what protobuf gives."""
    _write_odd_records(str(tmp_path / "run"))
    digest = _both_paths(str(tmp_path), monkeypatch)
    assert len(digest["problems"]) >= 1 and digest["runs"]["run"]["steps"][:3] == [1, 2, 3]


def _write_odd_records(run_dir: str) -> None:
    """Steps 1-39 whose records differ in structure at equal length, with a bad block at step 20."""
    layout = build_layout([("weight", "w", "float32", (2,)), ("grad", "g", "float32", (2,))])
    h = layout.hash
    out = event_file.EventFileWriter(run_dir)
    stats = np.stack([health.health_numpy(np.array([1.0, 2.0], np.float32))] * 2)
    moments = np.zeros(metadata.N_STATS)
    moments[metadata.field_span(metadata.MOMENT_FIELDS)] = 1.0
    out.write_summary(
        0,
        summary_pb2.Summary(
            value=[_summary_value(metadata.layout_tag(h), np.array(layout.to_json_bytes(), dtype=object))]
        ),
    )
    for step in range(1, 40):
        values = [
            _summary_value(metadata.stats_tag(h), stats + moments * step),  # counts still add up to the size
            _summary_value("other/x", np.float32(step), plugin="scalars"),  # not ours, varies
            _summary_value("scope/" + metadata.values_tag(h, "float32"), np.arange(4, dtype=np.float32) * step),
        ]
        if step % 3 == 0:  # same length, different tag: a second template in the same run
            values[2] = _summary_value(
                metadata.values_tag(h, "float32")[:-7] + "int32", np.arange(4, dtype=np.int32) * step
            )
        if step % 7 == 0:  # typed fields: protobuf only
            values.append(summary_pb2.Summary.Value(tag=metadata.SCALAR_TAGS["loss"], simple_value=0.5 * step))
        if step == 20:  # a stats block that does not fit the layout
            values[0] = _summary_value(metadata.stats_tag(h), stats[:1])
        out.write_summary(step, summary_pb2.Summary(value=values))
    out.close()


def _digest_with(logdir: str, monkeypatch, fast: bool, chunk: int) -> dict:
    """_summarise and the sorted problems, read with the fast path on or off and ``chunk``-byte reads."""
    from tb_parity_plugin.logdir import decode
    from tb_parity_plugin.logdir import reader as reader_module

    monkeypatch.setattr(decode, "FAST_PATH", fast)
    monkeypatch.setattr(reader_module, "CHUNK_SIZE", chunk)
    problems = sorted(list(map(str, dataclasses.astuple(p))) for p in LogdirReader(logdir, finished=True).problems)
    return {"runs": _summarise(logdir), "problems": problems}


def _count_template_builds(monkeypatch) -> tuple[list, list]:
    """(template builds, uniform runs scanned), filled as the reader reads."""
    from tb_parity_plugin.logdir import decode, event_scan

    builds: list = []
    scans: list = []
    build, scan = event_scan.build_template, decode._scan_run
    monkeypatch.setattr(event_scan, "build_template", lambda *a: builds.append(a[1]) or build(*a))
    monkeypatch.setattr(decode, "_scan_run", lambda *a: scans.append(a[1]) or scan(*a))
    return builds, scans


@pytest.mark.parametrize("damage", ["none", "bit_flip", "crc_valid_nonsense", "truncate"])
def test_templates_kept_between_chunks_read_what_protobuf_reads(tmp_path, monkeypatch, damage):
    """Read in 4 KB chunks, later chunks' records are matched against templates built in earlier
    ones; the result (damage included) must be what protobuf reads in one 16 MiB chunk."""
    from tb_parity_plugin.logdir import decode
    from tb_parity_plugin.logdir.reader import CHUNK_SIZE

    write_run(str(tmp_path / "long"), range(300)).close()  # the step varint grows at 128: a new template
    _write_odd_records(str(tmp_path / "odd"))
    alternating = BlockWriter(str(tmp_path / "alt"))  # steps of two layouts whose records are equally long:
    for step in range(60):  # a template kept from one must not take the other's records
        alternating.write_arrays(step, [("weight", "ab"[step % 2], np.full(3, step, np.float32))])
    alternating.close()
    path = write_run(str(tmp_path / "short"), range(40), name="w").path
    data = bytearray(open(path, "rb").read())
    bad = record_offsets(path)[30]
    length = struct.unpack_from("<Q", data, bad)[0]
    if damage == "bit_flip":
        data[bad + 100] ^= 0x04
    elif damage == "crc_valid_nonsense":  # the big tensor's size statistic made NaN, both CRCs valid again
        body = bytes(data[bad + 12 : bad + 12 + length]).replace(struct.pack("<d", 5000), struct.pack("<d", np.nan), 1)
        data[bad : bad + 16 + length] = event_file.frame_record(body)
    elif damage == "truncate":
        del data[bad + 50 :]
    with open(path, "wb") as f:
        f.write(bytes(data))
    builds, _ = _count_template_builds(monkeypatch)
    fast = _digest_with(str(tmp_path), monkeypatch, True, 4096)
    kept = len(builds)
    with monkeypatch.context() as m:  # the same read with no template kept between chunks
        m.setattr(decode.TagRoutes, "remember", lambda *a: None)
        builds.clear()
        assert _digest_with(str(tmp_path), monkeypatch, True, 4096) == fast
    assert 0 < kept < len(builds) // 2  # most runs of records were matched by kept templates
    assert fast == _digest_with(str(tmp_path), monkeypatch, False, CHUNK_SIZE)
    steps = fast["runs"]["short"]["steps"]
    assert steps == list(range(40)) if damage == "none" else steps[:28] == list(range(28))
    assert any(path.startswith("short/") for path, _, _ in fast["problems"]) == (damage != "none")


def test_the_template_cache_is_bounded():
    """At most 4 templates per length, 64 lengths, and none holding over 64 KiB of fixed bytes."""
    from tb_parity_plugin.logdir import decode, event_scan

    def template(fixed: int) -> event_scan.Template:
        return event_scan.Template(np.zeros(fixed + 8, np.uint8), [(0, fixed)], None, [])

    routes = decode.TagRoutes()
    kept = [template(100) for _ in range(6)]
    for t in kept:
        routes.remember(100, t)
    assert routes.templates[100] == kept[-4:]
    routes.remember(200, template(64 << 10))
    routes.remember(300, template((64 << 10) + 1))
    assert set(routes.templates) == {100, 200}
    for length in range(1000, 1062):
        routes.remember(length, template(10))
    assert len(routes.templates) == 64
    routes.remember(5000, template(10))  # a 65th length starts the cache afresh
    assert set(routes.templates) == {5000}


def test_a_tag_learnt_mid_file_is_filed_in_later_records(tmp_path, monkeypatch):
    """A stats tag first written without metadata is not ours; once a record's metadata marks
    it, later records of the old shape must be filed: templates kept from before no longer hold,
    and in one chunk the records after it are filed with the route although their run comes first."""
    from tb_parity_plugin.logdir.reader import CHUNK_SIZE

    layout = build_layout([("weight", "w", "float32", (2,))])
    h = layout.hash
    out = event_file.EventFileWriter(str(tmp_path / "run"))
    stats = np.stack([health.health_numpy(np.array([1.0, 2.0], np.float32))])
    bare_stats = summary_pb2.Summary.Value(tag=metadata.stats_tag(h), tensor=tensor_util.make_tensor_proto(stats))
    out.write_summary(
        0,
        summary_pb2.Summary(
            value=[_summary_value(metadata.layout_tag(h), np.array(layout.to_json_bytes(), dtype=object))]
        ),
    )
    out.write_summary(
        0, summary_pb2.Summary(value=[_summary_value(metadata.SCALAR_TAGS["lr"], np.float32(0), "scalars")])
    )
    for step in range(1, 21):
        lr = summary_pb2.Summary.Value(tag=metadata.SCALAR_TAGS["lr"], simple_value=step / 100)
        marked = _summary_value(metadata.stats_tag(h), stats)  # the first value of the tag with metadata
        out.write_summary(step, summary_pb2.Summary(value=[lr, marked if step == 11 else bare_stats]))
    out.close()
    builds, scans = _count_template_builds(monkeypatch)
    fast = _digest_with(str(tmp_path), monkeypatch, True, 1)  # one record per read
    assert len(builds) < 20 <= len(scans)  # steps 2-10 and 13-20 reuse a template
    assert fast["runs"]["run"]["steps"] == list(range(11, 21))
    assert fast["runs"]["run"]["tensors"]["weight/w"][3] == stats.tolist() * 10
    # in one chunk, runs of records go by length: steps 12-20 are filed before step 11 teaches
    # the route, so the chunk is read again in record order; protobuf alike
    assert _digest_with(str(tmp_path), monkeypatch, True, CHUNK_SIZE) == fast
    assert _digest_with(str(tmp_path), monkeypatch, False, CHUNK_SIZE) == fast
    assert fast["runs"]["run"]["scalars"]["lr"][0] == list(range(21))


def test_runs_of_one_model_share_their_parsed_layouts(tmp_path):
    """A layout is parsed once per reader: runs writing the same layout get the same object,
    and read exactly as each run does in a reader of its own; a different layout is its own."""
    write_run(str(tmp_path / "a"), range(5)).close()
    write_run(str(tmp_path / "b"), range(3)).close()
    write_run(str(tmp_path / "c"), range(3), name="other:0").close()
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    (layout_a,) = reader._runs["a"].layouts.values()
    (layout_b,) = reader._runs["b"].layouts.values()
    (layout_c,) = reader._runs["c"].layouts.values()
    assert layout_a is layout_b and layout_c != layout_a
    for name in ("a", "b", "c"):
        alone = LogdirReader(str(tmp_path), runs=[name])
        alone.reload()
        assert list(alone._runs[name].layouts.values()) == list(reader._runs[name].layouts.values())
        for key, series in alone.run(name).tensors.items():
            np.testing.assert_array_equal(reader.run(name).tensors[key].stats, series.stats)


def _write_tf1_style(run_dir: str, layout_at: tuple[int, ...], steps: int = 40) -> None:
    """Stats events as TF1's FileWriter writes them: a tag's metadata with its first value only.
    A new layout (tensor "a", then "b", ...) begins at each step of ``layout_at``."""
    out = event_file.EventFileWriter(run_dir)
    stats = np.stack([health.health_numpy(np.array([1.0, 2.0], np.float32))])
    for step in range(steps):
        index = sum(step >= at for at in layout_at) - 1
        layout = build_layout([("weight", "abcdefgh"[index], "float32", (2,))])
        if step in layout_at:
            layout_json = np.array(layout.to_json_bytes(), dtype=object)
            out.write_summary(
                step, summary_pb2.Summary(value=[_summary_value(metadata.layout_tag(layout.hash), layout_json)])
            )
            value = _summary_value(metadata.stats_tag(layout.hash), stats)
        else:
            proto = tensor_util.make_tensor_proto(stats)
            value = summary_pb2.Summary.Value(tag=metadata.stats_tag(layout.hash), tensor=proto)
        out.write_summary(step, summary_pb2.Summary(value=[value]))
    out.close()


def _count_redone(monkeypatch) -> list:
    """Chunks read again in record order (decode.parse_in_order), by their file offset."""
    from tb_parity_plugin.logdir import decode

    redone: list = []
    real = decode.parse_in_order
    monkeypatch.setattr(decode, "parse_in_order", lambda *a: redone.append(a[2]) or real(*a))
    return redone


def test_a_layout_begun_mid_run_keeps_its_steps_when_its_metadata_comes_once(tmp_path, monkeypatch):
    """TF1's pattern with a second layout from step 20: its later records are as long as the first
    layout's, so their run of records is filed before step 20's record teaches their tag (runs
    go by length). Reading that chunk again in record order keeps steps 21-39 (they were lost)."""
    _write_tf1_style(str(tmp_path / "tf1"), (0, 20))
    redone = _count_redone(monkeypatch)
    digest = _both_paths(str(tmp_path), monkeypatch)
    tensors = digest["runs"]["tf1"]["tensors"]
    assert len(tensors["weight/a"][3]) == 20 and len(tensors["weight/b"][3]) == 20
    assert digest["runs"]["tf1"]["steps"] == list(range(40)) and digest["problems"] == []
    assert redone  # the fast pass saw it and handed the chunk over


def test_metadata_with_first_values_is_learnt_without_reading_again(tmp_path, monkeypatch):
    """Our writer (metadata with every value) and TF1's pattern with one layout learn their
    routes in the fast pass: no chunk is read again."""
    write_run(str(tmp_path / "ours"), range(50)).close()
    _write_tf1_style(str(tmp_path / "tf1"), (0,))
    redone = _count_redone(monkeypatch)
    digest = _both_paths(str(tmp_path), monkeypatch)
    assert digest["runs"]["tf1"]["steps"] == list(range(40)) and digest["runs"]["ours"]["steps"] == list(range(50))
    assert redone == []


def test_unparsable_event_stops_the_file_at_that_record(tmp_path, monkeypatch):
    """A record with good CRCs but a broken Event stops the file there, on both paths."""
    path = write_run(str(tmp_path / "run"), range(6)).path
    data = bytearray(open(path, "rb").read())
    bad = record_offsets(path)[5]
    body = bytes(data[bad + 12 : bad + 12 + struct.unpack_from("<Q", data, bad)[0]])
    broken = body[:-3] + b"\xff\xff\xff"  # a truncated field at the end
    with open(path, "wb") as f:
        f.write(bytes(data[:bad]) + event_file.frame_record(broken) + bytes(data[bad + 16 + len(body) :]))
    digest = _both_paths(str(tmp_path), monkeypatch)
    assert digest["runs"]["run"]["steps"] == [0, 1, 2]
    (problem,) = LogdirReader(str(tmp_path)).problems
    assert problem.offset == bad and "unparsable" in problem.message


def test_decode_tensor_typed_fields_and_compression():
    from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2

    from tb_parity_plugin.records.dtypes import decode_tensor

    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=4)])
    compressed = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape, float_val=[1.0, 2.0])
    np.testing.assert_array_equal(decode_tensor(compressed), [1, 2, 2, 2])  # TF repeats the last element
    doubles = tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, tensor_shape=shape, double_val=[1, 2, 3, 4])
    np.testing.assert_array_equal(decode_tensor(doubles), [1, 2, 3, 4])
    halves = np.array([1.5, -np.inf, np.nan, 0], np.float16)
    half = tensor_pb2.TensorProto(dtype=types_pb2.DT_HALF, tensor_shape=shape, half_val=halves.view(np.uint16).tolist())
    np.testing.assert_array_equal(decode_tensor(half), halves)
    ints = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64, tensor_shape=shape, int64_val=[7])
    np.testing.assert_array_equal(decode_tensor(ints), [7, 7, 7, 7])


def test_layout_change_mid_run_merges_series(tmp_path):
    writer = BlockWriter(str(tmp_path / "run"))
    for step in range(4):
        tensors = [("weight", "a", np.full(2, step, np.float32))]
        if step >= 2:  # a tensor appears: a second layout
            tensors.append(("activation", "c", np.full(3, -step, np.float32)))
        writer.write_arrays(step, tensors)
    writer.close()
    run = LogdirReader(str(tmp_path)).run("run")
    a, c = run.tensors[("weight", "a")], run.tensors[("activation", "c")]
    np.testing.assert_array_equal(a.steps, [0, 1, 2, 3])
    np.testing.assert_array_equal(a.values[:, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(c.steps, [2, 3])
    np.testing.assert_array_equal(run.steps, [0, 1, 2, 3])


def test_a_partial_last_batch_is_named_as_such_not_as_a_layout_change(tmp_path):
    """A tf.function traced again for a partial last batch writes a second layout that differs in
    the leading dimension only: said as several batch sizes, each step compared at the shape it
    ran with; any other difference (here the dtype) stays a layout change."""
    writer = BlockWriter(str(tmp_path / "run"))
    for step in range(3):
        rows = 16 if step < 2 else 4
        writer.write_arrays(
            step,
            [
                ("activation", "h", np.full((rows, 3), step, np.float32)),
                ("weight", "w", np.zeros(2, np.float32 if step < 2 else np.float64)),
            ],
        )
    writer.close()
    run = LogdirReader(str(tmp_path)).run("run")
    h, w = run.tensors[("activation", "h")], run.tensors[("weight", "w")]
    assert h.layout_change.startswith("was traced for several batch sizes (float32 [16, 3]; float32 [4, 3])")
    assert w.layout_change.startswith("changed layout mid-run")
    np.testing.assert_array_equal(h.steps, [0, 1, 2])


def test_values_event_not_yet_written_holds_back_the_tail_step(tmp_path):
    """TF's writer may flush a step's stats event before its values event."""
    layout = build_layout([("weight", "w", "float32", (2,))])
    h = layout.hash
    out = event_file.EventFileWriter(str(tmp_path / "run"))
    stats = np.stack([health.health_numpy(np.zeros(2, np.float32))])
    out.write_summary(
        0,
        summary_pb2.Summary(
            value=[_summary_value(metadata.layout_tag(h), np.array(layout.to_json_bytes(), dtype=object))]
        ),
    )
    for step in range(3):
        out.write_summary(step, summary_pb2.Summary(value=[_summary_value(metadata.stats_tag(h), stats)]))
        if step < 2:
            out.write_summary(
                step,
                summary_pb2.Summary(
                    value=[_summary_value(metadata.values_tag(h, "float32"), np.full(2, step, np.float32))]
                ),
            )
    out.flush()
    reader = LogdirReader(str(tmp_path))
    series = reader.run("run").tensors[("weight", "w")]
    np.testing.assert_array_equal(series.steps, [0, 1])
    np.testing.assert_array_equal(series.values, [[0, 0], [1, 1]])
    out.write_summary(
        2, summary_pb2.Summary(value=[_summary_value(metadata.values_tag(h, "float32"), np.full(2, 2, np.float32))])
    )
    out.close()
    reader.reload()
    np.testing.assert_array_equal(reader.run("run").tensors[("weight", "w")].values[:, 0], [0, 1, 2])


@pytest.mark.parametrize("fast", [True, False])
def test_tags_are_ours_by_their_metadata_not_their_name(tmp_path, monkeypatch, fast):
    """A foreign tag under our prefix is not read; our blocks under a name scope are; a newer format is reported."""
    from tb_parity_plugin.logdir import decode

    monkeypatch.setattr(decode, "FAST_PATH", fast)
    layout = build_layout([("weight", "w", "float32", (2,))])
    h = layout.hash
    out = event_file.EventFileWriter(str(tmp_path / "run"))
    stats = np.stack([health.health_numpy(np.array([1.0, 2.0], np.float32))])
    foreign = np.stack([health.health_numpy(np.array([9.0, 9.0], np.float32))])
    newer = json.dumps({"version": metadata.FORMAT_VERSION + 1, "block": "stats", "layout": "other"}).encode()
    ours = metadata.create_summary_metadata("stats", h).plugin_data.content
    out.write_summary(
        0,
        summary_pb2.Summary(
            value=[_summary_value(metadata.layout_tag(h), np.array(layout.to_json_bytes(), dtype=object))]
        ),
    )
    for step in range(3):
        values = [
            # ours, under a tf.name_scope prefix; metadata only with the first value (as TF1's FileWriter does)
            _summary_value("scope/" + metadata.stats_tag(h), stats, content=ours)
            if step == 0
            else summary_pb2.Summary.Value(
                tag="scope/" + metadata.stats_tag(h), tensor=tensor_util.make_tensor_proto(stats)
            ),
            # another plugin's tag that looks like ours
            _summary_value(metadata.stats_tag("feedfeedfeed"), foreign, plugin="not_tb_parity"),
            # no metadata ever: not ours, whatever its name
            summary_pb2.Summary.Value(
                tag=metadata.stats_tag("abcabcabcabc"), tensor=tensor_util.make_tensor_proto(foreign)
            ),
            # ours, from a newer format
            _summary_value("tb_parity/stats/other", stats, content=newer),
        ]
        out.write_summary(step, summary_pb2.Summary(value=values))
    out.close()
    run = LogdirReader(str(tmp_path)).run("run")
    assert list(run.tensors) == [("weight", "w")]
    assert run.tensors[("weight", "w")].steps.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(run.tensors[("weight", "w")].stats, np.repeat(stats, 3, axis=0))
    assert len(run.problems) == 1 and "unsupported tb_parity metadata" in run.problems[0].message


def test_a_file_written_beside_another_is_another_writer_not_a_restart(tmp_path):
    """``summary_v2.Recorder`` writes steps of relaxed shapes (a partial batch) to a second file it
    opens when it first meets one. Opened in a later second, that file was taken for a restart at
    its first step (9) and cut the first file's later steps: a reviewer's single run lost steps
    10-29, and a bug at step 22 went unseen (a false AGREE). A file still written after another
    began is another writer (the records' wall times say so), not a restart."""
    run_dir = tmp_path / "run"
    main = write_run(str(run_dir), range(9))
    side = write_run(str(run_dir), [9])
    for step in range(10, 30):
        (side if step == 19 else main).write_arrays(step, step_tensors(step))
    main.close()
    side.close()
    os.rename(main.path, run_dir / "events.out.tfevents.0000000001.a")
    os.rename(side.path, run_dir / "events.out.tfevents.0000000002.a")
    run = LogdirReader(str(tmp_path)).run("run")
    weight = run.tensors[("weight", "dense/kernel:0")]
    np.testing.assert_array_equal(weight.steps, np.arange(30))
    for step in (9, 10, 22, 29):
        np.testing.assert_array_equal(weight.values[step], step_tensors(step)[1][2].reshape(-1))
    assert run.notices == []


def test_files_of_one_second_are_ordered_by_their_numbers_and_a_second_writer_is_named(tmp_path):
    """TensorFlow names its files ``...tfevents.<time>.<host>.<pid>.<N>.v2`` with N unpadded: a
    process's tenth writer (``.10.v2``) sorted before its ninth, so a retry's rewrite of steps 5-9
    lost to the crashed attempt's values. And a step written by two files is named, not silent."""
    run_dir = tmp_path / "run"
    first = write_run(str(run_dir), range(10))
    first.close()
    retry = write_run(str(run_dir), [])
    for step in range(5, 10):
        retry.write_arrays(step, step_tensors(step + 100))
    retry.close()
    os.rename(first.path, run_dir / "events.out.tfevents.0000000001.h.12.9.v2")
    os.rename(retry.path, run_dir / "events.out.tfevents.0000000001.h.12.10.v2")
    run = LogdirReader(str(tmp_path)).run("run")
    weight = run.tensors[("weight", "dense/kernel:0")]
    for step in range(10):
        want = step_tensors(step + 100 if step >= 5 else step)[1][2].reshape(-1)
        np.testing.assert_array_equal(weight.values[step], want)
    assert any("5 step(s) from step 5 written by more than one file" in n for n in run.notices), run.notices


def test_a_step_written_again_by_one_file_is_named_and_the_last_write_kept(tmp_path):
    """A TF1 ParityHook under gradient accumulation writes on every micro-batch's sess.run, and
    global_step advances once per update: each step was written 4 times in one file, and 3 of 4
    were dropped without a word (a new user's)."""
    writer = write_run(str(tmp_path / "run"), [])
    for step in range(3):
        for micro in range(4):
            writer.write_arrays(step, step_tensors(10 * step + micro))
    writer.close()
    run = LogdirReader(str(tmp_path)).run("run")
    weight = run.tensors[("weight", "dense/kernel:0")]
    np.testing.assert_array_equal(weight.steps, np.arange(3))
    for step in range(3):  # the last write of each step
        np.testing.assert_array_equal(weight.values[step], step_tensors(10 * step + 3)[1][2].reshape(-1))
    once = [n for n in run.notices if "3 step(s) from step 0 written again by" in n]
    assert once and "gradient accumulation" in once[0] and "more than one file" not in once[0], run.notices
