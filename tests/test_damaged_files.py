"""Damaged event files (issue 11 sections 2, 4 and 6): a seeded fuzz of bit flips, truncations,
appended garbage and CRC-valid nonsense.

For each damaged copy of a pair that diverges at step 30 of 40 (next to an undamaged sibling
pair in the same logdir): the reader never raises and never hangs, the sibling reads as before,
nothing before the first damaged byte is lost, every CRC-detectable damage is reported, and the
CLI never answers AGREE (exit 0): it finds the divergence (1), says the comparison is incomplete
(3), or names the error (2).
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import sys
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import plugin_fixtures as fx

from tb_parity_plugin import cli
from tb_parity_plugin.logdir.reader import LogdirReader
from tb_parity_plugin.records import event_file

SEEDS = range(48)
KINDS = ("bit_flip", "truncate", "garbage", "crc_valid_nonsense")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("pristine"))
    fx.write_pair(root, "pair", 40, diverge_at=30)
    fx.write_pair(root, "sibling", 10, diverge_at=4)
    return root


def event_path(root: str, run: str) -> str:
    (path,) = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, run)) for f in fs if "tfevents" in f]
    return path


def records(data: bytes) -> list[tuple[int, int]]:
    """(start, length) of every record in a well-formed file."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, length))
        pos += 16 + length
    return out


