"""GlobalAveragePool: the mean over the spatial axes of an NHWC tensor, in float32.

Runtime: ``dl_module_global_average_pool.hpp``: an integer sum per channel, one float32 scale
``2^e_in · (1 / count) · 2^-e_out``, ``tool::round``.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate

OP_TYPES = ("GlobalAveragePool",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``round(sum · 2^e_in · (1 / count) · 2^-e_out)`` per channel, saturated, shape
    ``[N, 1, 1, C]``.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo(n, None, 3, [-1]) for n in "xy"])
        >>> n = Node("g", "GlobalAveragePool", ["x"], ["y"], {"quant_type": "S8"})
        >>> for target in ("esp32s3", "esp32p4"):  # channel means 10 / 4 and -10 / 4
        ...     ctx = Context(m, target)
        ...     ctx.values["x"] = np.int8([[[[1, -1], [2, -2]], [[3, -3], [4, -4]]]])
        ...     print(target, compute(ctx, n)[0].ravel().tolist())
        esp32s3 [3, -2]
        esp32p4 [2, -2]
    """
    x = ctx.value(node.inputs[0], node)
    axes = tuple(range(1, x.ndim - 1))
    total = x.astype(np.int64).sum(axis=axes, keepdims=True)
    count = int(np.prod([x.shape[a] for a in axes]))
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    scale = np.float32(2.0**e_in) * (np.float32(1.0) / np.float32(count)) * np.float32(2.0**-e_out)
    out = round_float(total.astype(np.float32) * scale, ctx.half_even)
    return [saturate(out, ctx.out_dtype(node))]
