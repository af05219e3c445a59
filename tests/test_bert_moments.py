"""BERT's ``AdamWeightDecayOptimizer`` keeps Adam's moments as plain variables, not TF1 slots.

google-research/bert's ``optimization.py`` (copied by ELECTRA, ALBERT's LAMB and thousands of
fine-tuning projects) creates ``<variable>/adam_m`` and ``/adam_v`` with ``get_variable(...,
trainable=False)``. ``rec.variables(optimizer=opt)`` recorded them as ``state``, the Keras port's
``m``/``v`` as slots: a new user's BERT port got 96 structure lines whose hints said one run kept
no state and the other no slots, and following them (``--allow-unmatched 'state/*' 'slot/*'``)
compared no moment at all, so a wrong port passed. They are recorded as slots now, read as Adam's
first and second moments (moving averages), and a hint on runs recorded the old way says the
state and the slot are one quantity.

Each expectation is checked against a float64 numpy replay of BERT's rule first.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np
import pytest
import tensorflow as tf
from keras_recipes import BertAdam
from shim_readback import tensors_by_step

from tb_parity_plugin import compare, summary_v1, summary_v2

RNG = np.random.default_rng(19)
STEPS, BATCH, LR, WD = 5, 8, 0.05, 0.01
B1, B2, EPS = 0.9, 0.999, 1e-6
X = RNG.normal(size=(STEPS * BATCH, 4)).astype(np.float32)
Y = RNG.normal(size=(STEPS * BATCH, 2)).astype(np.float32)
K0 = (RNG.normal(size=(4, 2)) * 0.5).astype(np.float32)
EXCLUDE = ("bias",)  # BERT's exclude_from_weight_decay, as run_classifier passes it (LayerNorm aside)
MOMENTS = ("dense/kernel/adam_m:0", "dense/kernel/adam_v:0", "dense/bias/adam_m:0", "dense/bias/adam_v:0")


def numpy_moments(beta_1: float = B1, beta_2: float = B2) -> list[dict[str, np.ndarray]]:
    """BERT's rule on a dense layer under a mean squared error, in float64: each moment as read
    before each step (``<variable>/adam_m`` and ``/adam_v``; no bias correction, decay on the kernel)."""
    w = {"dense/kernel": K0.astype(np.float64), "dense/bias": np.zeros(2)}
    m = {k: np.zeros_like(x) for k, x in w.items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    out = []
    for step in range(STEPS):
        out.append({f"{k}/adam_{s}:0": (m if s == "m" else v)[k].copy() for k in w for s in "mv"})
        xb, yb = X[step * BATCH : (step + 1) * BATCH], Y[step * BATCH : (step + 1) * BATCH]
        err = 2 * (xb @ w["dense/kernel"] + w["dense/bias"] - yb) / yb.size
        grads = {"dense/kernel": xb.T @ err, "dense/bias": err.sum(axis=0)}
        for k, g in grads.items():
            m[k] = beta_1 * m[k] + (1 - beta_1) * g
            v[k] = beta_2 * v[k] + (1 - beta_2) * g * g
            update = m[k] / (np.sqrt(v[k]) + EPS) + (0.0 if k.endswith("bias") else WD * w[k])
            w[k] = w[k] - LR * update
    return out


class AdamWeightDecayOptimizer(tf.compat.v1.train.Optimizer):
    """google-research/bert ``optimization.py``'s optimizer, its ``apply_gradients`` as written there."""

    def __init__(
        self, learning_rate: Any, weight_decay_rate: float, beta_1: float, beta_2: float, epsilon: float
    ) -> None:
        super().__init__(False, "AdamWeightDecayOptimizer")
        self.learning_rate, self.weight_decay_rate = learning_rate, weight_decay_rate
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None, name: Optional[str] = None) -> Any:
        assignments = []
        for grad, param in grads_and_vars:
            param_name = re.sub(":\\d+$", "", param.name)  # BERT's _get_variable_name
            m = tf.compat.v1.get_variable(
                name=param_name + "/adam_m",
                shape=param.shape.as_list(),
                dtype=tf.float32,
                trainable=False,
                initializer=tf.compat.v1.zeros_initializer(),
            )
            v = tf.compat.v1.get_variable(
                name=param_name + "/adam_v",
                shape=param.shape.as_list(),
                dtype=tf.float32,
                trainable=False,
                initializer=tf.compat.v1.zeros_initializer(),
            )
            next_m = tf.multiply(self.beta_1, m) + tf.multiply(1.0 - self.beta_1, grad)
            next_v = tf.multiply(self.beta_2, v) + tf.multiply(1.0 - self.beta_2, tf.square(grad))
            update = next_m / (tf.sqrt(next_v) + self.epsilon)
            if not any(re.search(r, param_name) for r in EXCLUDE):
                update += self.weight_decay_rate * param
            assignments.extend([param.assign(param - self.learning_rate * update), m.assign(next_m), v.assign(next_v)])
        return tf.group(*assignments, name=name)


