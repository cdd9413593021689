"""Transpose: ``dl_module_transpose.hpp``, ``dl_base_shape.cpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("Transpose",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    perm = node.attributes.get("perm") or list(range(x.ndim))[::-1]
    return [np.ascontiguousarray(np.transpose(x, perm))]
