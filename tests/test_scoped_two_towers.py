"""A TF1 two-tower model under ``variable_scope("wide")`` and ``("deep")``, its layer outputs
recorded under their scopes (``wide/dense``, ``deep/dense``, ``deep/dense_1``), against a Keras
subclassed port whose ``__init__`` builds the deep tower first (so the port's ``dense_2`` is TF1's
``wide/dense``), from a new user's trial. The weights paired by their first values, but the outputs
did not follow their layers: ``wide/dense`` and ``deep/dense`` share the own name ``dense``, and the
scope was taken for a mode prefix. The faithful port was a structure divergence ("recorded by one
run only") while numpy found every tensor within tolerance."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tb_parity_plugin import compare, summary_v1, summary_v2

STEPS, BATCH, W, H, OUT = 4, 8, 5, 5, 3  # the wide and deep-out kernels share a shape
RNG = np.random.default_rng(21)
XW = RNG.standard_normal((STEPS * BATCH, W)).astype(np.float32)
XD = RNG.standard_normal((STEPS * BATCH, W)).astype(np.float32)
Y = RNG.standard_normal((STEPS * BATCH, 1)).astype(np.float32)
INIT = {
    "wide": (RNG.standard_normal((W, OUT)) * 0.4).astype(np.float32),
    "deep_hidden": (RNG.standard_normal((W, H)) * 0.4).astype(np.float32),
    "deep_out": (RNG.standard_normal((H, OUT)) * 0.4).astype(np.float32),
    "head": (RNG.standard_normal((2 * OUT, 1)) * 0.4).astype(np.float32),
}
LR = 0.05


def _tf1(run_dir: str) -> dict[str, list[np.ndarray]]:
    """Returns each output the session computed at each step, apart from the recorder."""
    seen: dict[str, list[np.ndarray]] = {}
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        xw = tf.compat.v1.placeholder(tf.float32, [None, W])
        xd = tf.compat.v1.placeholder(tf.float32, [None, W])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        dense = tf.compat.v1.layers.dense
        init = tf.constant_initializer
        with tf.compat.v1.variable_scope("wide"):
            wide = rec.activation("wide/dense", dense(xw, OUT, kernel_initializer=init(INIT["wide"]), name="dense"))
        with tf.compat.v1.variable_scope("deep"):
            h = rec.activation(
                "deep/dense", dense(xd, H, tf.nn.relu, kernel_initializer=init(INIT["deep_hidden"]), name="dense")
            )
            deep = rec.activation(
                "deep/dense_1", dense(h, OUT, kernel_initializer=init(INIT["deep_out"]), name="dense_1")
            )
        out = dense(tf.concat([wide, deep], 1), 1, kernel_initializer=init(INIT["head"]), name="head")
        loss = rec.loss(tf.compat.v1.losses.mean_squared_error(y, out))
        train_op = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(LR), loss, global_step=gs)
        outputs = {"wide": wide, "deep_hidden": h, "deep_out": deep}
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                rows = slice(s * BATCH, (s + 1) * BATCH)
                feed = {xw: XW[rows], xd: XD[rows], y: Y[rows]}
                for name, value in sess.run(outputs, feed).items():
                    seen.setdefault(name, []).append(value)
                rec.write(sess.run([train_op, fetches], feed)[1])
        rec.close()
    return seen


class TwoTower(tf.keras.Model):
    """Builds the deep tower first: Keras names the layers dense, dense_1, dense_2 (wide), dense_3."""

    def __init__(self) -> None:
        super().__init__(name="two_tower")
        self.deep_hidden = tf.keras.layers.Dense(H, activation="relu")
        self.deep_out = tf.keras.layers.Dense(OUT)
        self.wide = tf.keras.layers.Dense(OUT)
        self.head = tf.keras.layers.Dense(1)

    def call(self, inputs: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        xw, xd = inputs
        return self.head(tf.concat([self.wide(xw), self.deep_out(self.deep_hidden(xd))], 1))


def _keras(run_dir: str, swapped: bool = False) -> dict[str, list[np.ndarray]]:
    """Returns each output the port computed at each step, and (under ``names``) its layers' names:
    Keras numbers them per process (``dense_6`` after earlier tests), which is what pairing must survive."""
    model = TwoTower()
    model((tf.zeros((1, W)), tf.zeros((1, W))))
    crossed = {"wide": "deep_out", "deep_out": "wide"} if swapped else {}
    for name in INIT:
        getattr(model, name).kernel.assign(INIT[crossed.get(name, name)])
    opt = tf.keras.optimizers.SGD(LR)
    rec = summary_v2.Recorder(run_dir)
    for name in ("wide", "deep_hidden", "deep_out"):
        summary_v2.instrument_layer(rec, getattr(model, name))
    loss_fn = tf.keras.losses.MeanSquaredError()

    @tf.function
    def step(xw: tf.Tensor, xd: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with rec.step(opt.iterations):
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(y, model((xw, xd))))
            rec.minimize(opt, loss, model.trainable_variables, tape)
        return loss

    seen: dict[str, list[np.ndarray]] = {}
    for s in range(STEPS):
        rows = slice(s * BATCH, (s + 1) * BATCH)
        xw, xd = tf.constant(XW[rows]), tf.constant(XD[rows])
        h = model.deep_hidden(xd)
        for name, value in (("wide", model.wide(xw)), ("deep_hidden", h), ("deep_out", model.deep_out(h))):
            seen.setdefault(name, []).append(value.numpy())
        step(xw, xd, tf.constant(Y[rows]))
    rec.close()
    seen["names"] = [np.array(getattr(model, n).name) for n in ("wide", "deep_hidden", "deep_out")]
    return seen


def test_scoped_tf1_outputs_follow_their_layers_to_the_ports(tmp_path) -> None:
    tf1, port = _tf1(str(tmp_path / "tf1")), _keras(str(tmp_path / "tf2"))
    for name in tf1:  # numpy: the same outputs, step by step (the port's "names" aside)
        for a, b in zip(tf1[name], port[name]):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    assert np.abs(tf1["wide"][0] - tf1["deep_out"][0]).max() > 0.1  # the two [*, 3] outputs differ
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    paired = {m["baseline"]: m["candidate"] for m in report.to_dict()["mapping"] if m["kind"] == "activation"}
    wide, hidden, out = (str(n) for n in port["names"])  # dense_2, dense, dense_1 in a fresh process
    assert paired == {"wide/dense": wide, "deep/dense": hidden, "deep/dense_1": out}, paired
    assert report.agree, report.first_divergence


def test_kernels_swapped_across_the_towers_are_warned_of(tmp_path) -> None:
    """The port copied TF1's wide kernel into its deep-out layer and the reverse: its weights start
    like TF1's in creation order, its outputs ran in another order and all differ. numpy: the wide
    output is apart at step 0 from the port's output it is paired with (and from its own wide
    layer's); which layers the port's weights belong to, the records cannot prove (an input that
    differed upstream of both towers looks the same), so the verdict stays on the output and a
    warning names the crossed layers (it said nothing)."""
    tf1 = _tf1(str(tmp_path / "tf1"))
    port = _keras(str(tmp_path / "tf2"), swapped=True)
    wide, _, out = (str(n) for n in port["names"])
    assert (
        np.abs(port["deep_out"][0] - tf1["wide"][0]).max() > 0.1
        and np.abs(port["wide"][0] - tf1["wide"][0]).max() > 0.1
    )
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert first is not None and (first.step, first.kind, first.tensor) == (0, "activation", "wide/dense"), first
    assert first.candidate_tensor == out, first  # paired as the weights start: the port's deep-out layer
    (warning,) = [w for w in report.warnings if "weights loaded into the wrong layers" in w]
    assert f"wide/dense (the port's two_tower/{out}, which ran where its two_tower/{wide} ran)" in warning, warning
