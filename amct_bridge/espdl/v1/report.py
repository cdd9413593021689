"""Human-readable preview of an export: exponents per layer and the share of saturated values.

For each exported layer: input / output exponent, filter exponent (``lo..hi`` per channel),
bias and activation exponents, the share of filter / bias / alpha values that convert.py will
clip (``sat``) and of nonzero bias values that round to 0 (``bias0``), and how much of the
representable output range the calibrated output range uses (``out use``: above 100 % the
runtime saturates, far below it wastes precision). Then each runtime layer the C++ model
constructs (Add2D, pools, Concat): its input / output exponents and output use only.

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.v1.export import export_layers
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> w = {"kernel": np.ones((2, 2), np.float32)}
    >>> layers = [SourceLayer("in", "input"), SourceLayer("fc", "dense", ["in"], weights=w)]
    >>> fc = LayerStats("Dense", TensorRange(0, 1), TensorRange(0, 2))
    >>> st = CalibrationStats(layers={"fc": fc})
    >>> print(format_preview(export_layers(layers, None, stats=st)).splitlines()[0].split()[:4])
    ['layer', 'operation', 'in', 'out']
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from amct_bridge.espdl.v1 import spec
from amct_bridge.espdl.v1.preview import LayerPreview, QuantizedTensor
from amct_bridge.espdl.v1.result import ExportedLayer, ExportResult

_COLUMNS = (
    "layer",
    "operation",
    "in",
    "out",
    "filter",
    "bias",
    "act",
    "sat filt",
    "sat bias",
    "bias0",
    "sat act",
    "out use",
    "fused",
)


def _exp_text(t: QuantizedTensor | None) -> str:
    if t is None:
        return "-"
    if isinstance(t.exponent, np.ndarray):
        return f"{int(t.exponent.min())}..{int(t.exponent.max())}"
    return str(int(t.exponent))


def _act_text(p: LayerPreview) -> str:
    if p.activation is None:
        return p.activation_type or "-"
    return f"{p.activation_type}:{_exp_text(p.activation)}"


def _share(t: QuantizedTensor | None) -> str:
    return "-" if t is None else f"{100 * t.saturated_share:.1f}%"


def _zeroed(t: QuantizedTensor | None) -> str:
    if t is None or not t.values.size:
        return "-"
    return f"{100 * t.zeroed / t.values.size:.1f}%"


def output_use(layer: ExportedLayer, feature_type: str) -> float | None:
    """Calibrated output range / representable range at output_exponent (None if unknown).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> output_use(NS(output_range=(0.0, 1.0), entry={"output_exponent": -6}), "s8")
        0.5039370078740157
    """
    if layer.output_range is None:
        return None
    bits = spec.FEATURE_BITS[feature_type]
    e = layer.entry["output_exponent"]
    lo, hi = layer.output_range
    top = (2 ** (bits - 1) - 1) * 2.0**e
    bottom = 2 ** (bits - 1) * 2.0**e
    return max(hi / top if hi > 0 else 0.0, -lo / bottom if lo < 0 else 0.0)


def _row(p: LayerPreview, use: float | None, fused: list[str]) -> list[str]:
    return [
        p.name,
        p.operation,
        "-" if p.input_exponent is None else str(p.input_exponent),
        "-" if p.output_exponent is None else str(p.output_exponent),
        _exp_text(p.filter),
        _exp_text(p.bias),
        _act_text(p),
        _share(p.filter),
        _share(p.bias),
        _zeroed(p.bias),
        _share(p.activation),
        "?" if use is None else f"{100 * use:.0f}%",
        "+".join(fused) or "-",
    ]


def _runtime_row(item, feature_type: str) -> list[str]:
    """A runtime layer (Add2D, pools, Concat): its exponents and output use; no coefficients."""
    ins = ",".join("?" if e is None else str(e) for e in item.input_exponents) or "-"
    out = "?" if item.output_exponent is None else str(item.output_exponent)
    use = None
    if item.output_range is not None and item.output_exponent is not None:
        view = SimpleNamespace(
            output_range=item.output_range, entry={"output_exponent": item.output_exponent}
        )
        use = output_use(view, feature_type)
    row = [item.name, item.espdl_class, ins, out] + ["-"] * 7
    return [*row, "?" if use is None else f"{100 * use:.0f}%", "-"]


def _table(rows: list[list[str]]) -> list[str]:
    rows = [list(_COLUMNS), *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_set_preview(previews: list[LayerPreview]) -> str:
    """The same table for a convert.py input set read from disk (no calibration ranges).

    Example:
        >>> format_set_preview([]).split()[:2]
        ['layer', 'operation']
    """
    return "\n".join(_table([_row(p, None, []) for p in previews]))


def format_preview(result: ExportResult) -> str:
    """A text table of every exported layer, then warnings and the skipped layers.

    Example:
        >>> from amct_bridge.espdl.v1.result import ExportResult
        >>> format_preview(ExportResult(None, "s8", "per-tensor", "esp32", [], []))[:9]
        'layer  op'
    """
    # every fused layer but the chain's own source (a folded ZeroPadding2D comes before it)
    rows = [
        _row(x.preview, output_use(x, result.feature_type), [f for f in x.fused if f != x.source])
        for x in result.layers
    ]
    rows += [_runtime_row(x, result.feature_type) for x in result.runtime]
    lines = _table(rows)
    warn = [
        f"warning: {layer.name}: calibrated output exceeds the output_exponent range"
        for layer in result.layers
        if (output_use(layer, result.feature_type) or 0.0) > 1.0
    ]
    lines.extend(warn)
    lines.extend(f"warning: {w}" for w in result.warnings)
    lines.extend(f"left to the host: {h}" for h in getattr(result, "host", []))
    lines.extend(f"skipped: {p}" for p in result.skipped)
    return "\n".join(lines)
