"""Every dashboard route through TensorBoard's real WSGI app, as scalars_plugin_test does.

EventMultiplexer -> MultiplexerDataProvider -> TBContext -> TensorBoardWSGI, driven by
werkzeug's test client; the logdir is written with the pure-numpy BlockWriter.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer as event_multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

from tb_parity_plugin import api
from tb_parity_plugin.dashboard.plugin import ParityPlugin
from tb_parity_plugin.engine import colour_scale

sys.path.insert(0, os.path.dirname(__file__))
import plugin_fixtures as fx

PREFIX = "/data/plugin/tb_parity/"
LR = "baseline=lr%2Ftf1&candidate=lr%2Ftf2"


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("logs"))
    fx.write_pair(root, "lr", 20, diverge_at=5)
    fx.write_pair(root, "clean", 12)
    fx.write_pair(root, "nan", 12, nan_at=4)
    fx.write_pair(root, "html", 6, diverge_at=2, extra_name=fx.HTML_NAME)
    return root


def make_client(logdir: str) -> werkzeug_test.Client:
    multiplexer = event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    context = base_plugin.TBContext(
        logdir=logdir, data_provider=provider, multiplexer=multiplexer, flags=argparse.Namespace(reload_interval=0.2)
    )
    app = application.TensorBoardWSGI([ParityPlugin(context)], data_provider=provider)
    return werkzeug_test.Client(app, wrappers.Response)


@pytest.fixture(scope="module")
def client(logdir: str) -> werkzeug_test.Client:
    return make_client(logdir)


def get_json(client: werkzeug_test.Client, route: str, code: int = 200) -> dict:
    response = client.get(PREFIX + route)
    assert response.status_code == code, response.data[:300]
    assert response.headers["Content-Type"].startswith("application/json")
    return json.loads(response.data)


def test_index_js_is_served_as_javascript(client: werkzeug_test.Client) -> None:
    response = client.get(PREFIX + "index.js")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/javascript")
    assert b"render" in response.data


def test_plugin_entry_page_imports_the_module(client: werkzeug_test.Client) -> None:
    response = client.get("/data/plugin_entry.html?name=tb_parity")
    assert response.status_code == 200
    assert b'<base href="plugin/tb_parity/"' in response.data and b"./index.js" in response.data


def test_plugins_listing_marks_the_tab_active(client: werkzeug_test.Client) -> None:
    listing = json.loads(client.get("/data/plugins_listing").data)
    assert listing["tb_parity"]["enabled"] is True
    assert listing["tb_parity"]["loading_mechanism"]["type"] == "IFRAME"


def test_runs_suggest_tf1_as_baseline_per_folder(client: werkzeug_test.Client) -> None:
    body = get_json(client, "runs")
    names = {r["name"] for r in body["runs"]}
    assert {"lr/tf1", "lr/tf2", "clean/tf1", "nan/tf2"} <= names
    pairs = {p["folder"]: (p["baseline"], p["candidate"]) for p in body["pairs"]}
    assert pairs["lr"] == ("lr/tf1", "lr/tf2")
    assert body["suggested"] in body["pairs"]
    lr1 = next(r for r in body["runs"] if r["name"] == "lr/tf1")
    assert (lr1["side"], lr1["steps"], lr1["last_step"], lr1["tensors"]) == ("tf1", 20, 19, 5)


def test_summary_is_the_engine_report(client: werkzeug_test.Client) -> None:
    body = get_json(client, "summary?" + LR)
    first = body["first_divergence"]
    assert (first["step"], first["kind"], first["tensor"], first["reason"]) == (5, "lr", "learning_rate", "value")
    assert body["agree"] is False and body["steps_compared"] == 20 and body["tensors_compared"] == 5
    assert set(body["generations"]) == {"lr/tf1", "lr/tf2"}


def test_summary_policy_changes_the_verdict(client: werkzeug_test.Client) -> None:
    # issue 9: the learning rate is a hyper-parameter, held to float32 resolution whatever the training
    # tolerance; an override on lr/* loosens it
    assert get_json(client, "summary?" + LR + "&atol=1")["agree"] is False
    assert get_json(client, "summary?" + LR + "&atol=1&override=lr%2F*%3Aatol%3D1")["agree"] is True
    assert get_json(client, "summary?" + LR + "&rtol=0.5&warmup=0&override=lr%2F*%3Artol%3D0.5")["agree"] is True
    assert get_json(client, "summary?baseline=clean%2Ftf1&candidate=clean%2Ftf2")["agree"] is True


def test_matrix_buckets_without_hiding_the_first_divergence(client: werkzeug_test.Client) -> None:
    body = get_json(client, "matrix?" + LR + "&width=4")
    nb, nt = len(body["step_start"]), len(body["tensors"])
    assert nb <= 4 and nt == 5
    assert [t["tag"] for t in body["tensors"]][0] == "lr/learning_rate"  # execution order
    ratio = np.frombuffer(base64.b64decode(body["ratio"]), dtype="<f4").reshape(nb, nt)
    reason = np.frombuffer(base64.b64decode(body["reason"]), dtype=np.uint8).reshape(nb, nt)
    first = body["first"]
    assert first["step"] == 5 and first["tensor"] == 0
    assert body["step_start"][first["bucket"]] <= 5 <= body["step_end"][first["bucket"]]
    assert body["reason_codes"][reason[first["bucket"], 0]] == "value" and ratio[first["bucket"], 0] > 1
    full = get_json(client, "matrix?" + LR)
    assert len(full["step_start"]) == 20 and full["n_steps"] == 20


def test_matrix_carries_the_one_colour_scale(client: werkzeug_test.Client) -> None:
    """The dashboard colours with the scale the report uses (tests/browser/test_heat_colours.py
    compares the pixels); every reason the matrix can hold has a colour under it."""
    scale = get_json(client, "matrix?" + LR)["colour_scale"]
    assert scale == json.loads(json.dumps(colour_scale.to_dict()))
    assert scale["bad_ceiling"] == colour_scale.BAD_CEILING and scale["ok_floor"] == colour_scale.OK_FLOOR
    for theme in ("light", "dark"):
        assert {key for key, _ in scale["legend"]} | set(scale["flat"].values()) <= set(scale["palettes"][theme])


def test_tensor_series_with_values_and_diff(client: werkzeug_test.Client) -> None:
    body = get_json(client, "tensor?" + LR + "&tensor=lr%2Flearning_rate&values_at=5")
    assert body["baseline"]["steps"] == list(range(20)) and len(body["baseline"]["stats"][0]) == len(
        body["stats_fields"]
    )
    assert body["diff"]["reason"][5] == "value" and body["diff"]["reason"][4] == "ok"
    values = body["values"]
    assert values["step"] == 5 and len(values["baseline"]) == 1
    assert values["abs_diff"][0] == pytest.approx(abs(values["candidate"][0] - values["baseline"][0]))
    no_values = get_json(client, "tensor?" + LR + "&tensor=lr%2Flearning_rate")
    assert no_values["values"] is None


def test_nan_and_inf_survive_json(client: werkzeug_test.Client) -> None:
    q = "baseline=nan%2Ftf1&candidate=nan%2Ftf2"
    summary = get_json(client, "summary?" + q)
    assert summary["first_nonfinite"]["nan/tf2"] == {"step": 4, "tensor": "dense/Relu", "kind": "activation"}
    assert summary["first_nonfinite"]["nan/tf1"] is None
    body = get_json(client, "tensor?" + q + "&tensor=activation%2Fdense%2FRelu&values_at=4")
    assert body["values"]["candidate"][0] == "NaN" and body["values"]["candidate"][5] == "Infinity"
    stats = dict(zip(body["stats_fields"], body["candidate"]["stats"][4]))
    assert (stats["nan"], stats["pos_inf"]) == (1, 1)


def test_scalars_both_runs_with_diff_and_tolerance(client: werkzeug_test.Client) -> None:
    body = get_json(client, "scalars?" + LR)
    lr = body["lr"]
    assert lr["baseline"]["steps"] == list(range(20)) and len(lr["candidate"]["values"]) == 20
    diff = lr["diff"]
    assert diff["abs_diff"][4] == 0 and diff["abs_diff"][5] > diff["tolerance"][5]
    # issue 9: lr is a hyper-parameter: relative float32 resolution, atol 0, no warm-up
    b0 = abs(lr["baseline"]["values"][0])
    # one ulp of the value plus 2^-23 of the largest lr so far (the first: the schedule decays)
    assert diff["tolerance"][0] == pytest.approx(2.0**-23 * b0 + 2.0**-23 * b0) and diff["tolerance"][0] < 1e-5
    values = [abs(v) for v in lr["baseline"]["values"]]
    assert diff["tolerance"][10] == pytest.approx(2.0**-23 * values[10] + 2.0**-23 * max(values[:11]))
    assert body["loss"]["diff"]["steps"] == list(range(20))
    # the loss's band is what its verdict used: atol, the warm-up's rtol and 2^-18 of the loss itself
    loss = [abs(v) for v in body["loss"]["baseline"]["values"]]
    assert body["loss"]["diff"]["tolerance"][0] == pytest.approx(1e-5 + (1e-7 + 2.0**-18) * loss[0])


def test_html_names_come_back_verbatim(client: werkzeug_test.Client) -> None:
    body = get_json(client, "matrix?baseline=html%2Ftf1&candidate=html%2Ftf2")
    assert any(t["name"] == fx.HTML_NAME for t in body["tensors"])


@pytest.mark.parametrize(
    "route",
    [
        "summary",
        "summary?baseline=lr%2Ftf1",
        "summary?" + LR + "&atol=abc",
        "summary?" + LR + "&atol=-1",
        "summary?" + LR + "&rtol=nan",
        "summary?" + LR + "&atol=inf",
        "summary?" + LR + "&warmup=1.5",
        "summary?" + LR + "&equal_nan=maybe",
        "summary?" + LR + "&rtoll=0.1",
        "summary?" + LR + "&baseline=lr%2Ftf1",
        "summary?" + LR + "&mapping=nomapping",
        "summary?" + LR + "&override=nope",
        "summary?" + LR + "&mapping=re%3A(%3Dx",  # unbalanced regex
        "summary?" + LR + "&mapping=%3Db",  # empty OLD
        "summary?" + LR + "&mapping=re%3A(a)%3D%5C2",  # REPL names a group the regex lacks
        "summary?" + LR + "&mapping=a%3Db&mapping=a%3Dc",  # one name, two targets
        "summary?" + LR + "&mapping=a%3Dc&mapping=b%3Dc",  # two names, one target
        "summary?" + LR + "&override=*%3Aatol%3D1%2Catol%3D2",  # a setting given twice
        "summary?" + LR + "&override=re%3A(%3Aatol%3D1",
        "summary?" + LR + "&override=re%3A%5B%3Artol%3D0.1",
        "summary?" + LR + "&override=*%3Aatol%3Dinf",
        "summary?" + LR + "&override=*%3Aatol%3Dnan",
        "summary?" + LR + "&override=*%3Artol%3D-1",
        "summary?" + LR + "&override=*%3Awarmup_steps%3D-2",
        "summary?" + LR + "&override=*%3Aatol%3Dabc",
        "matrix?" + LR + "&width=0",
        "matrix?" + LR + "&width=x",
        "matrix?" + LR + "&width=100000",
        "tensor?" + LR,
        "tensor?" + LR + "&tensor=noslash",
        "tensor?" + LR + "&tensor=lr%2Flearning_rate&values_at=five",
        "runs?x=1",
    ],
)
def test_malformed_parameters_are_400_json(client: werkzeug_test.Client, route: str) -> None:
    body = get_json(client, route, code=400)
    assert isinstance(body["error"], str) and body["error"]


@pytest.mark.parametrize(
    "route",
    [
        "summary?baseline=nope&candidate=lr%2Ftf2",
        "scalars?baseline=lr%2Ftf1&candidate=nope",
        "tensor?" + LR + "&tensor=lr%2Fnope",
        "tensor?" + LR + "&tensor=lr%2Flearning_rate&values_at=999",
        # traversal: run names are looked up, never joined to a path
        "summary?baseline=..%2F..%2Fetc&candidate=lr%2Ftf2",
        "summary?baseline=%2Fetc%2Fpasswd&candidate=lr%2Ftf2",
        "summary?baseline=lr%2F..%2F..%2F..%2Fetc&candidate=lr%2Ftf2",
        "summary?baseline=%252e%252e%252fetc&candidate=lr%2Ftf2",
        "matrix?baseline=lr%2Ftf1%2F..%2F..&candidate=lr%2Ftf2",
    ],
)
def test_unknown_runs_and_tensors_are_404(client: werkzeug_test.Client, route: str) -> None:
    assert "error" in get_json(client, route, code=404)


@pytest.mark.parametrize(
    "path", ["..%2F..%2Fsetup.py", "../plugin.py", "static/index.js", "%2Fetc%2Fpasswd", "index.js/../plugin.py"]
)
def test_static_route_serves_only_the_bundle(client: werkzeug_test.Client, path: str) -> None:
    response = client.get(PREFIX + path)
    assert response.status_code == 404
    assert b"import" not in response.data


def test_data_still_arriving_is_seen_by_later_requests(tmp_path) -> None:
    root = str(tmp_path)
    fx.write_pair(root, "grow", 5)
    client = make_client(root)
    q = "baseline=grow%2Ftf1&candidate=grow%2Ftf2"
    assert get_json(client, "summary?" + q)["steps_compared"] == 5
    for side in ("tf1", "tf2"):
        fx.append_steps(os.path.join(root, "grow", side), side, 5, 12, diverge_at=8)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the background reader picks the steps up
        body = get_json(client, "summary?" + q)
        if body["steps_compared"] == 12:
            break
        time.sleep(0.2)
    assert body["steps_compared"] == 12
    assert body["first_divergence"]["step"] == 8
    assert len(get_json(client, "matrix?" + q)["step_start"]) == 12


def test_serves_with_tensorflow_absent(logdir: str) -> None:
    """A process where ``import tensorflow`` fails still loads the plugin and answers."""
    script = textwrap.dedent(
        f"""
        import sys, json
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "tensorflow" or name.startswith("tensorflow."):
                    raise ImportError("tensorflow is blocked in this test")
        sys.meta_path.insert(0, Block())
        try:
            import tensorflow
            raise SystemExit("tensorflow imported")
        except ImportError:
            pass
        from werkzeug import test as wt, wrappers
        from tensorboard import default, program
        from tensorboard.backend import application
        tb = program.TensorBoard(plugins=default.get_plugins(), assets_zip_provider=None)
        tb.configure(argv=["tensorboard", "--logdir", {logdir!r}, "--load_fast=false"])
        from tb_parity_plugin.dashboard.loader import ParityLoader
        assert any(isinstance(p, ParityLoader) for p in tb.plugin_loaders)
        provider, multiplexer = tb._make_data_provider()
        app = application.TensorBoardWSGIApp(tb.flags, tb.plugin_loaders, provider, None, multiplexer)
        client = wt.Client(app, wrappers.Response)
        r = client.get("/data/plugin/tb_parity/summary?{LR}")
        print(r.status_code, json.loads(r.data)["first_divergence"]["step"])
        print(client.get("/data/plugin/tb_parity/index.js").status_code)
        print("tensorflow" in sys.modules and sys.modules["tensorflow"] is not None)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:3] == ["200 5", "200", "False"], out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize("route", ["summary", "matrix", "tensor", "scalars"])
