"""ReduceL1: ``dl_module_reduce_l1.hpp`` (a sum of magnitudes, shifted to the output's
exponent)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, saturate, shift_round
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, rows_of

OP_TYPES = ("ReduceL1",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``shift_and_round(sum |x|, e_out - e_in)`` saturated; float32: the sum in order.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo("x", [3], 3, [0]),
        ...                                    ValueInfo("y", [1], 3, [2])])
        >>> ctx = Context(m, "esp32p4"); ctx.values["x"] = np.int8([-128, 2, -4])
        >>> compute(ctx, Node("n", "ReduceL1", ["x"], ["y"], {"keepdims": 0}))[0].tolist()
        [34]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    rows, shape = rows_of(ctx, node, x)
    if kind.kind == "f":
        return [fold(rows, lambda acc, v: acc + np.abs(v), 0.0).reshape(shape)]
    total = np.abs(rows.astype(np.int64)).sum(axis=1)  # std::abs after promotion: |-128| = 128
    shift = ctx.exponent(node.outputs[0], node) - ctx.exponent(node.inputs[0], node)
    return [saturate(shift_round(total, shift, ctx.half_even), kind).reshape(shape)]
