"""The README's command lines, checked against the code that runs them."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Any

import numpy as np

from tb_parity_plugin import cli

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _synopsis() -> str:
    """The ``tb-parity diff LOGDIR ...`` block under "Compare in CI"."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"```\n(tb-parity diff LOGDIR.*?)```", text, re.S)
    assert found, "the README's tb-parity diff synopsis"
    return found.group(1)


def test_the_diff_synopsis_names_every_option_the_cli_takes_and_no_other() -> None:
    """A new user read the synopsis for the flags: it named no ``--allow-unmatched``,
    ``--accept-read-problems``, ``--accept-fewer-steps`` or ``--require-values``, which the
    structure lines, the exit codes 3 and 4 and the prose ask for."""
    shown = set(re.findall(r"--[a-z][a-z-]*", _synopsis()))
    taken = {o for a in cli.comparison_options()._actions for o in a.option_strings if o.startswith("--")}
    taken = (taken - {"--help"}) | {"--json"}  # diff's own flag beside the shared ones
    assert shown == taken, f"README lacks {sorted(taken - shown)}, names {sorted(shown - taken)} the CLI lacks"


def test_every_flag_the_readme_shows_with_its_value_parses_as_the_cli_takes_it() -> None:
    """Each code span of the README that starts with a comparison flag and gives its value
    (``--allow-unmatched 'slot/*'``) parses as ``tb-parity diff LOGDIR <span>`` with nothing left
    over: ``--allow-unmatched 'state/*' 'slot/*'`` stopped the CLI with "unrecognized arguments:
    slot/*" (the flag takes one pattern, repeated)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    parser = cli.comparison_options()
    flags = {o for a in parser._actions for o in a.option_strings}
    checked = 0
    for span in re.findall(r"`(--[^`]+)`", text):
        words = shlex.split(span)
        if words[0].split("=")[0] not in flags or (len(words) == 1 and "=" not in words[0]):
            continue  # another command's flag, or a flag named without a value
        _, rest = parser.parse_known_args(["LOGDIR", *words])
        assert not rest, f"README's `{span}`: the CLI leaves {rest} unparsed"
        checked += 1
    assert checked >= 20  # the README's flag examples were found


def _json_table() -> dict[str, str]:
    """Field -> description of the README's ``--json`` table (a row may name several fields)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"`--json` prints one object with these fields.*?\n\n(\|.*?)\n\n", text, re.S)
    assert found, "the README's --json field table"
    rows = {}
    for line in found.group(1).splitlines()[2:]:
        names, what = line.strip("|").split("|", 1)
        for name in re.findall(r"`([a-z_]+)`", names):
            rows[name] = what
    return rows


def _braced(text: str) -> set[str]:
    """The field names of the first ``{a, b, ...}`` in a table cell."""
    found = re.search(r"`\{([a-z_, ]+)\}`", text)
    assert found, text
    return {name.strip() for name in found.group(1).split(",")}


def test_the_json_table_names_every_field_of_a_real_report_and_no_other(demo_logs: str) -> None:
    """The README listed 20 of the report's 30 fields (``verdict`` without ``incomplete``, and no
    ``ended_early``, ``replicas``, ``tolerance_text``, ...): a CI script written from it could not
    tell an incomplete run from an agreeing one. Checked on a real diverging report, so the
    divergence's own fields are there too."""
    out = io.StringIO()
    code = cli.main(["diff", os.path.join(demo_logs, "lr_offbyone"), "--json"], stdout=out, stderr=io.StringIO())
    assert code == 1
    report = json.loads(out.getvalue())
    table = _json_table()
    assert set(table) == set(report), (
        f"README lacks {sorted(set(report) - set(table))}, names {sorted(set(table) - set(report))}"
    )
    assert _braced(table["first_divergence"]) == set(report["first_divergence"])
    assert _braced(table["structure"]) == set(report["structure"])
    assert _braced(table["evidence"]) == set(report["evidence"])
    assert set(re.findall(r"`([a-z_]+)`", table["policy"])) == set(report["policy"])
    verdicts = set(re.findall(r"`([a-z ]+)`", table["verdict"]))
    assert verdicts == {"diverge", "incomplete", "agree", "agree within statistics"}


