"""Writes the seven demo pairs: ``python -m demo.write_logs LOGDIR``.

``LOGDIR/<pair>/tf1`` is the TF1 original, ``LOGDIR/<pair>/tf2`` its port:
``clean`` (a correct port), ``lr_offbyone`` (schedule off by one step), ``nan``
(hand-written cross-entropy that takes ``log`` of an underflowed softmax), ``none_batch``
(shape-agnostic code with a partial last batch: a correct port) and ``missing_bias`` (the port's
last layer has no bias: a structure divergence), ``batch_norm`` (batch norm and Momentum: TF1
with ``UPDATE_OPS`` against a Keras ``model.fit`` port; weights, moving statistics and slots
agree) and ``forward_pass`` (one forward pass per mode, no optimizer: agrees).

LOGDIR may be a URL (``s3://bucket/demo``, ``gs://...``, any fsspec URL): the pairs are written
to a temporary directory and uploaded with fsspec, which works for every store (TensorFlow
2.21's own file systems write ``gs://`` but not ``s3://``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Optional, Sequence

import demo  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)
from demo import bn_model, model_tf1, model_tf2
from demo.common import PairConfig
from tb_parity_plugin.records.urls import is_url

#: pair -> (config, bug planted in the port)
PAIRS = {
    "clean": (PairConfig(), None),
    "lr_offbyone": (PairConfig(), "lr_offbyone"),
    # Step 25's batch holds an unnormalized example the model classifies confidently:
    # its other-class softmax probabilities underflow to 0 in float32. TF1's stable
    # loss stays finite; the port's log(softmax) gives 0 * -inf = NaN.
    "nan": (PairConfig(outlier_step=25), "log_softmax"),
    # Shape-agnostic code, as users write it: placeholders [None, 3] against a tf.function with
    # an input_signature of None batch, and a partial last batch (5 of 8). A faithful port: agrees.
    "none_batch": (PairConfig(last_batch=5), None),
    # The port builds its last layer without a bias: a variable of one run only, a structure divergence.
    "missing_bias": (PairConfig(), "no_bias"),
}


#: pairs of the batch-norm model (demo/bn_model.py): (TF1 writer, TF2 writer)
BN_PAIRS = {
    # TF1 with UPDATE_OPS wired into the train op and Momentum, against a Keras model.fit port:
    # weights, batch-norm moving statistics (state) and momentum slots, read at each step's start.
    "batch_norm": (
        lambda run: bn_model.train_tf1(run, "momentum"),
        lambda run: bn_model.train_tf2_fit(run, optimizer=bn_model.OPTIMIZERS["momentum"][1]()),
    ),
    # The guides' first check: one forward pass per mode (inference, training), no optimizer.
    "forward_pass": (bn_model.forward_tf1, bn_model.forward_tf2),
}


def write_pair(logdir: str, pair: str) -> None:
    if pair in BN_PAIRS:
        tf1, tf2 = BN_PAIRS[pair]
        tf1(os.path.join(logdir, pair, "tf1"))
        tf2(os.path.join(logdir, pair, "tf2"))
        return
    cfg, bug = PAIRS[pair]
    model_tf1.train(os.path.join(logdir, pair, "tf1"), cfg)
    model_tf2.train(os.path.join(logdir, pair, "tf2"), cfg, bug=bug)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--pairs", nargs="*", default=[*PAIRS, *BN_PAIRS], choices=[*PAIRS, *BN_PAIRS])
    args = parser.parse_args(argv)
    if not is_url(args.logdir):
        write_pairs(args.logdir, args.pairs)
        return 0
    import fsspec

    with tempfile.TemporaryDirectory() as local:
        write_pairs(local, args.pairs)
        fs, root = fsspec.core.url_to_fs(args.logdir)
        for pair in args.pairs:
            fs.put(os.path.join(local, pair), f"{root.rstrip('/')}/{pair}", recursive=True)
    print(f"uploaded to {args.logdir}")
    return 0


def write_pairs(logdir: str, pairs: Sequence[str]) -> None:
    for pair in pairs:
        start = time.perf_counter()
        write_pair(logdir, pair)
        print(f"{pair}: {logdir}/{pair}/{{tf1,tf2}} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    sys.exit(main())
