"""Issue 11 against a real ``tensorboard`` process: what a user of a shared server relies on.

One server (module scope, ``--reload_interval=1``) serves a logdir holding a healthy pair, a pair
with a CRC-valid but non-UTF-8 record from the start, and a pair with a bit flip mid-file; the
tests then add a bad record and a new pair, and a live writer, while it runs. The server is the
plugin as TensorBoard loads it (entry point, background reader, werkzeug's threaded server), so
nothing here is a stand-in. Waits poll with a generous deadline: a hang fails, a slow machine not.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterator
from urllib.parse import quote

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import plugin_fixtures as fx
from test_reliability import _corrupt_our_tag, _file

from tb_parity_plugin import api
from tb_parity_plugin.records.writer import BlockWriter

DEADLINE_S = 120
LONG = "model/encoder/layer_with_a_long_name/dense/kernel"  # backtracking on it would take hours


class Server:
    """A ``tensorboard --logdir`` subprocess and JSON GETs against its tb_parity routes."""

    def __init__(self, logdir: str, log_path: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        tensorboard = shutil.which("tensorboard", path=os.path.dirname(sys.executable)) or "tensorboard"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [tensorboard, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port), "--reload_interval=1"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.base = f"http://127.0.0.1:{port}/data/plugin/tb_parity/"

    def get(self, route: str) -> tuple[int, Any]:
        """(status, JSON body); status 0 while the server is not listening yet."""
        try:
            with urllib.request.urlopen(self.base + route, timeout=DEADLINE_S) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except urllib.error.URLError:
            return 0, {}

    def until(self, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not check():
            assert self.proc.poll() is None, open(self.log.name).read()[-2000:]
            assert time.monotonic() < deadline, open(self.log.name).read()[-2000:]
            time.sleep(0.3)

    def summary(self, folder: str, extra: str = "") -> tuple[int, Any]:
        return self.get(f"summary?baseline={folder}/tf1&candidate={folder}/tf2{extra}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a server stuck in a request (what these tests catch)
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.log.close()


def _flip_a_bit_mid_file(path: str) -> None:
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10  # inside a step record: its data CRC fails
    open(path, "wb").write(bytes(data))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = str(tmp_path_factory.mktemp("served"))
    fx.write_pair(root, "good", 8, diverge_at=2, extra_name=LONG)
    fx.write_pair(root, "bad_utf8", 6)
    _corrupt_our_tag(_file(root, "bad_utf8/tf2"), 0)  # a non-UTF-8 tag in the first step, there at start-up
    fx.write_pair(root, "flipped", 40, diverge_at=30)
    _flip_a_bit_mid_file(_file(root, "flipped/tf2"))
    srv = Server(root, str(tmp_path_factory.mktemp("log") / "tensorboard.log"))
    srv.root = root  # type: ignore[attr-defined]
    try:
        srv.until(lambda: len(srv.get("runs")[1].get("runs", [])) == 6)
        yield srv
    finally:
        srv.close()


def test_a_bad_file_at_start_up_leaves_every_other_run_served(server: Server) -> None:
    status, runs = server.get("runs")
    assert status == 200 and {r["name"] for r in runs["runs"]} >= {"good/tf1", "good/tf2", "bad_utf8/tf1"}
    status, good = server.summary("good")
    assert status == 200 and good["first_divergence"]["step"] == 2 and not good["problems"]
    status, bad = server.summary("bad_utf8")
    assert status == 200 and bad["problems"] and {p["run"] for p in bad["problems"]} == {"bad_utf8/tf2"}
    assert bad["verdict"] != "agree"


def test_a_damaged_verdict_shows_its_problems_beside_it(server: Server) -> None:
    """The bit flip loses steps 20..39 of the candidate: the truth (diverge at 30) is among them,
    so what is left must not read as an agreement, and the problem must travel with the verdict."""
    status, body = server.summary("flipped")
    assert status == 200 and body["problems"] and body["problems"][0]["run"] == "flipped/tf2"
    assert "CRC" in body["problems"][0]["message"] and body["verdict"] != "agree" and not body["agree"]
    root = server.root  # type: ignore[attr-defined]
    expected = api.compare(root, "flipped/tf1", "flipped/tf2").to_dict()
    for key in ("verdict", "problems", "steps_compared", "first_divergence"):
        assert body[key] == expected[key], key


@pytest.mark.parametrize(
    ("param", "value"),
    [("override", "re:(.*.*)*X:rtol=0.1"), ("mapping", "re:(.*.*)*X=y"), ("allow_unmatched", "re:(x+x+)+y")],
)
def test_a_backtracking_pattern_neither_hangs_its_request_nor_the_others(
    server: Server, param: str, value: str
) -> None:
    answers: dict[str, Any] = {}

    def hostile() -> None:
        answers["hostile"] = server.summary("good", f"&{param}={quote(value, safe='')}")

    thread = threading.Thread(target=hostile, daemon=True)
    thread.start()
    answers["runs"] = server.get("runs")  # another user, at the same time
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the request with the pattern hung"
    assert answers["runs"][0] == 200
    status, body = answers["hostile"]
    assert status == 200 and body["first_divergence"]["step"] == 2


@pytest.mark.parametrize(
    ("route", "param", "value", "words"),
    [
        ("summary", "mapping", r"re:(dense)=\g<x>", "group 'x'"),
        ("matrix", "mapping", r"re:(dense)=\9", "group 9"),
        ("tensor", "override", r"re:(a)\1:rtol=0.1", "bad regex"),
        ("scalars", "allow_unmatched", "re:(", "bad regex"),
    ],
)
def test_a_bad_pattern_or_substitution_is_a_json_400(
    server: Server, route: str, param: str, value: str, words: str
) -> None:
    extra = f"&tensor=weight/{LONG}" if route == "tensor" else ""
    status, body = server.get(f"{route}?baseline=good/tf1&candidate=good/tf2&{param}={quote(value, safe='')}{extra}")
    assert status == 400 and words in body["error"] and param.split("_")[0] in body["error"]
    status, body = server.get(f"{route}?baseline=good/tf1&candidate=good/tf2&mapping=re:a{{99999999999}}=b{extra}")
    assert status in (200, 400)  # never a 500


def test_a_bad_record_appearing_later_does_not_stop_the_logdir(server: Server) -> None:
    root = server.root  # type: ignore[attr-defined]
    fx.write_pair(root, "later", 4)
    server.until(lambda: server.summary("later")[0] == 200)
    _corrupt_our_tag(_file(root, "later/tf2"), 2, append=True)  # a bad record appended to a run being served
    fx.write_pair(root, "fresh", 5, diverge_at=3)  # then a new pair elsewhere in the logdir
    server.until(lambda: (server.summary("fresh")[1].get("first_divergence") or {}).get("step") == 3)
    server.until(lambda: bool(server.summary("later")[1].get("problems")))
    status, later = server.summary("later")
    assert status == 200 and later["problems"][0]["run"] == "later/tf2" and later["steps_compared"] == 4


def test_a_live_writer_ends_with_the_offline_verdict(server: Server) -> None:
    """Steps appended (and flushed mid-record at times) while the server reads: once the writer
    stops, the served summary is the CLI's on the finished files, and the view only ever grew."""
    root = server.root  # type: ignore[attr-defined]
    writers = {side: BlockWriter(os.path.join(root, "live", side), side=side) for side in ("tf1", "tf2")}
    served: list[int] = []
    for step in range(60):
        for side, w in writers.items():
            w.write_arrays(step, fx.step_tensors(step, 45, side))
            if step % 7 == 0:
                w._file._file.flush()  # type: ignore[union-attr]  # a partial flush, as a busy writer does
        if step % 10 == 9:
            status, body = server.summary("live")
            if status == 200:
                served.append(body["steps_compared"])
            time.sleep(0.5)
    for w in writers.values():
        w.close()
    expected = api.compare(root, "live/tf1", "live/tf2").to_dict()
    server.until(lambda: server.summary("live")[1].get("steps_compared") == expected["steps_compared"])
    final = server.summary("live")[1]
    assert served == sorted(served)
    for key in ("verdict", "first_divergence", "steps_compared", "tensors_compared", "problems"):
        assert final[key] == expected[key], key


def test_a_run_deleted_and_created_again_is_judged_anew(server: Server) -> None:
    """Same names, same number of steps, new content: the dashboard's cached comparison (keyed by
    the runs' generations) once kept serving the deleted files' verdict."""
    root = server.root  # type: ignore[attr-defined]
    fx.write_pair(root, "again", 8)
    server.until(lambda: server.summary("again")[1].get("verdict") == "agree")
    shutil.rmtree(os.path.join(root, "again"))
    server.until(lambda: server.summary("again")[0] == 404)
    fx.write_pair(root, "again", 8, diverge_at=2)
    server.until(lambda: (server.summary("again")[1].get("first_divergence") or {}).get("step") == 2)
