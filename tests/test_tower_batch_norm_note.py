"""A TF1 multi-tower original that runs its first tower's ``UPDATE_OPS`` alone, against its
``MirroredStrategy`` port with a plain ``BatchNormalization``: both normalize each half of the batch
alone and train alike, but TF1's moving mean averages the first tower's half and the port's (its
replicas' copies, read as their mean) the whole batch. A trial's port was told at step 1 of
"batch normalization's momentum" (0.99 in both runs) or of "inputs no recorded tensor shows",
though the layer's input was recorded. Its port with ``BatchNormalization(synchronized=True)``
normalizes the whole batch where the towers normalize each half: it diverges at step 0 on the batch
norm's output, and was told of an activation, padding, epsilon or a training flag. Real TensorFlow
(tests/tower_runs.py), numpy first. An original that runs every tower's ``UPDATE_OPS`` updates the
moving mean once per tower in no set order (itself not deterministic): it was told of momenta 0.99
against 0.995 when both updates read the same value.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tower_runs as tr

from tb_parity_plugin import compare
from tb_parity_plugin.logdir.reader import LogdirReader


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``tf1``, ``tf1_all_updates``, ``tf2``, ``tf2_synced``, ``tf2_inference`` and ``tf2_momentum``, each
    written by its own process (logical devices)."""
    root = tmp_path_factory.mktemp("towers")
    script = os.path.join(os.path.dirname(__file__), "tower_runs.py")
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(root / which), which],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        for which in ("tf1", "tf1_all_updates", "tf2", "tf2_synced", "tf2_inference", "tf2_momentum")
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
    return str(root)


def _values(logdir: str, run: str, kind: str, name: str) -> np.ndarray:
    with LogdirReader(logdir) as reader:
        s = reader.run(run).tensors[(kind, name)]
    return s.values.reshape(len(s.steps), -1).astype(np.float64)  # flat per step: the batch is None


def test_the_towers_and_the_replicas_train_alike_and_average_other_rows(logdir: str) -> None:
    ref = tr.reference()
    for run in ("tf1", "tf2"):
        np.testing.assert_allclose(_values(logdir, run, "activation", "hidden")[0], ref["hidden"].ravel(), atol=1e-5)
        np.testing.assert_allclose(_values(logdir, run, "activation", "bn")[0], ref["bn"].ravel(), atol=1e-4)
    for name in ("hidden/kernel:0", "bn/gamma:0", "bn/beta:0", "logits/kernel:0", "logits/bias:0"):
        np.testing.assert_allclose(
            _values(logdir, "tf1", "weight", name), _values(logdir, "tf2", "weight", name), rtol=1e-5, atol=1e-6
        )
    mean = "bn/moving_mean:0"
    np.testing.assert_allclose(_values(logdir, "tf1", "state", mean)[1], ref["mean_first_tower"], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(_values(logdir, "tf2", "state", mean)[1], ref["mean_whole"], rtol=1e-5, atol=1e-8)
    assert np.abs(ref["mean_first_tower"] - ref["mean_whole"]).max() > 1e-3


def test_a_moving_mean_of_the_first_towers_rows_alone_is_named_so(logdir: str) -> None:
    first = compare(logdir, baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "state", "bn/moving_mean:0"), first
    note = first.note or ""
    assert "'tf1' (momentum 0.99) from the mean of rows 0-3 alone (share 1 of 2) of hidden" in note, note
    assert "'tf2' (momentum 0.99) from the mean of all 8 rows of it" in note, note
    assert "first tower's UPDATE_OPS" in note, note
    assert "its update rule differs" not in note and "no recorded tensor shows" not in note, note


def test_a_synchronized_port_of_towers_normalizing_each_half_is_told_which_rows_each_normalizes(logdir: str) -> None:
    ref = tr.reference()
    assert np.abs(ref["bn"] - ref["bn_whole"]).max() > 0.1  # numpy: the halves' statistics move the output
    np.testing.assert_allclose(
        _values(logdir, "tf2_synced", "activation", "hidden")[0], ref["hidden"].ravel(), atol=1e-5
    )
    np.testing.assert_allclose(_values(logdir, "tf2_synced", "activation", "bn")[0], ref["bn_whole"].ravel(), atol=1e-4)
    first = compare(logdir, baseline="tf1", candidate="tf2_synced").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "bn"), first
    note = first.note or ""
    assert "'tf1' normalizes each of 2 shares of 4 rows alone" in note, note
    assert "'tf2_synced' normalizes the whole batch of 8 rows at once" in note, note
    assert "affine function of hidden" in note and "TF1 multi-tower code" in note, note
    assert "padding" not in note, note


