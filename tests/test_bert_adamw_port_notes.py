"""Ports of BERT's ``AdamWeightDecayOptimizer``: each port bug's note names its cause.

google-research/bert's optimizer is Adam without bias correction, epsilon 1e-6, and a decoupled
weight decay (``w -= lr * (m / (sqrt(v) + eps) + λ w)``) on every variable but those whose name
matches ``LayerNorm``, ``layer_norm`` or ``bias``. A trial ported a dense + LayerNorm + GELU block
three wrong ways, each found at the right step and tensor with a note that did not name it:
Keras's own ``AdamW`` (bias-corrected: every update sqrt(1 - 0.999^t) / (1 - 0.9^t) times BERT's)
was told of epsilon and clipping on its kernel; a port decaying LayerNorm and biases too was told
to compare epsilon, betas and clipping on LayerNorm's gamma; a port adding the decay to the
gradient (L2, coupled) was told of clipping, the betas or "a weight decay", with no factor.

Each expectation is checked with numpy on BERT's rule and the recorded values first.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from keras_recipes import BertAdam
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(68)
STEPS, BATCH, LR, WD, B1, B2, EPS = 3, 8, 0.01, 0.01, 0.9, 0.999, 1e-6
EXCLUDE = ["LayerNorm", "layer_norm", "bias"]
X = RNG.normal(size=(STEPS * BATCH, 4)).astype(np.float32)
Y = RNG.normal(size=(STEPS * BATCH, 2)).astype(np.float32)
W1 = (RNG.normal(size=(4, 6)) * 0.5).astype(np.float32)
W2 = (RNG.normal(size=(6, 2)) * 0.5).astype(np.float32)


def gelu(x: tf.Tensor) -> tf.Tensor:
    """BERT's GELU (the tanh approximation)."""
    return 0.5 * x * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))


class AdamWeightDecayOptimizer(tf.compat.v1.train.Optimizer):
    """google-research/bert ``optimization.py``'s optimizer, its ``apply_gradients`` as written there."""

    def __init__(self, learning_rate: float) -> None:
        super().__init__(False, "AdamWeightDecayOptimizer")
        self.learning_rate = learning_rate

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None, name: Any = None) -> Any:
        assignments = []
        for grad, param in grads_and_vars:
            param_name = re.sub(":\\d+$", "", param.name)
            m, v = (
                tf.compat.v1.get_variable(
                    param_name + suffix,
                    param.shape.as_list(),
                    tf.float32,
                    tf.compat.v1.zeros_initializer(),
                    trainable=False,
                )
                for suffix in ("/adam_m", "/adam_v")
            )
            next_m = tf.multiply(B1, m) + tf.multiply(1.0 - B1, grad)
            next_v = tf.multiply(B2, v) + tf.multiply(1.0 - B2, tf.square(grad))
            update = next_m / (tf.sqrt(next_v) + EPS)
            if not any(re.search(r, param_name) for r in EXCLUDE):
                update += WD * param
            assignments.extend([param.assign(param - self.learning_rate * update), m.assign(next_m), v.assign(next_v)])
        return tf.group(*assignments, name=name)


