"""ReduceMax: ``dl_module_reduce_max.hpp`` (the largest value, at the input's exponent)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, rows_of

OP_TYPES = ("ReduceMax",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """The largest integer of each group, unscaled (the runtime ignores both exponents).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> m = EspdlModel([], {"a": Tensor("a", np.int64([1]), [0])})
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([[1, -5, 3], [-7, -2, -9]])
        >>> compute(ctx, Node("n", "ReduceMax", ["x", "a"], ["y"], {"keepdims": 0}))[0].tolist()
        [3, -2]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    rows, shape = rows_of(ctx, node, x)
    if kind.kind == "f":
        # std::max(acc, v) keeps acc unless acc < v, from -FLT_MAX (so NaN is skipped)
        start = -float(np.finfo(np.float32).max)
        out = fold(rows, lambda acc, v: np.where(acc < v, v, acc), start)
    else:
        out = rows.max(axis=1)  # from INT8_MIN / INT16_MIN: the plain maximum
    return [out.astype(kind).reshape(shape)]
