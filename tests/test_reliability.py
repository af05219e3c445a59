"""Hostile input cannot freeze, crash or fool the server or the CLI (issue 11).

Patterns go through RE2 (engine/patterns.py): a pattern with catastrophic backtracking in
Python's ``re`` must answer at once, and every bad pattern or replacement is a 400 with a JSON
message on the routes and exit 2 with one line naming the parameter in the CLI. A request that
would hang is caught by running it on a thread with a generous join timeout (a hang, not a
speed, is what fails here).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import threading
from typing import Any, Callable
from urllib.parse import quote

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import plugin_fixtures as fx
from test_plugin_routes import make_client

from tb_parity_plugin import cli

HANG_GUARD_S = 60  # Python's re needs minutes for the hostile patterns below on these tags
ROUTES = ("summary", "matrix", "tensor", "scalars")
HOSTILE = ("re:(.*.*)*X", "re:(a|aa)*b", "re:(x+x+)+y")


def finishes(fn: Callable[[], Any]) -> Any:
    """``fn()``'s result; fails the test if it has not returned after HANG_GUARD_S."""
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("v", fn()), daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "the call hung"
    return out.get("v")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("hostile"))
    # a long tag: exponential backtracking on it would take far longer than the guard
    fx.write_pair(root, "pair", 6, diverge_at=3, extra_name="model/encoder/layer_with_a_long_name/dense/kernel")
    return root


@pytest.fixture(scope="module")
def client(logdir: str) -> Any:
    return make_client(logdir)


def route(name: str, param: str, value: str) -> str:
    extra = "&tensor=weight/model/encoder/layer_with_a_long_name/dense/kernel" if name == "tensor" else ""
    return f"/data/plugin/tb_parity/{name}?baseline=pair/tf1&candidate=pair/tf2&{param}={quote(value, safe='')}{extra}"


@pytest.mark.parametrize("name", ROUTES)
@pytest.mark.parametrize("pattern", HOSTILE)
def test_a_backtracking_pattern_answers_at_once(client: Any, name: str, pattern: str) -> None:
    for param, value in (
        ("override", f"{pattern}:rtol=0.1"),
        ("mapping", f"{pattern}=y"),
        ("allow_unmatched", pattern),
    ):
        response = finishes(lambda param=param, value=value: client.get(route(name, param, value)))
        assert response.status_code == 200, response.get_data()


@pytest.mark.parametrize("name", ROUTES)
@pytest.mark.parametrize(
    ("param", "value", "words"),
    [
        ("mapping", r"re:(dense)=\g<x>", "group 'x'"),
        ("mapping", r"re:(dense)=\9", "group 9"),
        ("mapping", "re:(?<=a)b=c", "bad regex"),
        ("mapping", "re:a{1001}=b", "bad regex"),
        ("override", r"re:(a)\1:rtol=0.1", "bad regex"),
        ("allow_unmatched", "re:(", "bad regex"),
        ("override", "re:" + "a" * 2000 + ":rtol=0.1", "longer than"),
    ],
)
def test_a_bad_pattern_or_substitution_is_a_400_naming_the_parameter(
    client: Any, name: str, param: str, value: str, words: str
) -> None:
    response = finishes(lambda: client.get(route(name, param, value)))
    assert response.status_code == 400, response.get_data()[:300]
    message = json.loads(response.get_data())["error"]
    assert words in message and param.split("_")[0] in message


def test_an_overflowing_repetition_is_no_500(client: Any) -> None:
    """``a{99999999999}`` raised OverflowError in Python's re (a 500); RE2 reads it as a literal."""
    for name in ROUTES:
        response = finishes(lambda name=name: client.get(route(name, "mapping", "re:a{99999999999}=b")))
        assert response.status_code in (200, 400), response.get_data()[:300]


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--map", r"re:(dense)=\g<x>", "group 'x'"),
        ("--override", "re:(.*.*)*X:rtol=x", "rtol must be a number"),
        ("--allow-unmatched", "re:(", "bad regex"),
    ],
)
def test_the_cli_says_one_line_and_exits_2(logdir: str, flag: str, value: str, words: str, capsys: Any) -> None:
    code = finishes(lambda: cli.main(["diff", os.path.join(logdir, "pair"), flag, value]))
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_the_cli_with_a_hostile_pattern_finishes(logdir: str, capsys: Any) -> None:
    code = finishes(lambda: cli.main(["diff", os.path.join(logdir, "pair"), "--override", "re:(.*.*)*X:rtol=0.1"]))
    assert code == 1  # the planted divergence, found as usual


