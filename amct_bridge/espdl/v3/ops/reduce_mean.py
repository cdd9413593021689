"""ReduceMean: ``dl_module_reduce_mean.hpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input, round_float, saturate

OP_TYPES = ("ReduceMean",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    # dl_module_reduce_mean.hpp: round(float(sum) * 2^e_in / count * 2^-e_out), float32
    x = ctx.value(node.inputs[0], node)
    axes = ints_input(ctx, node, 1) or node.attributes.get("axes")
    if not axes:
        if node.attributes.get("noop_with_empty_axes", 0):
            return [x.copy()]
        axes = list(range(x.ndim))
    axes = tuple(sorted(a % x.ndim for a in axes))
    keep = bool(node.attributes.get("keepdims", 1))
    total = x.astype(np.int64).sum(axis=axes, keepdims=keep)
    count = np.float32(int(np.prod([x.shape[a] for a in axes])))
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    scaled = total.astype(np.float32) * np.float32(2.0**e_in) / count * np.float32(2.0**-e_out)
    return [saturate(round_float(scaled, ctx.half_even), ctx.out_dtype(node))]
