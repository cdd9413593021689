"""ReduceMean: ``dl_module_reduce_mean.hpp`` (an integer sum, scaled in float32)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, pin_finite, rows_of, scale

OP_TYPES = ("ReduceMean",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``round(float(sum) · 2^e_in / count · 2^-e_out)`` in float32, saturated; float32:
    the sum in order divided by the count.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo("x", [4], 3, [0]),
        ...                                    ValueInfo("y", [1], 3, [0])])
        >>> ctx = Context(m, "esp32p4"); ctx.values["x"] = np.int8([1, 2, 2, 5])
        >>> compute(ctx, Node("n", "ReduceMean", ["x"], ["y"]))[0].tolist()  # 2.5: to even
        [2]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    rows, shape = rows_of(ctx, node, x)
    count = np.float32(rows.shape[1])  # size_t count, converted to float by the division
    if kind.kind == "f":
        return [(fold(rows, lambda acc, v: acc + v, 0.0) / count).reshape(shape)]
    total = rows.astype(np.int64).sum(axis=1)
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    value = total.astype(np.float32) * scale(e_in) / count * scale(-e_out)
    return [saturate(round_float(pin_finite(value, kind), ctx.half_even), kind).reshape(shape)]