def train_tf1(run_dir: str, record: str = "variables") -> list[dict[str, np.ndarray]]:
    """The TF1 program as BERT's ``create_optimizer`` builds it (``tf.gradients``, the optimizer,
    then the global step's increment); ``record``: ``variables`` (``rec.variables(optimizer=opt)``)
    or ``as_state`` (the moments as ``state``, as the shim recorded them before, beside a counter of
    examples seen, a state of TF1's own). Returns each moment as fetched from the session before
    each step."""
    seen = []
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        y = tf.compat.v1.placeholder(tf.float32, [None, 2])
        p = tf.compat.v1.layers.dense(x, 2, kernel_initializer=tf.constant_initializer(K0), name="dense")
        loss = rec.loss(tf.reduce_mean(tf.square(rec.activation("dense", p) - y)))
        opt = AdamWeightDecayOptimizer(rec.lr(tf.constant(LR)), WD, B1, B2, EPS)
        tvars = tf.compat.v1.trainable_variables()
        grads = tf.gradients(loss, tvars)
        rec.grads(grads, tvars)
        with rec.before_update(gs):
            train = tf.group(opt.apply_gradients(zip(grads, tvars), global_step=gs), gs.assign(gs + 1))
        moments = {v.name: v for v in tf.compat.v1.global_variables() if v.name in MOMENTS}
        if record == "variables":
            rec.variables(optimizer=opt)
        else:
            seen_examples = tf.compat.v1.get_variable("examples_seen", initializer=0.0, trainable=False)
            with rec.before_update():
                train = tf.group(train, seen_examples.assign_add(tf.cast(tf.shape(x)[0], tf.float32)))
            rec.weights(tvars)
            rec.states([*(moments[name] for name in MOMENTS), seen_examples])
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                feed = {x: X[s * BATCH : (s + 1) * BATCH], y: Y[s * BATCH : (s + 1) * BATCH]}
                seen.append(sess.run(moments))
                rec.write(sess.run([train, fetches], feed)[1])
        rec.close()
    return seen


