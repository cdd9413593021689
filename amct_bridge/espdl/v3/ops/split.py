"""Split: the stored tensor cut into consecutive parts along ``axis``, values unchanged.

Runtime: ``dl_module_split.hpp``. The sizes are the constant second input (or the ``split``
attribute); without them the parts are ``ceil(dim / outputs)`` long, the last one shorter.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input

OP_TYPES = ("Split",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """One output per part of ``x`` along ``axis`` (default 0).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> ctx.values["x"] = np.arange(5, dtype=np.int8)
        >>> [p.tolist() for p in compute(ctx, Node("n", "Split", ["x"], ["a", "b"]))]
        [[0, 1, 2], [3, 4]]
    """
    x = ctx.value(node.inputs[0], node)
    axis = int(node.attributes.get("axis", 0)) % x.ndim
    sizes = ints_input(ctx, node, 1) or node.attributes.get("split")
    outputs = len(node.outputs)
    if not sizes:
        dim = x.shape[axis]
        size = -(-dim // outputs)
        sizes = [min(size, dim - i * size) for i in range(outputs)]
    edges = np.cumsum(sizes)[:-1]
    return [np.ascontiguousarray(p) for p in np.split(x, edges, axis=axis)]
