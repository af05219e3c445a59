"""The one run-pair rule set, and that the CLI, the API and the dashboard all apply it."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tb_parity_plugin import api, cli
from tb_parity_plugin.logdir.run_pairs import RunPairError, choose_pair, suggest_pairs
from tb_parity_plugin.records.writer import BlockWriter

CASES = [
    # sides, baseline, candidate -> pair or error text
    ({"a": "tf1", "b": "tf2"}, None, None, ("a", "b")),
    ({"a": "tf2", "b": "tf1"}, None, None, ("b", "a")),
    ({"a": "", "b": "tf2"}, None, None, ("a", "b")),
    ({"a": "", "b": ""}, None, None, "cannot tell"),
    ({"a": "tf1", "b": "tf2", "c": "tf2"}, None, None, "holds 3 runs"),
    ({"a": "tf1", "b": "tf2", "c": "tf2"}, "a", None, "pass both"),
    ({"a": "tf1", "b": "tf2"}, None, "a", ("b", "a")),
    ({"a": "tf1", "b": "tf2"}, "a", "a", "same run"),
    ({"a": "tf1", "b": "tf2"}, "a", "zzz", "no run 'zzz'"),
]


@pytest.mark.parametrize("sides, baseline, candidate, expected", CASES)
def test_choose_pair(sides, baseline, candidate, expected) -> None:
    if isinstance(expected, tuple):
        assert choose_pair(sides, baseline, candidate) == expected
    else:
        with pytest.raises(RunPairError, match=expected):
            choose_pair(sides, baseline, candidate)


def test_suggestions_follow_the_same_rules_per_folder() -> None:
    sides = {
        "p/x": "tf2",
        "p/y": "tf1",
        "q/only": "tf1",
        "r/a": "",
        "r/b": "",
        "s/a": "tf1",
        "s/b": "tf2",
        "s/c": "tf2",
    }
    assert suggest_pairs(sides) == [{"folder": "p", "baseline": "p/y", "candidate": "p/x"}]


def _write(logdir, name: str, side: str) -> None:
    w = BlockWriter(str(logdir / name), side=side)
    w.write_arrays(0, [("loss", "loss", np.float32(1.0))])
    w.close()


@pytest.mark.parametrize("sides, baseline, candidate, expected", CASES)
def test_cli_and_api_apply_the_rules(tmp_path, sides, baseline, candidate, expected) -> None:
    for name, side in sides.items():
        _write(tmp_path, name, side)
    argv = (
        ["diff", str(tmp_path)]
        + (["--baseline", baseline] if baseline else [])
        + (["--candidate", candidate] if candidate else [])
    )
    err = io.StringIO()
    code = cli.main(argv, stdout=io.StringIO(), stderr=err)
    if isinstance(expected, tuple):
        report = api.compare(str(tmp_path), baseline, candidate)
        assert (report.baseline, report.candidate) == expected and code == 0
    else:
        with pytest.raises(api.ParityInputError, match=expected):
            api.compare(str(tmp_path), baseline, candidate)
        assert code == 2 and expected.split("'")[0] in err.getvalue()
