"""RequantizeLinear, QuantizeLinear, DequantizeLinear: ``dl_module_requantize_linear.hpp``,
``dl_tensor_base.cpp``'s ``assign``, ``dl_base_requantize_linear.cpp``.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate, shift_round

OP_TYPES = ("RequantizeLinear", "QuantizeLinear", "DequantizeLinear")


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    # dl_module_requantize_linear.hpp (all three ops): output->assign(input), dl_tensor_base.cpp:
    # float in: round(x * 2^-e_out); float out: x * 2^e_in; one exponent: a saturating copy;
    # else round(x * 2^(e_in - e_out)), as the ISA's rounding shift (dl_base_requantize_linear)
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
