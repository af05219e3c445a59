"""Activations at a ReLU-like kink: a unit exactly 0 in one run and within atol of 0 in the other.

Where rounding puts a pre-activation at 0 decides whether a gradient flows through that unit, so
one unit's rounding can move a whole gradient by a finite amount for a step, on a faithful port
run without op determinism (a new user's Adagrad port: one ``fc2`` unit at 0.0 against 3.6e-9,
gradients out of tolerance at step 12, agreeing again at step 13). The gradient's difference is
real and stays a divergence; this finds, from the recorded values, the evidence that it may come
from rounding rather than the port, so the note can say so.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from tb_parity_plugin.engine.pair import Pair

#: How far from 0, relative to the activation's largest element, rounding can leave a unit that is
#: exactly 0 in the other run: 8 float32 ulps. A unit further off (but within atol) differs by more
#: than rounding, and the note would wrongly suggest the port is not the cause.
ROUNDING = 2.0**-20


def kinked(pairs: Sequence[Pair], k: int) -> list[tuple[str, int, float, float]]:
    """Per activation pair with full values at compared step ``k`` on both sides: (name, how many
    elements are exactly 0 in one run and nonzero in the other, within the pair's atol and
    :data:`ROUNDING` of its largest element; the first such baseline value, its candidate value),
    only pairs with some."""
    found = []
    for p in pairs:
        both = p.step_values(k) if p.base.kind == "activation" else None
        if both is None:
            continue
        b, c = both
        flips = (b == 0) != (c == 0)
        if not flips.any():
            continue
        scale = max(float(np.abs(b).max()), float(np.abs(c).max()))
        flips &= np.abs(np.where(b == 0, c, b)) <= min(p.atol_at(k), ROUNDING * scale)
        if flips.any():
            j = int(np.flatnonzero(flips)[0])
            found.append((p.base.name, int(flips.sum()), float(b[j]), float(c[j])))
    return found


def note(found: list[tuple[str, int, float, float]], step: Optional[int] = None) -> Optional[str]:
    """The note for a gradient diverging at a step where :func:`kinked` found units at their kink
    (``step``: that step, for a tensor diverging later that carries the gradient, such as its slot)."""
    if not found:
        return None
    name, count, b, c = found[0]
    more = f" (and {len(found) - 1} more activations)" if len(found) > 1 else ""
    units = f"{count} element{'s' if count > 1 else ''}"
    return (
        f"{'at this step' if step is None else f'at step {step}'} activation {name}{more} has {units} exactly 0 in one "
        "run and within rounding of 0 in the other "
        f"(e.g. {b:.3g} against {c:.3g}): a ReLU-like unit at its kink, where float rounding decides whether the "
        "gradient flows through it. The gradient's difference is real, but rounding rather than the port may "
        "cause it: check whether it recurs at later steps, and with "
        "tf.config.experimental.enable_op_determinism() on both sides"
    )