def damage(data: bytes, kind: str, rng: random.Random) -> tuple[bytes, int]:
    """The damaged bytes and the offset of the first damaged byte."""
    b = bytearray(data)
    recs = records(data)
    if kind == "bit_flip":
        at = rng.randrange(len(b) // 4, len(b))
        b[at] ^= 1 << rng.randrange(8)
        return bytes(b), at
    if kind == "truncate":
        at = rng.randrange(len(b) // 4, len(b) - 1)
        return bytes(b[:at]), at
    if kind == "garbage":
        return bytes(b) + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))), len(b)
    # CRC-valid nonsense: change payload bytes of one record, then make both CRCs valid again
    start, length = recs[rng.randrange(len(recs) // 4, len(recs))]
    payload = bytearray(b[start + 12 : start + 12 + length])
    for _ in range(rng.randrange(1, 4)):
        payload[rng.randrange(len(payload))] = rng.randrange(256)
    framed = event_file.frame_record(bytes(payload))
    return bytes(b[:start]) + framed + bytes(b[start + 16 + length :]), start


@pytest.mark.parametrize("seed", SEEDS)
def test_a_damaged_file_is_reported_never_fatal_never_agree(
    pristine: str, tmp_path: Any, seed: int, capsys: Any
) -> None:
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    root = str(tmp_path / "logs")
    shutil.copytree(pristine, root)
    path = event_path(root, "pair/tf2")
    original = open(path, "rb").read()
    damaged, at = damage(original, kind, rng)
    with open(path, "wb") as f:
        f.write(damaged)

    reader = LogdirReader(root, finished=True)
    reader.reload()  # never raises
    with LogdirReader(pristine) as clean:
        for run in ("sibling/tf1", "sibling/tf2", "pair/tf1"):
            np.testing.assert_array_equal(reader.run(run).steps, clean.run(run).steps)
        whole = clean.run("pair/tf2")
    got = reader.run("pair/tf2")
    problems = [p for p in reader.problems if p.path.startswith("pair/tf2")]
    # nothing before the first damaged byte is lost: steps whose records end before it are all there
    before = [s for (start, length), s in zip(records(original)[2:], whole.steps) if start + 16 + length <= at]
    assert set(before) <= set(got.steps.tolist()), (kind, at)
    if kind in ("bit_flip", "truncate", "garbage") and damaged != original:
        lost = set(whole.steps.tolist()) - set(got.steps.tolist())
        assert problems or not lost, (kind, at, sorted(lost))  # a loss is always reported
    reader.close()

    code = cli.main(["diff", root, "--baseline", "pair/tf1", "--candidate", "pair/tf2"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if kind != "crc_valid_nonsense":
        assert code in (1, 2, 3), (kind, at, code, out[-500:], err)
    else:
        assert code in (0, 1, 2, 3)
    assert cli.main(["diff", root, "--baseline", "sibling/tf1", "--candidate", "sibling/tf2"]) == 1  # untouched
    capsys.readouterr()


def test_a_declared_length_past_any_file_is_a_problem_in_a_live_reader_too(tmp_path: Any) -> None:
    """A valid header CRC over length 2^64-1 after a 17 MiB record: reported, nothing allocated for it."""
    from tensorboard.compat.proto import event_pb2

    root = str(tmp_path)
    fx.write_pair(root, "p", 5)
    fx.write_pair(root, "q", 5)
    path = event_path(root, "p/tf2")
    header = struct.pack("<Q", 2**64 - 1)
    with open(path, "ab") as f:
        f.write(event_file.frame_record(event_pb2.Event(step=100, file_version="x" * (17 << 20)).SerializeToString()))
        f.write(header + struct.pack("<I", event_file.masked_crc32c(header)) + bytes(64))
    for finished in (False, True):
        with LogdirReader(root, finished=finished) as reader:
            reader.reload()
            (problem,) = reader.problems
            assert problem.path.startswith("p/tf2") and "over the 2 GiB limit" in problem.message
            assert list(reader.run("p/tf2").steps) == list(range(5)) and list(reader.run("q/tf2").steps) == list(
                range(5)
            )


@pytest.mark.parametrize("elements", [1 << 27, 1 << 40])
def test_a_compressed_tensor_declaring_gigabytes_allocates_nothing(tmp_path: Any, elements: int) -> None:
    """A CRC-valid 100-byte stats value whose shape asks for ``elements`` doubles (TF's compressed
    form: one value, repeated): a read problem on its file, not gigabytes of memory."""
    import tracemalloc

    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2

    from tb_parity_plugin.records import metadata

    root = str(tmp_path)
    fx.write_pair(root, "p", 5)
    fx.write_pair(root, "q", 5)
    with LogdirReader(root) as first:
        first.reload()
        (layout_hash,) = first._runs["p/tf2"].layouts
    dim = tensor_shape_pb2.TensorShapeProto.Dim(size=elements)
    tensor = tensor_pb2.TensorProto(dtype=2, tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[dim]), double_val=[1])
    value = summary_pb2.Summary.Value(
        tag=metadata.stats_tag(layout_hash),
        tensor=tensor,
        metadata=metadata.create_summary_metadata("stats", layout_hash),
    )
    with open(event_path(root, "p/tf2"), "ab") as f:
        f.write(
            event_file.frame_record(
                event_pb2.Event(step=7, summary=summary_pb2.Summary(value=[value])).SerializeToString()
            )
        )
    tracemalloc.start()
    try:
        with LogdirReader(root, finished=True) as reader:
            reader.reload()
            peak = tracemalloc.get_traced_memory()[1]
            (problem,) = reader.problems
            assert problem.path.startswith("p/tf2") and list(reader.run("p/tf2").steps) == list(range(5))
            assert list(reader.run("q/tf2").steps) == list(range(5))
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # the files are a few KB; 1 << 27 doubles would be 1 GiB


def test_an_event_no_check_foresaw_keeps_every_record_before_it(tmp_path: Any) -> None:
    """A CRC-valid run_info nested 100 000 deep (json raises RecursionError, which no value check
    expects) after five good steps: the file stops at that record, the steps before it stay."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    from tb_parity_plugin.records import metadata, writer

    root = str(tmp_path)
    fx.write_pair(root, "p", 5)
    nested = np.array(b"[" * 100_000 + b"]" * 100_000, dtype=object)
    value = writer._tensor_value(metadata.RUN_INFO_TAG, nested, "run_info", "")
    with open(event_path(root, "p/tf2"), "ab") as f:
        f.write(
            event_file.frame_record(
                event_pb2.Event(step=0, summary=summary_pb2.Summary(value=[value])).SerializeToString()
            )
        )
    with LogdirReader(root, finished=True) as reader:
        reader.reload()
        run = reader.run("p/tf2")
        assert list(run.steps) == list(range(5)) and run.info.get("side") == "tf2"
        (problem,) = reader.problems
        assert problem.path.startswith("p/tf2") and "RecursionError" in problem.message


def _rewrite_stats(path: str, step: int, column: int, value: float) -> int:
    """Set ``column`` of every stats row of ``step`` to ``value``, keeping the CRCs valid; the record's offset."""
    from tensorboard.compat.proto import event_pb2

    data = open(path, "rb").read()
    for start, length in records(data):
        event = event_pb2.Event.FromString(data[start + 12 : start + 12 + length])
        stats = [v for v in event.summary.value if "/stats/" in v.tag]
        if event.step == step and stats:
            rows = np.frombuffer(stats[0].tensor.tensor_content, np.float64).reshape(-1, 14).copy()
            rows[:, column] = value
            stats[0].tensor.tensor_content = rows.tobytes()
            framed = event_file.frame_record(event.SerializeToString())
            open(path, "wb").write(data[:start] + framed + data[start + 16 + length :])
            return start
    raise AssertionError(f"no stats record at step {step}")


@pytest.mark.parametrize(("field", "value"), [("dtype", np.nan), ("rank", np.nan), ("size", np.inf), ("nan", np.nan)])
def test_crc_valid_nonsense_statistics_are_a_problem_not_a_verdict(
    pristine: str, tmp_path: Any, field: str, value: float, capsys: Any
) -> None:
    """A NaN dtype was judged a "dtype" divergence at its step, a NaN count a "nonfinite" one, a
    NaN size crashed the comparison: now the step is left out and named, and the verdict is the
    true one (step 30)."""
    from tb_parity_plugin.records import metadata

    root = str(tmp_path / "logs")
    shutil.copytree(pristine, root)
    offset = _rewrite_stats(event_path(root, "pair/tf2"), 3, metadata.STAT_INDEX[field], value)
    with LogdirReader(root, finished=True) as reader:
        run = reader.run("pair/tf2")
        assert 3 not in run.steps.tolist() and len(run.steps) == 39
        (problem,) = reader.problems
        assert problem.offset == offset and "step 3" in problem.message
    assert cli.main(["diff", root, "--baseline", "pair/tf1", "--candidate", "pair/tf2"]) == 1
    out = capsys.readouterr().out
    assert "DIVERGE at step 30" in out and "read problem" in out


# -- CRC-valid nonsense in every field the reader parses ------------------------------------------


def field_mutations(event: Any) -> list[tuple[str, Any]]:
    """(name, mutate(event)) for nonsense in each field of ``event`` the reader parses."""
    out: list[tuple[str, Any]] = [("step=-1", lambda e: setattr(e, "step", -1))]
    for i, v in enumerate(event.summary.value):

        def value(e: Any, i: int = i) -> Any:
            return e.summary.value[i]

        out += [
            (f"v{i}.tag", lambda e, value=value: setattr(value(e), "tag", "tb_parity/stats/ffffffffffff")),
            (f"v{i}.removed", lambda e, i=i: e.summary.value.__delitem__(i)),
        ]
        if v.HasField("metadata"):
            data = lambda e, value=value: value(e).metadata.plugin_data  # noqa: E731
            out += [
                (f"v{i}.plugin_name", lambda e, data=data: setattr(data(e), "plugin_name", "tb_parihy")),
                (f"v{i}.content", lambda e, data=data: setattr(data(e), "content", b"{garbage")),
                (f"v{i}.version", lambda e, data=data: setattr(data(e), "content", b'{"version": 999}')),
            ]
        if v.HasField("tensor"):
            tensor = lambda e, value=value: value(e).tensor  # noqa: E731
            out += [
                (f"v{i}.dtype", lambda e, tensor=tensor: setattr(tensor(e), "dtype", 99)),
                (f"v{i}.dtype_int", lambda e, tensor=tensor: setattr(tensor(e), "dtype", 3)),
                (f"v{i}.extra_dim", lambda e, tensor=tensor: tensor(e).tensor_shape.dim.add(size=2)),
            ]
            for j in range(len(v.tensor.tensor_shape.dim)):
                dim = lambda e, tensor=tensor, j=j: tensor(e).tensor_shape.dim[j]  # noqa: E731
                out += [
                    (f"v{i}.dim{j}=-1", lambda e, dim=dim: setattr(dim(e), "size", -1)),
                    (f"v{i}.dim{j}=2**40", lambda e, dim=dim: setattr(dim(e), "size", 2**40)),
                ]
            if v.tensor.tensor_content:
                out += [
                    (
                        f"v{i}.content_short",
                        lambda e, t=tensor: setattr(t(e), "tensor_content", t(e).tensor_content[:-8]),
                    ),
                    (
                        f"v{i}.content_ff",
                        lambda e, t=tensor: setattr(t(e), "tensor_content", b"\xff" * len(t(e).tensor_content)),
                    ),
                ]
            if v.tensor.string_val:
                out += [
                    (f"v{i}.json_garbage", lambda e, t=tensor: t(e).string_val.__setitem__(0, b"\xff{not json")),
                    (f"v{i}.json_list", lambda e, t=tensor: t(e).string_val.__setitem__(0, b"[]")),
                    (f"v{i}.json_cut", lambda e, t=tensor: t(e).string_val.__setitem__(0, t(e).string_val[0][:9])),
                ]
    return out


RECORDS = {"run_info": 1, "step 0 (with the layout)": 2, "step 3": 5, "step 31": 33}


def test_crc_valid_nonsense_in_any_parsed_field_is_never_silent(pristine: str, tmp_path: Any, capsys: Any) -> None:
    """Nonsense in each field (step, tag, plugin name and content, dtype, dims, tensor bytes, layout
    and run_info JSON) of the run_info record, the first step (layout), an early and a late step,
    both CRCs valid, one case at a time: the reader never raises, keeps every record before it, and
    the CLI never says AGREE; a lost step is always visible (a read problem, a step logged by one
    run only, or an error naming the cause)."""
    import json

    from tensorboard.compat.proto import event_pb2

    data = open(event_path(pristine, "pair/tf2"), "rb").read()
    with LogdirReader(pristine) as clean:
        whole = clean.run("pair/tf2")
    cases = 0
    for where, index in RECORDS.items():
        start, length = records(data)[index]
        pristine_event = event_pb2.Event.FromString(data[start + 12 : start + 12 + length])
        for name, mutate in field_mutations(pristine_event):
            case = f"{where}: {name}"
            event = event_pb2.Event()
            event.CopyFrom(pristine_event)
            mutate(event)
            root = str(tmp_path / f"case{cases}")
            shutil.copytree(pristine, root)
            framed = event_file.frame_record(event.SerializeToString())
            open(event_path(root, "pair/tf2"), "wb").write(data[:start] + framed + data[start + 16 + length :])
            with LogdirReader(root, finished=True) as reader:
                got = reader.run("pair/tf2")
            before = [s for (st, n), s in zip(records(data)[2:], whole.steps) if st + 16 + n <= start]
            assert set(before) <= set(got.steps.tolist()), case
            code = cli.main(["diff", root, "--baseline", "pair/tf1", "--candidate", "pair/tf2", "--json"])
            out, err = capsys.readouterr()
            assert code in (1, 2, 3) and "Traceback" not in err, (case, code, err)
            if code == 2:
                assert "holds no tb_parity records" in err and ("problem" in err or "no records of ours" in err), (
                    case,
                    err,
                )
            else:
                report = json.loads(out)
                lost = set(whole.steps.tolist()) - set(got.steps.tolist())
                assert not lost or report["problems"] or report["steps_only"]["pair/tf1"], (case, sorted(lost))
            shutil.rmtree(root)
            cases += 1
    assert cases > 60
