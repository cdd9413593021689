"""ReduceL2: ``dl_module_reduce_l2.hpp`` (an integer sum of squares, ``sqrt_newton`` in
float32)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, pin_finite, rows_of, scale
from amct_bridge.espdl.v3.ops.layer_normalization import sqrt_newton

OP_TYPES = ("ReduceL2",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``round(sqrt_newton(float(sum x²) · 2^(2 e_in)) · 2^-e_out)`` saturated; float32:
    ``sqrt_newton`` of the in-order sum of squares.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo("x", [2], 3, [-2]),
        ...                                    ValueInfo("y", [1], 3, [-3])])
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([12, -16])
        >>> compute(ctx, Node("n", "ReduceL2", ["x"], ["y"]))[0].tolist()  # 5 at 2^-3
        [40]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    rows, shape = rows_of(ctx, node, x)
    if kind.kind == "f":
        return [sqrt_newton(fold(rows, lambda acc, v: acc + v * v, 0.0)).reshape(shape)]
    wide = rows.astype(np.int64)
    total = (wide * wide).sum(axis=1)  # int32 / int64 accumulator: exact
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    norm = sqrt_newton(total.astype(np.float32) * scale(2 * e_in))
    value = pin_finite(norm * scale(-e_out), kind)
    return [saturate(round_float(value, ctx.half_even), kind).reshape(shape)]
