"""`tb-parity diff`: exit codes, the JSON contract and bad input, on logdirs written by BlockWriter."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from engine_helpers import write_run

from tb_parity_plugin import api, cli
from tb_parity_plugin.records.writer import BlockWriter

XSS = "<script>alert('x')</script>"


def tensors(
    step: int, shift: float = 0.0, from_step: int = 10**9, name: str = "dense/kernel:0", dtype=np.float32
) -> list:
    rng = np.random.default_rng(step)
    w = rng.standard_normal((3, 2)).astype(dtype)
    if step >= from_step:
        w = w + dtype(shift)
    return [
        ("lr", "lr", np.float32(0.1)),
        ("weight", name, w),
        ("activation", XSS, np.tanh(w)),
        ("loss", "loss", np.float32(1.0 / (step + 1))),
    ]


def make_pair(logdir: str, steps=range(20), cand=None, base=None) -> str:
    write_run(logdir, "tf1", steps, base or tensors, side="tf1")
    write_run(logdir, "tf2", steps, cand or tensors, side="tf2")
    return logdir


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def run_json(*argv: str) -> tuple[int, dict]:
    code, out, err = run_cli("diff", *argv, "--json")
    assert err == "", err
    return code, json.loads(out)


# -- agree / diverge -------------------------------------------------------------
def test_agree_exit_0_and_json_contract(tmp_path) -> None:
    logdir = make_pair(str(tmp_path))
    code, report = run_json(logdir)
    assert code == 0
    for key in (
        "baseline",
        "candidate",
        "steps_compared",
        "tensors_compared",
        "first_divergence",
        "first_nonfinite",
        "unmatched",
    ):
        assert key in report
    assert (report["baseline"], report["candidate"]) == ("tf1", "tf2")
    assert (report["steps_compared"], report["tensors_compared"], report["first_divergence"]) == (20, 4, None)
    assert report["first_nonfinite"] == {"tf1": None, "tf2": None}
    assert report["unmatched"] == {"tf1": [], "tf2": []}


def test_diverge_exit_1_names_baseline_tensor(tmp_path) -> None:
    logdir = make_pair(
        str(tmp_path),
        cand=lambda s: tensors(s, 0.5, from_step=13, name="simple_model/dense_7/kernel:0"),
    )
    code, report = run_json(logdir)
    assert code == 1
    first = report["first_divergence"]
    assert {k: first[k] for k in ("step", "tensor", "kind", "reason")} == {
        "step": 13,
        "tensor": "dense/kernel:0",
        "kind": "weight",
        "reason": "value",
    }
    assert first["max_abs_diff"] == pytest.approx(0.5) and first["max_rel_diff"] > 0
    # the baseline may be chosen explicitly, also the other way round
    code, swapped = run_json(logdir, "--baseline", "tf2", "--candidate", "tf1")
    assert code == 1 and swapped["first_divergence"]["tensor"] == "simple_model/dense_7/kernel:0"
    code, out, _ = run_cli("diff", logdir)
    assert code == 1
    assert "DIVERGE at step 13: weight/dense/kernel:0" in out
    assert "simple_model/dense_7/kernel:0" in out and "max_abs_diff=0.5" in out


def test_tolerance_flags(tmp_path) -> None:
    def one_percent_off(step: int) -> list:
        return [(k, n, a * np.float32(1.01) if k == "weight" and step >= 15 else a) for k, n, a in tensors(step)]

    logdir = make_pair(str(tmp_path), cand=one_percent_off)
    assert run_json(logdir)[0] == 0  # 1% after the 10 warm-up steps: within rtol 5%
    assert run_json(logdir, "--rtol", "0")[0] == 1
    assert run_json(logdir, "--warmup-steps", "16")[0] == 1
    assert run_json(logdir, "--rtol", "0.001")[0] == 1
    assert run_json(logdir, "--rtol", "0", "--atol", "0.1")[0] == 0
    assert run_json(logdir, "--rtol", "0", "--override", "weight/*:atol=0.1")[0] == 0


# -- the runs ------------------------------------------------------------------------
def test_missing_logdir_and_run_exit_2_one_line(tmp_path) -> None:
    code, out, err = run_cli("diff", str(tmp_path / "nope"))
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    logdir = make_pair(str(tmp_path / "ok"))
    code, _, err = run_cli("diff", logdir, "--baseline", "tf3")
    assert code == 2 and "tf3" in err and "tf1, tf2" in err and err.count("\n") == 1
    # Both named, one missing: only the named runs would be read, yet the error lists every run
    # (it listed "tf1" alone, hiding the name the user meant).
    code, _, err = run_cli("diff", logdir, "--baseline", "tf1", "--candidate", "tf3")
    assert code == 2 and "no run 'tf3'" in err and "(runs: tf1, tf2)" in err and err.count("\n") == 1
    assert run_cli("diff")[0] == 2
    assert run_cli("frobnicate")[0] == 2
    assert run_cli("diff", logdir, "--atol", "-1")[0] == 2
    assert run_cli("diff", logdir, "--map", "nonsense")[0] == 2
    for bad in ("*:atol=nan", "*:atol=inf", "*:rtol=-1", "re:(:atol=1"):
        code, out, err = run_cli("diff", logdir, "--override", bad, "--json")
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (bad, err)
        # under --json stdout holds the error as JSON too: a new user's CI script, json.loads(stdout), crashed
        # on the empty output of a bad flag or a missing logdir
        assert json.loads(out) == {"error": err.strip(), "exit": 2}, (bad, out)
    for flag in ("--json", "--js"):  # argparse takes a prefix of the flag too
        code, out, err = run_cli("diff", str(tmp_path / "nope"), flag)
        assert code == 2 and json.loads(out) == {"error": err.strip(), "exit": 2}, flag
    code, _, err = run_cli("diff", logdir, "--map", "re:(a)=\\2")
    assert code == 2 and "group" in err and err.count("\n") == 1


def test_three_runs_need_a_choice(tmp_path) -> None:
    logdir = make_pair(str(tmp_path))
    write_run(logdir, "tf2_fixed", range(20), tensors, side="tf2")
    code, _, err = run_cli("diff", logdir)
    assert code == 2 and "tf1, tf2, tf2_fixed" in err
    assert run_cli("diff", logdir, "--baseline", "tf1", "--candidate", "tf2_fixed")[0] == 0


def test_empty_run_exit_2(tmp_path) -> None:
    logdir = str(tmp_path)
    write_run(logdir, "tf1", range(5), tensors, side="tf1")
    write_run(logdir, "tf2", [], tensors, side="tf2")  # run_info only, no step
    code, _, err = run_cli("diff", logdir)
    assert code == 2 and "tf2" in err and "no tb_parity records" in err


def test_different_step_sets_compare_the_common_steps(tmp_path) -> None:
    logdir = make_pair(str(tmp_path), steps=range(0, 20))
    shutil.rmtree(os.path.join(logdir, "tf2"))
    write_run(logdir, "tf2", range(0, 30, 2), tensors, side="tf2")
    code, report = run_json(logdir)
    assert report["steps_compared"] == 10 and report["steps_only"] == {"tf1": 10, "tf2": 5}
    # tf1 ends at step 19, tf2 (every 2nd step) goes to 28: exit 3 unless accepted
    assert code == 3 and report["ended_early"] == {"tf1": {"last": 19, "other_last": 28, "steps": 5}}
    assert run_json(logdir, "--accept-fewer-steps")[0] == 0
    shutil.rmtree(os.path.join(logdir, "tf2"))
    write_run(logdir, "tf2", range(100, 110), tensors, side="tf2")
    code, _, err = run_cli("diff", logdir)
    assert code == 2 and "share no logged step (steps 0-19 against steps 100-109" in err


def test_shape_and_dtype_mismatch(tmp_path) -> None:
    def reshaped(step: int) -> list:
        t = tensors(step)
        t[1] = ("weight", t[1][1], t[1][2].reshape(2, 3))
        return t

    code, report = run_json(make_pair(str(tmp_path / "shape"), cand=reshaped))
    assert code == 1 and report["first_divergence"]["reason"] == "shape" and report["first_divergence"]["step"] == 0
    code, report = run_json(make_pair(str(tmp_path / "dtype"), cand=lambda s: tensors(s, dtype=np.float64)))
    assert code == 1 and report["first_divergence"]["reason"] == "dtype"


def test_nan_inf_everywhere(tmp_path) -> None:
    def poisoned(step: int) -> list:
        return [(k, n, np.full(np.shape(a), np.nan if k != "lr" else np.inf, np.float32)) for k, n, a in tensors(step)]

    logdir = make_pair(str(tmp_path), base=poisoned, cand=poisoned)
    code, report = run_json(logdir)
    assert code == 1 and report["first_divergence"]["reason"] == "nonfinite"  # equal_nan=False: NaN fails
    assert report["first_nonfinite"]["tf1"] == {"step": 0, "tensor": "lr", "kind": "lr"}
    assert report["first_nonfinite"]["tf2"]["step"] == 0
    assert run_json(logdir, "--equal-nan")[0] == 0
    code, out, _ = run_cli("diff", logdir)
    assert "first NaN/Inf in 'tf1': step 0, lr/lr" in out


def test_truncated_tail_keeps_the_rest_and_is_no_agreement(tmp_path) -> None:
    """A finished run whose file ends mid-record lost that record: exit 3 (incomplete), not AGREE."""
    logdir = make_pair(str(tmp_path))
    path = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(logdir, "tf2")) for f in fs][0]
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 7)
    code, report = run_json(logdir)
    assert code == 3 and report["verdict"] == "incomplete" and report["agree"] is False
    assert report["steps_compared"] == 19 and report["steps_only"] == {"tf1": 1, "tf2": 0}
    (problem,) = report["problems"]
    assert problem["run"] == "tf2" and "ends mid-record" in problem["message"]
    # the lost record was the last step: tf2 also ends a step early, which is accepted apart (a
    # corrupt record elsewhere says nothing of how long the run trained)
    code, report = run_json(logdir, "--accept-read-problems")
    assert code == 3 and report["ended_early"] == {"tf2": {"last": 18, "other_last": 19, "steps": 1}}
    assert "read problem" not in report["verdict_text"] and "--accept-fewer-steps" in report["verdict_text"]
    code, report = run_json(logdir, "--accept-read-problems", "--accept-fewer-steps")
    assert code == 0 and report["verdict"] == "agree" and report["problems"] == [problem]


def test_bit_flip_is_reported_not_a_crash(tmp_path) -> None:
    logdir = make_pair(str(tmp_path))
    path = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(logdir, "tf2")) for f in fs][0]
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    code, report = run_json(logdir)
    assert code == 3 and 0 < report["steps_compared"] < 20  # incomplete: what was not read may diverge
    assert report["problems"] and report["problems"][0]["run"] == "tf2" and report["problems"][0]["offset"] > 0
    code, out, _ = run_cli("diff", logdir)
    assert code == 3 and "read problem in 'tf2'" in out and "INCOMPLETE" in out


def test_garbage_file_is_an_input_error(tmp_path) -> None:
    os.makedirs(tmp_path / "tf1")
    os.makedirs(tmp_path / "tf2")
    for run in ("tf1", "tf2"):
        (tmp_path / run / "events.out.tfevents.1.host").write_bytes(os.urandom(300))
    code, _, err = run_cli("diff", str(tmp_path), "--baseline", "tf1")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("last_is_right", [True, False])
def test_step_written_twice_last_write_wins(tmp_path, last_is_right: bool) -> None:
    """One file writes step 5 wrong and right (in file order: which one comes last decides)."""
    logdir = str(tmp_path)
    write_run(logdir, "tf1", range(10), tensors, side="tf1")
    wrong = lambda s: tensors(s, 9.0, from_step=0)  # noqa: E731
    writes = [(s, tensors) for s in range(10)] + (
        [(5, wrong), (5, tensors)] if last_is_right else [(5, tensors), (5, wrong)]
    )
    writer = BlockWriter(os.path.join(logdir, "tf2"), side="tf2")
    for step, make in writes:
        writer.write_arrays(step, make(step))
    writer.close()
    code, report = run_json(logdir)
    if last_is_right:
        assert code == 0 and report["steps_compared"] == 10
    else:
        assert code == 1 and report["first_divergence"]["step"] == 5


def test_html_names_are_printed_as_given(tmp_path) -> None:
    logdir = make_pair(
        str(tmp_path), cand=lambda s: [t if t[0] != "activation" else (t[0], t[1], t[2] + 1) for t in tensors(s)]
    )
    code, report = run_json(logdir)
    assert code == 1 and report["first_divergence"]["tensor"] == XSS
    code, out, _ = run_cli("diff", logdir)
    assert XSS in out


def test_map_option_pairs_names(tmp_path) -> None:
    logdir = make_pair(str(tmp_path), cand=lambda s: tensors(s, name="renamed"))
    # canonical/fallback already pair it; an explicit mapping shows up as "map"
    code, report = run_json(logdir, "--map", "dense/kernel:0=renamed")
    assert code == 0
    assert {"baseline": "dense/kernel:0", "candidate": "renamed", "kind": "weight", "how": "map"} in report["mapping"]
    # `--map A=B LOGDIR` order works too
    code, _, _ = run_cli("diff", "--map", "dense/kernel:0=renamed", logdir, "--json")
    assert code == 0


# -- Python API ----------------------------------------------------------------------
def test_api_compare_matches_cli_and_assert_parity(tmp_path) -> None:
    logdir = make_pair(str(tmp_path), cand=lambda s: tensors(s, 0.5, from_step=13))
    report = api.compare(logdir)
    assert report.to_dict() == run_json(logdir)[1]
    with pytest.raises(AssertionError) as info:
        api.assert_parity(logdir)
    message = str(info.value)
    assert "step 13" in message and "weight/dense/kernel:0" in message and "max_abs_diff=0.5" in message
    # how the runs were paired reaches a pytest log too (a new user could not see a re-pairing there)
    with pytest.raises(AssertionError) as info:
        api.assert_parity(logdir, mapping=["no_such_tensor=other"])
    warned = [w for w in api.compare(logdir, mapping=["no_such_tensor=other"]).warnings]
    assert warned and all(f"warning: {w}" in str(info.value) for w in warned)
    assert api.assert_parity(logdir, atol=1.0).agree
    with pytest.raises(api.ParityInputError):
        api.compare(str(tmp_path / "missing"))
    with pytest.raises(api.ParityInputError):
        api.compare(logdir, policy=api.TolerancePolicy(), atol=1.0)


# -- the installed console script ---------------------------------------------------
def test_console_script_subprocess(tmp_path) -> None:
    script = shutil.which("tb-parity", path=os.path.dirname(sys.executable)) or shutil.which("tb-parity")
    if script is None:
        pytest.skip("tb-parity console script is not installed")
    logdir = make_pair(str(tmp_path), cand=lambda s: tensors(s, 0.5, from_step=3))
    proc = subprocess.run([script, "diff", logdir, "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["first_divergence"]["step"] == 3
    proc = subprocess.run([script, "diff", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_help_lists_both_commands(capsys) -> None:
    assert cli.main(["--help"]) == 0
    usage = capsys.readouterr().out
    assert "diff" in usage and "report" in usage
    code, out, err = run_cli()
    assert code == 2 and out == "" and "tb-parity diff" in err and "tb-parity report" in err


def test_report_takes_the_same_comparison_options_as_diff(tmp_path) -> None:
    """One parser: --override and --equal-nan reach the report's verdict as they reach diff's."""
    from tb_parity_plugin.cli import _parser

    sub = next(a for a in _parser()._actions if a.dest == "command").choices

    def options(name: str) -> set:
        return {o for a in sub[name]._actions for o in a.option_strings} - {"-h", "--help"}

    assert options("diff") - {"--json"} == options("report") - {"-o", "--output", "--progress", "--no-progress"}


def test_structure_divergence_in_text_and_json_and_allow_unmatched(tmp_path) -> None:
    """A tensor one run lacks fails the comparison (exit 1), first, named in both outputs."""

    def extra(step: int) -> list:
        return tensors(step) + [("weight", "batch_normalization/gamma:0", np.ones(2, np.float32))]

    logdir = make_pair(str(tmp_path), base=extra)
    code, report = run_json(logdir)
    assert code == 1 and report["first_divergence"]["reason"] == "structure"
    assert report["structure"]["only_in"]["tf1"][0]["tag"] == "weight/batch_normalization/gamma:0"
    assert report["verdict"] == "diverge" and report["first_step_divergence"] is None
    code, out, _ = run_cli("diff", logdir)
    assert (
        code == 1
        and "DIVERGE in structure" in out
        and "recorded by 'tf1' only (1): weight/batch_normalization/gamma:0" in out
    )
    code, report = run_json(logdir, "--allow-unmatched", "*/gamma*")
    assert code == 0 and report["structure"]["only_in"]["tf1"][0]["expected"] is True


def test_require_values_fails_an_agreement_resting_on_statistics(tmp_path) -> None:
    """A 1M-element embedding trained at a wrong lr can stay inside what its statistics allow (a
    new user's port agreed "within statistics", exit 0). ``--require-values`` (and
    ``assert_parity(require_values=True)``) make such an agreement fail, naming the tensors
    compared by statistics only; an element-wise agreement still passes."""
    big = np.linspace(-1, 1, 5000, dtype=np.float32)  # above full_values_limit (4096): statistics only
    nudged = big.copy()
    nudged[2500] += np.float32(1e-3)  # out of atol element-wise, inside min/max: nothing provable
    assert not np.allclose(nudged, big, rtol=1e-7, atol=1e-5)  # numpy, the guide's check: it does diverge
    logdir = make_pair(
        str(tmp_path / "stats"),
        steps=range(3),
        base=lambda s: [*tensors(s), ("weight", "embedding", big)],
        cand=lambda s: [*tensors(s), ("weight", "embedding", nudged)],
    )
    code, out, _ = run_cli("diff", logdir)
    assert code == 0 and "AGREE within statistics" in out
    assert "compared by statistics: weight/embedding" in out
    code, out, err = run_cli("diff", logdir, "--require-values")
    assert code == cli.EXIT_STATISTICS == 4
    assert "--require-values: the agreement rests on statistics for 1 tensor(s) (exit 4)" in err  # why, in a CI log
    assert run_json(logdir)[1]["statistics_only"] == ["weight/embedding"]
    with pytest.raises(AssertionError, match="compared by statistics: weight/embedding"):
        api.assert_parity(logdir, require_values=True)
    api.assert_parity(logdir)  # the default keeps the weaker agreement a pass
    clean = make_pair(str(tmp_path / "values"), steps=range(3))
    assert run_cli("diff", clean, "--require-values")[0] == 0
    api.assert_parity(clean, require_values=True)


def test_a_reader_that_stops_reading_keeps_the_exit_status(tmp_path) -> None:
    """``tb-parity diff LOGDIR | head`` printed "Broken pipe" and exited 2 (an input error): the
    verdict's exit status stands and nothing is printed to stderr."""
    logdir = make_pair(str(tmp_path), cand=lambda s: tensors(s, shift=1.0, from_step=3))
    script = f"{sys.executable} -m tb_parity_plugin.cli diff {logdir} | head -c 0; echo ${{PIPESTATUS[0]}}"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "1", done
    assert done.stderr == "", done.stderr


