"""An output computed from random draws, diverging first: the note names the random ops.

From a helper's VAE trial: a faithful port of ``z = mu + exp(0.5 * logvar) * eps`` with
``eps = tf.random.normal(tf.shape(mu))`` on each side (seeded otherwise) diverged at step 0 on
``z`` and was told "this layer computes another function of its input", as a real bug there
(``exp(logvar)`` as the standard deviation) was. The shims now record the types of the random
ops each forward tensor is computed from (back to the tensors recorded before it), and the note
says the draws differ unless made equal. Each expectation is checked on the recorded values with
numpy, not on the tool.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf1_session
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(5)
STEPS, BATCH, D, H, Z = 2, 4, 6, 5, 3
X = RNG.standard_normal((STEPS * BATCH, D)).astype(np.float32)
EPS = RNG.standard_normal((STEPS * BATCH, Z)).astype(np.float32)
W = {
    "enc": (RNG.standard_normal((D, H)) * 0.4).astype(np.float32),
    "mu": (RNG.standard_normal((H, Z)) * 0.4).astype(np.float32),
    "logvar": (RNG.standard_normal((H, Z)) * 0.4).astype(np.float32),
    "dec": (RNG.standard_normal((Z, D)) * 0.4).astype(np.float32),
}


def _loss(x, mu, logvar, out):
    kl = -0.5 * tf.reduce_sum(1.0 + logvar - tf.square(mu) - tf.exp(logvar), axis=1)
    return tf.reduce_mean(tf.reduce_sum(tf.square(out - x), axis=1) + kl)


def _tf1(run_dir: str, fed: bool, in_cond: bool = False) -> None:
    """The original: ``eps`` drawn with ``tf.random.normal`` (graph seed 1), or fed from numpy;
    ``in_cond``: ``z`` sampled in training only, under ``tf.cond(is_training, ...)`` (an ``If``)."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(1)
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        eps_in = tf.compat.v1.placeholder(tf.float32, [None, Z])

        def dense(h, name, act=None):
            return tf.compat.v1.layers.dense(
                h, W[name].shape[1], act, name=name, kernel_initializer=tf.constant_initializer(W[name])
            )

        h = rec.activation("enc", dense(x, "enc", tf.nn.relu))
        mu, logvar = rec.activation("mu", dense(h, "mu")), rec.activation("logvar", dense(h, "logvar"))
        if in_cond:
            is_training = tf.compat.v1.placeholder_with_default(True, [])
            sample = lambda: mu + tf.exp(0.5 * logvar) * tf.random.normal(tf.shape(mu))  # noqa: E731
            z = rec.activation("z", tf.cond(is_training, sample, lambda: mu))
        else:
            eps = eps_in if fed else tf.random.normal(tf.shape(mu))
            z = rec.activation("z", mu + tf.exp(0.5 * logvar) * eps)
        out = rec.activation("dec", dense(z, "dec"))
        loss = rec.loss(_loss(x, mu, logvar, out))
        rec.lr(tf.constant(0.01))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.01), loss, global_step=gs)
        tf1_session.train(rec, train_op, (x, eps_in), (X, EPS), STEPS, BATCH)


def _tf2(
    run_dir: str, fed: bool, std_of_logvar: str = "exp(0.5 * logvar)", stateless: bool = False, eager: bool = False
) -> None:
    """The port, a ``tf.function`` loop: ``eps`` drawn with ``tf.random.normal`` (seed 7) or passed in;
    ``std_of_logvar="exp(logvar)"`` is the log-variance taken for the log-std; ``stateless``: drawn
    with ``tf.random.stateless_normal`` seeded by the step, the op types Keras 3's
    ``keras.random.normal(..., seed=SeedGenerator(...))`` draws with; ``eager``: the step not a ``tf.function``."""
    tf.random.set_seed(7)
    layers = {
        name: tf.keras.layers.Dense(w.shape[1], "relu" if name == "enc" else None, name=name) for name, w in W.items()
    }
    for name, layer in layers.items():
        layer(tf.zeros((1, W[name].shape[0])))  # built by a call: its variables are named "<name>/kernel:0"
        layer.set_weights([W[name], np.zeros(W[name].shape[1], np.float32)])
    variables = [v for layer in layers.values() for v in layer.trainable_variables]
    opt = tf.keras.optimizers.SGD(0.01)
    rec = summary_v2.Recorder(run_dir)

    def step(x, eps_in):
        with rec.step(opt.iterations):
            rec.lr(tf.constant(0.01))
            with tf.GradientTape() as tape:
                h = rec.activation("enc", layers["enc"](x))
                mu, logvar = rec.activation("mu", layers["mu"](h)), rec.activation("logvar", layers["logvar"](h))
                if stateless:
                    seed = tf.stack([tf.constant(7, tf.int64), opt.iterations])
                    eps = tf.random.stateless_normal(tf.shape(mu), seed=seed)
                else:
                    eps = eps_in if fed else tf.random.normal(tf.shape(mu))
                std = tf.exp(logvar) if std_of_logvar == "exp(logvar)" else tf.exp(0.5 * logvar)
                z = rec.activation("z", mu + std * eps)
                out = rec.activation("dec", layers["dec"](z))
                loss = rec.loss(_loss(x, mu, logvar, out))
            rec.minimize(opt, loss, variables, tape)

    step = step if eager else tf.function(step)
    for s in range(STEPS):
        rows = slice(s * BATCH, (s + 1) * BATCH)
        step(tf.constant(X[rows]), tf.constant(EPS[rows]))
    rec.close()


