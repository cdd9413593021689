"""AveragePool: the window sums scaled in float32, the whole kernel as the area.

Runtime: ``dl_module_average_pool.hpp``, ``dl_base_avg_pool2d.cpp`` (``avgpool2d_hwc``, as
``CONFIG_ACCURATE_INFER`` selects on every target). The input is NHWC (or NWC for a 1-D pool);
the window geometry is :mod:`._pool`'s.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate
from amct_bridge.espdl.v3.ops._pool import pool_geometry, windows

OP_TYPES = ("AveragePool",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``round(sum · 2^e_in · (1 / (kh · kw)) · 2^-e_out)`` in float32 (``tool::round``),
    saturated; padded positions add 0 and still count in the area.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo(n, [1, 3, 1], 3, [-2]) for n in "xy"])
        >>> n = Node("p", "AveragePool", ["x"], ["y"],
        ...          {"kernel_shape": [2], "strides": [2], "pads": [1, 0], "quant_type": "S8"})
        >>> for target in ("esp32s3", "esp32p4"):  # windows (pad, 3) and (2, 3): 1.5 and 2.5
        ...     ctx = Context(m, target)
        ...     ctx.values["x"] = np.int8([[[3], [2], [3]]])
        ...     print(target, compute(ctx, n)[0].ravel().tolist())
        esp32s3 [2, 3]
        esp32p4 [2, 2]
    """
    x0 = ctx.value(node.inputs[0], node)
    x, kernel, strides, (top, left, bottom, right) = pool_geometry(ctx, node, x0)
    xp = np.pad(x.astype(np.int64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    total = sum(windows(xp, kernel, strides))
    # the whole kernel is the area (padding counts, whatever count_include_pad says)
    area = np.float32(1.0) / np.float32(kernel[0] * kernel[1])
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    scale = np.float32(2.0**e_in) * area * np.float32(2.0**-e_out)
    out = round_float(total.astype(np.float32) * scale, ctx.half_even)
    out = saturate(out, ctx.out_dtype(node))
    return [out[:, 0] if x0.ndim == 3 else out]
