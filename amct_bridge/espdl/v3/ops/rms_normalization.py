"""RMSNormalization: ``dl_module_rms_normalization.hpp``, ``dl_base_norm.cpp``'s ``rms_norm``
(the esp32s3 / esp32p4 kernels ``dl_*_rms_normalization.S`` compute the same float32 steps)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, pin_finite, scale

OP_TYPES = ("RMSNormalization",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Over the axes from ``axis`` (default -1) on, with the float32 ``scale`` input:
    ``ms = float(int sum x²) · s_in² / n``; ``r = 1 / sqrtf(ms + eps) · (s_in · 2^-e_out)``;
    ``y = round((x · r) · scale)`` saturated. float32: ``x · (1 / sqrtf(mean x² + eps)) ·
    scale``, the mean of squares summed in order.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor, ValueInfo
        >>> w = Tensor("w", np.float32([1.0, 0.5]), [0])
        >>> m = EspdlModel([], {"w": w}, value_info=[ValueInfo("x", [1, 2], 3, [0]),
        ...                                          ValueInfo("y", [1, 2], 3, [-4])])
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([[3, -4]])
        >>> node = Node("n", "RMSNormalization", ["x", "w"], ["y"], {"epsilon": 0.0})
        >>> compute(ctx, node)[0].tolist()  # rms = sqrt(12.5): 0.8485, -0.5657 at 2^-4
        [[14, -9]]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    axis = int(node.attributes.get("axis", -1))
    if not -x.ndim <= axis < x.ndim:
        raise ctx.refuse(node, f"axis {axis} is out of range for rank {x.ndim}")
    inner = int(np.prod(x.shape[axis % x.ndim :]))
    if len(node.inputs) < 2 or not node.inputs[1]:
        raise ctx.refuse(node, "no scale input (the runtime requires one)")
    weight = ctx.initializer(node.inputs[1], node).data
    if weight.dtype != np.float32:
        # get_element_ptr<float>() reads the scale's bytes as float32 whatever its type
        raise ctx.refuse(node, f"the scale is {weight.dtype}; the runtime reads it as float32")
    if weight.size != inner:
        raise ctx.refuse(node, f"the scale has {weight.size} values, expected {inner}")
    weight = weight.reshape(1, inner)
    eps = np.float32(node.attributes.get("epsilon", 1e-5))
    rows = x.reshape(-1, inner)
    if kind.kind == "f":
        mean_sq = fold(rows, lambda acc, v: acc + v * v, 0.0) / np.float32(inner)
        inv = np.float32(1.0) / np.sqrt(mean_sq + eps)
        return [(rows * inv[:, None] * weight).astype(np.float32).reshape(x.shape)]
    s_in = scale(ctx.exponent(node.inputs[0], node))
    factor = s_in * scale(-ctx.exponent(node.outputs[0], node))
    wide = rows.astype(np.int64)
    sum_sq = (wide * wide).sum(axis=1)  # dl::base::reduce_l2: an exact integer sum
    mean_sq = sum_sq.astype(np.float32) * (s_in * s_in) / np.float32(inner)
    inv = np.float32(1.0) / np.sqrt(mean_sq + eps) * factor  # fast_inv_sqrt: DL_FAST_MATH 0
    value = rows.astype(np.float32) * inv[:, None] * weight
    out = round_float(pin_finite(value, kind), ctx.half_even)
    return [saturate(out, kind).reshape(x.shape)]