def _step0(run_dir: str) -> dict:
    got = tensors_by_step(run_dir)[0]
    return {name: np.asarray(got[("activation", name)][2]).reshape(BATCH, -1) for name in ("mu", "logvar", "z")}


@pytest.mark.parametrize("in_cond", [False, True])
def test_noise_drawn_on_each_side_is_named_at_the_reparameterized_output(tmp_path, in_cond: bool) -> None:
    """``in_cond``: the original samples under ``tf.cond`` (its random op inside the ``If``'s branch
    function), which without looking into the branch was said to draw noise in the port only."""
    _tf1(str(tmp_path / "tf1"), fed=False, in_cond=in_cond)
    _tf2(str(tmp_path / "tf2"), fed=False)
    a, b = _step0(str(tmp_path / "tf1")), _step0(str(tmp_path / "tf2"))
    for name in ("mu", "logvar"):  # numpy: the inputs of z agree ...
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-6)
    # ... and the noise each run drew, (z - mu) / exp(0.5 * logvar), does not
    eps_a, eps_b = ((r["z"] - r["mu"]) / np.exp(0.5 * r["logvar"]) for r in (a, b))
    assert np.abs(eps_a - eps_b).max() > 0.1
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "z"), first
    assert "both runs compute it from a random op" in first.note, first.note
    assert "'tf1': RandomStandardNormal; 'tf2': RandomStandardNormal" in first.note
    assert "at this step: this layer computes another function" not in first.note  # told as the cause


def test_noise_drawn_with_explicit_seeds_is_not_sent_to_the_deterministic_tool(tmp_path) -> None:
    """A helper's Keras 3 VAE port (the Keras example's ``keras.random.normal(..., seed=self.seed_generator)``)
    was told to run both sides under DeterministicRandomTestTool to make the draws equal: the tool seeds
    stateful ops only (Keras 3 has no such tool at all), and a stateless op takes its seed as an input,
    so under the tool its draws still differ and only feeding the same noise makes them equal."""
    tool = tf.compat.v1.keras.utils.DeterministicRandomTestTool
    with tool(mode="constant").scope():
        _tf1(str(tmp_path / "tf1"), fed=False)
    with tool(mode="constant").scope():
        _tf2(str(tmp_path / "tf2"), fed=False)
    with tool(mode="constant").scope():
        _tf2(str(tmp_path / "stateless"), fed=False, stateless=True)
    a, b, c = (_step0(str(tmp_path / run)) for run in ("tf1", "tf2", "stateless"))
    eps_a, eps_b, eps_c = ((r["z"] - r["mu"]) / np.exp(0.5 * r["logvar"]) for r in (a, b, c))
    np.testing.assert_allclose(eps_a, eps_b, rtol=1e-5, atol=1e-5)  # numpy: the tool equalizes tf.random.normal ...
    assert np.abs(eps_a - eps_c).max() > 0.1  # ... and not tf.random.stateless_normal
    assert compare(str(tmp_path), baseline="tf1", candidate="tf2").agree
    first = compare(str(tmp_path), baseline="tf1", candidate="stateless").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "z"), first
    assert "'stateless': StatelessRandomGetKeyCounter, StatelessRandomNormalV2" in first.note, first.note
    assert "DeterministicRandomTestTool seeds stateful ops only" in first.note
    assert "or both run under DeterministicRandomTestTool" not in first.note


