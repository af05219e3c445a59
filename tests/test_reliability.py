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
import subprocess
import sys
import threading
from typing import Any, Callable
from urllib.parse import quote

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
