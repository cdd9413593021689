"""RequantizeLinear, QuantizeLinear, DequantizeLinear: a tensor moved to another exponent or type.

Runtime: ``dl_module_requantize_linear.hpp`` (one module for all three ops, which calls
``output->assign(input)``), ``dl_tensor_base.cpp``'s ``assign`` and
``dl_base_requantize_linear.cpp`` for the integer-to-integer case.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate, shift_round

OP_TYPES = ("RequantizeLinear", "QuantizeLinear", "DequantizeLinear")


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``dl_tensor_base.cpp``'s ``assign``: float in, ``round(x · 2^-e_out)``; float out,
    ``x · 2^e_in``; else ``x · 2^(e_in - e_out)`` as the ISA's rounding shift, saturated.

    One exponent is a saturating copy (a shift of 0).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo("x", [5], 3, [-4]),
        ...     ValueInfo("y", [5], 3, [-3]), ValueInfo("f", [5], 1, [])])
        >>> n = Node("q", "RequantizeLinear", ["x"], ["y"])
        >>> for target in ("esp32s3", "esp32p4"):  # 0.5, 1.5, -0.5, -1.5, 2.5
        ...     ctx = Context(m, target)
        ...     ctx.values["x"] = np.int8([1, 3, -1, -3, 5])
        ...     print(target, compute(ctx, n)[0].tolist())
        esp32s3 [1, 2, 0, -1, 3]
        esp32p4 [0, 2, 0, -2, 2]
        >>> compute(ctx, Node("d", "DequantizeLinear", ["x"], ["f"]))[0].tolist()
        [0.0625, 0.1875, -0.0625, -0.1875, 0.3125]
    """
    x = ctx.value(node.inputs[0], node)
    out_type = ctx.value_dtype(node.outputs[0], node)
    if out_type.kind == "f":
        e_in = ctx.exponent(node.inputs[0], node)
        return [(x.astype(np.float32) * np.float32(2.0**e_in)).astype(out_type)]
    e_out = ctx.exponent(node.outputs[0], node)
    if x.dtype.kind == "f":
        scaled = x.astype(np.float32) * np.float32(2.0**-e_out)
        return [saturate(round_float(scaled, ctx.half_even), out_type)]
    shift = e_out - ctx.exponent(node.inputs[0], node)
    return [saturate(shift_round(x.astype(np.int64), shift, ctx.half_even), out_type)]
