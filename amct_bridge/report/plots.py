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
    """The matplotlib Figure :func:`snr_png` prints, laid out. The legend sits outside the axes,
    to their right: inside, bars of every height leave it no free corner (it covered one).

    Example:
        >>> from amct_bridge.report.table import LayerRow, Report
        >>> rep = Report(rows=[LayerRow("fc", "fc", "Dense", snr_model=25.0)], samples=4)
        >>> missing_reason() is not None or len(snr_figure(rep).axes[0].patches)
        3
    """
    rows = report.rows
    fig = _figure(max(6.0, 0.6 * len(rows) + 2), 3.6)
    ax = fig.add_subplot()
    series = (
        ("layer output, alone", "snr_alone"),
        ("layer output, cumulative", "snr_cumulative"),
        ("model output, alone", "snr_model"),
    )
    width = 0.8 / len(series)
    for i, (label, attr) in enumerate(series):
        xs = [j + (i - 1) * width for j in range(len(rows))]
        ax.bar(xs, [_capped(getattr(r, attr)) for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), [f"{r.key}\n#{r.rank}" for r in rows], fontsize=7)
    ax.set_ylabel("SNR (dB), float vs simulated")
    ax.set_title("SNR per layer (#rank: 1 = most sensitive)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.grid(axis="y", alpha=0.3)
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


def spread_png(report) -> bytes | None:
    """scale_w per output channel (log scale), one line per layer with per-channel scales;
    None when no layer has more than one weight scale.

    Example:
        >>> from amct_bridge.report.table import Report
        >>> spread_png(Report(rows=[], samples=0)) is None
        True
    """
    rows = [r for r in report.rows if len(r.scale_w) > 1]
    if not rows:
        return None
    fig = _figure(6.0, 3.2)
    ax = fig.add_subplot()
    for r in rows:
        ax.plot(
            range(len(r.scale_w)), r.scale_w, marker=".", label=f"{r.key} ({r.scale_spread:.3g}x)"
        )
    ax.set_yscale("log")
    ax.set_xlabel("output channel")
    ax.set_ylabel("scale_w")
    ax.set_title("weight scale per channel (max/min in the legend)")
    ax.legend(fontsize=7)
    return _png(fig)
