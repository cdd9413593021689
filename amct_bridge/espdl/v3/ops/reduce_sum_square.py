"""ReduceSumSquare: ``dl_module_reduce_sum_square.hpp`` (an integer sum of squares, shifted to
the output's exponent)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, saturate, shift_round
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, rows_of

OP_TYPES = ("ReduceSumSquare",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``shift_and_round(sum x², e_out - 2 e_in)`` saturated; float32: the sum in order.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo("x", [2], 3, [-1]),
        ...                                    ValueInfo("y", [1], 3, [0])])
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([3, -2])
        >>> compute(ctx, Node("n", "ReduceSumSquare", ["x"], ["y"]))[0].tolist()  # 13 / 4
        [3]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    rows, shape = rows_of(ctx, node, x)
    if kind.kind == "f":
        return [fold(rows, lambda acc, v: acc + v * v, 0.0).reshape(shape)]
    wide = rows.astype(np.int64)
    total = (wide * wide).sum(axis=1)
    shift = ctx.exponent(node.outputs[0], node) - 2 * ctx.exponent(node.inputs[0], node)
    return [saturate(shift_round(total, shift, ctx.half_even), kind).reshape(shape)]
