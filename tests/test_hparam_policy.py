"""Issue 9 section 3: the learning rate is compared strictly, so a wrong schedule is found on lr.

The migration guide's dense model (the demo's) with the guide's lr of 1e-3, logged by the real
TF1 and TF2 shims. A port whose schedule ends at another ``end_learning_rate`` (lr off by 1e-7
per step) or decays over other ``decay_steps`` must diverge on ``lr`` at the first step where
the two schedules differ, which numpy computes here from the schedules' formula.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import demo  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from demo import model_tf1, model_tf2
from demo.common import PairConfig
from tb_parity_plugin import compare

BASE = PairConfig(steps=12, learning_rate=1e-3, end_learning_rate=1e-4, decay_steps=40)
PORTS = {
    "end_lr": dataclasses.replace(BASE, end_learning_rate=1e-4 + 4e-6),  # lr off by 1e-7 per step
    "decay_steps": dataclasses.replace(BASE, decay_steps=39),
}


def _schedule(cfg: PairConfig, steps: np.ndarray) -> np.ndarray:
    frac = 1.0 - np.minimum(steps, cfg.decay_steps) / cfg.decay_steps
    return (cfg.learning_rate - cfg.end_learning_rate) * frac + cfg.end_learning_rate


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("hparam")
    for name, cfg in [("faithful", BASE), *PORTS.items()]:
        model_tf1.train(os.path.join(root, name, "tf1"), BASE)
        model_tf2.train(os.path.join(root, name, "tf2"), cfg)
    return str(root)


def test_a_faithful_schedule_agrees_on_lr(logdir: str) -> None:
    assert compare(os.path.join(logdir, "faithful")).agree


@pytest.mark.parametrize("port", list(PORTS))
def test_another_schedule_diverges_on_lr_where_the_schedules_part(logdir: str, port: str) -> None:
    steps = np.arange(BASE.steps)
    differ = np.abs(_schedule(PORTS[port], steps) - _schedule(BASE, steps)) > 1e-6 * _schedule(BASE, steps)
    first_step = int(np.flatnonzero(differ)[0])
    report = compare(os.path.join(logdir, port))
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (first_step, "lr", "lr")
    # Under the training policy (atol 1e-5 during the warm-up) the lr difference is invisible:
    # the divergence surfaces later, far from its cause, which is what the strict default prevents.
    loose = compare(os.path.join(logdir, port), overrides=["lr/*:atol=1e-5,rtol=0.05,warmup_steps=10"])
    assert loose.first_divergence is None or (loose.first_divergence.step, loose.first_divergence.kind) != (
        first_step,
        "lr",
    )