def test_the_same_run_as_baseline_and_candidate_is_400(client: werkzeug_test.Client, route: str) -> None:
    extra = "&tensor=lr%2Flearning_rate" if route == "tensor" else ""
    body = get_json(client, f"{route}?baseline=lr%2Ftf1&candidate=lr%2Ftf1{extra}", code=400)
    assert "same run" in body["error"]


def test_matrix_first_names_the_step_of_its_outlined_cell_after_a_structure_divergence(tmp_path) -> None:
    """A port with a state of its own diverges in structure first (at no step); the heat map
    outlines the first divergence among the steps, and a click on it opens ``first.step``. That
    step was the structure divergence's (0), where the outlined cell agrees: a helper's VAE port
    (its KL weight kept as a variable, its loss apart from step 1) opened the loss at step 0."""
    import state_port  # TensorFlow: imported by this test only

    lrs = state_port.write(str(tmp_path / "port"))
    apart = int(np.flatnonzero(lrs[0] != lrs[1])[0])  # numpy: the schedules part at step 2
    assert apart == 2
    client = make_client(str(tmp_path))
    pair = "baseline=port%2Ftf1&candidate=port%2Ftf2"
    summary = get_json(client, "summary?" + pair)
    assert summary["first_divergence"]["reason"] == "structure"
    for width in ("", "&width=2"):
        body = get_json(client, "matrix?" + pair + width)
        first = body["first"]
        assert body["tensors"][first["tensor"]]["tag"] == "lr/lr"
        assert body["step_start"][first["bucket"]] <= first["step"] <= body["step_end"][first["bucket"]]
        assert first["step"] == apart, first


