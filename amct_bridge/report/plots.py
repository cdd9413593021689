"""PNG plots of a report (matplotlib, the ``report`` extra; imported only when plotting).

Figures are drawn with matplotlib's Agg canvas directly (``Figure`` + ``FigureCanvasAgg``), not
through ``pyplot``: no GUI backend is ever selected and no global figure state is touched.

Example:
    >>> from amct_bridge.report.table import LayerRow, Report
    >>> rep = Report(rows=[LayerRow("fc", "fc", "Dense", snr_alone=30.0, snr_model=25.0)],
    ...              samples=4)
    >>> missing_reason() is not None or snr_png(rep)[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
    True
"""

from __future__ import annotations

import io
import math
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from amct_bridge.report.table import Report

#: SNR drawn for an exact layer (infinite SNR), and the floor of the axis.
SNR_CAP = 100.0


def missing_reason() -> str | None:
    """Why plots cannot be drawn (matplotlib not installed), or None when they can.

    Example:
        >>> missing_reason() in (None, "matplotlib is not installed (pip install "
        ...                      "'amct-bridge[report]')")
        True
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'amct-bridge[report]')"
    return None


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _layout(fig) -> None:
    with warnings.catch_warnings():  # long layer names on many ticks: drawn untightened
        warnings.filterwarnings("ignore", message="Tight layout not applied")
        fig.tight_layout()


def _png(fig) -> bytes:
    buf = io.BytesIO()
    _layout(fig)
    fig.canvas.print_png(buf)
    return buf.getvalue()


def _capped(value: float | None) -> float:
    if value is None:
        return math.nan
    return min(value, SNR_CAP) if math.isfinite(value) or value > 0 else -SNR_CAP


def snr_png(report) -> bytes:
    """Grouped bars per layer: layer SNR alone, layer SNR cumulative, model SNR alone (dB).

    Example:
        >>> # see the module docstring
    """
    return _png(snr_figure(report))


def snr_figure(report):
    """The matplotlib Figure :func:`snr_png` prints, laid out: one group of horizontal bars
    per layer, the layer names on the y axis in execution order, top to bottom (horizontal,
    they never overlap: the figure grows 0.3 inch per layer; x labels overlapped from 11 layers
    on and were unreadable at 29). The legend sits outside the axes, to their right: inside,
    bars of every length leave it no free corner (it covered one).

    Example:
        >>> from amct_bridge.report.table import LayerRow, Report
        >>> rep = Report(rows=[LayerRow("fc", "fc", "Dense", snr_model=25.0)], samples=4)
        >>> missing_reason() is not None or len(snr_figure(rep).axes[0].patches)
        3
    """
    rows = report.rows
    fig = _figure(8.0, max(3.6, 0.3 * len(rows) + 1.4))
    ax = fig.add_subplot()
    series = (
        ("layer output, alone", "snr_alone"),
        ("layer output, cumulative", "snr_cumulative"),
        ("model output, alone", "snr_model"),
    )
    height = 0.8 / len(series)
    for i, (label, attr) in enumerate(series):
        ys = [j + (i - 1) * height for j in range(len(rows))]
        ax.barh(ys, [_capped(getattr(r, attr)) for r in rows], height, label=label)
    ax.set_yticks(range(len(rows)), [f"{r.key}  #{r.rank}" for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first layer on top
    ax.set_xlabel("SNR (dB), float vs simulated")
    ax.set_title("SNR per layer (#rank: 1 = most sensitive)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.grid(axis="x", alpha=0.3)
    _layout(fig)
    return fig


def histogram_png(report, key: str) -> bytes:
    """Histogram of layer ``key``'s float input (log count) with the clip range as red lines.

    Example:
        >>> # needs a report with report.histograms[key]; see amct_bridge.report.table
    """
    counts, edges = report.histograms[key]
    row = next(r for r in report.rows if r.key == key)
    fig = _figure(6.0, 3.0)
    ax = fig.add_subplot()
    widths = [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]
    ax.bar(edges[:-1], counts, widths, align="edge", color="tab:blue")
    ax.set_yscale("log")
    for x in (row.clip_min, row.clip_max):
        ax.axvline(x, color="tab:red", linewidth=1.5)
    share = 100 * (row.saturated or 0.0)
    ax.set_title(
        f"{key}: input, clip [{row.clip_min:.4g}, {row.clip_max:.4g}], {share:.3g}% saturated",
        fontsize=9,
    )
    ax.set_xlabel("input value")
    ax.set_ylabel("count")
    return _png(fig)


def spread_png(report: Report) -> bytes | None:
    """scale_w per output channel (log scale), one line per layer with per-channel scales;
    None when no layer has more than one weight scale (see :func:`spread_figure`).

    Example:
        >>> from amct_bridge.report.table import Report
        >>> spread_png(Report(rows=[], samples=0)) is None
        True
    """
    fig = spread_figure(report)
    return None if fig is None else _png(fig)


def spread_figure(report: Report) -> Figure | None:
    """The Figure of :func:`spread_png`, laid out (None: nothing to draw): one row per layer
    with per-channel scales, the layer names on the y axis in execution order, top to bottom
    (the figure grows 0.25 inch per layer), each output channel's ``scale_w`` a dot on a log x
    axis, a line from the smallest to the largest, and the spread (max/min) written at the
    row's right end. Each row has its own colour, sampled from a colour map. Readable at 100
    layers; the lines over channel indices it replaces were not (their legend covered them
    and the colours repeated after 10 layers).

    Example:
        >>> from amct_bridge.report.table import LayerRow, Report
        >>> rep = Report(rows=[LayerRow("c", "c", "Conv2D", scale_w=[0.1, 0.2],
        ...                             scale_spread=2.0)], samples=1)
        >>> fig = None if missing_reason() else spread_figure(rep)
        >>> fig is None or [t.get_text() for t in fig.axes[0].texts]
        ['2x']
    """
    rows = [r for r in report.rows if len(r.scale_w) > 1]
    if not rows:
        return None
    from matplotlib import colormaps
    from matplotlib.transforms import blended_transform_factory

    fig = _figure(8.0, max(2.4, 0.25 * len(rows) + 1.3))
    ax = fig.add_subplot()
    cmap = colormaps["viridis"]
    # the spread's text: x in axes units (just right of the axes), y in data units (its row)
    right = blended_transform_factory(ax.transAxes, ax.transData)
    for i, r in enumerate(rows):
        color = cmap(0.9 * i / max(1, len(rows) - 1))
        scales = [float(v) for v in r.scale_w]
        ax.plot([min(scales), max(scales)], [i, i], color=color, linewidth=1, alpha=0.6)
        ax.plot(scales, [i] * len(scales), "o", color=color, markersize=2.5, alpha=0.7)
        spread = r.scale_spread if r.scale_spread is not None else max(scales) / min(scales)
        ax.text(1.01, i, f"{spread:.3g}x", transform=right, va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)), [r.key for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first layer on top
    ax.set_xlabel("scale_w (one dot per output channel)")
    ax.set_title("weight scale per channel (max/min at the right)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    _layout(fig)
    return fig
