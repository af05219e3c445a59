"""A TF1 self-attention written with dense layers (BERT's ``attention_layer``: query, key and value
kernels ``[d, heads * key_dim]``, an output kernel ``[heads * key_dim, d]``) ported to Keras
``MultiHeadAttention`` (``[d, heads, key_dim]`` and ``[heads, key_dim, d]``). The port holds the
same elements in another shape; it used to be a shape divergence whatever it computed. Each
expectation is checked against the variables and outputs both sides held, with numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tb_parity_plugin import compare, summary_v1, summary_v2

S, D, H, K, C = 5, 8, 2, 4, 3  # sequence, model width, heads, key_dim, classes
STEPS, BATCH = 4, 6
RNG = np.random.default_rng(11)
X = RNG.standard_normal((STEPS, BATCH, S, D)).astype(np.float32)
Y = RNG.integers(0, C, (STEPS, BATCH))
QKV = {n: (RNG.standard_normal((D, H * K)) * 0.4).astype(np.float32) for n in ("query", "key", "value")}
QKV_B = {n: (RNG.standard_normal(H * K) * 0.1).astype(np.float32) for n in ("query", "key", "value")}
OUT = (RNG.standard_normal((H * K, D)) * 0.4).astype(np.float32)
OUT_B = (RNG.standard_normal(D) * 0.1).astype(np.float32)
HEAD = (RNG.standard_normal((D, C)) * 0.4).astype(np.float32)
LR = 0.01
#: TF1's ``attention/output`` is Keras's ``attention/attention_output``: the user's map
MAP = ["re:attention/output/=attention/attention_output/"]
#: The key's bias has a gradient of 0 in exact math (softmax ignores a shift of a query's scores),
#: which Adam turns into steps near its lr in any two runs: the README's override for it
KEY_BIAS = ["weight/*key/bias*:atol=1e-3"]


def _tf1(run_dir: str, scale: float = K**-0.5) -> list[dict[str, np.ndarray]]:
    """The TF1 original; returns the query kernel and the attention output the session held at
    each step (before the update), apart from the recorder."""
    seen = []
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, S, D])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        dense = tf.compat.v1.layers.dense
        proj = {
            n: dense(
                x,
                H * K,
                kernel_initializer=tf.constant_initializer(QKV[n]),
                bias_initializer=tf.constant_initializer(QKV_B[n]),
                name=f"attention/{n}",
            )
            for n in ("query", "key", "value")
        }

        def heads(t: Any) -> Any:
            return tf.transpose(tf.reshape(t, [-1, S, H, K]), [0, 2, 1, 3])

        scores = tf.matmul(heads(proj["query"]) * scale, heads(proj["key"]), transpose_b=True)
        context = tf.matmul(tf.nn.softmax(scores), heads(proj["value"]))
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, S, H * K])
        out = dense(
            context,
            D,
            kernel_initializer=tf.constant_initializer(OUT),
            bias_initializer=tf.constant_initializer(OUT_B),
            name="attention/output",
        )
        out = rec.activation("attention", out)
        logits = dense(tf.reduce_mean(out, axis=1), C, kernel_initializer=tf.constant_initializer(HEAD), name="head")
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        opt = tf.compat.v1.train.AdamOptimizer(LR, epsilon=1e-7)
        train = rec.minimize(opt, loss, global_step=gs)
        rec.variables(optimizer=opt)
        kernel = [v for v in tf.compat.v1.trainable_variables() if v.op.name == "attention/query/kernel"][0]
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                seen.append(dict(zip(("kernel", "out"), sess.run([kernel, out], {x: X[s]}))))
                rec.write(sess.run([train, fetches], {x: X[s], y: Y[s]})[1])
        rec.close()
    return seen


def _keras(run_dir: str, query_kernel: np.ndarray | None = None) -> list[dict[str, np.ndarray]]:
    """The port: Keras MultiHeadAttention given the TF1 weights reshaped (``query_kernel``: the
    converter's own ``[d, heads, key_dim]`` query kernel instead); a tf.function loop."""
    inputs = tf.keras.Input((S, D))
    mha = tf.keras.layers.MultiHeadAttention(H, K, name="attention")
    head = tf.keras.layers.Dense(C, name="head")
    out = mha(inputs, inputs)
    model = tf.keras.Model(inputs, head(tf.reduce_mean(out, axis=1)))
    weights = []
    for n in ("query", "key", "value"):
        weights += [QKV[n].reshape(D, H, K), QKV_B[n].reshape(H, K)]
    if query_kernel is not None:
        weights[0] = query_kernel
    mha.set_weights(weights + [OUT.reshape(H, K, D), OUT_B])
    head.set_weights([HEAD, np.zeros(C, np.float32)])
    opt = tf.keras.optimizers.Adam(LR)
    rec = summary_v2.Recorder(run_dir)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                h = rec.activation("attention", mha(x, x))
                loss = rec.loss(loss_fn(y, head(tf.reduce_mean(h, axis=1))))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    seen = []
    for s in range(STEPS):
        seen.append({"kernel": mha._query_dense.kernel.numpy().reshape(D, H * K), "out": mha(X[s], X[s]).numpy()})
        step(tf.constant(X[s]), tf.constant(Y[s]))
    rec.close()
    return seen


def _first_apart(tf1: list[dict[str, np.ndarray]], port: list[dict[str, np.ndarray]], key: str) -> int | None:
    """numpy's answer: the first step the two sides' ``key`` differ past the warm-up tolerance."""
    for s, (a, b) in enumerate(zip(tf1, port)):
        if not np.allclose(b[key], a[key], rtol=1e-7, atol=1e-5):
            return s
    return None


def test_a_faithful_multi_head_attention_port_agrees_element_wise(tmp_path) -> None:
    tf1, port = _tf1(str(tmp_path / "tf1")), _keras(str(tmp_path / "tf2"))
    assert _first_apart(tf1, port, "kernel") is None and _first_apart(tf1, port, "out") is None
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", mapping=MAP, overrides=KEY_BIAS)
    assert report.agree, report.first_divergence
    mapping = {(m["kind"], m["baseline"]): m["candidate"] for m in report.to_dict()["mapping"]}
    assert mapping[("weight", "attention/query/kernel:0")].endswith("attention/query/kernel:0")
    assert "attention/attention_output/kernel" in mapping[("slot", "attention/output/kernel/Adam:0")]
    (reshaped,) = [w for w in report.warnings if "in row-major order" in w]
    # 4 kernels and 3 biases, each with its gradient and Adam's two slots (the output bias is [d] on both)
    assert (
        reshaped.startswith("28 paired tensor(s)") and "weight/attention/query/kernel:0 [8, 8] ~ [8, 2, 4]" in reshaped
    )
    detail = report.comparison.detail("attention/query/kernel:0", step=STEPS - 1)
    assert detail.diff is not None and detail.diff.shape == (D, H * K)
    np.testing.assert_allclose(detail.diff, port[-1]["kernel"] - tf1[-1]["kernel"], atol=1e-6)


def test_a_query_kernel_converted_transposed_diverges_on_it_at_step_0(tmp_path) -> None:
    """The converter reshaped the TF1 kernel as ``[d, key_dim, heads]`` and swapped the axes: the
    same elements, another layout, which the port then computes with."""
    wrong = QKV["query"].reshape(D, K, H).transpose(0, 2, 1)
    tf1, port = _tf1(str(tmp_path / "tf1")), _keras(str(tmp_path / "tf2"), query_kernel=wrong)
    assert _first_apart(tf1, port, "kernel") == 0
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2", mapping=MAP, overrides=KEY_BIAS).first_divergence
    assert (first.step, first.kind, first.tensor, first.reason) == (0, "weight", "attention/query/kernel:0", "value")


def test_heads_split_in_another_order_are_named_at_step_0(tmp_path) -> None:
    """A new user's converter split the heads in another order (``[d, key_dim, heads]`` then
    transposed): the query kernel diverged at step 0 with no note, though both runs held the same
    values there, in another order."""
    wrong = QKV["query"].reshape(D, K, H).transpose(0, 2, 1)
    tf1, port = _tf1(str(tmp_path / "tf1")), _keras(str(tmp_path / "tf2"), query_kernel=wrong)
    held_tf1, held_port = tf1[0]["kernel"], port[0]["kernel"]  # [d, heads * key_dim] both, as each held it
    assert not np.allclose(held_tf1, held_port) and np.array_equal(np.sort(held_tf1, None), np.sort(held_port, None))
    assert np.array_equal(held_tf1.reshape(D, K, H).swapaxes(1, 2).reshape(-1), held_port.reshape(-1))
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2", mapping=MAP, overrides=KEY_BIAS).first_divergence
    assert (first.step, first.tensor) == (0, "attention/query/kernel:0"), first
    assert "same values in another order" in (first.note or ""), first.note
    assert f"axis 1 of {H * K} read as [{K}, {H}] and transposed to [{H}, {K}]" in (first.note or ""), first.note


def test_another_attention_scale_diverges_on_the_attention_output_at_step_0(tmp_path) -> None:
    """TF1 scaled the scores by 1/sqrt(d) where Keras scales by 1/sqrt(key_dim)."""
    tf1, port = _tf1(str(tmp_path / "tf1"), scale=D**-0.5), _keras(str(tmp_path / "tf2"))
    assert _first_apart(tf1, port, "kernel") is None or _first_apart(tf1, port, "kernel") > 0
    assert _first_apart(tf1, port, "out") == 0
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2", mapping=MAP, overrides=KEY_BIAS).first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "activation", "attention"), first


def test_without_the_map_the_structure_report_suggests_it(tmp_path) -> None:
    """A helper's TF1 BERT-style attention against Keras MultiHeadAttention was 96 structure lines,
    whose ambiguous partners were all wrong, until it wrote its maps by hand. The report suggests
    the one this port needs (TF1's ``attention/output`` is Keras's ``attention_output``), and the
    suggestion, passed as it is, gives the verdict the user's own map gives."""
    import pytest

    from tb_parity_plugin import api, cli
    from tb_parity_plugin.report import page

    _tf1(str(tmp_path / "tf1"))
    _keras(str(tmp_path / "tf2"))
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", overrides=KEY_BIAS)
    assert report.first_divergence is not None and report.first_divergence.reason == "structure"
    suggested = report.structure["suggested_maps"]
    assert suggested == ["re:^attention/output/=attention/attention_output/"], suggested
    line = "suggested: --map 're:^attention/output/=attention/attention_output/'"
    assert any(line in text for text in cli.structure_lines(report))
    assert "suggested-maps" in page.report_fragment(report) and "attention_output/" in page.report_fragment(report)
    with pytest.raises(AssertionError, match="suggested: --map"):
        api.assert_parity(str(tmp_path), baseline="tf1", candidate="tf2", overrides=KEY_BIAS)
    mapped = compare(str(tmp_path), baseline="tf1", candidate="tf2", mapping=suggested, overrides=KEY_BIAS)
    assert mapped.agree, mapped.first_divergence
    assert mapped.structure["suggested_maps"] == []


def test_suggested_maps_follow_the_weights_values_not_creation_order() -> None:
    """The review of the suggestions: TF1 created its key projection before its query, Keras its
    query first; suggested in creation order, the maps paired them crosswise (a false DIVERGE once
    passed). The weights' first statistics (the port copied TF1's) pair them; layers that start
    alike (a layer norm's gamma 1 and beta 0, twice) get no suggestion."""
    from engine_helpers import run, series

    from tb_parity_plugin.engine import Comparison

    rng = np.random.default_rng(0)
    w = {r: rng.standard_normal((3, 4)).astype(np.float32) for r in ("q", "k")}

    def side(name: str, layers: list[tuple[str, str]], merged: bool) -> Any:
        tensors = []
        for i, (scope, role) in enumerate(layers):
            kernel = w[role].reshape(3, 2, 2) if merged else w[role]
            tensors += [
                series("weight", f"{scope}/kernel:0", [kernel] * 2, order=2 * i),
                series(
                    "weight", f"{scope}/bias:0", [np.zeros((2, 2) if merged else 4, np.float32)] * 2, order=2 * i + 1
                ),
            ]
        for j, scope in enumerate(("ln_a", "ln_b") if name == "tf1" else ("norm1", "norm2")):
            tensors += [
                series("weight", f"{scope}/gamma:0", [np.ones(4, np.float32)] * 2, order=10 + 2 * j),
                series("weight", f"{scope}/beta:0", [np.zeros(4, np.float32)] * 2, order=11 + 2 * j),
            ]
        return run(name, tensors)

    base = side("tf1", [("enc/k", "k"), ("enc/q", "q")], False)
    cand = side("tf2", [("mha/query", "q"), ("mha/key", "k")], True)
    suggested = Comparison(base, cand).structure().suggested_maps
    assert suggested == ["re:^enc/k/=mha/key/", "re:^enc/q/=mha/query/"], suggested
    mapped = Comparison(base, cand, mapping=suggested + ["ln_a=norm1", "ln_b=norm2"]).report()
    assert mapped.agree, mapped.first_divergence


def test_a_suggested_map_pastes_into_a_shell_as_one_argument() -> None:
    """The review's scope named ``it's``: quoted by hand, two maps became one argument."""
    import shlex

    from tb_parity_plugin import api

    items = ["re:^enc/k/=it's/key/", "re:^enc/q/=mha/query/"]
    words = shlex.split(api.suggested_maps_line(items).split(" (layers")[0].removeprefix("suggested: "))
    assert words == ["--map", items[0], "--map", items[1]], words
