"""GlobalAveragePool: ``dl_module_global_average_pool.hpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate

OP_TYPES = ("GlobalAveragePool",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    axes = tuple(range(1, x.ndim - 1))
    total = x.astype(np.int64).sum(axis=axes, keepdims=True)
    count = int(np.prod([x.shape[a] for a in axes]))
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    scale = np.float32(2.0**e_in) * (np.float32(1.0) / np.float32(count)) * np.float32(2.0**-e_out)
    out = round_float(total.astype(np.float32) * scale, ctx.half_even)
    return [saturate(out, ctx.out_dtype(node))]
