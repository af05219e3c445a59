"""One colour scale: the dashboard's heat map and the HTML report colour each cell alike.

The scale is defined once (``engine/colour_scale.py``); the report paints its PNG with it,
the dashboard receives it in ``/matrix`` and paints its canvas. Here both pictures of the
same comparison are read back pixel by pixel: the report's PNG decoded from its data URI,
the dashboard's canvas at each cell's centre (outlines only touch cell edges).
"""

from __future__ import annotations

import base64
import os
import re
import struct
import zlib

import numpy as np
import pytest

from browser.test_dashboard import open_tab
from tb_parity_plugin import api
from tb_parity_plugin.engine import colour_scale
from tb_parity_plugin.report import page as report_page

one_server = pytest.mark.parametrize("server", ["load_fast_false"], indirect=True)


def decode_png(uri: str) -> np.ndarray:
    """RGB pixels of an 8-bit RGB PNG whose rows use filter 0 (what graphics.png_data_uri writes)."""
    data = base64.b64decode(uri.split(",", 1)[1])
    pos, idat, size = 8, b"", (0, 0)
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if tag == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif tag == b"IDAT":
            idat += body
        pos += 12 + length
    w, h = size
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)
    assert not rows[:, 0].any(), "unexpected PNG filter"
    return rows[:, 1:].reshape(h, w, 3)


@one_server
@pytest.mark.parametrize("pair", ["lr_offbyone", "nan", "upstream"])
def test_dashboard_and_report_colour_each_cell_alike(page, server: str, demo_logdir: str, pair: str) -> None:
    report = api.compare(os.path.join(demo_logdir, pair))
    m = report.matrix()
    html = report_page.report_document(report)
    (uri,) = re.findall(r'href="(data:image/png;base64,[^"]+)"', html)
    reported = decode_png(uri)  # [tensor, step, rgb]
    n_steps, n_tensors = m.error_ratio.shape
    assert reported.shape[:2] == (n_tensors, n_steps)

    frame = open_tab(page, server, pair)
    canvas = frame.locator("[data-testid=heatmap]")
    row = max(2, min(16, 480 // n_tensors))  # heatmap.ts's row height
    shown = np.array(
        canvas.evaluate(
            """(c, [nb, nt, row]) => {
                 const ctx = c.getContext('2d'), dpr = window.devicePixelRatio || 1, w = c.width / dpr, out = [];
                 for (let t = 0; t < nt; t++) for (let b = 0; b < nb; b++) {
                   const px = ctx.getImageData(Math.floor((b + 0.5) * w / nb * dpr), Math.floor((t + 0.5) * row * dpr), 1, 1).data;
                   out.push([px[0], px[1], px[2]]);
                 }
                 return out;
               }""",
            [n_steps, n_tensors, row],
        ),
        np.int16,
    ).reshape(n_tensors, n_steps, 3)
    worst = np.abs(shown - reported.astype(np.int16)).max(axis=2)
    bad = np.argwhere(worst > 1)  # one unit of rounding between float64 numpy and JS
    assert not len(bad), [
        (m.tensors[t], int(m.step_start[s]), float(m.error_ratio[s, t]), shown[t, s].tolist(), reported[t, s].tolist())
        for t, s in bad[:5]
    ]
    # the pair has cells of several colours (so the comparison means something), and a column
    # compared by statistics alone has its ok cells in their own colour in both
    colours = {tuple(c) for c in reported.reshape(-1, 3).tolist()}
    assert len(colours) >= 3
    assert (colour_scale.PALETTES["light"]["unproven"] in colours) == bool((m.statistics & (m.reason == 0)).any())
