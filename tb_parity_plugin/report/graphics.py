"""Static pictures for the HTML report: inline SVG line charts and a PNG data URI.

Written with numpy + zlib only, so a report needs no plotting dependency and opens
offline: nothing is fetched, everything is inside the one HTML string.
"""

from __future__ import annotations

import base64
import html
import struct
import zlib
from typing import Optional, Sequence

import numpy as np


def png_data_uri(rgb: np.ndarray) -> str:
    """``rgb`` uint8 ``[height, width, 3]`` as a ``data:image/png;base64,...`` URI."""
    h, w, _ = rgb.shape
    rows = np.concatenate([np.zeros((h, 1), np.uint8), np.ascontiguousarray(rgb, np.uint8).reshape(h, w * 3)], 1)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def fmt(x: object) -> str:
    """A figure for a table cell: 4 significant digits; NaN/Inf/None spelled out."""
    if x is None:
        return "–"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    try:
        v = float(x)  # type: ignore[arg-type]  # any float()-able object; the rest is caught below
    except (TypeError, ValueError):
        return str(x)
    return f"{v:.4g}" if np.isfinite(v) else str(v).replace("inf", "Inf").replace("nan", "NaN")


class Series:
    """One line of a chart: steps, values, a label and a CSS class for its stroke."""

    def __init__(self, label: str, steps: np.ndarray, values: np.ndarray, css: str) -> None:
        self.label, self.css = label, css
        self.steps = np.asarray(steps, np.float64)
        self.values = np.asarray(values, np.float64)


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    log: bool = False,
    marker_step: Optional[int] = None,
    empty: str = "no data",
    width: int = 460,
    height: int = 170,
) -> str:
    """An SVG chart; non-finite points break a line, ``log`` drops points <= 0, and a
    chart with nothing to draw says ``empty``."""
    pad_l, pad_r, pad_t, pad_b = 66, 20, 22, 24
    pw, ph = width - pad_l - pad_r, height - pad_t - pad_b
    ys = [s.values if not log else np.where(s.values > 0, s.values, np.nan) for s in series]
    ys = [np.log10(y) if log else y for y in ys]
    finite = np.concatenate([y[np.isfinite(y)] for y in ys] + [np.zeros(0)])
    xs = np.concatenate([s.steps for s in series] + [np.zeros(0)])
    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">']
    parts.append(f'<text x="{pad_l}" y="14" class="ctitle">{html.escape(title)}</text>')
    if finite.size == 0 or xs.size == 0:
        parts.append(f'<text x="{pad_l}" y="{pad_t + ph / 2}" class="axis">{html.escape(empty)}</text></svg>')
        return "".join(parts)
    x0, x1 = float(xs.min()), float(xs.max())
    y0, y1 = float(finite.min()), float(finite.max())
    if x1 == x0:
        x1 = x0 + 1
    if log and y1 - y0 < 1:  # at least one decade, so float noise does not fill the chart
        y0, y1 = (y0 + y1) / 2 - 0.5, (y0 + y1) / 2 + 0.5
    elif y1 == y0:
        y0, y1 = y0 - (abs(y0) * 0.1 or 1), y1 + (abs(y1) * 0.1 or 1)

    def px(x: np.ndarray) -> np.ndarray:
        return pad_l + (x - x0) / (x1 - x0) * pw

    def py(y: np.ndarray) -> np.ndarray:
        return pad_t + ph - (y - y0) / (y1 - y0) * ph

    parts.append(f'<rect x="{pad_l}" y="{pad_t}" width="{pw}" height="{ph}" class="plot"/>')
    for tick in (y0, y1):
        label = fmt(10**tick if log else tick)
        parts.append(
            f'<text x="{pad_l - 4}" y="{py(np.float64(tick)) + 4:.1f}" class="axis" text-anchor="end">{label}</text>'
        )
    for x in (x0, x1):
        parts.append(
            f'<text x="{px(np.float64(x)):.1f}" y="{height - 8}" class="axis" text-anchor="middle">{fmt(int(x))}</text>'
        )
    if marker_step is not None and x0 <= marker_step <= x1:
        mx = px(np.float64(marker_step))
        parts.append(f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{pad_t}" y2="{pad_t + ph}" class="marker"/>')
    for s, y in zip(series, ys):
        ok = np.isfinite(y)
        pts_x, pts_y = px(s.steps), py(np.where(ok, y, y0))
        path, pen_down = [], False
        for i in range(len(y)):
            if not ok[i]:
                pen_down = False
                continue
            path.append(f"{'L' if pen_down else 'M'}{pts_x[i]:.1f},{pts_y[i]:.1f}")
            pen_down = True
        if path:
            parts.append(f'<path d="{"".join(path)}" class="{s.css}"><title>{html.escape(s.label)}</title></path>')
    legend_x: float = pad_l + 8
    for s in series:
        parts.append(
            f'<line x1="{legend_x}" x2="{legend_x + 14}" y1="{pad_t + 10}" y2="{pad_t + 10}" class="{s.css}"/>'
            f'<text x="{legend_x + 18}" y="{pad_t + 14}" class="legend">{html.escape(s.label)}</text>'
        )
        legend_x += 24 + 6.5 * min(len(s.label), 40)
    parts.append("</svg>")
    return "".join(parts)
