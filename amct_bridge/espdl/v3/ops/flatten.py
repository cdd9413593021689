"""Flatten: the tensor viewed as 2-D, values unchanged.

Runtime: ``dl_module_flatten.hpp``: the dimensions before ``axis`` (default 1) become the
first, the rest the second.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("Flatten",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``x`` reshaped to ``[prod(shape[:axis]), prod(shape[axis:])]``.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> ctx.values["x"] = np.arange(12, dtype=np.int8).reshape(2, 3, 2)
        >>> compute(ctx, Node("f", "Flatten", ["x"], ["y"], {"axis": 2}))[0].shape
        (6, 2)
    """
    x = ctx.value(node.inputs[0], node)
    axis = int(node.attributes.get("axis", 1)) % max(x.ndim, 1)
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]
