"""Section 3 of issue 10: one forward pass each side, inference and training mode, no optimizer."""

from __future__ import annotations

import numpy as np
from shim_readback import tensors_by_step

from demo.bn_model import W1, W2, XS, forward_tf1, forward_tf2
from tb_parity_plugin import compare

X = XS[0]


def test_faithful_port_agrees_in_both_modes_with_a_numpy_reference(tmp_path) -> None:
    forward_tf1(str(tmp_path / "tf1"))
    forward_tf2(str(tmp_path / "tf2"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    got = tensors_by_step(str(tmp_path / "tf1"))[0]
    h = X.astype(np.float64) @ W1
    bn_inf = h / np.sqrt(1 + 1e-3)  # moving mean 0, variance 1
    bn_train = (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-3)
    np.testing.assert_allclose(got[("activation", "inference/bn")][2], bn_inf, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[("activation", "training/bn")][2], bn_train, rtol=1e-4, atol=1e-4)
    want = np.maximum(bn_train, 0) @ W2
    np.testing.assert_allclose(got[("output", "training/output")][2], want, rtol=1e-4, atol=1e-4)


def test_batch_norm_stuck_in_inference_diverges_in_training_mode_on_it(tmp_path) -> None:
    forward_tf1(str(tmp_path / "tf1"))
    forward_tf2(str(tmp_path / "tf2"), bn_training=False)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "training/bn")
    assert {d.tensor for d in report.divergences_at_first_step} == {"training/bn", "training/output"}


def test_dropout_left_on_diverges_in_inference_mode_on_it(tmp_path) -> None:
    forward_tf1(str(tmp_path / "tf1"), dropout=True)
    forward_tf2(str(tmp_path / "tf2"), dropout_training=True, modes=("inference",))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*/training/*"])
    first = report.first_divergence
    assert (first.kind, first.tensor) == ("activation", "inference/dropout")


def test_dropout_left_on_in_inference_mode_is_named_with_its_rate(tmp_path) -> None:
    """From a trial: the forward pass records no weight, and the dropout on in the port's inference pass
    got no note. Numpy: the original's inference dropout output is its input, relu(bn); each element of
    the port's is 0 or twice it (rate 0.5)."""
    forward_tf1(str(tmp_path / "tf1"), dropout=True)
    forward_tf2(str(tmp_path / "tf2"), dropout_training=True, modes=("inference",))
    tf1, tf2 = tensors_by_step(str(tmp_path / "tf1"))[0], tensors_by_step(str(tmp_path / "tf2"))[0]
    h = np.maximum(np.asarray(tf1[("activation", "inference/bn")][2], np.float64), 0).reshape(-1)
    off = np.asarray(tf1[("activation", "inference/dropout")][2]).reshape(-1)
    on = np.asarray(tf2[("activation", "inference/dropout")][2]).reshape(-1)
    np.testing.assert_allclose(off, h, rtol=1e-6)
    assert ((on == 0) | np.isclose(on, 2 * h, rtol=1e-6)).all() and ((on == 0) & (h != 0)).any()
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", allow_unmatched=["*/training/*"])
    note = report.first_divergence.note
    assert "dropout of rate 0.5 is on in 'tf2' only" in note, note
    assert "this is the inference-mode pass, where dropout is off" in note