def test_a_structure_divergence_says_its_step_pointer_covers_paired_tensors_only(tmp_path) -> None:
    """A new user's untied-embedding port: the pointer named step 1 on an activation while the
    unpaired embedding's gradient differed at step 0 (numpy); the line now says what it covers."""
    logdir = str(tmp_path)
    write_run(logdir, "tf1", range(3), lambda s: [("loss", "l", np.float32(s))], side="tf1")
    write_run(
        logdir,
        "tf2",
        range(3),
        lambda s: [("loss", "l", np.float32(s + (s == 1))), ("weight", "extra", np.ones(2))],
        side="tf2",
    )
    code, out, _ = run_cli("diff", logdir)
    assert code == 1 and "DIVERGE in structure" in out
    assert "first divergence among the steps: step 1, loss/l (value), among the paired tensors only" in out
    with pytest.raises(AssertionError) as raised:  # no tensor's tolerance to name: the policy alone
        api.assert_parity(logdir)
    assert "\ntolerance; policy: {" in str(raised.value) and "None" not in str(raised.value).split("\n")[1]


def test_runs_that_recorded_nothing_in_common_are_told_what_each_recorded(tmp_path) -> None:
    """A new user's forward pass: TF1 recorded each layer with rec.activation, the port only
    forward_pass's output/inference/output, and the error said only that nothing could be
    paired. It now names what each run recorded and how to pair them."""
    write_run(str(tmp_path), "tf1", [0], lambda s: [("activation", "inference/conv2d", np.ones(3, np.float32))], "tf1")
    write_run(str(tmp_path), "tf2", [0], lambda s: [("output", "inference/output", np.ones(3, np.float32))], "tf2")
    code, _, err = run_cli("diff", str(tmp_path))
    assert code == cli.EXIT_ERROR, err
    assert "'tf1' recorded activation/inference/conv2d; 'tf2' recorded output/inference/output" in err, err
    assert "rec.output" in err and "--map" in err
