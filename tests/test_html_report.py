"""`tb-parity report` opened in headless chromium: it shows the engine's verdict, fetches
nothing at all, and shows names holding HTML as text."""

from __future__ import annotations

import contextlib
import html
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tb_parity_plugin import api
from tb_parity_plugin.cli import main as cli_main
from tb_parity_plugin.records.writer import BlockWriter

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts"
EVIL = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'">'


@pytest.fixture(scope="module")
def demo_logs(tmp_path_factory) -> str:
    logdir = str(tmp_path_factory.mktemp("report") / "logs")
    subprocess.run(
        [sys.executable, "-m", "demo.write_logs", logdir, "--pairs", "lr_offbyone", "clean"],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return logdir


def open_report(browser, path: Path, shot: str):
    """Loads ``path``; returns (page, every request URL but the page's own)."""
    page = browser.new_page(viewport={"width": 1150, "height": 900})
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri(), wait_until="load")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    return page, [u for u in requests if u != path.as_uri()]


def report_cli(*args: str) -> int:
    return cli_main(["report", *args])


def test_report_shows_the_verdict_and_makes_no_request(demo_logs, tmp_path, browser):
    out = tmp_path / "report.html"
    status = report_cli(demo_logs, "--baseline", "lr_offbyone/tf1", "--candidate", "lr_offbyone/tf2", "-o", str(out))
    expected = api.compare(demo_logs, "lr_offbyone/tf1", "lr_offbyone/tf2")
    first = expected.first_divergence
    assert status == 1 and first is not None and first.kind == "lr"  # the planted schedule bug
    page, requests = open_report(browser, out, "html_report_lr_offbyone.png")
    assert requests == []
    verdict = page.locator(".verdict").inner_text()
    assert verdict == f"First divergence at step {first.step}: {first.tensor} (lr, {first.reason})"
    rows = page.locator("table.divergences tbody tr")
    assert rows.count() == len(expected.divergences_at_first_step)
    assert page.locator("table.divergences tr.first").inner_text().split("\t")[2] == first.tensor
    mismatched = page.locator("table.divergences tr.first td").nth(8).inner_text()
    assert mismatched == f"{100 * first.mismatch_fraction:.3g}%"  # as the CLI prints it, not a bare fraction
    assert page.locator("svg.chart").count() == 4  # lr, loss and their differences
    assert page.locator("svg.heat image").count() == 1
    page.close()


def test_clean_pair_reads_agree(demo_logs, tmp_path, browser):
    out = tmp_path / "clean.html"
    assert report_cli(demo_logs, "--baseline", "clean/tf1", "--candidate", "clean/tf2", "-o", str(out)) == 0
    expected = api.compare(demo_logs, "clean/tf1", "clean/tf2")
    page, requests = open_report(browser, out, "html_report_clean.png")
    assert requests == []
    assert page.locator(".verdict.agree").inner_text() == (
        f"Runs agree within tolerance across {expected.steps_compared} steps and {expected.tensors_compared} tensors."
    )
    page.close()


def test_names_holding_html_stay_text(tmp_path, browser):
    logdir = tmp_path / "logs"
    for side, shift, extra in (("tf1", 0.0, "weight"), ("tf2", 1.0, "grad")):  # `extra`: one side only
        writer = BlockWriter(str(logdir / side), side=side, mode="graph")
        for step in range(3):
            writer.write_arrays(
                step,
                [
                    ("lr", "lr", np.float32(0.1)),
                    ("activation", EVIL, np.arange(4.0) + shift * step),
                    (extra, f"only_{side}/{EVIL}", np.ones(2)),
                ],
            )
        writer.close()
    out = tmp_path / "evil.html"
    assert report_cli(str(logdir), "-o", str(out)) == 1
    text = out.read_text(encoding="utf-8")
    assert EVIL not in text and html.escape(EVIL) in text
    page, requests = open_report(browser, out, "html_report_escaped.png")
    assert requests == []  # the <img src=x> was not loaded
    assert page.title() != "pwned"
    assert EVIL in page.locator(".verdict").inner_text()
    assert EVIL in page.locator("ul.unmatched").inner_text()
    page.close()


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert report_cli(str(tmp_path / "missing"), "-o", str(tmp_path / "x.html")) == 2
    err = capsys.readouterr().err
    assert err.startswith("tb-parity report: error:") and err.count("\n") == 1
    assert not (tmp_path / "x.html").exists()


def test_progress_bar_on_request(demo_logs, tmp_path, capsys):
    out = tmp_path / "p.html"
    report_cli(demo_logs, "--baseline", "clean/tf1", "--candidate", "clean/tf2", "--progress", "-o", str(out))
    assert "reading logdir" in capsys.readouterr().err  # tqdm in a terminal
    assert out.exists()


