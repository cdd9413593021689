"""ReduceSum: ``dl_module_reduce_sum.hpp`` (an integer sum, shifted to the output's exponent)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, saturate, shift_round
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, rows_of

OP_TYPES = ("ReduceSum",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``shift_and_round(sum, e_out - e_in)`` saturated; float32: the sum in order.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor, ValueInfo
        >>> m = EspdlModel([], {"a": Tensor("a", np.int64([1]), [0])},
        ...     value_info=[ValueInfo("x", [2, 3], 3, [0]), ValueInfo("y", [2], 3, [1])])
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([[1, 2, 2], [-1, -2, -2]])
        >>> node = Node("n", "ReduceSum", ["x", "a"], ["y"], {"keepdims": 0})
        >>> compute(ctx, node)[0].tolist()  # 5 / 2 and -5 / 2 rounded half up
        [3, -2]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    rows, shape = rows_of(ctx, node, x)
    if kind.kind == "f":
        return [fold(rows, lambda acc, v: acc + v, 0.0).reshape(shape)]
    total = rows.astype(np.int64).sum(axis=1)  # int32 / int64 accumulator: exact
    shift = ctx.exponent(node.outputs[0], node) - ctx.exponent(node.inputs[0], node)
    return [saturate(shift_round(total, shift, ctx.half_even), kind).reshape(shape)]
