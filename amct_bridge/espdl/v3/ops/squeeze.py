"""Squeeze and Unsqueeze: dimensions of size 1 removed or inserted, values unchanged.

Runtime: ``dl_module_squeeze.hpp``, ``dl_module_unsqueeze.hpp``. ``axes`` is the constant
second input or the attribute; Squeeze without it removes every dimension of size 1.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input

OP_TYPES = ("Squeeze", "Unsqueeze")


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``x`` without (Squeeze) or with (Unsqueeze, counted on the output's rank) the unit axes.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> ctx.values["x"] = np.zeros((1, 3, 1), np.int8)
        >>> compute(ctx, Node("n", "Squeeze", ["x"], ["y"], {"axes": [0]}))[0].shape
        (3, 1)
        >>> compute(ctx, Node("n", "Squeeze", ["x"], ["y"]))[0].shape
        (3,)
        >>> compute(ctx, Node("n", "Unsqueeze", ["x"], ["y"], {"axes": [0, -1]}))[0].shape
        (1, 1, 3, 1, 1)
    """
    x = ctx.value(node.inputs[0], node)
    axes = ints_input(ctx, node, 1) or node.attributes.get("axes")
    if node.op_type == "Squeeze":
        if axes is None:
            return [x.reshape([d for d in x.shape if d != 1])]
        return [np.squeeze(x, tuple(a % x.ndim for a in axes))]
    if axes is None:
        raise ctx.refuse(node, "no axes")
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(a % rank for a in axes)))]
