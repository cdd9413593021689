"""Transpose: the stored tensor's axes permuted, values unchanged.

Runtime: ``dl_module_transpose.hpp``, ``dl_base_shape.cpp``. Without ``perm`` the axes are
reversed, as in ONNX.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("Transpose",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``np.transpose(x, perm)``, copied contiguous.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> ctx.values["x"] = np.int8([[1, 2, 3], [4, 5, 6]])
        >>> compute(ctx, Node("t", "Transpose", ["x"], ["y"], {"perm": [1, 0]}))[0].tolist()
        [[1, 4], [2, 5], [3, 6]]
    """
    x = ctx.value(node.inputs[0], node)
    perm = node.attributes.get("perm") or list(range(x.ndim))[::-1]
    return [np.ascontiguousarray(np.transpose(x, perm))]
