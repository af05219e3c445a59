"""A wide table whose crossed ids the port hashes to other buckets, from a trial's wide-and-deep port.

TF1 hashes the joined string ``"<user>_X_<item>"`` with ``string_to_hash_bucket_fast``; the port crosses
the two ids with Keras's ``HashedCrossing``, another hash. The table starts at 0, so every output and the
loss agree at step 0, and the table's gradient holds the same values at other rows. The table is above
``full_values_limit``: its gradient is compared by statistics, which agree, and by its element sample,
which differs. The note said "the whole gradient is exactly 0 in 'tf2' alone" (the sample's elements
were, the gradient was not) and sent the user to stop_gradients and custom gradients. Expectations are
checked against numpy: the gradient of a mean sigmoid cross-entropy at logits 0 is (0.5 - y) / batch per
looked-up row.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tb_parity_plugin import compare, summary_v1, summary_v2

BUCKETS, BATCH, STEPS = 5000, 64, 2  # 5000 > 4096: the table is kept as statistics and a sample
RNG = np.random.default_rng(17)  # a seed whose crosses share no bucket in either run, and hit the sample
USER = RNG.integers(0, 40, (STEPS, BATCH))
ITEM = RNG.integers(0, 90, (STEPS, BATCH))
Y = RNG.integers(0, 2, (STEPS, BATCH, 1)).astype(np.float32)


def _joined(user: tf.Tensor, item: tf.Tensor) -> tf.Tensor:
    return tf.strings.join([tf.strings.as_string(user), tf.strings.as_string(item)], separator="_X_")


def _tf1(run_dir: str) -> None:
    with tf.Graph().as_default():
        rec = summary_v1.Recorder(run_dir)
        gs = tf.compat.v1.train.get_or_create_global_step()
        user = tf.compat.v1.placeholder(tf.int64, [None])
        item = tf.compat.v1.placeholder(tf.int64, [None])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        buckets = tf.compat.v1.string_to_hash_bucket_fast(_joined(user, item), BUCKETS)
        table = tf.compat.v1.get_variable("crossed/weights", [BUCKETS, 1], initializer=tf.zeros_initializer())
        bias = tf.compat.v1.get_variable("bias", [1], initializer=tf.zeros_initializer())
        logits = rec.activation("logits", tf.nn.embedding_lookup(table, buckets) + bias)
        loss = rec.loss(tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits)))
        train = rec.minimize(tf.compat.v1.train.GradientDescentOptimizer(0.5), loss, global_step=gs)
        rec.variables()
        fetches = rec.fetches
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                rec.write(sess.run([train, fetches], {user: USER[s], item: ITEM[s], y: Y[s]})[1])
        rec.close()


class _Bias(tf.keras.layers.Layer):
    def build(self, shape: tf.TensorShape) -> None:
        self.bias = self.add_weight("bias", [1], initializer="zeros")

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return x + self.bias


def _port(run_dir: str) -> None:
    user = tf.keras.Input((), dtype=tf.int64)
    item = tf.keras.Input((), dtype=tf.int64)
    buckets = tf.keras.layers.HashedCrossing(BUCKETS)((user, item))  # the slip: another hash than TF1's
    rows = tf.keras.layers.Embedding(BUCKETS, 1, embeddings_initializer="zeros", name="crossed")(buckets)
    model = tf.keras.Model([user, item], _Bias(name="bias")(rows))
    opt = tf.keras.optimizers.SGD(0.5)
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    rec = summary_v2.Recorder(run_dir)

    @tf.function
    def step(u: tf.Tensor, i: tf.Tensor, y: tf.Tensor) -> None:
        with rec.step(opt.iterations, variables=model, optimizer=opt):
            with tf.GradientTape() as tape:
                loss = rec.loss(bce(y, rec.activation("logits", model([u, i]))))
            rec.minimize(opt, loss, model.trainable_variables, tape)

    for s in range(STEPS):
        step(tf.constant(USER[s]), tf.constant(ITEM[s]), tf.constant(Y[s]))
    rec.close()


def _table_gradient(buckets: np.ndarray) -> np.ndarray:
    """numpy: step 0's gradient of the table, logits 0: (sigmoid(0) - y) / batch summed per row."""
    grad = np.zeros(BUCKETS)
    np.add.at(grad, buckets, (0.5 - Y[0, :, 0].astype(np.float64)) / BATCH)
    return grad


def test_crossed_ids_hashed_to_other_buckets_are_told_so_not_a_gradient_that_is_all_zero(tmp_path) -> None:
    _tf1(str(tmp_path / "tf1"))
    _port(str(tmp_path / "tf2"))
    tf1_rows = tf.strings.to_hash_bucket_fast(_joined(USER[0], ITEM[0]), BUCKETS).numpy()
    port_rows = tf.keras.layers.HashedCrossing(BUCKETS)((USER[0], ITEM[0])).numpy()
    g1, g2 = _table_gradient(tf1_rows), _table_gradient(port_rows)
    assert np.count_nonzero(g1) == np.count_nonzero(g2) > 50  # no bucket shared by two crosses in either run
    np.testing.assert_allclose(np.sort(g1), np.sort(g2))  # the same values ...
    assert np.abs(g1 - g2).max() > 1e-3  # ... at other rows: a real difference from step 0

    report = compare(str(tmp_path), baseline="tf1", candidate="tf2")
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "grad", "crossed/weights:0#sample"), first
    note = first.note or ""
    assert "exactly 0" not in note and "stop_gradient" not in note, note
    assert "the same values at other positions" in note and "HashedCrossing" in note, note


def test_one_sampled_element_of_another_value_is_not_told_moved(tmp_path) -> None:
    """A dense gradient of about a million elements, one sampled element 30% larger in one run (a value
    that differs, no move): a change that small in a single element stays within float32 rounding of the
    whole's statistics (L2 by 3.4e-7 of itself, numpy), which therefore agree, and the note said "likely the
    same values at other positions ... ids mapped to other rows". Statistics that a lone change of the
    sampled elements cannot move say nothing of where the values are."""
    from engine_helpers import write_run

    from tb_parity_plugin.records import metadata

    rng = np.random.default_rng(3)
    w = (rng.standard_normal((65536, 16)) * 0.05).astype(np.float32)
    g = (rng.standard_normal((65536, 16)) * 0.01).astype(np.float32)
    pos = metadata.sample_positions(g.size)
    other = g.copy()
    other.flat[pos[100]] *= 1.3
    g64, o64 = g.astype(np.float64), other.astype(np.float64)
    assert not np.array_equal(np.sort(g.ravel()), np.sort(other.ravel()))  # not the same values moved
    assert abs(np.linalg.norm(o64) / np.linalg.norm(g64) - 1) < 8 * np.finfo(np.float32).eps
    for run, grad in (("tf1", g), ("tf2", other)):
        write_run(
            str(tmp_path),
            run,
            [0, 1],
            lambda step, grad=grad: [
                ("weight", "table:0", w),
                ("grad", "table:0", grad),
                ("grad", "table:0" + metadata.SAMPLE_MARK, grad.ravel()[pos]),
                ("loss", "loss", np.float32(1.0)),
            ],
        )
    first = compare(str(tmp_path), baseline="tf1", candidate="tf2").first_divergence
    assert (first.step, first.kind, first.tensor) == (0, "grad", "table:0" + metadata.SAMPLE_MARK), first
    assert "same values at other positions" not in (first.note or ""), first.note
