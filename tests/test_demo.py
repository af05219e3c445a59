"""The demo's planted bugs are found where they were planted, through the installed CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tb_parity_plugin import compare
from tb_parity_plugin.logdir.reader import LogdirReader

TB_PARITY = shutil.which("tb-parity", path=os.path.dirname(sys.executable)) or "tb-parity"


def _diff(logdir: str) -> tuple[int, dict]:
    proc = subprocess.run([TB_PARITY, "diff", logdir, "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_lr_off_by_one_diverges_first_on_lr_at_step_0(demo_logs: str) -> None:
    code, report = _diff(os.path.join(demo_logs, "lr_offbyone"))
    assert code == 1
    assert (report["baseline"], report["candidate"]) == ("tf1", "tf2")
    first = report["first_divergence"]
    assert (first["step"], first["kind"], first["tensor"], first["reason"]) == (0, "lr", "lr", "value")
    # polynomial decay 0.1 -> 0.01 over 40 steps: one step of the schedule is 0.00225
    assert first["max_abs_diff"] == pytest.approx(0.00225, rel=1e-3)
    # the port reads the schedule one step later at every step (numpy: polynomial decay by hand)
    tf1_lr = [(0.1 - 0.01) * (1 - s / 40) + 0.01 for s in range(40)]
    assert first["max_abs_diff"] == pytest.approx(tf1_lr[0] - tf1_lr[1], rel=1e-5)
    assert "the candidate's value at each step is the baseline's 1 step(s) later" in first["note"], first["note"]
    assert report["unmatched"] == {"tf1": [], "tf2": []}
    assert report["first_nonfinite"] == {"tf1": None, "tf2": None}


def test_nan_pair_diverges_when_the_port_loss_turns_nonfinite(demo_logs: str) -> None:
    code, report = _diff(os.path.join(demo_logs, "nan"))
    assert code == 1
    first = report["first_divergence"]
    assert (first["kind"], first["tensor"], first["reason"]) == ("loss", "loss", "nonfinite")
    assert report["first_nonfinite"]["tf1"] is None
    assert report["first_nonfinite"]["tf2"] == {"step": first["step"], "tensor": "loss", "kind": "loss"}


def test_clean_pair_agrees_and_names_align_across_scopes(demo_logs: str) -> None:
    code, report = _diff(os.path.join(demo_logs, "clean"))
    assert code == 0 and report["first_divergence"] is None
    assert report["steps_compared"] == 40 and report["tensors_compared"] == 17
    how = {(m["kind"], m["baseline"]): (m["candidate"], m["how"]) for m in report["mapping"]}
    assert how[("weight", "dense/kernel:0")] == ("simple_model/dense/kernel:0", "canonical")


def test_python_api_gives_the_cli_verdict(demo_logs: str) -> None:
    for pair in ("lr_offbyone", "nan", "clean"):
        _, cli_report = _diff(os.path.join(demo_logs, pair))
        assert compare(os.path.join(demo_logs, pair)).to_dict() == cli_report


def test_shape_agnostic_pair_agrees_element_wise_with_its_partial_last_batch(demo_logs: str) -> None:
    code, report = _diff(os.path.join(demo_logs, "none_batch"))
    assert code == 0 and report["verdict"] == "agree", report["first_divergence"]
    assert report["evidence"]["statistics"] == 0  # activations of a None batch keep full values
    with LogdirReader(os.path.join(demo_logs, "none_batch")) as reader:
        act = reader.run("tf2").tensors[("activation", "dense")]
        assert act.shape == (None, 2) and act.runtime_shapes[-1] == (5, 2) and act.runtime_shapes[0] == (8, 2)


def test_missing_bias_pair_fails_on_structure(demo_logs: str) -> None:
    code, report = _diff(os.path.join(demo_logs, "missing_bias"))
    assert code == 1 and report["first_divergence"]["reason"] == "structure"
    assert report["structure"]["only_in"]["tf1"][0]["tag"] == "weight/dense_2/bias:0"
    assert report["structure"]["variables"]["tf2"]["count"] == report["structure"]["variables"]["tf1"]["count"] - 1


def test_batch_norm_pair_agrees_on_state_and_slots(demo_logs: str) -> None:
    code, report = _diff(os.path.join(demo_logs, "batch_norm"))
    assert code == 0 and report["verdict"] == "agree", report["first_divergence"]
    kinds = {m["kind"] for m in report["mapping"]}
    assert {"weight", "state", "slot"} <= kinds
    slots = [m for m in report["mapping"] if m["kind"] == "slot"]
    assert all(m["baseline"].endswith("/Momentum:0") for m in slots)  # TF1's names, paired without a map


def test_forward_pass_pair_agrees_in_both_modes(demo_logs: str) -> None:
    code, report = _diff(os.path.join(demo_logs, "forward_pass"))
    assert code == 0 and report["steps_compared"] == 1
    names = {m["baseline"] for m in report["mapping"]}
    assert {"inference/output", "training/output", "inference/bn", "training/bn"} <= names
