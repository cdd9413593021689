"""Does the record belong to these weights? Compare its ARQ ``scale_w`` with the exported filter.

AMCT's ARQ weight scale (:func:`amct_bridge.quant.arq.row_scales`: the dominant value over 127
when positive, its magnitude over 128 otherwise) per output channel or per tensor, computed on
the BN-folded weights unless ``skip_fusion``. If the record's scales disagree with the filter we
are about to export, the record (and its sidecar ranges) were most likely made for other
weights. A wrong count of scales is an error; differing
values are a warning (QAT or DMQ may legitimately change the weights afterwards).

Example:
    >>> import numpy as np
    >>> from amct_bridge.records.model import LayerFactors
    >>> w = np.array([[1.0, 0.25], [-0.25, -0.5]], np.float32).reshape(1, 1, 2, 2)  # HWCN
    >>> check_scale_w("c", LayerFactors(scale_w=[1 / 127, 0.5 / 128]), w, 3)  # fits: None
    >>> print(check_scale_w("c", LayerFactors(scale_w=[0.02]), w, 3))  # doctest: +ELLIPSIS
    layer 'c': record scale_w differs from the model's (folded) weights by up to 154%: ...
    >>> check_scale_w("c", LayerFactors(scale_w=[2.0**-6]), w, 3)  # power-of-two QAT: None
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.quant.arq import row_scales
from amct_bridge.quant.espdl import auto_exponent
from amct_bridge.records.model import LayerFactors

#: Relative difference above which scale_w and the weights are said to disagree.
TOLERANCE = 1e-3


def arq_scales(filt: np.ndarray, axis: int | None, bits: int = 8) -> np.ndarray:
    """AMCT ARQ scales of ``filt`` on a ``bits`` grid: per channel along ``axis`` or one.

    Example:
        >>> arq_scales(np.array([-1.0, 0.5]), None).tolist()
        [0.0078125]
    """
    flat = (
        filt.reshape(1, -1)
        if axis is None
        else np.moveaxis(filt, axis, 0).reshape(filt.shape[axis], -1)
    )
    # the record's own formula: a constant positive channel (one weight) is w / 127, not / 128
    return row_scales(flat, bits).astype(np.float64)


def check_scale_w(
    name: str, factors: LayerFactors | None, filt: np.ndarray, axis: int
) -> str | None:
    """None if ``factors.scale_w`` fits ``filt`` (or there is none), else a warning text.

    Raises ExportError when the number of scales is neither 1 nor the channel count.
    """
    if factors is None or not factors.scale_w or factors.tensor_balance_factor:
        return None
    scales = np.asarray(factors.scale_w, np.float64)
    channels = filt.shape[axis]
    if scales.size not in (1, channels):
        raise ExportError(
            f"layer {name!r}: record has {scales.size} scale_w values but the layer has {channels} "
            "output channels: was the record made for this model?"
        )
    if scales.size == 1 and scales[0] == 2.0 ** auto_exponent(filt, 8):
        return None  # power-of-two QAT (docs/qat.md): 2^e, the filter's own ESP-DL exponent
    # a QAT record's dst_type (INT4) sets the weights' grid; otherwise AMCT's INT8 weights
    bits = 4 if (factors.dst_type or "").upper() == "INT4" else 8
    ref = arq_scales(filt, None if scales.size == 1 else axis, bits)
    usable = ref > np.finfo(np.float32).eps  # ARQ replaces tiny scales by 1.0
    if not usable.any():
        return None
    diff = np.abs(scales[usable] - ref[usable]) / ref[usable]
    if float(diff.max()) <= TOLERANCE:
        return None
    return (
        f"layer {name!r}: record scale_w differs from the model's (folded) weights by up to "
        f"{100 * float(diff.max()):.0f}%: was the record made for this model?"
    )