def test_noise_drawn_in_an_eager_port_is_not_said_to_be_drawn_in_the_original_only(tmp_path) -> None:
    """An eager step has no graph, so the shim sees no random op there: a helper's faithful eager port
    drawing its noise with ``tf.random.normal`` was told that only 'tf1' draws here, or that the layer
    computes another function of its input, when the draws alone differ."""
    _tf1(str(tmp_path / "tf1"), fed=False)
    _tf2(str(tmp_path / "tf2"), fed=False, eager=True)
    a, b = _step0(str(tmp_path / "tf1")), _step0(str(tmp_path / "tf2"))
    for name in ("mu", "logvar"):  # numpy: the inputs of z agree, the noise each run drew does not
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-6)
    eps_a, eps_b = ((r["z"] - r["mu"]) / np.exp(0.5 * r["logvar"]) for r in (a, b))
    assert np.abs(eps_a - eps_b).max() > 0.1
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "z"), first
    assert "'tf2' was recorded eagerly, where the shim sees no random op, so it may draw here too" in first.note
    assert "'tf2' does not" not in first.note, first.note


def test_the_same_noise_fed_agrees_and_a_log_std_bug_gets_no_random_note(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"), fed=True)
    _tf2(str(tmp_path / "tf2"), fed=True)
    assert compare(str(tmp_path), baseline="tf1", candidate="tf2").agree
    _tf2(str(tmp_path / "tf2_bug"), fed=True, std_of_logvar="exp(logvar)")
    a, b = _step0(str(tmp_path / "tf1")), _step0(str(tmp_path / "tf2_bug"))
    eps = EPS[:BATCH]  # numpy: the original's z uses exp(0.5 * logvar), the port's exp(logvar), of the same eps
    np.testing.assert_allclose(a["z"], a["mu"] + np.exp(0.5 * a["logvar"]) * eps, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b["z"], b["mu"] + np.exp(b["logvar"]) * eps, rtol=1e-5, atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2_bug").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "z"), first
    assert "this layer computes another function of its input" in first.note
    assert "random op" not in first.note


def test_noise_drawn_in_one_run_only_is_said_so(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"), fed=True)
    _tf2(str(tmp_path / "tf2"), fed=False)
    a, b = _step0(str(tmp_path / "tf1")), _step0(str(tmp_path / "tf2"))
    np.testing.assert_allclose(a["mu"], b["mu"], rtol=1e-6, atol=1e-6)
    assert np.abs(a["z"] - b["z"]).max() > 0.1  # numpy: the fed noise is not what the port drew
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "z"), first
    assert "in 'tf2' only it is computed from a random op" in first.note, first.note


W_OUT = (RNG.standard_normal((H, D)) * 0.4).astype(np.float32)


def _tf1_dropout_off(run_dir: str, switch: str) -> None:
    """An original whose dropout is switched off for the parity check: its training flag defaults to
    False (``switch="flag"``, the random op inside the ``If``'s branch) or its ``keep_prob`` is fed
    1.0 (``"keep_prob"``, the op runs and keeps every element)."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, D])
        keep_prob = tf.compat.v1.placeholder(tf.float32, [])
        h = rec.activation("enc", x @ tf.compat.v1.get_variable("enc/kernel", initializer=W["enc"]))
        h = tf.nn.relu(h)
        if switch == "flag":
            h = tf.compat.v1.layers.dropout(h, 0.5, training=tf.compat.v1.placeholder_with_default(False, []))
        else:
            h = tf.nn.dropout(h, rate=1.0 - keep_prob)
        out = rec.activation("dec", h @ tf.compat.v1.get_variable("dec/kernel", initializer=W_OUT))
        loss = rec.loss(tf.reduce_mean(tf.square(out - x)))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.01), loss, global_step=gs)
        tf1_session.train(rec, train_op, (x,), (X,), STEPS, BATCH, fixed={keep_prob: 1.0})


def _tf2_elu(run_dir: str, dropout_off: bool = False) -> None:
    """The port with a real bug, ELU where the original has ReLU; without dropout, or with its dropout
    switched off too (``dropout_off``: a rate fed 0.0, the op stays in the function)."""
    enc, dec = tf.Variable(W["enc"], name="enc/kernel"), tf.Variable(W_OUT, name="dec/kernel")
    opt = tf.keras.optimizers.SGD(0.01)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x, rate):
        with rec.step(opt.iterations):
            with tf.GradientTape() as tape:
                h = rec.activation("enc", x @ enc)
                a = tf.nn.dropout(tf.nn.elu(h), rate=rate) if dropout_off else tf.nn.elu(h)
                out = rec.activation("dec", a @ dec)
                loss = rec.loss(tf.reduce_mean(tf.square(out - x)))
            rec.minimize(opt, loss, [enc, dec], tape)

    for s in range(STEPS):
        step(tf.constant(X[s * BATCH : (s + 1) * BATCH]), tf.constant(0.0))
    rec.close()


@pytest.mark.parametrize("switch", ["flag", "keep_prob"])
def test_a_dropout_switched_off_in_the_original_keeps_the_note_on_the_function(tmp_path, switch: str) -> None:
    """A new user's CNN trial: the TF1 original's dropout switched off for the parity check (training
    flag False, or keep_prob fed 1.0) still holds its random op, and a real bug in the port after it
    (ELU for ReLU) was told only "'tf1' draws random numbers here and 'tf2' does not": the note sent
    the user looking for a dropout, away from the activation. numpy: the original computes ReLU
    exactly, as without dropout; the port ELU."""
    _tf1_dropout_off(str(tmp_path / "tf1"), switch)
    _tf2_elu(str(tmp_path / "tf2"))
    a, b = tensors_by_step(str(tmp_path / "tf1"))[0], tensors_by_step(str(tmp_path / "tf2"))[0]
    h = np.asarray(a[("activation", "enc")][2]).reshape(BATCH, H)
    np.testing.assert_allclose(h, np.asarray(b[("activation", "enc")][2]).reshape(BATCH, H), rtol=1e-6, atol=1e-6)
    dec_a, dec_b = (np.asarray(r[("activation", "dec")][2]).reshape(BATCH, D) for r in (a, b))
    np.testing.assert_allclose(dec_a, np.maximum(h, 0) @ W_OUT, rtol=1e-5, atol=1e-6)  # no element dropped
    np.testing.assert_allclose(dec_b, np.where(h > 0, h, np.expm1(h)) @ W_OUT, rtol=1e-5, atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dec"), first
    assert "in 'tf1' only it is computed from a random op" in first.note, first.note
    assert "switched off" in first.note and "this layer computes another function of its input" in first.note


T = 3  # time steps of the masked sequence runs
REAL = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], bool)  # per sample: real positions, then padding
SEQ = RNG.standard_normal((STEPS * BATCH, T, D)).astype(np.float32)


def _tf1_masked(run_dir: str) -> None:
    """A sequence original recording its outputs at real positions only (``mask=``), its dropout
    before the first switched off for the check (``keep_prob`` fed 1.0): the op stays in the graph."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, T, D])
        real = tf.compat.v1.placeholder(tf.bool, [None, T])
        keep_prob = tf.compat.v1.placeholder(tf.float32, [])
        h = tf.nn.dropout(x, rate=1.0 - keep_prob)
        h = rec.activation("enc", h @ tf.compat.v1.get_variable("enc/kernel", initializer=W["enc"]), real)
        out = rec.activation("dec", tf.nn.relu(h) @ tf.compat.v1.get_variable("dec/kernel", initializer=W_OUT), real)
        loss = rec.loss(tf.reduce_mean(tf.square(out - x)))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.01), loss, global_step=gs)
        tf1_session.train(rec, train_op, (x,), (SEQ,), STEPS, BATCH, fixed={real: REAL, keep_prob: 1.0})


