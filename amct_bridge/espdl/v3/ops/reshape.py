"""Reshape: the tensor given a new shape, values unchanged.

Runtime: ``dl_module_reshape.hpp``. The shape is the constant second input (or the ``shape``
attribute); as in ONNX, 0 keeps the input's dimension and -1 is inferred.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input

OP_TYPES = ("Reshape",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``x`` reshaped, a 0 in the shape taking the input's dimension at that index.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> ctx = Context(EspdlModel([], {"s": Tensor("s", np.int64([0, 3, -1]), [0])}), "c")
        >>> ctx.values["x"] = np.arange(6, dtype=np.int8).reshape(1, 6)
        >>> compute(ctx, Node("r", "Reshape", ["x", "s"], ["y"]))[0].tolist()
        [[[0, 1], [2, 3], [4, 5]]]
    """
    x = ctx.value(node.inputs[0], node)
    shape = ints_input(ctx, node, 1) or node.attributes.get("shape")
    if shape is None:
        raise ctx.refuse(node, "no target shape")
    shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]
