"""ReduceMin: ``dl_module_reduce_min.hpp`` (the smallest value, at the input's exponent)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, rows_of

OP_TYPES = ("ReduceMin",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """The smallest integer of each group, unscaled (the runtime ignores both exponents).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> m = EspdlModel([], {"a": Tensor("a", np.int64([0]), [0])})
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([[1, -5, 3], [-7, -2, 9]])
        >>> compute(ctx, Node("n", "ReduceMin", ["x", "a"], ["y"], {"keepdims": 1}))[0].tolist()
        [[-7, -5, 3]]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    rows, shape = rows_of(ctx, node, x)
    if kind.kind == "f":
        # std::min(acc, v) keeps acc unless v < acc, from INFINITY (so NaN is skipped)
        out = fold(rows, lambda acc, v: np.where(v < acc, v, acc), np.inf)
    else:
        out = rows.min(axis=1)  # from INT8_MAX / INT16_MAX: the plain minimum
    return [out.astype(kind).reshape(shape)]
