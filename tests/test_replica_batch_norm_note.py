"""A plain BatchNormalization under MirroredStrategy normalizes each replica's share of the batch:
against a one-device TF1 run its output diverges at step 0, and the note names per-replica
statistics (README: "What counts as a divergence"). A new user's U-Net named the layer ``bn1`` and
recorded its first conv's output (8192 elements) as statistics; the divergence came with no note:
the name was matched on both runs' names joined by a space, which the pattern's anchors
(``(^|/)bn\\d*(/|$)``) never matched, and an output before it compared by statistics only dropped
the note, although the run's own moving statistics, apart across its replicas, show the per-replica
normalization whatever came before. A ResNet's ``synchronized=False`` port, its larger conv kernels
kept as statistics, lost the note likewise: a weight compared by statistics only dropped it. Real
TensorFlow (tests/replica_bn_runs.py), checked against
numpy first.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import replica_bn_runs as rb

from tb_parity_plugin import compare
from tb_parity_plugin.logdir.reader import LogdirReader

#: the default limit keeps the dense output's 1024 elements; 512 keeps its statistics and a sample;
#: 300 keeps the dense kernel's 384 elements (6 x 64) as statistics and a sample too
LIMITS = (4096, 512, 300)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``<limit>/{tf1,tf2}``, each run written by its own process (logical devices)."""
    root = tmp_path_factory.mktemp("replica_bn")
    script = os.path.join(os.path.dirname(__file__), "replica_bn_runs.py")
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    procs = []
    for limit in LIMITS:
        for which in ("tf1", "tf2"):
            path = str(root / str(limit) / which)
            procs.append(
                subprocess.Popen(
                    [sys.executable, script, path, which, str(limit)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    env=env,
                )
            )
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
    return str(root)


def _values(logdir: str, run: str, name: str) -> np.ndarray:
    with LogdirReader(os.path.join(logdir, "4096")) as reader:
        s = reader.run(run).tensors[("activation", name)]
    return s.values.reshape(len(s.steps), rb.BATCH, rb.UNITS)[0].astype(np.float64)


def test_the_runs_normalize_as_numpy_says(logdir: str) -> None:
    whole, halves = rb.reference()
    assert np.abs(whole - halves).max() > 0.1  # numpy: per-replica statistics move the output
    np.testing.assert_allclose(_values(logdir, "tf1", "bn1"), whole, atol=1e-4)
    np.testing.assert_allclose(_values(logdir, "tf2", "bn1"), halves, atol=1e-4)


@pytest.mark.parametrize("limit", LIMITS)
def test_a_per_replica_batch_norm_named_bn1_is_named_in_the_note(logdir: str, limit: int) -> None:
    report = compare(os.path.join(logdir, str(limit)), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "bn1"), first
    assert first.evidence == ("values" if limit == 4096 else "statistics"), first
    note = first.note or ""
    assert "ran 1 and 2 replicas" in note and "SyncBatchNormalization" in note, note
    if limit == 300:  # nor does the kernel: a weight kept as statistics took the whole note away
        assert "dense before it and dense/kernel:0 were compared by statistics only" in note, note
        assert "every weight compared by values agrees" in note, note
    elif limit < 4096:  # the dense output before it proves nothing: the note says so
        assert "dense before it was compared by statistics only" in note, note
    else:
        assert "the outputs recorded before it agree" in note, note
