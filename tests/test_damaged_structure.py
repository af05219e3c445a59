"""A tensor missing from a damaged run is not a structure divergence (issue 11 section 4).

The records a run lost to corruption may have held the tensor, so its absence says nothing
about the port: the verdict is INCOMPLETE, naming the read problems, and the structure
report still lists the tensor. Accepting the problems makes it a divergence again; a tensor
missing from a run that read cleanly stays one whatever the other run's damage.
"""

from __future__ import annotations

import io
import json
import os
import sys
from typing import Any

import numpy as np
import pytest
from engine_helpers import write_run

from tb_parity_plugin import cli

sys.path.insert(0, os.path.dirname(__file__))
import plugin_fixtures as fx
from test_reliability import _client, _corrupt_our_tag  # _client: the plugin without TensorBoard's own loaders


def tensors(step: int, with_bias: bool = True) -> list[Any]:
    w = np.random.default_rng(step).standard_normal((3, 2)).astype(np.float32)
    out = [("weight", "dense/kernel", w), ("loss", "loss", np.float32(1.0 / (step + 1)))]
    return out + [("weight", "dense/bias", np.zeros(2, np.float32))] if with_bias else out


def diff(*argv: str) -> tuple[int, dict[str, Any]]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["diff", *argv, "--json"], stdout=out, stderr=err)
    assert err.getvalue() == "", err.getvalue()
    return code, json.loads(out.getvalue())


def truncate_tail(path: str) -> None:
    """A finished file ending mid-record: the last record's bytes lost (a read problem)."""
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)


@pytest.mark.parametrize("damaged", ["tf1", "tf2"])
def test_a_tensor_missing_from_a_damaged_run_makes_the_verdict_incomplete(tmp_path: Any, damaged: str) -> None:
    logdir = str(tmp_path)
    paths = {
        "tf1": write_run(logdir, "tf1", range(8), tensors, side="tf1"),
        "tf2": write_run(logdir, "tf2", range(8), lambda s: tensors(s, with_bias=False), side="tf2"),
    }
    truncate_tail(paths[damaged])
    code, report = diff(logdir)
    assert report["problems"] and {p["run"] for p in report["problems"]} == {damaged}
    assert report["structure"]["only_in"]["tf1"][0]["tag"] == "weight/dense/bias"  # listed either way
    if damaged == "tf2":  # the candidate may have lost dense/bias with its records
        assert (code, report["verdict"], report["first_divergence"]) == (cli.EXIT_INCOMPLETE, "incomplete", None)
        code, accepted = diff(logdir, "--accept-read-problems")
        assert (code, accepted["first_divergence"]["reason"]) == (cli.EXIT_DIVERGE, "structure")
    else:  # the candidate read cleanly and has no dense/bias: a divergence, damage or not
        assert (code, report["first_divergence"]["reason"]) == (cli.EXIT_DIVERGE, "structure")


def test_a_candidate_damaged_at_its_first_record_is_incomplete_on_the_dashboard(tmp_path: Any) -> None:
    """Seen: such a pair was DIVERGE "in structure" (every tensor recorded by the baseline only)."""
    logdir = str(tmp_path)
    fx.write_pair(logdir, "utf8", 6)
    (bad,) = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(logdir, "utf8", "tf2")) for f in fs]
    _corrupt_our_tag(bad, 0)  # a CRC-valid record with a tag that is not UTF-8: no step of tf2 read
    response = _client(logdir).get("/data/plugin/tb_parity/summary?baseline=utf8/tf1&candidate=utf8/tf2")
    body = json.loads(response.get_data())
    assert response.status_code == 200, body
    assert (body["verdict"], body["first_divergence"]) == ("incomplete", None)
    assert body["problems"] and body["problems"][0]["run"] == "utf8/tf2"
    assert body["structure"]["only_in"]["utf8/tf1"]  # still listed beside the verdict
