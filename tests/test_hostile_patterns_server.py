"""Issue 11 section 1 against a real ``tensorboard`` process: one request must not freeze the server.

A backtracking pattern only shows its harm in the real server, whose routes, reload thread and
other users share one interpreter; the WSGI-client tests (test_reliability.py) cannot see
another user waiting. One server for the module (starting TensorBoard is the slow part).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import plugin_fixtures as fx
from tensorboard_process import get, tensorboard, wait_for

#: Quadratic-or-worse under a backtracking engine: a 15-character tag took 7 s, ours are longer.
EVIL = "(.*.*)*X"
PAIR_ROUTES = ("summary", "matrix", "tensor", "scalars")


def pair(folder: str, **params: Any) -> dict[str, Any]:
    return {"baseline": f"{folder}/tf1", "candidate": f"{folder}/tf2", **params}


def route_params(route: str, folder: str, **params: Any) -> dict[str, Any]:
    extra = {"tensor": "weight/dense/kernel"} if route == "tensor" else {}
    return pair(folder, **extra, **params)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("served") / "logs")
    fx.write_pair(root, "good", 12, diverge_at=6, drift=1.0)
    return root


@pytest.fixture(scope="module")
def server(logdir: str) -> Iterator[str]:
    with tensorboard(logdir) as base:
        yield base


# -- 1. one request must not freeze the server ----------------------------------------
def test_backtracking_patterns_answer_and_leave_the_server_free(server: str) -> None:
    hostile = [
        {"override": f"re:{EVIL}:atol=1"},
        {"mapping": f"re:{EVIL}=y"},
        {"allow_unmatched": f"re:{EVIL}"},
        {"override": "*" * 200 + "X:atol=1"},  # a glob is matched by the same engine
    ]
    answers: list[tuple[int, Any]] = []

    def hammer() -> None:
        for params in hostile:
            for route in PAIR_ROUTES:
                answers.append(get(server, route, **route_params(route, "good", **params)))

    worker = threading.Thread(target=hammer)
    worker.start()
    status, body = get(server, "runs")  # another user, meanwhile
    worker.join()
    assert status == 200 and "good/tf1" in {r["name"] for r in body["runs"]}
    assert [s for s, _ in answers] == [200] * len(hostile) * len(PAIR_ROUTES), answers
    summaries = [body for _, body in answers[:: len(PAIR_ROUTES)]]
    assert all(b["first_divergence"]["step"] == 6 for b in summaries)  # the patterns matched nothing


@pytest.mark.parametrize(
    "params",
    [
        {"mapping": r"re:(dense)=\g<x>"},  # IndexError under re
        {"mapping": r"re:(dense)=\2"},
        {"mapping": "re:(?=x)=y"},  # a lookahead: not RE2
        {"override": "re:(?<=a)b:atol=1"},
        {"allow_unmatched": "re:(unclosed"},
        {"override": "re:" + "a" * 5000 + ":atol=1"},
        {"override": "re:((((((((((a{1000}){1000}){1000}){1000})))))):atol=1"},  # beyond RE2's memory bound
    ],
)
def test_bad_pattern_or_substitution_is_400_json_on_every_pair_route(server: str, params: dict[str, str]) -> None:
    for route in PAIR_ROUTES:
        status, body = get(server, route, **route_params(route, "good", **params))
        assert status == 400, (route, params, body)
        assert isinstance(body.get("error"), str) and body["error"], body


def test_huge_repeat_count_is_not_a_500(server: str) -> None:
    """``a{99999999999}``: OverflowError under ``re``; RE2 reads the braces as literal text."""
    for route in PAIR_ROUTES:
        status, body = get(server, route, **route_params(route, "good", mapping="re:a{99999999999}=b"))
        assert status == 200, (route, body)
        status, _ = get(server, route, **route_params(route, "good", override="re:a{99999999999}:atol=1"))
        assert status == 200


def test_runs_still_answers_after_the_hostile_requests(server: str) -> None:
    assert wait_for(lambda: get(server, "runs")[0] == 200, "the runs route")