def test_report_shows_structure_and_the_weaker_agreement(tmp_path) -> None:
    """Issue 9: the report names tensors recorded by one run only, and says 'agree within statistics'."""
    import numpy as np
    from engine_helpers import write_run

    from tb_parity_plugin.report import page

    big = np.linspace(-1, 1, 5000, dtype=np.float32)  # above full_values_limit: statistics only
    write_run(
        str(tmp_path / "a"), "tf1", range(3), lambda s: [("weight", "w", big), ("weight", "gamma", big[:2])], side="tf1"
    )
    write_run(str(tmp_path / "a"), "tf2", range(3), lambda s: [("weight", "w", big)], side="tf2")
    doc = page.report_document(api.compare(str(tmp_path / "a")))
    assert "recorded by <code>tf1</code> only" in doc and "weight/gamma" in doc
    out = io.StringIO()  # the one line says what `diff` says: a structure divergence is at no step
    with contextlib.redirect_stdout(out):
        assert report_cli(str(tmp_path / "a"), "-o", str(tmp_path / "a.html")) == 1
    assert "diverge in structure" in out.getvalue() and "at step" not in out.getvalue(), out.getvalue()
    write_run(str(tmp_path / "b"), "tf1", range(3), lambda s: [("weight", "w", big)], side="tf1")
    write_run(str(tmp_path / "b"), "tf2", range(3), lambda s: [("weight", "w", big)], side="tf2")
    doc = page.report_document(api.compare(str(tmp_path / "b")))
    assert "AGREE within statistics" in doc


def test_an_agreement_within_statistics_names_its_tensors_and_the_remedy_not_tolerance(tmp_path) -> None:
    """A new user's embedding row, wrong in the port and never looked up, hid in a table of 1M
    elements: the CLI said AGREE within statistics and named the table, with the full_values_limit
    remedy, while the HTML report headed its page "Runs agree within tolerance" and named no tensor.
    numpy: two elements swapped outside the sample's positions keep every statistic and the sample,
    yet differ far past tolerance."""
    from engine_helpers import write_run

    from tb_parity_plugin.records import metadata
    from tb_parity_plugin.report import page

    table = np.linspace(-1, 1, 5000, dtype=np.float32)  # above full_values_limit: statistics only
    sampled = set(metadata.sample_positions(table.size).tolist())
    i, j = (int(x) for x in np.setdiff1d(np.arange(table.size), list(sampled))[[3, -3]])
    port = table.copy()
    port[[i, j]] = port[[j, i]]
    assert np.abs(port - table).max() > 1.0  # numpy: a real difference, past any tolerance
    write_run(str(tmp_path), "tf1", range(3), lambda s: [("weight", "emb", table)], side="tf1")
    write_run(str(tmp_path), "tf2", range(3), lambda s: [("weight", "emb", port)], side="tf2")
    report = api.compare(str(tmp_path))
    assert report.verdict == "agree within statistics" and report.statistics_only == ["weight/emb"]
    doc = page.report_document(report)
    assert "Runs agree within tolerance" not in doc
    assert "Runs agree within statistics across 3 steps" in doc
    assert api.statistics_only_line(report) in doc and "full_values_limit" in doc


def test_the_divergence_maps_long_names_are_marked_as_cut(tmp_path) -> None:
    """A row label cut to its end starts with an ellipsis ("tate/batch_normalization/moving_mean:0"
    read as a name); the tooltip holds the whole name."""
    from engine_helpers import write_run

    from tb_parity_plugin.report import page

    name = "state/batch_normalization/moving_mean:0"  # 39 characters, the map shows 38
    for run in ("tf1", "tf2"):
        write_run(str(tmp_path), run, range(3), lambda s: [("state", name[6:], np.ones(3, np.float32))], side=run)
    doc = page.report_document(api.compare(str(tmp_path)))
    assert f">\u2026{name[-37:]}<title>{name}</title>" in doc and f">{name[-38:]}<" not in doc


@pytest.mark.parametrize("diverge_at", [None, 3])
def test_a_verdict_from_damaged_files_carries_its_problems(tmp_path, capsys, diverge_at) -> None:
    """A bit flip mid-file in the candidate: the page's verdict box is followed at once by the read
    problems (not only a list at the page's end), an unproven agreement is INCOMPLETE (not "Runs do
    not agree"), and the command's one line never says a bare "agree"."""
    import os

    sys.path.insert(0, str(Path(__file__).parent))
    import plugin_fixtures as fx

    root = str(tmp_path / "logs")
    fx.write_pair(root, "p", 40, diverge_at=diverge_at)
    run_dir = os.path.join(root, "p", "tf2")
    (name,) = os.listdir(run_dir)
    path = os.path.join(run_dir, name)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(path, "wb").write(bytes(data))
    out = tmp_path / "r.html"
    code = cli_main(["report", os.path.join(root, "p"), "-o", str(out), "--no-progress"])
    line = capsys.readouterr().out
    assert code == (3 if diverge_at is None else 1) and "1 read problem(s)" in line
    page = out.read_text()
    box = page.index('class="verdict ')
    problems = page.index('data-testid="problems"')
    assert box < problems < page.index('class="meta"', box) and "CRC" in page[problems : problems + 600]
    if diverge_at is None:
        assert 'class="verdict incomplete"' in page and "INCOMPLETE" in page[box : box + 300]