def test_writing_into_a_closed_pipe_ends_quietly(logdir: str) -> None:
    """``tb-parity diff ... | head -1``: no BrokenPipeError traceback."""
    proc = subprocess.run(
        f"{sys.executable} -m tb_parity_plugin.cli diff {os.path.join(logdir, 'pair')} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("baseline")


# -- the served view follows the files (section 3) -----------------------------------------------


def _file(root: str, run: str) -> str:
    (path,) = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, run)) for f in fs if "tfevents" in f]
    return path


def _other_pair(tmp: str, steps: int, diverge_at: Any = None) -> str:
    fx.write_pair(tmp, "other", steps, diverge_at=diverge_at)
    return tmp


@pytest.mark.parametrize(
    "change", ["replaced_same_name", "replaced_new_name", "rewritten_same_size", "rewritten_shorter", "run_deleted"]
)
def test_the_reader_follows_a_changed_file(tmp_path: Any, change: str) -> None:
    from tb_parity_plugin.logdir.reader import LogdirReader

    root = str(tmp_path / "logs")
    fx.write_pair(root, "pair", 8)
    reader = LogdirReader(root)
    reader.reload()
    assert list(reader.run("pair/tf2").steps) == list(range(8))
    path = _file(root, "pair/tf2")
    other = _file(_other_pair(str(tmp_path / "src"), 5, diverge_at=1), "other/tf2")
    data = open(other, "rb").read()
    if change == "replaced_same_name":
        os.replace(other, path)
    elif change == "replaced_new_name":
        os.remove(path)
        shutil.copy(other, path + ".new")
    elif change == "rewritten_same_size":  # in place, same inode: a copy of itself with other values
        original = open(path, "rb").read()
        fx.write_pair(str(tmp_path / "same"), "pair", 8, diverge_at=0)
        replacement = open(_file(str(tmp_path / "same"), "pair/tf2"), "rb").read()
        assert len(replacement) == len(original) and replacement != original
        with open(path, "r+b") as f:
            f.write(replacement)
    elif change == "rewritten_shorter":
        with open(path, "r+b") as f:
            f.write(data)
            f.truncate(len(data))
    else:
        shutil.rmtree(os.path.join(root, "pair", "tf2"))
    reader.reload()
    if change == "run_deleted":
        assert "pair/tf2" not in reader.run_names()
        with pytest.raises(KeyError):
            reader.run("pair/tf2")
        return
    steps = list(reader.run("pair/tf2").steps)
    expected = list(range(8)) if change == "rewritten_same_size" else list(range(5))
    assert steps == expected
    with LogdirReader(os.path.dirname(os.path.dirname(path))) as fresh:  # what a new reader sees
        new, old = fresh.run("tf2").tensors, reader.run("pair/tf2").tensors
        assert new.keys() == old.keys()
        for key in new:
            np.testing.assert_array_equal(old[key].stats, new[key].stats)
    reader.close()


def test_a_logdir_deleted_and_recreated_serves_only_the_new_files(tmp_path: Any) -> None:
    from tb_parity_plugin.logdir.reader import LogdirReader

    root = str(tmp_path / "logs")
    fx.write_pair(root, "pair", 8)
    reader = LogdirReader(root)
    reader.reload()
    shutil.rmtree(root)
    with pytest.raises(FileNotFoundError):
        reader.reload()
    assert reader.run_names() == []  # nothing served from files that are gone
    fx.write_pair(root, "pair", 3, diverge_at=1)
    reader.reload()
    assert list(reader.run("pair/tf2").steps) == [0, 1, 2]


