"""Notes on a momentum port's weight that diverges after its gradients agreed, on ports written the
way users write them (TF1 ``MomentumOptimizer`` in a Session against Keras ``SGD`` under ``fit``).

* ``nesterov=True`` on the port: the first update is ``1 + momentum`` times TF1's; the note named
  "the learning rate as applied, or Adam's bias correction" (no Adam in sight).
* ``clipnorm`` where TF1 clipped by the global norm: each variable's update is its own factor of
  TF1's and its momentum slot differs at once; the note named the learning rate and Adam too.

Each expectation is checked on the frameworks' own weights (numpy), not on the tool.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf
from tf1_recipes import dense_regression

from tb_parity_plugin import compare, summary_v2

RNG = np.random.default_rng(7)
STEPS, LR, MOMENTUM, CLIP = 3, 0.05, 0.9, 0.1
X = RNG.normal(size=(STEPS, 8, 4)).astype(np.float32)
Y = RNG.normal(size=(STEPS, 8, 1)).astype(np.float32) * 3.0
K = RNG.normal(size=(4, 1)).astype(np.float32) * 0.5


def _tf1(run_dir: str, clip: Optional[float] = None) -> list[list[np.ndarray]]:
    """TF1 dense regression, MomentumOptimizer, gradients recorded before an optional
    ``clip_by_global_norm`` (README); returns [kernel, bias] read before each step."""

    def momentum(gs: Any, rec: Any) -> Any:
        return tf.compat.v1.train.MomentumOptimizer(rec.lr(tf.constant(LR)), MOMENTUM)

    return dense_regression(run_dir, K, X, Y, momentum, lambda opt, variables: variables, clip)


def _port(run_dir: str, momentum: float = MOMENTUM, **sgd: object) -> list[list[np.ndarray]]:
    """The Keras port: SGD with momentum under fit, instrumented (README)."""
    model = tf.keras.Sequential(
        [tf.keras.Input((4,)), tf.keras.layers.Dense(1, kernel_initializer=tf.constant_initializer(K), name="dense")]
    )
    model.compile(tf.keras.optimizers.SGD(LR, momentum=momentum, **sgd), "mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec)
    seen = []
    for s in range(STEPS):
        seen.append([v.numpy() for v in model.get_layer("dense").weights])
        model.fit(X[s], Y[s], batch_size=8, epochs=1, shuffle=False, verbose=0)
    rec.close()
    return seen


def test_nesterov_on_the_port_is_named_by_its_factor_of_one_plus_momentum(tmp_path) -> None:
    tf1 = _tf1(str(tmp_path / "tf1"))
    port = _port(str(tmp_path / "tf2"), nesterov=True)
    # numpy on the frameworks' weights: the same start, then every element's first update 1.9x TF1's
    for a, b in zip(port[0], tf1[0]):
        np.testing.assert_array_equal(a, b)
    ratio = (port[1][0] - port[0][0]) / (tf1[1][0] - tf1[0][0])
    np.testing.assert_allclose(ratio, 1 + MOMENTUM, rtol=1e-4)
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (found.step, found.kind) == (1, "weight"), found
    assert "the update is the baseline's times 1.9 at every element" in found.note, found.note
    assert "Nesterov momentum 0.9 on the candidate only" in found.note, found.note
    assert "bias correction" not in found.note, found.note  # momentum's slots only: no Adam in sight


def test_clipnorm_against_global_clipping_is_told_by_the_momentum_slot_not_the_learning_rate(tmp_path) -> None:
    tf1 = _tf1(str(tmp_path / "tf1"), clip=CLIP)
    port = _port(str(tmp_path / "tf2"), clipnorm=CLIP)
    # numpy: each variable's first update is its own factor of TF1's (global norm over its own norm,
    # both clipped to CLIP), so no one learning rate can explain it
    factors = [float(np.median((p - p0) / (t - t0))) for p, p0, t, t0 in zip(port[1], port[0], tf1[1], tf1[0])]
    assert all(f > 1.05 for f in factors) and abs(factors[0] - factors[1]) > 0.05, factors
    found = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (found.step, found.kind) == (1, "weight"), found
    assert "yet its optimizer slot" in found.note and "clipnorm clips each variable by its own norm" in found.note, (
        found.note
    )
    assert "bias correction" not in found.note and "Nesterov" not in found.note, found.note


def test_another_momentum_is_told_by_the_slots_rule_first(tmp_path) -> None:
    """A review: TF1 momentum 0.9 against Keras 0.5 was told clipnorm first, once the slot check
    came before the settings."""
    tf1 = _tf1(str(tmp_path / "tf1"))
    port = _port(str(tmp_path / "tf2"), momentum=0.5)
    # numpy: the first update agrees (the accumulator is that step's gradient), the second does not
    np.testing.assert_allclose(port[1][0], tf1[1][0], rtol=1e-6)
    assert np.abs(port[2][0] - tf1[2][0]).max() > 1e-4
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.first_divergence.step == 2, report.first_divergence
    (weight,) = [d for d in report.divergences_at_first_step if d.kind == "weight" and "kernel" in d.tensor]
    assert "yet its optimizer slot" in weight.note, weight.note
    assert "the slot's own rule (momentum), clipping" in weight.note and "Nesterov" not in weight.note, weight.note