def train_port(run_dir: str, beta_1: float = B1, beta_2: float = B2, slots: bool = True) -> None:
    """The Keras port in a ``tf.function`` loop; ``slots=False`` records no optimizer slot."""
    model = tf.keras.Sequential(
        [tf.keras.Input((4,)), tf.keras.layers.Dense(2, kernel_initializer=tf.constant_initializer(K0), name="dense")]
    )
    opt = BertAdam(LR, WD, EXCLUDE, beta_1=beta_1, beta_2=beta_2, epsilon=EPS)
    opt.build(model.trainable_variables)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt if slots else None):
            rec.lr(tf.constant(LR))
            with tf.GradientTape() as tape:
                loss = rec.loss(tf.reduce_mean(tf.square(rec.activation("dense", model(x)) - y)))
            grads = tape.gradient(loss, model.trainable_variables)
            rec.grads(grads, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

    for s in range(STEPS):
        step(tf.constant(X[s * BATCH : (s + 1) * BATCH]), tf.constant(Y[s * BATCH : (s + 1) * BATCH]))
    rec.close()


def test_bert_moments_are_recorded_as_slots_and_compared_on_a_faithful_port(tmp_path) -> None:
    seen = train_tf1(str(tmp_path / "tf1"))
    train_port(str(tmp_path / "tf2"))
    want = numpy_moments()
    recorded = tensors_by_step(str(tmp_path / "tf1"))
    for step in range(STEPS):  # numpy: the session's moments, and the recorded slots are they
        for name in MOMENTS:
            np.testing.assert_allclose(seen[step][name], want[step][name], rtol=1e-4, atol=1e-9)
            np.testing.assert_array_equal(
                recorded[step][("slot", name)][2].reshape(seen[step][name].shape), seen[step][name]
            )
        assert not [key for key in recorded[step] if key[0] == "state"], recorded[step].keys()
    assert np.abs(want[2]["dense/kernel/adam_v:0"]).min() > 0  # the moments move: comparing them proves something
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.agree, report.first_divergence
    slots = {m["baseline"]: m["candidate"] for m in report.to_dict()["mapping"] if m["kind"] == "slot"}
    assert slots == {
        "dense/kernel/adam_m:0": "m/dense/kernel",
        "dense/kernel/adam_v:0": "v/dense/kernel",
        "dense/bias/adam_m:0": "m/dense/bias",
        "dense/bias/adam_v:0": "v/dense/bias",
    }, slots


@pytest.mark.parametrize(
    "wrong, value, moment", [("beta_2", 0.99, "adam_v"), ("beta_1", 0.5, "adam_m")], ids=["beta_2", "beta_1"]
)
def test_a_wrong_beta_diverges_on_its_moment_where_numpy_parts_them(
    tmp_path, wrong: str, value: float, moment: str
) -> None:
    """The moment parts at step 1 (read before the update: both 0 at step 0), by (1 - beta) of the
    port's over TF1's, and the note reads it as Adam's moving average: the BERT moments are taken
    for Adam's first and second moments, so the slot's note names the beta and the port's value."""
    train_tf1(str(tmp_path / "tf1"))
    train_port(str(tmp_path / "tf2"), **{wrong: value})
    right, port = numpy_moments(), numpy_moments(**{wrong: value})
    parts = [
        step
        for step in range(STEPS)
        if not np.allclose(port[step][f"dense/kernel/{moment}:0"], right[step][f"dense/kernel/{moment}:0"], rtol=1e-3)
    ]
    assert parts[0] == 1
    other = "adam_m" if moment == "adam_v" else "adam_v"  # the other moment still agrees at step 1
    np.testing.assert_allclose(port[1][f"dense/kernel/{other}:0"], right[1][f"dense/kernel/{other}:0"], rtol=1e-9)
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert not report.agree and report.first_divergence.step == parts[0], report.first_divergence
    at_step = {(d.kind, d.tensor): d for d in report.divergences_at_first_step}
    assert ("slot", f"dense/kernel/{moment}:0") in at_step, list(at_step)
    assert ("slot", f"dense/kernel/{other}:0") not in at_step, list(at_step)
    note = at_step[("slot", f"dense/kernel/{moment}:0")].note or ""
    assert f"the two {wrong}s differ" in note and f"the candidate's is {value:.4g}" in note, note


def test_moments_recorded_as_state_are_told_as_the_ports_slots_not_to_be_silenced(tmp_path) -> None:
    """Runs recorded the old way (the moments as ``state``): each line says the other run records
    the same quantity as a slot, and no line suggests ``--allow-unmatched 'state/*'`` or says a
    run keeps no state or no slot at all."""
    train_tf1(str(tmp_path / "tf1"), record="as_state")
    train_port(str(tmp_path / "tf2"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    assert report.first_divergence.reason == "structure"
    notes = {(d.kind, d.tensor or d.candidate_tensor): d.note or "" for d in report.divergences_at_first_step}
    assert len(notes) == 9, list(notes)
    assert "'tf2' records it as slot/v/dense/kernel: the same quantity" in notes[("state", "dense/kernel/adam_v:0")]
    assert "'tf1' records this moment as state/dense/bias/adam_m:0" in notes[("slot", "m/dense/bias")]
    assert "rec.variables" in notes[("state", "dense/kernel/adam_m:0")]
    counter = notes.pop(("state", "examples_seen:0"))  # a state of TF1's own: the glob, and what else it hides
    assert "'tf2' recorded no state at all" in counter, counter
    assert "--allow-unmatched 'state/*' (which would also leave the 4 optimizer moment(s)" in counter, counter
    for note in notes.values():
        assert "--allow-unmatched '" not in note and "at all" not in note, note
    train_port(str(tmp_path / "bare"), slots=False)  # a port recording no slot: told to record them
    report = compare(str(tmp_path), baseline="tf1", candidate="bare")
    notes = {(d.kind, d.tensor): d.note or "" for d in report.divergences_at_first_step}
    notes.pop(("state", "examples_seen:0"))
    assert len(notes) == 4, list(notes)
    first = notes[("state", "dense/kernel/adam_m:0")]
    assert "'bare' records no slot of that variable" in first and "--allow-unmatched would leave it uncompared" in first
    assert not any("at all" in note or "--allow-unmatched '" in note for note in notes.values()), notes


def _one_step(rec: Any, train: Any, feed: Optional[dict] = None) -> set[tuple[str, str]]:
    """Runs ``train`` once with ``rec.fetches``, writes it as step 0; the (kind, name)s on disk."""
    fetches = rec.fetches
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        rec.write(sess.run([train, fetches], feed)[1], step=0)
    rec.close()
    return set(tensors_by_step(rec.logdir)[0])


def test_only_a_non_trainable_namesake_of_the_variables_shape_is_its_moment(tmp_path) -> None:
    """A user's own non-trainable ``<variable>/adam_v`` of another shape, a trainable one of the
    same shape, and a moment of another name (LAMB's ``lamb_m``) in one graph, recorded with
    ``rec.variables()``: only the moments by both name and shape are slots."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        get = tf.compat.v1.get_variable
        kernel = get("dense/kernel", initializer=K0)
        bias = get("dense/bias", initializer=np.zeros(2, np.float32))
        moments = [
            get("dense/kernel/lamb_m", initializer=np.zeros_like(K0), trainable=False),
            get("dense/bias/adam_m", initializer=np.zeros(2, np.float32), trainable=False),
        ]
        own = get("dense/kernel/adam_v", initializer=np.zeros(3, np.float32), trainable=False)
        trainable = get("dense/bias/adam_v", initializer=np.zeros(2, np.float32))
        train = tf.group(
            kernel.assign_sub(0.1 * kernel),
            bias.assign_add(tf.ones(2)),
            *(v.assign_add(tf.ones_like(v)) for v in [*moments, own]),
        )
        rec.variables()
        assert _one_step(rec, train) == {
            ("weight", "dense/kernel:0"),
            ("weight", "dense/bias:0"),
            ("weight", trainable.name),
            ("slot", "dense/kernel/lamb_m:0"),
            ("slot", "dense/bias/adam_m:0"),
            ("state", own.name),
        }


def test_slots_of_the_bert_optimizer_are_its_moments(tmp_path) -> None:
    """``rec.slots(opt, tvars)`` finds them among the graph's global variables (BERT's optimizer
    keeps no TF1 slot, so it raised 'keeps no slot')."""
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(str(tmp_path / "tf1"))
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        p = tf.compat.v1.layers.dense(x, 2, name="dense")
        opt = AdamWeightDecayOptimizer(LR, WD, B1, B2, EPS)
        tvars = tf.compat.v1.trainable_variables()
        train = opt.apply_gradients(zip(tf.gradients(tf.reduce_mean(p), tvars), tvars))
        assert len(rec.slots(opt, tvars)) == 4
        assert _one_step(rec, train, {x: X[:BATCH]}) == {("slot", name) for name in MOMENTS}
