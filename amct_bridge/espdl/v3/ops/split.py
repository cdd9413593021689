"""Split: ``dl_module_split.hpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input

OP_TYPES = ("Split",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
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