def test_a_real_server_follows_a_deleted_run_and_a_recreated_logdir(tmp_path: Any) -> None:
    """A real ``tensorboard`` process: a deleted run answers 404, a re-created pair its new verdict."""
    import shutil as sh
    import socket
    import time
    import urllib.error
    import urllib.request

    from tb_parity_plugin import api

    root = str(tmp_path / "logs")
    fx.write_pair(root, "pair", 8)
    fx.write_pair(root, "gone", 4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tensorboard = sh.which("tensorboard", path=os.path.dirname(sys.executable)) or "tensorboard"
    log = open(tmp_path / "tb.log", "w")
    proc = subprocess.Popen(
        [tensorboard, "--logdir", root, "--host", "127.0.0.1", "--port", str(port), "--reload_interval=1"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}/data/plugin/tb_parity/"

    def get(route: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(base + route, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except urllib.error.URLError:  # not listening yet
            return 0, {}

    def until(check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 120
        while not check():
            assert time.monotonic() < deadline and proc.poll() is None, open(log.name).read()[-2000:]
            time.sleep(0.5)

    try:
        until(lambda: len(get("runs")[1].get("runs", [])) == 4)
        assert get("summary?baseline=pair/tf1&candidate=pair/tf2")[1]["verdict"] == "agree"
        shutil.rmtree(os.path.join(root, "gone"))
        until(lambda: get("summary?baseline=gone/tf1&candidate=gone/tf2")[0] == 404)
        shutil.rmtree(root)
        fx.write_pair(root, "pair", 6, diverge_at=2)
        expected = api.compare(os.path.join(root, "pair")).first_divergence
        assert expected is not None
        until(
            lambda: (
                (get("summary?baseline=pair/tf1&candidate=pair/tf2")[1].get("first_divergence") or {}).get("step") == 2
            )
        )
        status, summary = get("summary?baseline=pair/tf1&candidate=pair/tf2")
        assert summary["steps_compared"] == 6 and summary["first_divergence"]["tensor"] == expected.tensor
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


# -- one bad file does not take down the others (section 2) ---------------------------------------


def _bad_utf8(payload: bytes) -> bytes:
    """A CRC-valid record of ``payload`` with one of our tags made invalid UTF-8."""
    from tb_parity_plugin.records import event_file

    raw = bytearray(payload)
    raw[raw.index(b"tb_parity/stats/") + 3] = 0xFF
    return event_file.frame_record(bytes(raw))


def _corrupt_our_tag(path: str, step: int, append: bool = False) -> None:
    """Make one of our tags in the event of ``step`` invalid UTF-8 (in place, or appended as a
    new record), keeping every CRC valid."""
    from tensorboard.compat.proto import event_pb2

    data = open(path, "rb").read()
    out, pos = bytearray(), 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        payload = data[pos + 12 : pos + 12 + length]
        ours = event_pb2.Event.FromString(payload).step == step and b"tb_parity/stats/" in payload
        out += _bad_utf8(payload) if ours and not append else data[pos : pos + 16 + length]
        if ours and append:
            with open(path, "ab") as f:
                f.write(_bad_utf8(payload))
            return
        pos += 16 + length
    open(path, "wb").write(bytes(out))


def _client(logdir: str) -> Any:
    """The plugin behind TensorBoard's WSGI app; TensorBoard's own loaders are not run here
    (they raise on the bad UTF-8 below, which a real server logs on its reload thread)."""
    import argparse

    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug import test as werkzeug_test
    from werkzeug import wrappers

    from tb_parity_plugin.dashboard.plugin import ParityPlugin

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    context = base_plugin.TBContext(
        logdir=logdir, data_provider=provider, multiplexer=multiplexer, flags=argparse.Namespace(reload_interval=0.2)
    )
    app = application.TensorBoardWSGI([ParityPlugin(context)], data_provider=provider)
    return werkzeug_test.Client(app, wrappers.Response)


@pytest.mark.parametrize("step", [0, 3])
def test_a_crc_valid_record_with_a_non_utf8_tag_stays_in_its_file(tmp_path: Any, step: int, capsys: Any) -> None:
    root = str(tmp_path)
    fx.write_pair(root, "bad", 6)
    fx.write_pair(root, "good", 6, diverge_at=2)
    _corrupt_our_tag(_file(root, "bad/tf2"), step)
    client = _client(root)
    runs = client.get("/data/plugin/tb_parity/runs")
    assert runs.status_code == 200 and len(json.loads(runs.get_data())["runs"]) == 4
    good = json.loads(client.get("/data/plugin/tb_parity/summary?baseline=good/tf1&candidate=good/tf2").get_data())
    assert good["first_divergence"]["step"] == 2 and not good["problems"]
    bad = json.loads(client.get("/data/plugin/tb_parity/summary?baseline=bad/tf1&candidate=bad/tf2").get_data())
    assert bad["problems"] and bad["problems"][0]["run"] == "bad/tf2" and bad["verdict"] != "agree"
    assert cli.main(["diff", root, "--baseline", "good/tf1", "--candidate", "good/tf2"]) == 1  # a healthy sibling
    capsys.readouterr()


def test_a_bad_record_appearing_later_stops_only_its_file(tmp_path: Any) -> None:
    from tb_parity_plugin.logdir.reader import LogdirReader

    root = str(tmp_path)
    fx.write_pair(root, "bad", 4)
    fx.write_pair(root, "good", 4)
    reader = LogdirReader(root)
    reader.reload()
    path = _file(root, "bad/tf2")
    _corrupt_our_tag(path, 2, append=True)  # a bad record appended to a run already read
    fx.append_steps(os.path.join(root, "bad", "tf2"), "tf2", 4, 8)  # then a second, healthy file
    fx.append_steps(os.path.join(root, "good", "tf2"), "tf2", 4, 8)
    reader.reload()
    assert list(reader.run("good/tf2").steps) == list(range(8))  # read on, elsewhere
    bad = reader.run("bad/tf2")
    assert bad.problems and bad.problems[0].path == os.path.relpath(path, root)
    assert list(bad.steps) == list(range(8))  # before the bad record, and the next file


def test_one_mangled_values_record_leaves_out_its_step_only(tmp_path: Any) -> None:
    from tb_parity_plugin.logdir.reader import LogdirReader
    from tb_parity_plugin.records.writer import BlockWriter

    root = str(tmp_path)
    for side in ("tf1", "tf2"):
        w = BlockWriter(os.path.join(root, side), side=side)
        for step in range(6):
            layout = w.write_arrays(step, fx.step_tensors(step, None, side)) if step != 3 or side == "tf1" else None
            if layout is None:  # step 3 of tf2: statistics fine, values block of the wrong length
                arrays = fx.step_tensors(step, None, side)
                good = BlockWriter.__new__(BlockWriter)  # only to build the layout and stats the same way
                from tb_parity_plugin.records import health
                from tb_parity_plugin.records.writer import build_layout

                layout = build_layout([(k, n, np.asarray(a).dtype.name, np.shape(a)) for k, n, a in arrays])
                stats = np.stack([health.health_numpy(np.asarray(a)) for _, _, a in arrays])
                w.write_step(step, layout, stats, {"float32": np.zeros(3, np.float32)})
                del good
        w.close()
    with LogdirReader(root, finished=True) as reader:
        run = reader.run("tf2")
        weight = run.tensors[("weight", "dense/kernel")]
        assert weight.values is not None and list(weight.steps) == [0, 1, 2, 4, 5]  # the others keep values
        assert any("left out" in p.message and "first 3" in p.message for p in run.problems)


# -- the CLI reads only what it compares (section 5) and a live writer (section 6) ------------------


def test_naming_both_runs_reads_only_them(tmp_path: Any) -> None:
    from tb_parity_plugin import api

    root = str(tmp_path)
    fx.write_pair(root, "small", 4, diverge_at=2)
    fx.write_pair(root, "large", 200)
    seen: dict[str, Any] = {}

    def reload(reader: Any) -> None:
        reader.reload()
        seen["runs"], seen["bytes"] = reader.run_names(), reader.bytes_read

    report = api.compare(root, "small/tf1", "small/tf2", reload=reload)
    assert report.first_divergence is not None and report.first_divergence.step == 2
    assert seen["runs"] == ["small/tf1", "small/tf2"]
    small = sum(os.path.getsize(_file(root, r)) for r in ("small/tf1", "small/tf2"))
    assert seen["bytes"] <= small  # not a byte of the large pair


def test_a_live_writer_ends_with_the_offline_verdict(tmp_path: Any) -> None:
    """A writer appends steps (in chunks, flushed mid-record at times) while the plugin serves;
    once it stops, the served verdict equals the CLI's on the finished files."""
    import time

    from tb_parity_plugin import api

    root = str(tmp_path)
    client = _client(root)
    route = "/data/plugin/tb_parity/summary?baseline=live/tf1&candidate=live/tf2"

    def observe() -> Any:
        response = client.get(route)
        return json.loads(response.get_data())["steps_compared"] if response.status_code == 200 else None

    served = fx.write_live(os.path.join(root, "live"), observe)
    expected = api.compare(os.path.join(root, "live")).to_dict()
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        final = json.loads(client.get(route).get_data())
        if final["steps_compared"] == expected["steps_compared"] or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert served == sorted(served)  # the view only grew
    for key in ("first_divergence", "steps_compared", "tensors_compared", "verdict", "problems"):
        assert final[key] == expected[key], key


def test_an_empty_or_garbage_run_names_its_cause(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path)
    fx.write_pair(root, "pair", 3)
    with open(_file(root, "pair/tf2"), "wb") as f:
        f.write(os.urandom(4096))  # garbage: the first record header fails its CRC
    assert cli.main(["diff", os.path.join(root, "pair")]) == 2
    err = capsys.readouterr().err
    assert "holds no tb_parity records" in err and "CRC" in err  # the cause, not just the symptom
    os.makedirs(os.path.join(root, "other", "tf1"))
    open(os.path.join(root, "other", "tf1", "events.out.tfevents.0.x"), "wb").close()
    fx.write_pair(root, "other2", 2)
    assert cli.main(["diff", root, "--baseline", "other/tf1", "--candidate", "other2/tf2"]) == 2
    err = capsys.readouterr().err
    assert "holds no tb_parity records" in err and "hold no records of ours" in err


def test_a_run_created_again_never_reuses_a_generation(tmp_path: Any) -> None:
    """Caches key comparisons by generation: a run deleted and written again must not come back
    with the generation its deleted files had (it did, and the dashboard kept the old verdict)."""
    from tb_parity_plugin.logdir.reader import LogdirReader

    root = str(tmp_path)
    fx.write_pair(root, "pair", 8)
    with LogdirReader(root) as reader:
        seen = {reader.run("pair/tf2").generation}
        for diverge_at in (2, 3):
            shutil.rmtree(os.path.join(root, "pair"))
            reader.reload()
            fx.write_pair(root, "pair", 8, diverge_at=diverge_at)
            reader.reload()
            generation = reader.run("pair/tf2").generation
            assert generation > max(seen)
            seen.add(generation)


def test_an_ambiguous_logdir_is_refused_before_any_file_is_read(tmp_path: Any, capsys: Any) -> None:
    """Without both names, a logdir of four runs cannot be compared: that is known from the listing,
    so the big pair beside the small one is never read (it was, in full, before the error)."""
    from tb_parity_plugin import api

    root = str(tmp_path)
    fx.write_pair(root, "small", 4)
    fx.write_pair(root, "large", 200)
    reads: list[int] = []

    def reload(reader: Any) -> None:
        reader.reload()
        reads.append(reader.bytes_read)

    for names in ((None, None), ("small/tf1", None), (None, "small/tf2")):
        with pytest.raises(api.ParityInputError, match="holds 4 runs") as raised:
            api.compare(root, *names, reload=reload)
        assert "baseline= and candidate= in Python" in str(raised.value)  # not only the CLI's flags
    assert reads == []
    assert cli.main(["diff", root, "--baseline", "small/tf1"]) == 2
    assert "pass both --baseline and --candidate" in capsys.readouterr().err
    assert api.compare(os.path.join(root, "small"), "tf1", reload=reload).agree  # one name, two runs: read
    assert reads and reads[0] > 0
