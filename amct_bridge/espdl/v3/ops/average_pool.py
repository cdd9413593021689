"""AveragePool: ``dl_module_average_pool.hpp``, ``dl_base_avg_pool2d.cpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate
from amct_bridge.espdl.v3.ops._pool import pool_geometry, windows

OP_TYPES = ("AveragePool",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    x0 = ctx.value(node.inputs[0], node)
    x, kernel, strides, (top, left, bottom, right) = pool_geometry(ctx, node, x0)
    xp = np.pad(x.astype(np.int64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    total = sum(windows(xp, kernel, strides))
    # CONFIG_ACCURATE_INFER: avgpool2d_hwc on every target, the whole kernel as the area
    # (padding counts, whatever count_include_pad says), one float32 scale
    area = np.float32(1.0) / np.float32(kernel[0] * kernel[1])
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    scale = np.float32(2.0**e_in) * area * np.float32(2.0**-e_out)
    out = round_float(total.astype(np.float32) * scale, ctx.half_even)
    out = saturate(out, ctx.out_dtype(node))
    return [out[:, 0] if x0.ndim == 3 else out]
