"""Two BERT-style encoder blocks (TF1 ``tf.compat.v1.layers.dense`` under ``encoder/layer_<i>``)
ported to Keras ``MultiHeadAttention`` + ``Dense`` layers left at their default names. Each block's
output kernel ``[inner, d]`` is paired with its Keras ``dense_<n>`` by order (two of that shape on
each side); its bias ``[d]`` is one of many of that shape (TF1's query/key/value biases are ``[d]``,
Keras's ``[heads, key_dim]``), so it has to follow its kernel. It did not: the layer was then called
"parametrised otherwise" and the warning offered ``--allow-unmatched '*dense*'``, which silences
every dense layer. Expectations are checked against the variables both sides held (numpy)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tb_parity_plugin import compare, summary_v1, summary_v2

S, D, H, K, INNER, C, NL = 3, 4, 2, 2, 8, 2, 2
STEPS, BATCH = 3, 4
RNG = np.random.default_rng(48)
X = RNG.standard_normal((STEPS, BATCH, S, D)).astype(np.float32)
Y = RNG.integers(0, C, (STEPS, BATCH))
WL = [
    {
        n: (RNG.standard_normal(shape) * 0.3).astype(np.float32)
        for n, shape in [
            ("q", (D, H * K)),
            ("qb", (H * K,)),
            ("k", (D, H * K)),
            ("kb", (H * K,)),
            ("v", (D, H * K)),
            ("vb", (H * K,)),
            ("o", (H * K, D)),
            ("ob", (D,)),
            ("i", (D, INNER)),
            ("ib", (INNER,)),
            ("f", (INNER, D)),
            ("fb", (D,)),
        ]
    }
    for _ in range(NL)
]
HEAD = (RNG.standard_normal((D, C)) * 0.3).astype(np.float32)
MAPS = [
    m
    for i, keras in enumerate(("multi_head_attention", "multi_head_attention_1"))
    for m in (
        f"re:^encoder/layer_{i}/attention/output/dense/={keras}/attention_output/",
        *(f"re:^encoder/layer_{i}/attention/self/{n}/={keras}/{n}/" for n in ("query", "key", "value")),
    )
]


def _ln(t):
    mean, var = tf.nn.moments(t, [-1], keepdims=True)
    return (t - mean) * tf.math.rsqrt(var + 1e-12)


def _tf1(run_dir: str) -> dict[str, np.ndarray]:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, S, D])
        y = tf.compat.v1.placeholder(tf.int64, [None])

        def dense(t, n, name, w, key, activation=None):
            init = tf.compat.v1.constant_initializer
            return tf.compat.v1.layers.dense(
                t, n, activation, name=name, kernel_initializer=init(w[key]), bias_initializer=init(w[key + "b"])
            )

        def heads(t):
            return tf.transpose(tf.reshape(t, [-1, S, H, K]), [0, 2, 1, 3])

        h = x
        for i, w in enumerate(WL):
            with tf.compat.v1.variable_scope(f"encoder/layer_{i}"):
                with tf.compat.v1.variable_scope("attention/self"):
                    q, k, v = (dense(h, H * K, n, w, n[0]) for n in ("query", "key", "value"))
                    p = tf.nn.softmax(tf.matmul(heads(q), heads(k), transpose_b=True) * K**-0.5)
                    ctx = tf.reshape(tf.transpose(tf.matmul(p, heads(v)), [0, 2, 1, 3]), [-1, S, H * K])
                with tf.compat.v1.variable_scope("attention/output"):
                    a = _ln(dense(ctx, D, "dense", w, "o") + h)
                with tf.compat.v1.variable_scope("intermediate"):
                    inner = dense(a, INNER, "dense", w, "i", tf.nn.relu)
                with tf.compat.v1.variable_scope("output"):
                    h = rec.activation(f"layer_{i}/output", _ln(dense(inner, D, "dense", w, "f") + a))
        logits = tf.compat.v1.layers.dense(h[:, 0], C, kernel_initializer=tf.compat.v1.constant_initializer(HEAD))
        loss = rec.loss(tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits))
        train = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.1), loss, global_step=gs)
        rec.variables()
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            held = {v.op.name: sess.run(v) for v in tf.compat.v1.trainable_variables()}
            for s in range(STEPS):
                rec.write(sess.run([train, fetches], {x: X[s], y: Y[s]})[1])
        rec.close()
    return held


def _keras(run_dir: str) -> dict[str, np.ndarray]:
    """The port, every layer at its default Keras name; returns the variables it starts with."""
    tf.keras.backend.clear_session()  # default names count the layers made before in this process
    blocks = [
        (tf.keras.layers.MultiHeadAttention(H, K), tf.keras.layers.Dense(INNER, "relu"), tf.keras.layers.Dense(D))
        for _ in WL
    ]
    head = tf.keras.layers.Dense(C)
    x_in = tf.keras.Input((S, D))

    def forward(x, record):
        h = x
        for i, (mha, inner, out) in enumerate(blocks):
            a = _ln(mha(h, h) + h)
            h = record(f"layer_{i}/output", _ln(out(inner(a)) + a))
        return head(h[:, 0])

    model = tf.keras.Model(x_in, forward(x_in, lambda n, t: t))
    for w, (mha, inner, out) in zip(WL, blocks):
        mha.set_weights(
            [w[n].reshape(D, H, K) if n in "qkv" else w[n].reshape(H, K) for n in ("q", "qb", "k", "kb", "v", "vb")]
            + [w["o"].reshape(H, K, D), w["ob"]]
        )
        inner.set_weights([w["i"], w["ib"]])
        out.set_weights([w["f"], w["fb"]])
    head.set_weights([HEAD, np.zeros(C, np.float32)])
    held = {v.name[:-2]: v.numpy() for v in model.trainable_variables}
    opt = tf.keras.optimizers.SGD(0.1)
    rec = summary_v2.Recorder(run_dir)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with rec.step(opt.iterations, variables=model):
            with tf.GradientTape() as tape:
                loss = rec.loss(loss_fn(y, forward(x, rec.activation)))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for s in range(STEPS):
        step(tf.constant(X[s]), tf.constant(Y[s]))
    rec.close()
    return held


def test_a_bias_follows_its_kernel_paired_by_order(tmp_path) -> None:
    tf1, port = _tf1(str(tmp_path / "tf1")), _keras(str(tmp_path / "tf2"))
    # numpy: which Keras layer holds each TF1 block's output projection (default names: dense, dense_1 per block)
    for i, keras in enumerate(("dense_1", "dense_3")):
        np.testing.assert_array_equal(tf1[f"encoder/layer_{i}/output/dense/kernel"], port[f"{keras}/kernel"])
        np.testing.assert_array_equal(tf1[f"encoder/layer_{i}/output/dense/bias"], port[f"{keras}/bias"])
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    mapping = {(m["kind"], m["baseline"]): m["candidate"] for m in report.to_dict()["mapping"]}
    for i, keras in enumerate(("dense_1", "dense_3")):
        for leaf in ("kernel", "bias"):
            assert mapping.get(("weight", f"encoder/layer_{i}/output/dense/{leaf}:0")) == f"{keras}/{leaf}:0", mapping
    assert not [w for w in report.warnings if "could not be paired" in w], report.warnings
    # the attention's suggested maps are all it takes to compare the whole faithful port
    report = compare(str(tmp_path), baseline="tf1", candidate="tf2", mapping=MAPS)
    assert report.agree, report.first_divergence