def _tf2_masked_elu(run_dir: str) -> None:
    """The port, its dropout likewise switched off (rate fed 0.0), and ELU where the original has ReLU
    after the first recorded output."""
    enc, dec = tf.Variable(W["enc"], name="enc/kernel"), tf.Variable(W_OUT, name="dec/kernel")
    opt = tf.keras.optimizers.SGD(0.01)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x, real, rate):
        with rec.step(opt.iterations):
            with tf.GradientTape() as tape:
                h = rec.activation("enc", tf.nn.dropout(x, rate=rate) @ enc, mask=real)
                out = rec.activation("dec", tf.nn.elu(h) @ dec, mask=real)
                loss = rec.loss(tf.reduce_mean(tf.square(out - x)))
            rec.minimize(opt, loss, [enc, dec], tape)

    for s in range(STEPS):
        step(tf.constant(SEQ[s * BATCH : (s + 1) * BATCH]), tf.constant(REAL), tf.constant(0.0))
    rec.close()


def test_an_output_recorded_masked_keeps_the_random_ops_before_it_from_later_outputs(tmp_path) -> None:
    """An output recorded with ``mask=`` is recorded as its padding zeroed, a tensor the model does not
    read: the model reads the output itself, so the random ops before it were walked past and listed
    for every later output too. Both runs' switched-off dropouts before ``enc`` were then named at
    ``dec``, whose real bug (ELU for ReLU) was told "the draws differ ... make them equal". numpy:
    ``enc`` agrees at the real positions, ``dec`` is ReLU's in the original and ELU's in the port."""
    _tf1_masked(str(tmp_path / "tf1"))
    _tf2_masked_elu(str(tmp_path / "tf2"))
    a, b = tensors_by_step(str(tmp_path / "tf1"))[0], tensors_by_step(str(tmp_path / "tf2"))[0]
    x = SEQ[:BATCH]
    h = x @ W["enc"]
    for run in (a, b):
        got = np.asarray(run[("activation", "enc")][2]).reshape(BATCH, T, H)
        np.testing.assert_allclose(got, h * REAL[..., None], rtol=1e-5, atol=1e-6)  # no element dropped
    dec_a, dec_b = (np.asarray(r[("activation", "dec")][2]).reshape(BATCH, T, D) for r in (a, b))
    np.testing.assert_allclose(dec_a, (np.maximum(h, 0) @ W_OUT) * REAL[..., None], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dec_b, (np.where(h > 0, h, np.expm1(h)) @ W_OUT) * REAL[..., None], rtol=1e-5, atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dec"), first
    assert "random op" not in first.note, first.note
    assert "this layer computes another function of its input" in first.note, first.note


def test_candidate_samplers_are_random_ops_and_uniform_quantization_is_not() -> None:
    """word2vec's sampled loss draws its negatives with ``fixed_unigram_candidate_sampler`` (or a
    learned unigram one), which were not counted: a faithful port's loss apart at step 0 was told the
    loss is computed differently. ``UniformQuantize`` / ``UniformDequantize`` were counted, by their
    name, though they draw nothing. Checked by running each twice: the samplers' draws differ, the
    quantization's values do not."""
    from tb_parity_plugin.shim import randomness

    with tf.Graph().as_default():
        labels = tf.constant([[1], [3]], tf.int64)
        fixed = tf.random.fixed_unigram_candidate_sampler(labels, 1, 8, True, 50, unigrams=[1.0] * 50)
        learned = tf.random.learned_unigram_candidate_sampler(labels, 1, 8, True, 50)
        kw = dict(
            scales=tf.constant(0.01), zero_points=tf.constant(0), quantization_min_val=-128, quantization_max_val=127
        )
        x = tf.constant(np.linspace(-1, 1, 6, dtype=np.float32))
        dequantized = tf.raw_ops.UniformDequantize(
            input=tf.raw_ops.UniformQuantize(input=x, Tout=tf.qint8, **kw), Tout=tf.float32, **kw
        )
        assert randomness.random_ops(fixed.sampled_candidates) == ("FixedUnigramCandidateSampler",)
        assert randomness.random_ops(learned.sampled_candidates) == ("LearnedUnigramCandidateSampler",)
        assert randomness.random_ops(dequantized) == ()
        with tf.compat.v1.Session() as sess:
            for t in (fixed.sampled_candidates, learned.sampled_candidates):
                draws = [sess.run(t) for _ in range(3)]
                assert any(not np.array_equal(draws[0], d) for d in draws[1:])
            np.testing.assert_array_equal(sess.run(dequantized), sess.run(dequantized))


def test_dropouts_switched_off_in_both_runs_keep_the_note_on_the_function(tmp_path) -> None:
    """Both runs switch their dropout off for the check (TF1's keep_prob fed 1.0, the port's rate fed
    0.0): each still holds its random op, and the port's real bug (ELU for ReLU) was told only that
    the draws differ unless made equal, which they already were. numpy: no element dropped on either
    side, the original ReLU's and the port ELU's."""
    _tf1_dropout_off(str(tmp_path / "tf1"), "keep_prob")
    _tf2_elu(str(tmp_path / "tf2"), dropout_off=True)
    a, b = tensors_by_step(str(tmp_path / "tf1"))[0], tensors_by_step(str(tmp_path / "tf2"))[0]
    h = np.asarray(a[("activation", "enc")][2]).reshape(BATCH, H)
    dec_a, dec_b = (np.asarray(r[("activation", "dec")][2]).reshape(BATCH, D) for r in (a, b))
    np.testing.assert_allclose(dec_a, np.maximum(h, 0) @ W_OUT, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dec_b, np.where(h > 0, h, np.expm1(h)) @ W_OUT, rtol=1e-5, atol=1e-6)
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "dec"), first
    assert "both runs compute it from a random op" in first.note, first.note
    assert "switched off" in first.note and "this layer computes another function of its input" in first.note
