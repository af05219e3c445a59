"""A port trained as a preempted job is: a process trains up to its checkpoint, a NEW process restores
it and goes on where the first stopped, both recording into one run directory. Real TensorFlow in
real processes (``tests/resumed_port.py``); the first step and tensor each bug changes come from a
float64 numpy replay (``resumed_port.replay``)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import resumed_port
from resumed_port import SPLIT

from tb_parity_plugin import compare

HERE = os.path.dirname(os.path.abspath(__file__))


def _phase(run_dir: str, ckpt_dir: str, phase: int, bug: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]))
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "resumed_port.py"), run_dir, ckpt_dir, str(phase), bug],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("bug", ["none", "input", "optimizer", "counter"])
def test_a_port_resumed_in_a_new_process_where_it_stopped_names_the_resume(tmp_path, bug: str) -> None:
    """Phase 2 begins at step SPLIT, right after phase 1's last step: no step is written twice, yet a
    new process can only go on from a checkpoint. Until this, such a file was taken for a new recorder
    of the same job (no resume): a pipeline back at its first batch was told of fit's shuffling, and
    Adam's moments left out of the checkpoint were told of clipping, betas and an initial accumulator.
    A port that numbers its steps by ``optimizer.iterations``, not restored, writes steps 0-3 again:
    the reader takes that file for a rerun, so its resumed weights meet the baseline's step 0; they
    diverged there with no note, of runs that agree up to the resume."""
    logdir, ckpt = str(tmp_path / "logs"), str(tmp_path / "ckpt")
    resumed_port.train(os.path.join(logdir, "tf1"), str(tmp_path / "unused"), 0, "none")
    _phase(os.path.join(logdir, "tf2"), ckpt, 1, bug)
    _phase(os.path.join(logdir, "tf2"), ckpt, 2, bug)
    assert len(os.listdir(os.path.join(logdir, "tf2"))) == 2

    straight, port = resumed_port.replay("none"), resumed_port.replay(bug)
    apart = [
        s
        for s in range(resumed_port.STEPS)
        if not np.allclose(straight[s]["dense"], port[s]["dense"], atol=1e-4)
        or any(not np.allclose(a, b, atol=1e-6) for a, b in zip(straight[s]["m"], port[s]["m"]))
    ]
    report = compare(logdir, baseline="tf1", candidate="tf2")
    if bug == "counter":
        # numpy: the port trains as the straight run up to step 4 (its phase 2 goes on from step 4's weights)
        assert apart[0] == SPLIT, apart
        first = report.first_divergence
        assert first is not None and (first.step, first.kind) == (0, "weight"), first
        assert "every weight it recorded here is the other run's at step 4" in first.note, first.note
        assert "numbers its steps from 0 again" in first.note, first.note
        return
    if bug == "none":
        assert not apart and report.agree, report.first_divergence
        return
    assert apart[0] == SPLIT, apart
    first = report.first_divergence
    assert first is not None and first.step == SPLIT, first
    if bug == "input":
        # numpy: the first layer's output departs first, fed batch 0 again; every weight and moment agrees
        assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(straight[SPLIT]["m"], port[SPLIT]["m"]))
        assert (first.kind, first.tensor) == ("activation", "dense"), first
        assert "'tf2' was resumed at this step" in first.note and "shuffles" not in first.note, first.note
    else:
        # numpy: Adam's first moments are 0 at the resume and not in the straight run; outputs agree there
        assert np.allclose(straight[SPLIT]["dense"], port[SPLIT]["dense"])
        assert all(not a.any() for a in port[SPLIT]["m"]) and all(a.any() for a in straight[SPLIT]["m"])
        assert first.kind == "slot", first
        assert "'tf2' was resumed at this step" in first.note and "restore the optimizer" in first.note, first.note
        assert "clipping" not in first.note, first.note
