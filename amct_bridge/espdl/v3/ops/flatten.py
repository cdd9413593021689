"""Flatten: ``dl_module_flatten.hpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("Flatten",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    axis = int(node.attributes.get("axis", 1)) % max(x.ndim, 1)
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]