def train_tf1(run_dir: str) -> None:
    """The block as BERT writes it: ``tf.gradients``, the optimizer, the global step's increment."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        y = tf.compat.v1.placeholder(tf.float32, [None, 2])
        h = rec.activation("dense", tf.compat.v1.layers.dense(x, 6, kernel_initializer=tf.constant_initializer(W1)))
        with tf.compat.v1.variable_scope("LayerNorm"):  # contrib's layer_norm: beta 0, gamma 1, epsilon 1e-12
            beta = tf.compat.v1.get_variable("beta", [6], initializer=tf.compat.v1.zeros_initializer())
            gamma = tf.compat.v1.get_variable("gamma", [6], initializer=tf.compat.v1.ones_initializer())
            mean, variance = tf.nn.moments(h, [-1], keepdims=True)
            h = rec.activation("LayerNorm", tf.nn.batch_normalization(h, mean, variance, beta, gamma, 1e-12))
        out = tf.compat.v1.layers.dense(gelu(h), 2, name="dense_1", kernel_initializer=tf.constant_initializer(W2))
        loss = rec.loss(tf.reduce_mean(tf.square(rec.activation("dense_1", out) - y)))
        opt = AdamWeightDecayOptimizer(rec.lr(tf.constant(LR)))
        tvars = tf.compat.v1.trainable_variables()
        grads = tf.gradients(loss, tvars)
        rec.grads(grads, tvars)
        with rec.before_update(gs):
            train = tf.group(opt.apply_gradients(zip(grads, tvars), global_step=gs), gs.assign(gs + 1))
        rec.variables(optimizer=opt)
        tf1_session.train(rec, train, (x, y), (X, Y), STEPS, BATCH)


def train_port(run_dir: str, port: str) -> None:
    """The Keras port trained with ``fit``: ``faithful``, ``decay_all``, ``coupled`` (the subclass)
    or ``adamw`` (Keras's ``AdamW`` with BERT's settings and exclusions)."""
    tf.keras.backend.clear_session()
    model = tf.keras.Sequential(
        [
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(6, kernel_initializer=tf.constant_initializer(W1), name="dense"),
            tf.keras.layers.LayerNormalization(epsilon=1e-12, name="LayerNorm"),
            tf.keras.layers.Activation(lambda t: tf.keras.activations.gelu(t, approximate=True)),
            tf.keras.layers.Dense(2, kernel_initializer=tf.constant_initializer(W2), name="dense_1"),
        ]
    )
    if port == "adamw":
        opt = tf.keras.optimizers.AdamW(LR, weight_decay=WD, beta_1=B1, beta_2=B2, epsilon=EPS)
        opt.exclude_from_weight_decay(var_names=EXCLUDE)
    else:
        opt = BertAdam(
            LR, WD, [] if port == "decay_all" else EXCLUDE, B1, B2, EPS, port == "coupled", "AdamWeightDecay"
        )
    model.compile(opt, loss="mse")
    rec = summary_v2.Recorder(run_dir)
    summary_v2.instrument(model, rec, layers=["dense", "LayerNorm", "dense_1"])
    model.fit(X, Y, batch_size=BATCH, shuffle=False, verbose=0)
    rec.close()


@pytest.fixture(scope="module")
def tf1_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    logdir = tmp_path_factory.mktemp("bert_adamw")
    train_tf1(str(logdir / "tf1"))
    return str(logdir)


def _values(run: dict, step: int, kind: str, name: str) -> np.ndarray:
    return np.asarray(run[step][(kind, name)][2], np.float64)


def test_a_faithful_port_agrees(tf1_run: str) -> None:
    train_port(f"{tf1_run}/faithful", "faithful")
    report = compare(tf1_run, baseline="tf1", candidate="faithful")
    assert report.agree, report.first_divergence


def test_decay_on_layer_norm_is_named_a_decoupled_decay(tf1_run: str) -> None:
    """numpy: gamma's first update differs by -lr·λ·gamma (1 at every element), the rest agrees."""
    train_port(f"{tf1_run}/decay_all", "decay_all")
    base, cand = tensors_by_step(f"{tf1_run}/tf1"), tensors_by_step(f"{tf1_run}/decay_all")
    gamma = [_values(run, 1, "weight", "LayerNorm/gamma:0") for run in (base, cand)]
    np.testing.assert_allclose(gamma[1] - gamma[0], -LR * WD * np.ones(6), rtol=1e-3)
    report = compare(tf1_run, baseline="tf1", candidate="decay_all")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "weight", "LayerNorm/gamma:0"), first
    note = first.note or ""
    assert "-0.0001 times the weight" in note and "0.01 times the lr 0.01 of step 0" in note, note
    assert "a decoupled weight decay" in note and "'decay_all' applies to this variable" in note, note
    assert "compare the optimizers' settings" not in note, note


def test_keras_adamw_is_named_bias_correction(tf1_run: str) -> None:
    """numpy: Keras AdamW's first update of a bias (no decay) is sqrt(1 - 0.999) / (1 - 0.9) times
    BERT's; the kernel's, that plus a term in the weight (the decay outside the correction)."""
    train_port(f"{tf1_run}/adamw", "adamw")
    base, cand = tensors_by_step(f"{tf1_run}/tf1"), tensors_by_step(f"{tf1_run}/adamw")
    correction = math.sqrt(1 - B2) / (1 - B1)
    moved = [
        _values(run, 1, "weight", "dense_1/bias:0") - _values(run, 0, "weight", "dense_1/bias:0")
        for run in (base, cand)
    ]
    np.testing.assert_allclose(moved[1], correction * moved[0], rtol=1e-4)
    report = compare(tf1_run, baseline="tf1", candidate="adamw")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (1, "weight", "dense/kernel:0"), first
    notes = {d.tensor: d.note or "" for d in report.divergences_at_first_step if d.kind == "weight"}
    for name in ("dense/kernel:0", "dense_1/bias:0"):
        assert f"times {correction:.4g} at every element" in notes[name], notes[name]
        assert "Adam's bias correction at update 1" in notes[name], notes[name]
        assert "'adamw' corrects Adam's moments and 'tf1' does not" in notes[name], notes[name]
    assert "times the weight" in notes["dense/kernel:0"] and "times the weight" not in notes["dense_1/bias:0"]


def test_a_coupled_decay_is_named_on_the_first_moment(tf1_run: str) -> None:
    """numpy: the kernel's first moment after the first update is (1 - beta_1)·λ·w0 above BERT's."""
    train_port(f"{tf1_run}/coupled", "coupled")
    base, cand = tensors_by_step(f"{tf1_run}/tf1"), tensors_by_step(f"{tf1_run}/coupled")
    m = [_values(base, 1, "slot", "dense/kernel/adam_m:0"), _values(cand, 1, "slot", "m/dense/kernel")]
    np.testing.assert_allclose(m[1] - m[0], (1 - B1) * WD * W1, rtol=1e-3, atol=1e-9)
    report = compare(tf1_run, baseline="tf1", candidate="coupled")
    assert report.first_divergence.step == 1, report.first_divergence  # the kernel (its update) and its moments
    at_step = {(d.kind, d.tensor): d.note or "" for d in report.divergences_at_first_step}
    note = at_step[("slot", "dense/kernel/adam_m:0")]
    assert "0.001 times the weight dense/kernel:0 at step 0" in note, note
    assert "'coupled' adds a weight decay to the gradient (L2, coupled" in note and "λ = 0.01" in note, note
    assert ("slot", "LayerNorm/gamma/adam_m:0") not in at_step, list(at_step)  # excluded: no decay either way