def test_a_moving_mean_updated_once_per_tower_is_named_so(logdir: str) -> None:
    ref = tr.reference()
    got = _values(logdir, "tf1_all_updates", "state", "bn/moving_mean:0")[1]
    # numpy: one of the three orders TF1 may run the towers' updates in, each apart from the port's
    assert min(np.abs(got - want).max() for want in ref["mean_all_towers"]) < 1e-7, got
    assert min(np.abs(ref["mean_whole"] - want).max() for want in ref["mean_all_towers"]) > 1e-3
    first = compare(logdir, baseline="tf1_all_updates", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "state", "bn/moving_mean:0"), first
    note = first.note or ""
    assert "'tf1_all_updates' (momentum 0.99) 2 times, once from the mean of each 4 rows of hidden" in note, note
    assert "'tf2' (momentum 0.99) from the mean of all 8 rows of it" in note, note
    assert "every tower's UPDATE_OPS once per tower, in no set order" in note, note
    assert "0.995" not in note and "its update rule differs" not in note, note


def test_a_port_in_inference_mode_against_towers_is_told_its_moving_statistics_stayed_put(logdir: str) -> None:
    """The port's loop calls the model without training=True: its batch norm normalizes with the moving
    statistics (0 and 1 at step 0), an affine function of its input over the whole batch, as a whole batch
    normalized at once is, but averaging elsewhere than beta. It was told it "normalizes the whole batch of 8
    rows at once" and "the runs take the batch statistics over other rows", and not that its moving mean
    stayed put. numpy: its output is hidden / sqrt(1 + epsilon), whose channel means are not 0 (beta)."""
    ref = tr.reference()
    inference = ref["hidden"] / np.sqrt(1.0 + tr.EPSILON)
    assert np.abs(inference.mean(0)).max() > 0.1 and np.abs(inference - ref["bn_whole"]).max() > 0.1
    np.testing.assert_allclose(_values(logdir, "tf2_inference", "activation", "bn")[0], inference.ravel(), atol=1e-5)
    mean = _values(logdir, "tf2_inference", "state", "bn/moving_mean:0")
    assert not np.abs(mean[1] - mean[0]).any(), mean
    first = compare(logdir, baseline="tf1", candidate="tf2_inference").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "bn"), first
    note = first.note or ""
    assert "normalizes the whole batch" not in note and "batch statistics over other rows" not in note, note
    assert "'tf2_inference' left bn/moving_mean:0 unchanged" in note and "inference mode" in note, note


def test_a_moving_mean_of_other_rows_and_another_momentum_is_not_said_to_share_the_rule(logdir: str) -> None:
    """The port's batch norm keeps keras.applications' momentum 0.999 where TF1's is 0.99, and averages
    the whole batch where TF1's first tower averages its half: the note named both momenta and said the
    runs update it "not by another rule". numpy: 0.001 x the whole batch's mean."""
    ref = tr.reference()
    got = _values(logdir, "tf2_momentum", "state", "bn/moving_mean:0")[1]
    np.testing.assert_allclose(got, 0.1 * ref["mean_whole"], rtol=1e-5, atol=1e-8)
    first = compare(logdir, baseline="tf1", candidate="tf2_momentum").first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "state", "bn/moving_mean:0"), first
    note = first.note or ""
    assert "'tf2_momentum' (momentum 0.999) from the mean of all 8 rows" in note, note
    assert "not by another rule" not in note and "other momenta (0.99 against 0.999" in note, note
