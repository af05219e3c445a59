"""Multi-replica runs: a TF2 port under MirroredStrategy on two logical CPUs against a one-device TF1 run.

Every expectation is checked against the numpy reference of tests/replica_runs.py first (what
one device computes in float64), then the tool's verdict against that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import replica_runs as rr
from keras3_process import run_keras3

from tb_parity_plugin import api
from tb_parity_plugin.logdir.reader import LogdirReader

VARIANTS = (
    "faithful",
    "local_mean",
    "unsynced",
    "unsynced_var",
    "momentum",
    "unbuilt_momentum",
    "interleaved",
    "local_batch",
    "mean_recorded",
    "fit",
    "fit_momentum",
    "fit_sum",
)
BN_VARIANTS = ("bn_synced", "bn_unsynced")
ALONE = (*BN_VARIANTS, "local_results", "fit_two_outputs")  # TF2 runs with no TF1 baseline beside them


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``<variant>/{tf1,tf2}`` per variant; each run written by its own process (logical devices)."""
    root = tmp_path_factory.mktemp("replicas")
    script = os.path.join(os.path.dirname(__file__), "replica_runs.py")
    jobs = {"tf1": str(root / "_tf1"), "tf1_momentum": str(root / "_tf1_momentum")}
    jobs |= {v: str(root / v / "tf2") for v in VARIANTS}
    jobs |= {v: str(root / v / "tf2") for v in ALONE}
    procs = [
        subprocess.Popen([sys.executable, script, path, which], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for which, path in jobs.items()
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
    for v in VARIANTS:
        shutil.copytree(jobs["tf1_momentum" if v.endswith("momentum") else "tf1"], root / v / "tf1")
    return str(root)


def series(logdir: str, variant: str, run: str, kind: str, name: str) -> Any:
    """The series, with ``values`` shaped ``[steps, *shape]`` (the reader keeps them flat)."""
    with LogdirReader(os.path.join(logdir, variant)) as reader:
        s = reader.run(run).tensors[(kind, name)]
    s.values = s.values.reshape(len(s.steps), *s.shape)
    return s


def test_the_runs_compute_what_numpy_says(logdir: str) -> None:
    ref = rr.numpy_reference()
    tf1 = series(logdir, "faithful", "tf1", "grad", "dense/kernel:0")
    tf2 = series(logdir, "faithful", "tf2", "grad", "dense/kernel:0")
    bad = series(logdir, "local_mean", "tf2", "grad", "dense/kernel:0")
    for step in range(rr.STEPS):
        np.testing.assert_allclose(tf1.values[step], ref["grad_kernel"][step], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(tf2.values[step], ref["grad_kernel"][step], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bad.values[0], 2 * ref["grad_kernel"][0], rtol=1e-5, atol=1e-6)  # the porting bug
    kernel = series(logdir, "faithful", "tf2", "weight", "dense/kernel:0")
    np.testing.assert_allclose(kernel.values[0], ref["kernel"][0], rtol=1e-6)  # read before the update
    np.testing.assert_allclose(kernel.values[2], ref["kernel"][2], rtol=1e-5, atol=1e-6)


def test_a_run_says_how_many_replicas_it_had(logdir: str) -> None:
    with LogdirReader(os.path.join(logdir, "faithful")) as reader:
        assert reader.run("tf2").info["replicas"] == 2
        assert "replicas" not in reader.run("tf1").info or reader.run("tf1").info["replicas"] == 1
        names = {s.name for s in reader.run("tf2").tensors.values() if s.kind == "grad"}
    assert {"dense/kernel:0", "dense/kernel:0@replica0", "dense/kernel:0@replica1"} <= names


def test_per_replica_copies_hold_each_replicas_own_values(logdir: str) -> None:
    """Local gradients sum to the all-reduced one; activations are the two halves of the global batch."""
    grads = [series(logdir, "faithful", "tf2", "grad", f"dense/kernel:0@replica{k}").values for k in (0, 1)]
    total = series(logdir, "faithful", "tf2", "grad", "dense/kernel:0").values
    np.testing.assert_allclose(grads[0] + grads[1], total, rtol=1e-6, atol=1e-7)
    assert not np.allclose(grads[0], grads[1])
    halves = [series(logdir, "faithful", "tf2", "activation", f"logits@replica{k}").values for k in (0, 1)]
    logits = series(logdir, "faithful", "tf2", "activation", "logits").values
    np.testing.assert_array_equal(np.concatenate(halves, axis=1), logits)
    assert halves[0].shape[1:] == (rr.BATCH // 2, rr.CLASSES) and logits.shape[1:] == (rr.BATCH, rr.CLASSES)


def test_a_faithful_port_under_mirrored_strategy_agrees(logdir: str) -> None:
    report = api.compare(os.path.join(logdir, "faithful"))
    assert report.agree, report.first_divergence
    assert report.steps_compared == rr.STEPS
    assert report.replicas["tf2"]["count"] == 2 and not report.replicas["tf2"]["disagreements"]
    assert not report.unmatched["tf2"]  # per-replica copies are not unmatched tensors
    assert report.to_dict()["replicas"]["tf2"]["count"] == 2


def test_a_momentum_slot_under_mirrored_strategy_is_recorded_in_lr_units(logdir: str) -> None:
    """Keras SGD keeps momentum as -lr x TF1's accumulator; the shim records it divided by -lr, and
    under MirroredStrategy it recorded the raw mirrored slot: a new user's faithful port diverged
    at step 1 on the slot with cosine -1. numpy's accumulator first, then the verdict."""
    ref = rr.numpy_reference(rr.MOMENTUM)
    tf2 = series(logdir, "momentum", "tf2", "slot", "m/dense/kernel")
    tf1 = series(logdir, "momentum", "tf1", "slot", "dense/kernel/Momentum:0")
    for step in range(rr.STEPS):
        np.testing.assert_allclose(tf1.values[step], ref["accum"][step], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(tf2.values[step], ref["accum"][step], rtol=1e-5, atol=1e-6)
    report = api.compare(os.path.join(logdir, "momentum"))
    assert report.agree, report.first_divergence
    assert {m["kind"] for m in report.to_dict()["mapping"]} >= {"slot"}


def test_slots_the_recorder_builds_under_mirrored_strategy_are_mirrored(logdir: str) -> None:
    """The TF guide's custom loop leaves its optimizer unbuilt until ``apply_gradients`` inside
    ``strategy.run``; ``rec.slots`` (and ``rec.step(..., optimizer=)``) builds it around
    ``strategy.run``, where no strategy is current: the slots were plain variables, which each replica
    updated in turn, so the recorder changed the training (a new user's faithful port: momentum 1.9
    times TF1's after one step, the replicas' weights apart). numpy's weights and accumulator first."""
    ref = rr.numpy_reference(rr.MOMENTUM)
    slot = series(logdir, "unbuilt_momentum", "tf2", "slot", "m/dense/kernel")
    kernel = series(logdir, "unbuilt_momentum", "tf2", "weight", "dense/kernel:0")
    for step in range(rr.STEPS):
        np.testing.assert_allclose(slot.values[step], ref["accum"][step], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(kernel.values[step], ref["kernel"][step], rtol=1e-5, atol=1e-6)
    for k in range(2):  # a mirrored slot: each replica's copy, the same as the single copy
        copy = series(logdir, "unbuilt_momentum", "tf2", "slot", f"m/dense/kernel@replica{k}")
        np.testing.assert_allclose(copy.values, slot.values, rtol=1e-6, atol=1e-7)
    report = api.compare(os.path.join(logdir, "unbuilt_momentum"))
    assert report.agree, report.first_divergence
    assert not report.replicas["tf2"]["disagreements"]


def test_a_batch_dealt_to_the_replicas_in_another_order_is_named_so(logdir: str) -> None:
    """A global batch dealt to the replicas row by row (a dataset sharded by element) trains as TF1
    does, but its logits, recorded as the replicas' parts concatenated, hold the batch's rows in
    another order: a new user's port was told "another batch" (Keras fit's shuffling) though its
    loss and gradients agreed at every step. numpy first: the rows, the loss and the gradient."""
    ref = rr.numpy_reference()
    x, _, w0 = rr.data()
    tf1 = series(logdir, "faithful", "tf1", "activation", "logits").values[0]
    port = series(logdir, "interleaved", "tf2", "activation", "logits").values[0]
    dealt = [*range(0, rr.BATCH, 2), *range(1, rr.BATCH, 2)]
    np.testing.assert_allclose(tf1, x[: rr.BATCH] @ w0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(port, (x[: rr.BATCH] @ w0)[dealt], rtol=1e-5, atol=1e-6)
    for step in range(rr.STEPS):
        grad = series(logdir, "interleaved", "tf2", "grad", "dense/kernel:0").values[step]
        loss = series(logdir, "interleaved", "tf2", "loss", "loss").values[step]
        np.testing.assert_allclose(grad, ref["grad_kernel"][step], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loss, ref["loss"][step], rtol=1e-5, atol=1e-6)
    first = api.compare(os.path.join(logdir, "interleaved")).first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "logits")
    assert "its 8 rows are the same rows in another order (6 of them moved" in first.note
    assert "the loss and every gradient recorded at this step agree: the step trains the same" in first.note
    assert "a global batch dealt to the replicas otherwise than experimental_distribute_dataset" in first.note
    assert "another batch" not in first.note


def test_a_loss_divided_by_each_replicas_batch_is_named_with_the_replica_count(logdir: str) -> None:
    """``compute_average_loss(..., global_batch_size=)`` given the per-replica batch: the loss and the
    gradient are twice the one-device ones. A new user's port was told only "the loss is computed
    differently (reduction, from_logits, label smoothing, ...)". numpy first."""
    ref = rr.numpy_reference()
    loss = series(logdir, "local_batch", "tf2", "loss", "loss").values[0]
    grad = series(logdir, "local_batch", "tf2", "grad", "dense/kernel:0").values[0]
    np.testing.assert_allclose(loss, 2 * ref["loss"][0], rtol=1e-5)
    np.testing.assert_allclose(grad, 2 * ref["grad_kernel"][0], rtol=1e-5, atol=1e-6)
    first = api.compare(os.path.join(logdir, "local_batch")).first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "loss", "loss")
    assert "'tf2' ran 2 replicas and its loss is 2 times that of 'tf1'" in first.note
    assert "global_batch_size= the per-replica batch" in first.note


def test_a_loss_recorded_as_each_replicas_mean_is_not_told_the_gradient_is_scaled(logdir: str) -> None:
    """A port that trains on ``compute_average_loss`` over the global batch but records each replica's
    ``reduce_mean`` summed: the recorded loss is twice TF1's, the gradient TF1's. The note said the
    all-reduce gave "2 times the one-device gradient", which the recorded gradients refute. numpy first."""
    ref = rr.numpy_reference()
    for step in range(rr.STEPS):
        loss = series(logdir, "mean_recorded", "tf2", "loss", "loss").values[step]
        grad = series(logdir, "mean_recorded", "tf2", "grad", "dense/kernel:0").values[step]
        kernel = series(logdir, "mean_recorded", "tf2", "weight", "dense/kernel:0").values[step]
        np.testing.assert_allclose(loss, 2 * ref["loss"][step], rtol=1e-5)
        np.testing.assert_allclose(grad, ref["grad_kernel"][step], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(kernel, ref["kernel"][step], rtol=1e-5, atol=1e-6)
    first = api.compare(os.path.join(logdir, "mean_recorded")).first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "loss", "loss")
    assert "'tf2' ran 2 replicas and its loss is 2 times that of 'tf1'" in first.note, first.note
    assert "only the recorded loss is scaled, not what trains" in first.note, first.note
    assert "times the one-device gradient" not in first.note, first.note


#: the TF1 baseline's running statistics, which the fit ports do not keep
_RUNNING = ("weight/running_mean:0", "weight/running_var:0")


@pytest.mark.parametrize("variant", ["fit", "fit_momentum"])
def test_keras_fit_under_mirrored_strategy_is_recorded_across_replicas_and_agrees(logdir: str, variant: str) -> None:
    """``instrument`` refused ``fit`` under MirroredStrategy, so a port trained so had to be rewritten
    as a custom loop to be checked: another program than the user's. It now records across the
    replicas (a ``merge_call`` opens the step before the forward pass and closes it before the update).
    numpy first: the weights before each step, the all-reduced gradient (the replicas' halves summed),
    the loss, the logits as the halves concatenated, and with momentum TF1's accumulator."""
    momentum = rr.MOMENTUM if variant == "fit_momentum" else 0.0
    ref = rr.numpy_reference(momentum)
    x = rr.data()[0].astype(np.float64)
    kernel = series(logdir, variant, "tf2", "weight", "dense/kernel:0").values
    grad = series(logdir, variant, "tf2", "grad", "dense/kernel:0").values
    halves = [series(logdir, variant, "tf2", "grad", f"dense/kernel:0@replica{k}").values for k in (0, 1)]
    loss = series(logdir, variant, "tf2", "loss", "loss").values
    logits = series(logdir, variant, "tf2", "activation", "logits").values
    for step in range(rr.STEPS):
        np.testing.assert_allclose(kernel[step], ref["kernel"][step], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad[step], ref["grad_kernel"][step], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(halves[0][step] + halves[1][step], ref["grad_kernel"][step], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loss[step], ref["loss"][step], rtol=1e-5)
        xb = x[step * rr.BATCH : (step + 1) * rr.BATCH]
        np.testing.assert_allclose(logits[step], xb @ ref["kernel"][step] + ref["bias"][step], rtol=1e-5, atol=1e-6)
    assert not np.allclose(halves[0], halves[1])  # each replica's own half of the batch
    if momentum:
        accum = series(logdir, variant, "tf2", "slot", "m/dense/kernel").values
        for step in range(rr.STEPS):
            np.testing.assert_allclose(accum[step], ref["accum"][step], rtol=1e-5, atol=1e-6)
    report = api.compare(os.path.join(logdir, variant), allow_unmatched=_RUNNING)
    assert report.agree, (report.first_divergence, report.warnings)
    assert report.steps_compared == rr.STEPS and report.replicas["tf2"]["count"] == 2


def test_a_fit_loss_summed_over_the_batch_under_mirrored_strategy_diverges_on_the_gradient(logdir: str) -> None:
    """``reduction="sum"``: Keras scales only a mean loss for the replicas, so the all-reduced
    gradient is the global batch's sum, 8 times the one-device mean's (numpy), found at step 0."""
    ref = rr.numpy_reference()
    grad = series(logdir, "fit_sum", "tf2", "grad", "dense/kernel:0").values
    np.testing.assert_allclose(grad[0], rr.BATCH * ref["grad_kernel"][0], rtol=1e-5, atol=1e-5)
    report = api.compare(os.path.join(logdir, "fit_sum"), allow_unmatched=_RUNNING)
    first = report.first_divergence
    assert first is not None and first.step == 0 and first.kind in ("loss", "grad"), first
    grads = [d for d in report.divergences_at_first_step if d.kind == "grad" and d.tensor == "dense/kernel:0"]
    assert grads and grads[0].max_rel_diff == pytest.approx(rr.BATCH - 1, rel=1e-3), grads


def test_a_layer_of_two_outputs_is_recorded_under_fit_with_mirrored_strategy(logdir: str) -> None:
    """A review: each replica names a multi-output layer's outputs (``two/0``) itself, and passed
    through ``merge_call`` the names became a PerReplica of strings: fit raised "name must be a
    non-empty string". numpy: ``2 x`` and ``x + 1`` of each global batch, each replica its half."""
    x = rr.data()[0]
    doubled = series(logdir, "fit_two_outputs", "tf2", "activation", "two/0").values
    shifted = series(logdir, "fit_two_outputs", "tf2", "activation", "two/1").values
    first_half = series(logdir, "fit_two_outputs", "tf2", "activation", "two/0@replica0").values
    assert len(doubled) == rr.STEPS
    for step in range(rr.STEPS):
        xb = x[step * rr.BATCH : (step + 1) * rr.BATCH]
        np.testing.assert_allclose(doubled[step], 2 * xb, rtol=1e-6)
        np.testing.assert_allclose(shifted[step], xb + 1, rtol=1e-6)
        np.testing.assert_allclose(first_half[step], 2 * xb[: rr.BATCH // 2], rtol=1e-6)


def test_a_fit_that_fails_under_mirrored_strategy_leaves_no_step_open(tmp_path: Any) -> None:
    """A review: an error between the merge_call that opens the step and the one that closes it (a
    loss that cannot take the labels, raised while fit traces) left the recorder in the step, so a
    ``predict`` then raised in the instrumented layer and, compiled again, the next ``fit`` raised
    "recorder.step() does not nest". The step closes with the error, as on one device."""
    import tensorflow as tf

    from tb_parity_plugin import summary_v2

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))
    with strategy.scope():
        inputs = tf.keras.Input((3,))
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(2, kernel_initializer="ones", name="dense")(inputs))
        model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    summary_v2.instrument(model, rec, layers=["dense"])
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    with pytest.raises(ValueError, match="Dimensions must be equal"):
        model.fit(x, np.ones((4, 3), np.float32), batch_size=4, verbose=0)  # labels of the wrong width
    assert not rec.recording
    np.testing.assert_allclose(model.predict(x, verbose=0), np.repeat(x.sum(1, keepdims=True), 2, 1))
    with strategy.scope():
        model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    summary_v2.instrument(model, rec)
    model.fit(x, np.zeros((4, 2), np.float32), batch_size=4, verbose=0)
    rec.close()
    with LogdirReader(str(tmp_path)) as reader:
        loss = reader.run("tf2").tensors[("loss", "loss")]
    np.testing.assert_allclose(loss.values.ravel(), [np.mean(x.sum(1) ** 2)], rtol=1e-6)  # the kernel of ones


def test_a_loss_not_scaled_for_the_global_batch_diverges_on_the_gradient_at_step_0(logdir: str) -> None:
    report = api.compare(os.path.join(logdir, "local_mean"))
    first = report.first_divergence
    assert first is not None and (first.step, first.kind) == (0, "grad"), first
    assert first.max_rel_diff == pytest.approx(1.0, rel=1e-3)  # twice the one-device gradient
    assert not any(d.kind == "loss" for d in report.divergences_at_first_step)  # the loss, as a mean, agrees


def test_a_replica_out_of_sync_is_its_own_finding(logdir: str) -> None:
    report = api.compare(os.path.join(logdir, "unsynced"))
    first = report.first_divergence
    assert first is not None and first.reason == "replica" and first.tensor == "running_mean:0"
    assert first.step == 1  # equal at step 0 (zeros), apart after each replica's own update
    assert "not in sync" in (first.note or "")
    assert report.replicas["tf2"]["disagreements"][0]["candidate_tensor"].startswith("running_mean:0@replica")
    assert report.first_step_divergence is None or report.first_step_divergence.reason != "value"


def test_replicas_out_of_sync_are_held_to_the_warm_up_tolerance(logdir: str) -> None:
    """A new user's moving variance near 1, updated per replica: about 1% apart, which the warm-up's
    rtol (1e-7) flags and the 5% after it does not. The check once used the 5% at every step."""
    single = series(logdir, "unsynced_var", "tf2", "weight", "running_var:0").values
    copies = [series(logdir, "unsynced_var", "tf2", "weight", f"running_var:0@replica{k}").values for k in (0, 1)]
    one_device = series(logdir, "unsynced_var", "tf1", "weight", "running_var:0").values
    np.testing.assert_allclose(single, one_device, rtol=1e-6)  # the single copy is the one-device value
    np.testing.assert_array_equal(copies[0][0], single[0])  # step 0: all ones
    gap = np.abs(copies[0][1] - single[1])  # numpy: past the warm-up's tolerance, within the later 5%
    assert (gap > 1e-5 + 1e-7 * np.abs(single[1])).any() and (gap < 0.05 * np.abs(single[1])).all(), gap
    report = api.compare(os.path.join(logdir, "unsynced_var"))
    first = report.first_divergence
    assert first is not None and (first.reason, first.tensor, first.step) == ("replica", "running_var:0", 1), first
    assert [d["tensor"] for d in report.replicas["tf2"]["disagreements"]] == ["running_var:0"]


def test_a_per_replica_loss_needs_its_reduction() -> None:
    import tensorflow as tf

    from tb_parity_plugin import summary_v2

    with pytest.raises(ValueError, match="reduction='sum'"):
        summary_v2.combine_replicas([tf.constant(1.0), tf.constant(2.0)], None, "loss/'loss'")


def test_the_cli_and_the_report_name_the_replicas(logdir: str, tmp_path: Any, capsys: Any) -> None:
    from tb_parity_plugin import cli

    assert cli.main(["diff", os.path.join(logdir, "unsynced")]) == 1
    out = capsys.readouterr().out
    assert "replicas: 'tf2' ran 2 replicas" in out and "out of sync: weight/running_mean:0 from step 1" in out
    html = tmp_path / "r.html"
    assert cli.main(["report", os.path.join(logdir, "unsynced"), "-o", str(html)]) == 1
    assert "ran 2 replicas" in html.read_text()


def test_a_replica_count_that_changes_mid_run_is_a_warning_naming_the_tensor(tmp_path: Any) -> None:
    """Written with the pure-numpy writer: two replicas for steps 0-1, four from step 2 on."""
    from tb_parity_plugin.records.writer import BlockWriter

    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    for side in ("tf1", "tf2"):
        writer = BlockWriter(str(tmp_path / side), side=side)
        for step in range(4):
            arrays = [("weight", "dense/kernel:0", w)]
            if side == "tf2":
                arrays += [("weight", f"dense/kernel:0@replica{k}", w) for k in range(2 if step < 2 else 4)]
            writer.write_arrays(step, arrays)
        writer.close()
    report = api.compare(str(tmp_path))
    assert report.agree  # every copy holds the single copy's value
    (warning,) = [w for w in report.warnings if "replica count changed" in w]
    assert "weight/dense/kernel:0" in warning and "replicas 2, 3" in warning
    assert report.replicas["tf2"]["count"] == 4 and report.replicas["tf2"]["warnings"] == [warning]


def test_the_tensor_route_shows_one_replica_or_the_reduction(logdir: str) -> None:
    import json

    from test_plugin_routes import make_client
    from werkzeug import test as werkzeug_test

    client: werkzeug_test.Client = make_client(os.path.join(logdir, "faithful"))
    route = "/data/plugin/tb_parity/tensor?baseline=tf1&candidate=tf2&tensor=grad/dense/kernel:0&values_at=0"
    whole = json.loads(client.get(route).get_data())
    one = json.loads(client.get(route + "&replica=1").get_data())
    local = series(logdir, "faithful", "tf2", "grad", "dense/kernel:0@replica1").values[0]
    assert whole["replicas"] == 2 and whole["replica"] is None and one["replica"] == 1
    np.testing.assert_allclose(np.array(one["values"]["candidate"], dtype=np.float32).reshape(local.shape), local)
    assert one["diff"]["reason"] == whole["diff"]["reason"]  # the verdict is the one-device value's
    assert client.get(route + "&replica=2").status_code == 404
    bad = client.get(route + "&replica=one")
    assert bad.status_code == 400 and "replica" in json.loads(bad.get_data())["error"]


def test_recording_inside_a_replica_context_says_what_records_instead(tmp_path: Any) -> None:
    """A new user's recipe for a model with its own ``train_step`` (``rec.step`` inside it) under
    ``fit`` with a MirroredStrategy: fit runs the step once per replica, and the error said
    "recorder.step() does not nest" (nothing was nested) or "outside strategy.run" (the user never
    called it). Both now say that the step runs per replica and what records instead."""
    import tensorflow as tf

    from tb_parity_plugin import summary_v2

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    rec = summary_v2.Recorder(str(tmp_path / "tf2"))

    class OwnStep(tf.keras.Model):
        def train_step(self, data):  # type: ignore[no-untyped-def]
            x, y = data
            with rec.step(self.optimizer.iterations):
                with tf.GradientTape() as tape:
                    loss = self.compiled_loss(y, self(x, training=True))
                rec.loss(loss)
                grads = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {"loss": loss}

    with strategy.scope():
        inputs = tf.keras.Input((3,))
        model = OwnStep(inputs, tf.keras.layers.Dense(1)(inputs))
        model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    x, y = np.ones((4, 3), np.float32), np.ones((4, 1), np.float32)
    with pytest.raises(RuntimeError, match="once per replica.*around strategy.run"):
        model.fit(x, y, batch_size=4, verbose=0)

    def custom_step() -> None:  # the same mistake in a custom loop: the recorder entered inside strategy.run
        with rec.step(0):
            rec.loss(tf.constant(1.0))

    with pytest.raises(RuntimeError, match="once per replica"):
        strategy.run(custom_step)

    # The step entered around strategy.run, an intermediate recorded inside the replica function:
    # refused as "logged twice in one step; give each a distinct name" (a reviewer recorded it once)
    with pytest.raises(RuntimeError, match="activation/'h'.*return what to record from the replica function"):
        with rec.step(0):
            strategy.run(lambda: rec.activation("h", tf.constant([1.0, 2.0])))
    rec.close()


@pytest.mark.parametrize("variant", BN_VARIANTS)
def test_a_real_batch_norms_replica_copies_are_in_sync_only_when_synchronized(logdir: str, variant: str) -> None:
    """A review: per-replica moving means of small activations (1e-6) were within the training atol,
    so an unsynchronized batch norm looked synchronized and the note naming it was withheld. With
    real ``BatchNormalization``, synchronized copies are the same bits at every step, and
    unsynchronized ones are apart by a share of their own size (numpy on the recorded copies), which
    :func:`replicas.kept_in_sync` tells apart though the gap is under atol 1e-5."""
    from tb_parity_plugin.engine import replicas

    with LogdirReader(os.path.join(logdir, variant)) as reader:
        single, found = replicas.split(reader.run("tf2"))
    key = ("state", "batch_normalization/moving_mean:0")
    mean = single.tensors[key].values.reshape(rr.STEPS, -1).astype(np.float64)
    copies = [c.values.reshape(rr.STEPS, -1).astype(np.float64) for c in found.copies[key]]
    assert len(copies) == 2
    gap = max(np.abs(c - mean).max() for c in copies)
    # numpy: the step-1 moving mean is 0.01 x the batch mean (inputs of size 1e-4), the whole
    # batch's when synchronized, each half's otherwise
    x = rr.bn_data()[: rr.BATCH]
    whole, halves = 0.01 * x.mean(0), [0.01 * x[: rr.BATCH // 2].mean(0), 0.01 * x[rr.BATCH // 2 :].mean(0)]
    np.testing.assert_allclose(mean[1], whole, rtol=1e-5, atol=1e-12)
    keys = [k for k in found.copies if k[0] == "state"]
    if variant == "bn_synced":
        assert gap == 0.0
        for copy in copies:
            np.testing.assert_array_equal(copy, mean)
        assert replicas.kept_in_sync(single, found, keys) is True
    else:
        for copy, half in zip(copies, halves):
            np.testing.assert_allclose(copy[1], half, rtol=1e-5, atol=1e-12)
        assert 0.1 * np.abs(mean).max() < gap < 1e-5  # apart by a share of itself, within the training atol
        assert replicas.kept_in_sync(single, found, keys) is False


@pytest.mark.parametrize("width", [4, 5000])
def test_the_replicas_line_says_when_copies_were_compared_by_statistics(width: int) -> None:
    """A replica copy too large for full values is compared by what its statistics prove: the
    replicas line said "out of sync from step 1" as if element-wise. It now says "(by statistics)"
    there, and the finding's evidence is statistics; a small copy's is its values."""
    from engine_helpers import run as make_run
    from engine_helpers import series as make_series

    from tb_parity_plugin.engine import Comparison
    from tb_parity_plugin.engine.replicas import describe
    from tb_parity_plugin.records import metadata

    kept = width <= 4096
    single = [np.full(width, 1.0, np.float32), np.full(width, 0.5, np.float32)]
    apart = [single[0], single[1] * np.float32(1.5)]  # numpy: the copy's mean is 1.5x the single copy's
    tensors = [make_series("weight", "w", single, keep_values=kept)]
    base = make_run("tf1", tensors)
    cand = make_run(
        "tf2",
        [
            *tensors,
            make_series("weight", "w" + metadata.REPLICA_MARK + "0", single, keep_values=kept),
            make_series("weight", "w" + metadata.REPLICA_MARK + "1", apart, keep_values=kept),
        ],
    )
    cand.info["replicas"] = 2
    report = Comparison(base, cand).report()
    (found,) = report.replicas["tf2"]["disagreements"]
    assert (found["step"], found["evidence"]) == (1, "values" if kept else "statistics"), found
    line = describe(report.to_dict()["replicas"])[0]
    assert ("out of sync: weight/w from step 1 (by statistics)" in line) == (not kept), line
    assert ("by statistics" in found["note"]) == (not kept), found["note"]


def test_the_replicas_parts_as_a_list_are_refused_and_a_list_on_one_device_is_recorded(logdir: str) -> None:
    """A review: ``rec.loss(strategy.experimental_local_results(loss))`` without ``reduction=``
    was stacked into a vector of the replicas' parts. Tensors on two devices are refused, naming
    it; a metric per head given as a list on one device is recorded as one value per head, as
    summary_v1 records it."""
    with open(os.path.join(logdir, "local_results", "tf2", "refused.txt")) as f:
        refused = f.read()
    assert "loss/'local'" in refused and "got a tuple of 2, as from experimental_local_results" in refused
    with LogdirReader(os.path.join(logdir, "local_results")) as reader:
        run = reader.run("tf2")
        assert ("loss", "local") not in run.tensors
        heads = run.tensors[("metric", "heads")]
        np.testing.assert_array_equal(heads.values.reshape(len(heads.steps), -1)[0], [0.25, 0.5])


_KERAS3_BN = """
import os, sys
import numpy as np
import tensorflow as tf
(cpu,) = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tb_parity_plugin import summary_v2
assert not keras.__version__.startswith("2."), keras.__version__
with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(name="bn")])
    model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=False)
rec = summary_v2.Recorder(sys.argv[1])
summary_v2.instrument(model, rec)
x = np.load(sys.argv[2])
model.fit(x, x, batch_size=len(x) // 2, epochs=1, shuffle=False, verbose=0)
rec.close()
"""


def test_a_keras_3_variables_replica_copies_are_recorded(tmp_path: Any) -> None:
    """A new user's Keras 3 CNN port under fit with MirroredStrategy: a Keras 3 variable wraps its
    mirrored tf.Variable, so only the replica 0 copy was recorded and its BatchNormalization
    (synchronized=False), whose moving mean each replica updates from its own half of the batch, was
    said to have "every variable's copies agree". numpy: each copy is its own half's update."""
    x = np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32)
    x[4:8] += 5.0  # the second replica's half of the first batch
    np.save(tmp_path / "x.npy", x)
    run_keras3(["-c", _KERAS3_BN, str(tmp_path / "tf2"), str(tmp_path / "x.npy")], timeout=600)
    with LogdirReader(str(tmp_path)) as reader:
        tensors = reader.run("tf2").tensors
    copies = [tensors[("state", f"sequential/bn/moving_mean@replica{k}")].values.reshape(-1, 3) for k in (0, 1)]
    for k, half in enumerate((x[0:4], x[4:8])):
        np.testing.assert_allclose(copies[k][1], 0.01 * half.mean(0), rtol=1e-5)  # before step 1
    single = tensors[("state", "sequential/bn/moving_mean")].values.reshape(-1, 3)
    np.testing.assert_allclose(single[1], 0.01 * x[0:4].mean(0), rtol=1e-5)  # the first copy, as Keras reads it
