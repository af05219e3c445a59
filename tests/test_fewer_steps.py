"""A port that trains fewer steps than its baseline is no agreement.

A new user's port ran one epoch too few (20 of 30 steps): every step both logged agreed, and the
CLI exited 0, ``assert_parity`` passed and the HTML report said "Runs agree across 20 steps". Only
steps both runs logged are compared, so a run that ends before the other makes "no divergence"
``incomplete`` (exit 3) in every front end, unless accepted (``--accept-fewer-steps``: a port still
training, or one trained shorter on purpose). A run logged more sparsely is not "ended early".
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_optimizer_subclass import MOMENTUM, STEPS, TF1StyleSGD, schedule, train_port, train_tf1

from tb_parity_plugin import api, cli
from tb_parity_plugin.logdir.reader import LogdirReader


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("fewer")
    train_tf1(str(root / "tf1"))
    train_port(str(root / "tf2"), TF1StyleSGD(schedule(), momentum=MOMENTUM, nesterov=True), steps=STEPS - 2)
    return str(root)


def test_a_port_that_stops_early_is_incomplete_in_every_front_end(logdir: str, tmp_path, capsys) -> None:
    with LogdirReader(logdir) as reader:  # numpy on the records: the port logged 4 of the 6 steps
        assert [list(reader.run(r).steps) for r in ("tf1", "tf2")] == [list(range(STEPS)), list(range(STEPS - 2))]
    report = api.compare(logdir, baseline="tf1", candidate="tf2")
    assert report.first_divergence is None and report.verdict == "incomplete"
    assert report.ended_early == {"tf2": {"last": STEPS - 3, "other_last": STEPS - 1, "steps": 2}}
    assert "'tf2' ends at step 3 and 'tf1' logged 2 step(s) after it" in report.verdict_text
    with pytest.raises(AssertionError, match="'tf2' trained fewer steps") as raised:
        api.assert_parity(logdir, baseline="tf1", candidate="tf2")
    # Python's spelling of the remedy, the keyword assert_parity takes (it said the CLI's flag)
    assert "accept_fewer_steps=True" in str(raised.value) and "--accept" not in str(raised.value)
    assert cli.main(["diff", logdir]) == cli.EXIT_INCOMPLETE
    assert "INCOMPLETE" in capsys.readouterr().out
    page = tmp_path / "r.html"
    assert cli.main(["report", logdir, "-o", str(page)]) == cli.EXIT_INCOMPLETE
    assert 'class="verdict incomplete"' in page.read_text() and "ends at step 3" in page.read_text()
    # accepted: the steps both logged agree (the port is faithful)
    assert api.assert_parity(logdir, baseline="tf1", candidate="tf2", accept_fewer_steps=True).agree
    assert cli.main(["diff", logdir, "--accept-fewer-steps"]) == cli.EXIT_AGREE


def test_a_run_logged_more_sparsely_has_not_ended_early(tmp_path) -> None:
    """Every 3rd step (last 27) against every step to 29: the next step it would log is 30."""
    from engine_helpers import write_run

    def tensors(step: int) -> list:
        return [("weight", "w", np.full(3, step, np.float32))]

    write_run(str(tmp_path), "tf1", range(30), tensors, side="tf1")
    write_run(str(tmp_path), "tf2", range(0, 30, 3), tensors, side="tf2")
    report = api.compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree and report.ended_early == {}, report.verdict_text
    os.remove(os.path.join(str(tmp_path), "tf2", os.listdir(os.path.join(str(tmp_path), "tf2"))[0]))
    write_run(str(tmp_path), "tf2", range(0, 27, 3), tensors, side="tf2")  # last 24: step 27 is missing
    assert api.compare(str(tmp_path), baseline="tf1", candidate="tf2").ended_early == {
        "tf2": {"last": 24, "other_last": 29, "steps": 5}
    }


def test_a_run_one_step_short_has_ended_early() -> None:
    """Every step to 4 against every step to 5: the one step it would have logged next is missing."""
    from tb_parity_plugin.engine.verdicts import ended_early

    assert ended_early({"tf1": np.arange(6), "tf2": np.arange(5)}) == {"tf2": {"last": 4, "other_last": 5, "steps": 1}}
    assert ended_early({"tf1": np.arange(30), "tf2": np.arange(0, 30, 3)}) == {}  # its next step would be 30
