"""What both sides of a demo pair share: data, initial weights and hyper-parameters.

Both sides start from the same numpy arrays so that any divergence is the port's doing.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

UNITS = (2, 2, 3)  # the guide's model: input 3 -> dense 2 -> dense 2 -> dense 3 (logits)
LAYER_NAMES = ("dense", "dense_1", "dense_2")  # TF1's automatic names, reused by the port
N_EXAMPLES = 8


@dataclasses.dataclass(frozen=True)
class PairConfig:
    """Hyper-parameters and data of one demo pair (identical on both sides)."""

    steps: int = 40
    learning_rate: float = 0.1
    end_learning_rate: float = 0.01
    decay_steps: int = 40
    #: Step whose batch holds one unnormalized example (features x OUTLIER_SCALE).
    outlier_step: Optional[int] = None
    #: Shape-agnostic code: TF1 placeholders ``[None, 3]``, a TF2 ``input_signature`` of ``None``
    #: batch, and a last batch of this many examples (a partial batch, as a dataset's remainder).
    last_batch: Optional[int] = None


OUTLIER_SCALE = 100.0


def data(cfg: PairConfig) -> tuple[np.ndarray, np.ndarray]:
    """One fixed batch per step: features ``[steps, N, 3]`` float32, one-hot labels.

    Labels come from a teacher of rank 2, which the model (2-unit layers) can learn,
    so after a few dozen steps it classifies confidently; the outlier example is then
    far from every decision boundary, and a naive ``log(softmax)`` underflows on it.
    """
    rng = np.random.default_rng(42)
    teacher = rng.standard_normal((3, 2)) @ rng.standard_normal((2, 3))
    x = rng.standard_normal((cfg.steps, N_EXAMPLES, 3))
    if cfg.outlier_step is not None:
        x[cfg.outlier_step, 0] *= OUTLIER_SCALE
    labels = np.argmax(x @ teacher, axis=-1)
    return x.astype(np.float32), np.eye(3, dtype=np.float32)[labels]


def initial_weights() -> list[tuple[np.ndarray, np.ndarray]]:
    """(kernel, bias) per layer, Glorot-uniform-like, from a fixed seed."""
    rng = np.random.default_rng(7)
    out, fan_in = [], 3
    for units in UNITS:
        limit = np.sqrt(6.0 / (fan_in + units))
        kernel = rng.uniform(-limit, limit, (fan_in, units)).astype(np.float32)
        bias = (0.1 * rng.standard_normal(units)).astype(np.float32)
        out.append((kernel, bias))
        fan_in = units
    return out


def batch(cfg: PairConfig, x: np.ndarray, y: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The examples of ``step``: all of them, or the partial last batch of a shape-agnostic pair."""
    if cfg.last_batch is not None and step == cfg.steps - 1:
        return x[step, : cfg.last_batch], y[step, : cfg.last_batch]
    return x[step], y[step]
