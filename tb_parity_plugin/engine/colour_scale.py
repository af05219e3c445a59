"""The heat map's colour scale, defined once for the dashboard and the HTML report.

The report colours its PNG with :func:`cell_colours`; the dashboard receives :func:`to_dict`
in every ``/matrix`` payload and applies the same rule in ``frontend/src/heatmap.ts``
(``cellColor``), so one error ratio gets one colour in both (tests/browser checks pixels).

The colour follows the engine's reason code, never the ratio alone: a cell the engine
judged ``ok`` stays green even when a statistics-only ratio exceeds 1 (statistics prove
a divergence only through their bounds), and a ``value`` divergence is orange to red.

* ``ok``: pale to darker green as the error ratio rises from :data:`OK_FLOOR` to 1 (log).
* ``value``: orange to red as it rises from 1 to :data:`BAD_CEILING` (log); beyond, red.
* ``ok`` in a cell judged by statistics alone (``ParityMatrix.by_statistics``): one flat colour,
  ``unproven``, whatever its ratio: moments within their bounds say less than elements within
  tolerance (a new user's embedding cell was pale green, "4.6e-9 ok", with 25 elements 42x out).
* every other reason has one colour (NaN/Inf pattern, shape or dtype, one run only,
  not logged).

Lives beside ``matrix.py`` (whose reason codes it keys on) because both front ends sit
above the engine; it decides nothing, it only names colours.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from tb_parity_plugin.engine import matrix

#: Error ratios at or below this are the palest green.
OK_FLOOR = 1e-4
#: Error ratios at or above this are the darkest red (the legend says "red = 1000x").
BAD_CEILING = 1e3

RGB = tuple[int, int, int]
#: Stops and flat colours, light and dark side by side (the dashboard follows TensorBoard's dark mode).
_COLOURS: tuple[tuple[str, RGB, RGB], ...] = (
    ("ok_low", (232, 245, 233), (52, 64, 56)),
    ("ok_high", (129, 199, 132), (67, 160, 71)),
    ("unproven", (176, 206, 230), (62, 96, 122)),
    ("bad_low", (255, 183, 77), (255, 183, 77)),
    ("bad_high", (198, 40, 40), (244, 67, 54)),
    ("nonfinite", (142, 36, 170), (186, 104, 200)),
    ("structural", (57, 73, 171), (121, 134, 203)),
    ("missing", (158, 158, 158), (120, 120, 120)),
    ("absent", (238, 238, 238), (72, 72, 72)),
)
PALETTES: dict[str, dict[str, RGB]] = {
    "light": {key: light for key, light, _ in _COLOURS},
    "dark": {key: dark for key, _, dark in _COLOURS},
}
#: Reasons drawn in one flat colour (a palette key); ``ok`` and ``value`` use the ramps.
FLAT = {
    matrix.NONFINITE: "nonfinite",
    matrix.SHAPE: "structural",
    matrix.DTYPE: "structural",
    matrix.MISSING: "missing",
    matrix.ABSENT: "absent",
}
#: The legend both front ends show: (palette key, what it means).
LEGEND = (
    ("ok_high", "within tolerance (darker = closer to the limit)"),
    ("unproven", "within bounds by statistics only (elements not compared)"),
    ("bad_high", f"out of tolerance (red = {BAD_CEILING:g}x)"),
    ("nonfinite", "NaN/Inf pattern differs"),
    ("structural", "shape/dtype differs"),
    ("missing", "logged by one run only"),
    ("absent", "not logged"),
)


def to_dict() -> dict[str, Any]:
    """The scale as the ``/matrix`` payload's ``colour_scale`` (reasons by name)."""
    return {
        "ok_floor": OK_FLOOR,
        "bad_ceiling": BAD_CEILING,
        "palettes": {theme: {k: list(v) for k, v in colours.items()} for theme, colours in PALETTES.items()},
        "flat": {matrix.REASONS[code]: key for code, key in FLAT.items()},
        "legend": [list(item) for item in LEGEND],
    }


def _mix(low: RGB, high: RGB, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # floor(x + 0.5), not np.rint (which rounds half to even): the same as the dashboard's Math.round
    out: npt.NDArray[np.float64] = np.floor(np.asarray(low) + (np.asarray(high) - np.asarray(low)) * t[..., None] + 0.5)
    return out


def cell_colours(
    ratio: npt.ArrayLike, reason: npt.ArrayLike, theme: str = "light", statistics: npt.ArrayLike = False
) -> npt.NDArray[np.uint8]:
    """uint8 RGB ``[..., 3]`` per cell from the engine's error ratio and reason code; ``statistics``
    (broadcast against the cells, e.g. ``ParityMatrix.statistics``) marks cells
    compared by statistics alone."""
    p = PALETTES[theme]
    ratio = np.asarray(ratio, np.float64)
    reason = np.asarray(reason)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.nan_to_num(ratio, nan=0.0)
        t = np.clip((np.log10(np.fmax(r, OK_FLOOR)) - math.log10(OK_FLOOR)) / -math.log10(OK_FLOOR), 0, 1)
        u = np.clip(np.log10(np.fmax(r, 1.0)) / math.log10(BAD_CEILING), 0, 1)
    rgb = np.where(
        (reason == matrix.VALUE)[..., None], _mix(p["bad_low"], p["bad_high"], u), _mix(p["ok_low"], p["ok_high"], t)
    )
    rgb[(reason == matrix.OK) & np.broadcast_to(np.asarray(statistics, bool), reason.shape)] = p["unproven"]
    for code, key in FLAT.items():
        rgb[reason == code] = p[key]
    return rgb.astype(np.uint8)
