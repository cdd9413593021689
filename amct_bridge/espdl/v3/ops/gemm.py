"""Gemm: ``dl_module_gemm.hpp``, the input viewed as ``[1, 1, rows, C]`` and run as a 1x1 conv."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops.conv import conv_core

OP_TYPES = ("Gemm",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    # dl_module_gemm.hpp: the input is viewed as [1, 1, rows, C] and run as a 1x1 conv
    if node.attributes.get("transA", 0) or node.attributes.get("transB", 0):
        raise ctx.refuse(node, "transA/transB must be 0 (esp-ppq transposes the weight)")
    x = ctx.value(node.inputs[0], node)
    rows = x.reshape(1, 1, -1, x.shape[-1])
    out = conv_core(ctx, node, rows, 2)
    return [out.reshape(*x.shape[:-1], out.shape[-1])]