def test_the_json_examples_flat_objects_are_a_real_reports(demo_logs: str) -> None:
    """The README's ``--json`` example shows ``evidence`` and ``policy`` whole (no ``...``): a CI script
    copied from it read ``evidence`` without ``sampled`` and a ``policy`` without ``accept_fewer_steps``,
    fields the table names and every report holds. Each is checked, keys and values, against the
    real report of the same pair."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"\$ tb-parity diff demo_logs/lr_offbyone --json\n(.*?)```", text, re.S)
    assert found, "the README's --json example"
    out = io.StringIO()
    code = cli.main(["diff", os.path.join(demo_logs, "lr_offbyone"), "--json"], stdout=out, stderr=io.StringIO())
    assert code == 1
    report = json.loads(out.getvalue())
    for field in ("evidence", "policy"):
        shown = re.search(rf'"{field}": (\{{[^{{}}]*\}})', found.group(1))
        assert shown, field
        assert json.loads(shown.group(1)) == report[field], (field, shown.group(1), report[field])


def _port_files(tmp: str, update_ops: bool = True) -> None:
    """The README's end-to-end example, as written there (``update_ops=False``: the original without
    its train op's ``control_dependencies`` on ``UPDATE_OPS``)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    blocks = dict(re.findall(r"```python\n# (tf1_original\.py|tf2_port\.py)\n(.*?)```", text, re.S))
    assert set(blocks) == {"tf1_original.py", "tf2_port.py"}
    if not update_ops:
        deps = "tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))"
        assert deps in blocks["tf1_original.py"]
        blocks["tf1_original.py"] = blocks["tf1_original.py"].replace(deps, "tf.control_dependencies([])")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(README)}
    for name in ("tf1_original.py", "tf2_port.py"):
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
            f.write(blocks[name])
        subprocess.run([sys.executable, name], cwd=tmp, env=env, check=True, capture_output=True, timeout=300)


def _diff(logdir: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = cli.main(["diff", logdir, "--json"], stdout=out, stderr=io.StringIO())
    return code, json.loads(out.getvalue())


def test_the_end_to_end_example_agrees_as_written(tmp_path: Any) -> None:
    """The README's whole example (TF1 batch norm through UPDATE_OPS against Keras ``fit``), run as
    a new user copies it: a faithful port, every tensor compared element-wise."""
    _port_files(str(tmp_path))
    code, report = _diff(str(tmp_path / "logs"))
    assert code == 0, report["verdict_text"]
    assert report["verdict"] == "agree" and report["steps_compared"] == 8
    assert not report["unmatched"]["tf1"] and not report["unmatched"]["tf2"]
    assert any(m["kind"] == "state" and m["baseline"].endswith("moving_mean:0") for m in report["mapping"])


def test_the_end_to_end_example_without_update_ops_diverges_on_the_moving_mean_at_step_1(tmp_path: Any) -> None:
    """The README's claim for the classic slip, checked against numpy: TF1's moving mean stays 0, and
    Keras's after the first step is 0.01 (1 - its momentum 0.99) of the first batch's mean of the dense
    output (the bias starts at 0)."""
    _port_files(str(tmp_path), update_ops=False)
    code, report = _diff(str(tmp_path / "logs"))
    first = report["first_divergence"]
    assert code == 1 and (first["step"], first["kind"], first["tensor"]) == (
        1,
        "state",
        "batch_normalization/moving_mean:0",
    )
    data = np.load(tmp_path / "data.npz")
    expected = np.abs(0.01 * (data["X"][:8].astype(np.float64) @ data["W1"]).mean(axis=0)).max()
    np.testing.assert_allclose(first["max_abs_diff"], expected, rtol=1e-4)
    assert "did not update it" in first["note"]
