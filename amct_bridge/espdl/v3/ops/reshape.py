"""Reshape: ``dl_module_reshape.hpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input

OP_TYPES = ("Reshape",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    shape = ints_input(ctx, node, 1) or node.attributes.get("shape")
    if shape is None:
        raise ctx.refuse(node, "no target shape")
    shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]
