"""Per-layer quantization report (framework-free core; see docs/report.md).

A framework adapter (:func:`amct_bridge.keras.report.quant_report`) runs the model; this package
computes the table (:func:`build_report` -> :class:`Report` of :class:`LayerRow`), ranks the
layers, writes the AMCT config fragment, and renders text or one self-contained HTML file.

Example:
    >>> from amct_bridge.report import snr_db
    >>> round(snr_db([1.0, 2.0], [1.0, 2.1]), 1)
    27.0
"""

from amct_bridge.report.fragment import config_fragment, skip_fragment
from amct_bridge.report.metrics import (
    clip_range,
    saturated_share,
    scale_spread,
    snr_db,
    top1_accuracy,
)
from amct_bridge.report.render import render_html, text_table, write_html
from amct_bridge.report.table import (
    LayerInfo,
    LayerRow,
    Report,
    ReportRunner,
    RunResult,
    build_report,
    read_record,
)

__all__ = [
    "LayerInfo",
    "LayerRow",
    "Report",
    "ReportRunner",
    "RunResult",
    "build_report",
    "clip_range",
    "config_fragment",
    "read_record",
    "render_html",
    "saturated_share",
    "scale_spread",
    "skip_fragment",
    "snr_db",
    "text_table",
    "top1_accuracy",
    "write_html",
]
