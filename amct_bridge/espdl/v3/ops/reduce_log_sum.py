"""ReduceLogSum: ``dl_module_reduce_log_sum.hpp`` (an integer sum, ``logf`` in float32)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, logf, round_float, saturate
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, pin_finite, rows_of, scale

OP_TYPES = ("ReduceLogSum",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``round(logf(float(sum) · 2^e_in) · 2^-e_out)`` saturated (a sum of 0 gives -inf, the
    type's minimum); float32: ``logf`` of the in-order sum.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo("x", [2], 3, [-1]),
        ...                                    ValueInfo("y", [1], 3, [-4])])
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([3, 3])
        >>> compute(ctx, Node("n", "ReduceLogSum", ["x"], ["y"]))[0].tolist()  # ln 3 = 1.0986
        [18]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    rows, shape = rows_of(ctx, node, x)
    if kind.kind == "f":
        return [logf(fold(rows, lambda acc, v: acc + v, 0.0)).reshape(shape)]
    total = rows.astype(np.int64).sum(axis=1)
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    log = logf(total.astype(np.float32) * scale(e_in))  # log(0) = -inf, log(<0) = NaN
    value = pin_finite(log * scale(-e_out), kind)
    return [saturate(round_float(value, ctx.half_even), kind).reshape(shape)]
