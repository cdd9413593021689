"""Mul: ``dl_module_mul.hpp``, ``dl_base_mul.cpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate, shift_round

OP_TYPES = ("Mul",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    a, b = (ctx.value(n, node).astype(np.int64) for n in node.inputs[:2])
    e0, e1 = (ctx.exponent(n, node) for n in node.inputs[:2])
    shift = ctx.exponent(node.outputs[0], node) - e0 - e1
    product = a * b
    if ctx.out_dtype(node) == np.int16 and ctx.target == "c":
        # the C kernel scales the int product as a float: beyond 2^24 it loses low bits
        scaled = product.astype(np.float32) * np.float32(2.0**-shift)
        return [saturate(round_float(scaled, ctx.half_even), np.int16)]
    return [saturate(shift_round(product, shift, ctx.half_even), ctx.out_dtype(node))]
