"""MatMul: ``dl_module_matmul.hpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node, Tensor, filter_nhwc
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops.conv import fused_activation, per_tensor_filter, requant_output

OP_TYPES = ("MatMul",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    # dl_module_matmul.hpp: with rank <= 2 operands, a 1x1 conv whose filter is input 1 (a
    # constant that esp-ppq stores in the conv filter layout); no bias
    if node.inputs[1] not in ctx.model.initializers:
        raise ctx.refuse(node, "a MatMul of two activations is not simulated (constant B only)")
    x = ctx.value(node.inputs[0], node)
    filt = ctx.initializer(node.inputs[1], node)
    per_tensor_filter(ctx, node, filt)
    if x.ndim > 2 or len(filt.dims) > 2:
        raise ctx.refuse(node, "batched MatMul (rank > 2) is not simulated")
    dims = filt.dims if len(filt.dims) == 2 else [filt.dims[0], 1]
    shaped = Tensor(filt.name, filt.data.reshape(dims), filt.exponents)
    w = filter_nhwc(shaped, 1, ctx.target).reshape(dims[1], dims[0]).astype(np.int64)
    acc = np.atleast_2d(x.astype(np.int64)) @ w.T
    shift = ctx.exponent(node.outputs[0], node) - filt.exponent - ctx.exponent(node.inputs[0], node)
    out = requant_output(ctx, node, acc, shift, fused_activation(ctx, node), ctx.out_dtype(node))
    if x.ndim == 1:
        out = out[0]
    return [out if len(filt.dims) == 2 else out[..., 0]]
