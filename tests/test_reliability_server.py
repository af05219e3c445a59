"""Issue 11 sections 2-4 and 6 against a real ``tensorboard`` process: a shared server's view of
damaged and changing files.

One server (module scope) serves a logdir holding a healthy pair, a pair with a CRC-valid but
non-UTF-8 record from the start, and a pair with a bit flip mid-file; the tests then add a bad
record and a new pair, delete and re-create a run, and run a live writer while it serves. The
hostile-pattern cases against a real server are in test_hostile_patterns_server.py.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any, Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import plugin_fixtures as fx
from tensorboard_process import get, tensorboard, wait_for
from test_reliability import _corrupt_our_tag, _file

from tb_parity_plugin import api


def _flip_a_bit_mid_file(path: str) -> None:
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10  # inside a step record: its data CRC fails
    open(path, "wb").write(bytes(data))


def summary(base: str, folder: str) -> tuple[int, Any]:
    return get(base, "summary", baseline=f"{folder}/tf1", candidate=f"{folder}/tf2")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("served") / "logs")
    fx.write_pair(root, "good", 8, diverge_at=2)
    fx.write_pair(root, "bad_utf8", 6)
    _corrupt_our_tag(_file(root, "bad_utf8/tf2"), 0)  # a non-UTF-8 tag in the first step, there at start-up
    fx.write_pair(root, "flipped", 40, diverge_at=30)
    _flip_a_bit_mid_file(_file(root, "flipped/tf2"))
    return root


@pytest.fixture(scope="module")
def server(logdir: str) -> Iterator[str]:
    with tensorboard(logdir) as base:
        wait_for(lambda: len(get(base, "runs")[1].get("runs", [])) == 6, "the six runs")
        yield base


def test_a_bad_file_at_start_up_leaves_every_other_run_served(server: str) -> None:
    status, runs = get(server, "runs")
    assert status == 200 and {r["name"] for r in runs["runs"]} >= {"good/tf1", "good/tf2", "bad_utf8/tf1"}
    status, good = summary(server, "good")
    assert status == 200 and good["first_divergence"]["step"] == 2 and not good["problems"]
    status, bad = summary(server, "bad_utf8")
    assert status == 200 and bad["problems"] and {p["run"] for p in bad["problems"]} == {"bad_utf8/tf2"}
    assert bad["verdict"] != "agree"


def test_a_damaged_verdict_shows_its_problems_beside_it(server: str, logdir: str) -> None:
    """The bit flip loses steps 20..39 of the candidate: the truth (diverge at 30) is among them,
    so what is left must not read as an agreement, and the problem travels with the verdict."""
    status, body = summary(server, "flipped")
    assert status == 200 and body["problems"] and body["problems"][0]["run"] == "flipped/tf2"
    assert "CRC" in body["problems"][0]["message"] and body["verdict"] == "incomplete" and not body["agree"]
    expected = api.compare(logdir, "flipped/tf1", "flipped/tf2").to_dict()
    for key in ("verdict", "problems", "steps_compared", "first_divergence"):
        assert body[key] == expected[key], key


def test_a_bad_record_appearing_later_does_not_stop_the_logdir(server: str, logdir: str) -> None:
    fx.write_pair(logdir, "later", 4)
    wait_for(lambda: summary(server, "later")[0] == 200, "the pair 'later'")
    _corrupt_our_tag(_file(logdir, "later/tf2"), 2, append=True)  # a bad record appended to a served run
    fx.write_pair(logdir, "fresh", 5, diverge_at=3)  # then a new pair elsewhere in the logdir
    wait_for(lambda: (summary(server, "fresh")[1].get("first_divergence") or {}).get("step") == 3, "'fresh'")
    wait_for(lambda: summary(server, "later")[1].get("problems"), "the problem of 'later'")
    status, later = summary(server, "later")
    assert status == 200 and later["problems"][0]["run"] == "later/tf2" and later["steps_compared"] == 4


def test_a_run_deleted_and_created_again_is_judged_anew(server: str, logdir: str) -> None:
    """Same names, same number of steps, new content: the dashboard's cached comparison (keyed by
    the runs' generations) once kept serving the deleted files' verdict."""
    fx.write_pair(logdir, "again", 8)
    wait_for(lambda: summary(server, "again")[1].get("verdict") == "agree", "'again' read")
    shutil.rmtree(os.path.join(logdir, "again"))
    wait_for(lambda: summary(server, "again")[0] == 404, "'again' gone")
    fx.write_pair(logdir, "again", 8, diverge_at=2)
    wait_for(lambda: (summary(server, "again")[1].get("first_divergence") or {}).get("step") == 2, "the new verdict")


def test_a_live_writer_ends_with_the_offline_verdict(server: str, logdir: str) -> None:
    """Steps appended (and flushed mid-record at times) while the server reads: once the writer
    stops, the served summary is the CLI's on the finished files, and the view only ever grew."""

    def observe() -> Any:
        status, body = summary(server, "live")
        return body["steps_compared"] if status == 200 else None

    served = fx.write_live(os.path.join(logdir, "live"), observe, pause=0.5)
    expected = api.compare(logdir, "live/tf1", "live/tf2").to_dict()
    wait_for(lambda: summary(server, "live")[1].get("steps_compared") == expected["steps_compared"], "all steps")
    final = summary(server, "live")[1]
    assert served == sorted(served)
    for key in ("verdict", "first_divergence", "steps_compared", "tensors_compared", "problems"):
        assert final[key] == expected[key], key
