"""FULL_HEALTH counts and moments of a tensor, as numpy (the reference).

The TF-op version used by the logging shim lives in ``health_tf.py`` and must agree
with :func:`health_numpy` (tests check it). Row layout: ``metadata.STATS_FIELDS``.
"""

from __future__ import annotations

import numpy as np

from tb_parity_plugin.records import metadata
from tb_parity_plugin.records.dtypes import TF_DTYPE_ENUM


def health_numpy(array: np.ndarray, dtype_name: str | None = None) -> np.ndarray:
    """Stats row (float64, ``len(STATS_FIELDS)``) of ``array``.

    Counts follow Debugger V2's FULL_HEALTH; min/max/mean/std/l2 cover the finite
    elements only and are NaN when there are none. ``std`` is the population std.
    """
    a = np.asarray(array)
    name = dtype_name or a.dtype.name
    x = a.astype(np.float64, copy=False).ravel()
    row = np.zeros(metadata.N_STATS, dtype=np.float64)
    idx = metadata.STAT_INDEX
    row[idx["dtype"]] = TF_DTYPE_ENUM.get(name, 0)
    row[idx["rank"]] = a.ndim
    row[idx["size"]] = x.size
    nan = np.isnan(x)
    pos_inf = np.isposinf(x)
    neg_inf = np.isneginf(x)
    finite = ~(nan | pos_inf | neg_inf)
    f = x[finite]
    row[idx["neg_inf"]] = neg_inf.sum()
    row[idx["pos_inf"]] = pos_inf.sum()
    row[idx["nan"]] = nan.sum()
    row[idx["neg_finite"]] = (f < 0).sum()
    row[idx["zero"]] = (f == 0).sum()
    row[idx["pos_finite"]] = (f > 0).sum()
    if f.size:
        row[idx["min"]] = f.min()
        row[idx["max"]] = f.max()
        row[idx["mean"]] = f.mean()
        row[idx["std"]] = f.std()
        row[idx["l2"]] = np.sqrt(np.dot(f, f))
    else:
        for field in metadata.MOMENT_FIELDS:
            row[idx[field]] = np.nan
    return row
