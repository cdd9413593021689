"""Same-padded average pooling at the border: what ESP-DL v1 computes, measured at export.

Keras (TensorFlow's "same") and MindSpore (``pad_mode="same"``) average only the real cells of a
window that hangs over the map's edge. ESP-DL v1's ``AvgPool2D`` cannot: it pads with zeros and
multiplies the window's sum by one constant, ``⌊2^k / (h·w)⌋`` for the full window (the
simulator does the same). v1 has no per-position divisor, and nothing after the pool can correct
it per position either: a convolution's weights are the same at every position, Mul2D's
arithmetic is unpublished and there is no constant tensor to multiply by. So the export cannot
be exact: at a border position with ``n`` real cells of ``N`` the chip gives ``n / N`` of the
model's value (0.44× at the corners of a 3×3 window).

:func:`border_warnings` measures it per pool, analytically per output position (the input's
spatial size comes from running the chip graph once on zeros), and says so in export.json's
``warnings`` and on stderr, with the share of border positions, the smallest ratio and the SNR
that alone gives on a constant map.

Example:
    >>> r = border_ratios((4, 4), {"pool": [3, 3], "strides": [1, 1], "padding": "SAME_END"})
    >>> r[0, 0], r[0, 1], r[1, 1]
    (0.4444444444444444, 0.6666666666666666, 1.0)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.chip_ops import border_ratios

if TYPE_CHECKING:
    from amct_bridge.espdl.v1.result import ExportResult

_SAME = ("SAME_END", "SAME_BEGIN")


def _input_shapes(result: ExportResult) -> dict[str, tuple[int, int]]:
    """(H, W) of every chip tensor, from one run of the chip graph on zeros."""
    from amct_bridge.espdl.v1.chip import simulate_chip
    from amct_bridge.espdl.v1.network import INPUT, network_from_result

    net = network_from_result(result)
    if net.input_shape is None or len(net.input_shape) != 3:
        return {}
    zeros = np.zeros((1, *net.input_shape), np.int64)
    run = simulate_chip(net, zeros, None, 0 if net.input_exponent is None else net.input_exponent)
    shapes = {INPUT: tuple(net.input_shape[:2])}
    shapes.update({k: tuple(v.shape[1:3]) for k, v in run.layers.items() if len(v.shape) == 4})
    return shapes


def border_warnings(result: ExportResult) -> list[str]:
    """One warning per same-padded AvgPool2D that averages padding at the border, with the
    figures measured on its input size (none for pools whose windows never leave the map).

    Example:
        >>> from amct_bridge.espdl.v1.result import ExportResult
        >>> border_warnings(ExportResult(None, "s8", "per-tensor", "esp32", [], []))
        []
    """
    graph = result.graph or {}
    pools = [
        x
        for x in graph.get("layers", [])
        if x["class"] == "AvgPool2D" and x.get("attrs", {}).get("padding") in _SAME
    ]
    if not pools:
        return []
    try:
        shapes = _input_shapes(result)
    except ExportError as err:
        shapes, why = {}, str(err)
    else:
        why = "the model input's shape is not known"
    out = []
    for pool in pools:
        attrs = pool["attrs"]
        kh, kw = (int(k) for k in attrs["pool"])
        sy, sx = (int(s) for s in attrs.get("strides", (kh, kw)))
        what = (
            f"layer {pool['source']!r} (average pool {kh}x{kw}, stride {sy}x{sx}, padding "
            f"'same'): the model averages only the real cells of a window at the map's border, "
            "ESP-DL v1's AvgPool2D divides by the full window (it pads zeros; v1 has no "
            "per-position divisor, and no later layer can correct it per position)"
        )
        hw = shapes.get(pool["inputs"][0])
        if hw is None:
            # windows wider than the stride always leave the map; others only on some sizes
            if kh > sy or kw > sx:
                out.append(f"{what}; the border error could not be measured ({why})")
            continue
        ratio = border_ratios(hw, attrs)
        border = ratio < 1.0
        if not border.any():
            continue  # the windows never leave the map on this input size
        worst = float(ratio.min())
        noise = float(np.sum((1.0 - ratio) ** 2))
        snr = 10.0 * math.log10(ratio.size / noise)
        out.append(
            f"{what}: on its {hw[0]}x{hw[1]} input, {int(border.sum())} of {ratio.size} output "
            f"positions ({100 * border.mean():.0f}%) are border positions, where the chip gives "
            f"between {worst:.2f}x and {float(ratio[border].max()):.2f}x the model's value "
            f"(the model's is up to {1 / worst:.2f}x the chip's); on a constant map that alone "
            f"limits the layer's SNR to {snr:.1f} dB. espdl-eval measures it on your data; "
            "exact alternatives: padding='valid', or a ZeroPadding2D before a 'valid' pool in "
            "the model (what the chip computes), fine-tuned"
        )
    return out
