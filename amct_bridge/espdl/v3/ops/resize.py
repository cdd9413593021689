"""Resize: ``dl_module_resize.hpp``, ``dl_base_resize.cpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input, saturate, shift_round

OP_TYPES = ("Resize",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    # nearest, asymmetric, floor: dl_base_resize.cpp repeats each pixel scale times
    if node.attributes.get("mode", "nearest") != "nearest":
        raise ctx.refuse(node, f"mode {node.attributes.get('mode')!r} (nearest is simulated)")
    x = ctx.value(node.inputs[0], node)
    scales = None
    if len(node.inputs) > 2 and node.inputs[2]:
        scales = [float(s) for s in ctx.value(node.inputs[2], node).reshape(-1)]
    if not scales and len(node.inputs) > 3 and node.inputs[3]:
        sizes = ints_input(ctx, node, 3)
        nchw = [x.shape[0], x.shape[-1], *x.shape[1:-1]]
        scales = [o / i for o, i in zip(sizes, nchw, strict=True)]
    if not scales or len(scales) != x.ndim:
        raise ctx.refuse(node, "needs scales or sizes for every axis")
    # the data is NWC/NHWC but scales/sizes keep ONNX's NCW/NCHW order (dl_module_resize.hpp)
    out = x
    for axis, scale in enumerate(scales[2:], start=1):
        if scale == 1:
            continue
        size = int(x.shape[axis] * np.float32(scale))
        inv = np.float32(1.0) / np.float32(scale)
        src = (np.arange(size, dtype=np.float32) * inv).astype(np.int64)
        out = np.take(out, np.minimum(src, x.shape[axis] - 1), axis=axis)
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    if e_in != e_out:
        out = saturate(shift_round(out.astype(np.int64), e_out - e_in, ctx.half_even), x.dtype)
    return [out]
