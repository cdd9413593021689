"""The report as a text table (terminal) and as one self-contained HTML file.

The HTML embeds its plots as ``data:image/png;base64`` images (no other file, no script, no
network); without matplotlib it has the tables only and says why.

Example:
    >>> from amct_bridge.report.table import LayerRow, Report
    >>> rep = Report(rows=[LayerRow("fc", "fc", "Dense", snr_alone=math.inf, rank=1)], samples=2)
    >>> print(text_table(rep).splitlines()[2][:58].rstrip())
       1 fc               Dense                             -
"""

from __future__ import annotations

import base64
import html
import math
import os

from amct_bridge.records.atomic import atomic_write_bytes
from amct_bridge.report import plots

#: (header, width, row -> text) of the text table's columns.
_COLUMNS = (
    ("rank", 4, lambda r: str(r.rank)),
    ("layer", 16, lambda r: r.key),
    ("kind", 15, lambda r: r.kind),
    ("input min..max", 19, lambda r: _span(r.input_min, r.input_max)),
    ("clip min..max", 19, lambda r: _span(r.clip_min, r.clip_max)),
    ("sat%", 6, lambda r: _num(None if r.saturated is None else 100 * r.saturated, ".2g")),
    ("scale_d", 9, lambda r: _num(r.scale_d, ".3g")),
    ("off", 4, lambda r: _num(r.offset_d, "d")),
    ("w spread", 8, lambda r: _num(r.scale_spread, ".3g")),
    ("SNR alone", 9, lambda r: _num(r.snr_alone, ".1f")),
    ("SNR cum", 8, lambda r: _num(r.snr_cumulative, ".1f")),
    ("SNR model", 9, lambda r: _num(r.snr_model, ".1f")),
    ("acc drop", 8, lambda r: _num(r.accuracy_drop, "+.4f")),
)


def _num(value, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(value, spec)


def _span(lo, hi) -> str:
    return "-" if lo is None else f"{lo:.4g}..{hi:.4g}"


def text_table(report) -> str:
    """The rows (execution order), then the top-K summary and the config fragment.

    Example:
        >>> # see the module docstring
    """
    rows = [[f(row) for _, _, f in _COLUMNS] for row in report.rows]
    # each column as wide as its longest cell (long MindSpore cell names kept the columns out
    # of line); the widths above are the minimum
    widths = [
        max([w, len(h), *(len(cells[i]) for cells in rows)]) for i, (h, w, _) in enumerate(_COLUMNS)
    ]

    def line(cells: list[str]) -> str:
        return " ".join(
            f"{c:<{w}}" if i in (1, 2) else f"{c:>{w}}"
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    head = line([h for h, _, _ in _COLUMNS])
    lines = [f"per-layer quantization report ({report.samples} samples; SNR in dB)", head]
    lines += [line(cells) for cells in rows]
    lines += [
        "",
        *summary_lines(report),
        "",
        "config fragment (AMCT simple config):",
        report.fragment.rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"


def summary_lines(report) -> list[str]:
    """Model-level lines: top-K, model SNR and (with labels) accuracies.

    Example:
        >>> from amct_bridge.report.table import Report
        >>> summary_lines(Report(rows=[], samples=1, top=["c"], skip_layers=["c"]))[0]
        'most sensitive (model output SNR, this layer alone): c'
    """
    lines = ["most sensitive (model output SNR, this layer alone): " + ", ".join(report.top)]
    kept = f"with {', '.join(report.skip_layers) or 'nothing'} in float"
    if report.snr_model_quantized is not None:
        line = f"model output SNR: all quantized {_num(report.snr_model_quantized, '.1f')} dB"
        if report.snr_model_kept_float is not None:
            line += f"; {kept} {_num(report.snr_model_kept_float, '.1f')} dB"
        lines.append(line)
    if report.no_accuracy:  # not a classifier for these labels: the regression figures
        if report.mse_model_quantized is not None:
            line = f"model output MSE: all quantized {_num(report.mse_model_quantized, '.4g')}"
            if report.mse_model_kept_float is not None:
                line += f"; {kept} {_num(report.mse_model_kept_float, '.4g')}"
            lines.append(line)
        lines.append(
            f"accuracy: n/a ({report.no_accuracy}); the model output's SNR and MSE above, "
            "against the float model's, are the figures to judge it by"
        )
    if report.float_accuracy is not None:
        line = f"accuracy: float {report.float_accuracy:.4f}; all quantized "
        line += f"{report.quantized_accuracy:.4f}"
        if report.no_drop:
            line += ": no accuracy drop, so no layer needs to stay in float"
        else:
            line += f"; {kept} {report.kept_float_accuracy:.4f}"
        # issue 23 §5: fake-quant uses AMCT's scales, which the chip does not
        line += (
            " (fake-quant with AMCT's scales; an ESP-DL chip's power-of-two exponents differ: "
            "amct-bridge espdl-eval)"
        )
        lines.append(line)
    return lines


def render_html(report, *, with_plots: bool = True) -> str:
    """One self-contained HTML page: summary, table, plots (PNG, base64), config fragment.

    Example:
        >>> from amct_bridge.report.table import Report
        >>> "<table" in render_html(Report(rows=[], samples=0), with_plots=False)
        True
    """
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8"><title>amct-bridge quantization report</title>',
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #bbb;padding:2px 6px;font-size:12px;text-align:right}"
        "td:nth-child(2),td:nth-child(3){text-align:left}pre{background:#f4f4f4;padding:8px}"
        "</style></head><body>",
        "<h1>Per-layer quantization report</h1>",
        f"<p>{report.samples} samples. SNR in dB, float against simulated "
        "(see docs/report.md for each column).</p>",
        "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in summary_lines(report)) + "</ul>",
        "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h, _, _ in _COLUMNS) + "</tr>",
    ]
    for row in report.rows:
        mark = ' style="background:#fde0dc"' if row.key in report.top else ""
        parts.append(
            f"<tr{mark}>" + "".join(f"<td>{esc(f(row))}</td>" for _, _, f in _COLUMNS) + "</tr>"
        )
    parts.append("</table>")
    reason = plots.missing_reason() if with_plots else "plots were not requested"
    if reason:
        parts.append(f"<p><b>No plots:</b> {esc(reason)}.</p>")
    else:
        parts += _plot_sections(report)
    parts += [
        "<h2>Config fragment</h2>",
        "<p>Paste into the AMCT simple config (<code>config=</code> of the callback, "
        "<code>amct-bridge calibrate --config</code>):</p>",
        f"<pre>{esc(report.fragment)}</pre>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p>'


def _plot_sections(report) -> list[str]:
    out = ["<h2>SNR per layer</h2>", _img(plots.snr_png(report), "SNR per layer")]
    if report.histograms:
        out.append("<h2>Inputs of the most sensitive layers, with the clip range</h2>")
        out += [_img(plots.histogram_png(report, k), f"input of {k}") for k in report.histograms]
    spread = plots.spread_png(report)
    if spread is not None:
        out += ["<h2>Weight scale per channel</h2>", _img(spread, "scale_w per channel")]
    return out


def write_html(report, path: str | os.PathLike, *, with_plots: bool = True) -> None:
    """Write :func:`render_html` to ``path`` atomically.

    Example:
        >>> import tempfile, pathlib
        >>> from amct_bridge.report.table import Report
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "r.html"
        >>> write_html(Report(rows=[], samples=0), p, with_plots=False); p.exists()
        True
    """
    atomic_write_bytes(path, render_html(report, with_plots=with_plots).encode("utf-8"))