@pytest.mark.parametrize("header_only", [False, True])
@pytest.mark.parametrize("route", ["summary", "matrix", "tensor", "scalars"])
def test_a_run_holding_no_records_is_refused_as_the_cli_refuses_it(tmp_path, route: str, header_only: bool) -> None:
    """A port whose event file holds nothing of ours (a writer opened and closed: only its
    file_version header, or no byte at all): ``tb-parity diff`` exits 2 "holds no tb_parity
    records", and the tab answered 200 "DIVERGE in structure", every baseline tensor "recorded by
    one run only" (trial h102, on a real pair of h97's). The tab must say what the CLI says."""
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    root = str(tmp_path)
    fx.write_pair(root, "port", 4)
    fx.write_pair(root, "other", 3)
    side = os.path.join(root, "port", "tf2")
    for name in os.listdir(side):
        os.remove(os.path.join(side, name))
    if header_only:
        EventFileWriter(side).close()  # what tf.summary writes for a run that records nothing
    else:
        open(os.path.join(side, "events.out.tfevents.0.x"), "wb").close()
    with pytest.raises(api.ParityInputError, match="holds no tb_parity records") as cli_error:
        api.compare(root, "port/tf1", "port/tf2")
    client = make_client(root)
    extra = "&tensor=lr%2Flearning_rate" if route == "tensor" else ""
    body = get_json(client, f"{route}?baseline=port%2Ftf1&candidate=port%2Ftf2{extra}", code=404)
    assert body["error"] == "Not found: " + str(cli_error.value).replace(root, "this logdir")
    assert get_json(client, "summary?baseline=other%2Ftf1&candidate=other%2Ftf2")["verdict"] == "agree"
