"""Clip: ``dl_module_clip.hpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input, round_float, saturate

OP_TYPES = ("Clip",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    # dl_module_clip.hpp: clip the integers to min/max (inputs, in the input's quantization),
    # then round(temp * 2^e_in * 2^-e_out)
    x = ctx.value(node.inputs[0], node)
    info = np.iinfo(x.dtype)
    low = ints_input(ctx, node, 1)
    high = ints_input(ctx, node, 2)
    temp = np.clip(x, low[0] if low else info.min, high[0] if high else info.max)
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    rescale = np.float32(2.0**e_in) * np.float32(2.0**-e_out)
    out = round_float(temp.astype(np.float32) * rescale, ctx.half_even)
    return [saturate(out, ctx.out_dtype(node))]