def test_the_report_lists_the_engines_warnings_as_text(tmp_path) -> None:
    """The CLI prints the engine's warnings; the report showed none of them. A mapping that pairs
    nothing warns, and its text (holding HTML) shows as text."""
    import numpy as np
    from engine_helpers import write_run

    from tb_parity_plugin.report import page

    for side in ("tf1", "tf2"):
        write_run(str(tmp_path), side, range(2), lambda s: [("weight", "w", np.ones(3, np.float32))], side=side)
    report = api.compare(str(tmp_path), mapping=["<b>nope</b>=w"])
    assert report.warnings and "<b>nope</b>" in report.warnings[0]
    doc = page.report_document(report)
    assert 'data-testid="warnings"' in doc
    assert html.escape("<b>nope</b>") in doc and "<b>nope</b>" not in doc


def test_a_structure_verdict_names_a_tensor_only_the_candidate_records(tmp_path) -> None:
    """A new user's port added a conv bias (use_bias left on): `diff` said "DIVERGE in structure ...
    first weight/conv2d/bias:0" and the tab "Structure differs", while the page headed "First
    divergence at step 0:  (weight, structure)", with no tensor (a candidate-only tensor has no
    baseline name) and a step that a structure divergence does not have; and it never said where
    the compared steps first diverge, which `diff` and the tab do."""
    from engine_helpers import write_run

    from tb_parity_plugin.report import page

    w = np.linspace(-1, 1, 8, dtype=np.float32)
    write_run(str(tmp_path), "tf1", range(3), lambda s: [("weight", "kernel", w)], side="tf1")
    write_run(
        str(tmp_path), "tf2", range(3), lambda s: [("weight", "kernel", w + 1), ("weight", "bias", w[:2])], side="tf2"
    )
    report = api.compare(str(tmp_path))
    first, later = report.first_divergence, report.first_step_divergence
    assert first is not None and first.reason == "structure" and first.tensor == ""
    assert first.candidate_tensor == "bias" and later is not None and later.tensor == "kernel"
    doc = page.report_document(report)
    verdict = html.unescape(doc.split('<div class="verdict diverge">')[1].split('<div class="meta"')[0])
    assert (
        verdict
        == "Structure differs: 1 tensor(s) recorded by one run only, first <code>bias</code> (weight, structure)"
    )
    assert "First divergence at step" not in doc
    assert f"the first divergence is at step {later.step}: <code>weight/kernel</code> (value)" in doc


def test_a_plain_agreement_says_what_allow_unmatched_left_out(tmp_path, browser) -> None:
    """A GRU port compared with ``--allow-unmatched '*gru_cell*'`` (TF1's gates/candidate kernels
    against Keras's fused kernel: no pairing by name): `diff` and the tab said "AGREE ...; not
    compared: 14 tensor(s) recorded by one run only and declared expected ...: compare what they
    compute another way", while the page headed "Runs agree within tolerance across 4 steps and
    11 tensors." and said nothing of the recurrent layer it never compared (the engine words that
    clause once for every front end since the LSTM users it misled). numpy: the shared tensors are
    equal, the cell's kernels have other shapes in each run."""
    from engine_helpers import write_run

    w = np.linspace(-1, 1, 8, dtype=np.float32)
    gates, fused = np.ones((7, 6), np.float32), np.ones((4, 9), np.float32)
    assert np.array_equal(w, w.copy()) and gates.shape != fused.shape
    write_run(
        str(tmp_path), "tf1", range(3), lambda s: [("weight", "w", w), ("weight", "gru_cell/gates", gates)], side="tf1"
    )
    write_run(
        str(tmp_path), "tf2", range(3), lambda s: [("weight", "w", w), ("weight", "gru_cell/kernel", fused)], side="tf2"
    )
    report = api.compare(str(tmp_path), allow_unmatched=["*gru_cell*"])
    assert report.verdict == "agree" and report.first_divergence is None
    assert "not compared: 2 tensor(s)" in report.verdict_text  # what `diff` prints and the tab shows
    out = tmp_path / "gru.html"
    assert report_cli(str(tmp_path), "--allow-unmatched", "*gru_cell*", "-o", str(out)) == 0
    page, _ = open_report(browser, out, "html_report_allow_unmatched.png")
    headline = page.locator(".verdict.agree").inner_text()
    assert headline.startswith(f"Runs agree within tolerance across 3 steps and {report.tensors_compared} tensors.")
    assert report.verdict_text in headline
    page.close()
