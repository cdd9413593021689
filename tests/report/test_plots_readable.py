"""The report's plots stay readable with many layers (issue 33 §10): layer names never
overlap (they overlapped from 11 layers on, unreadable at 29), the weight-scale plot has no
legend over its lines and no colour repeated (the default cycle repeats after 10). Checked on
the drawn figures' text extents, as test_report_suggestions checks the SNR legend."""

from __future__ import annotations

import itertools

import matplotlib  # noqa: F401  (the report extra: a missing install fails, never skips)
import numpy as np
import pytest

from amct_bridge.report import LayerRow, Report
from amct_bridge.report.plots import snr_figure, spread_figure, spread_png


def _rows(n: int) -> list[LayerRow]:
    """MobileNet-like names; random SNRs and per-channel scales (up to 40 channels)."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        scales = rng.uniform(0.001, 0.05, 16 + i % 24)
        row = LayerRow(
            f"block_{i // 3}_{('expand', 'depthwise', 'project')[i % 3]}",
            f"block_{i // 3}",
            "Conv2D",
            snr_alone=float(rng.uniform(10, 60)),
            snr_cumulative=float(rng.uniform(5, 50)),
            snr_model=float(rng.uniform(10, 70)),
            scale_w=[float(v) for v in scales],
            scale_spread=float(scales.max() / scales.min()),
            rank=i + 1,
        )
        rows.append(row)
    return rows


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _inside(box, page) -> bool:
    return page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1


def _name_labels(fig, rows):
    """The drawn tick labels that name a layer (on whichever axis), with their extents."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    keys = {r.key for r in rows}
    labels = [
        t for t in (*ax.get_xticklabels(), *ax.get_yticklabels()) if t.get_text().split()[0] in keys
    ]
    return [t.get_window_extent(renderer) for t in labels], renderer


def _no_two_overlap(boxes) -> list[tuple[int, int]]:
    return [
        (i, j) for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2) if _overlap(a, b)
    ]


@pytest.mark.parametrize("n", [11, 29, 100])
def test_snr_layer_names_never_overlap(n):
    rows = _rows(n)
    fig = snr_figure(Report(rows=rows, samples=8))
    boxes, renderer = _name_labels(fig, rows)
    assert len(boxes) == n  # every layer is named
    assert _no_two_overlap(boxes) == []
    assert all(_inside(b, fig.bbox) for b in boxes)
    # the legend stays off the bars and inside the figure at 100 layers too
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    assert not [p for p in ax.patches if _overlap(p.get_window_extent(renderer), legend)]
    assert _inside(legend, fig.bbox)


@pytest.mark.parametrize("n", [12, 100])
def test_weight_scale_plot_is_readable_at_100_layers(n):
    rows = _rows(n)
    fig = spread_figure(Report(rows=rows, samples=8))
    boxes, renderer = _name_labels(fig, rows)
    assert len(boxes) == n and _no_two_overlap(boxes) == []
    assert all(_inside(b, fig.bbox) for b in boxes)
    ax = fig.axes[0]
    assert ax.get_legend() is None  # nothing drawn over the data
    # the spread written at each row's end: the report's own figure, not overlapping, visible
    spreads = [t for t in fig.texts + ax.texts]
    assert [t.get_text() for t in spreads] == [f"{r.scale_spread:.3g}x" for r in rows]
    text_boxes = [t.get_window_extent(renderer) for t in spreads]
    assert _no_two_overlap(text_boxes) == [] and all(_inside(b, fig.bbox) for b in text_boxes)
    # one colour per layer (its dots), none repeated
    colours = {tuple(line.get_color()) for line in ax.lines if line.get_linestyle() == "None"}
    assert len(colours) == n
    # every channel's scale is a dot: the data is all there
    dots = [line for line in ax.lines if line.get_linestyle() == "None"]
    assert [list(d.get_xdata()) for d in dots] == [r.scale_w for r in rows]
    assert spread_png(Report(rows=rows, samples=8))[:8] == b"\x89PNG\r\n\x1a\n"
