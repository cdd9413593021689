"""Clip: the integers clipped to min / max, then rescaled to the output's exponent.

Runtime: ``dl_module_clip.hpp``. ``min`` and ``max`` are constant inputs in the input's
quantization (either may be absent: the type's limit).
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input, round_float, saturate

OP_TYPES = ("Clip",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``temp = clip(x, min, max)`` on the integers, then ``round(temp · 2^e_in · 2^-e_out)`` in
    float32 (``tool::round``), saturated (``dl_module_clip.hpp``).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor, ValueInfo
        >>> lo, hi = Tensor("lo", np.int8([-4]), [-2]), Tensor("hi", np.int8([6]), [-2])
        >>> m = EspdlModel([], {"lo": lo, "hi": hi},
        ...     value_info=[ValueInfo("x", [5], 3, [-2]), ValueInfo("y", [5], 3, [-1])])
        >>> n = Node("c", "Clip", ["x", "lo", "hi"], ["y"], {"quant_type": "S8"})
        >>> for target in ("esp32s3", "esp32p4"):  # [-4, -3, 1, 3, 6] / 2
        ...     ctx = Context(m, target)
        ...     ctx.values["x"] = np.int8([-9, -3, 1, 3, 9])
        ...     print(target, compute(ctx, n)[0].tolist())
        esp32s3 [-2, -1, 1, 2, 3]
        esp32p4 [-2, -2, 0, 2, 3]
    """
    x = ctx.value(node.inputs[0], node)
    info = np.iinfo(x.dtype)
    low = ints_input(ctx, node, 1)
    high = ints_input(ctx, node, 2)
    temp = np.clip(x, low[0] if low else info.min, high[0] if high else info.max)
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    rescale = np.float32(2.0**e_in) * np.float32(2.0**-e_out)
    out = round_float(temp.astype(np.float32) * rescale, ctx.half_even)
    return [saturate(out, ctx.out_dtype(node))]
