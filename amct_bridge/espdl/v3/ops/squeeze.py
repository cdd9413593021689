"""Squeeze and Unsqueeze: ``dl_module_squeeze.hpp``, ``dl_module_unsqueeze.hpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input

OP_TYPES = ("Squeeze", "Unsqueeze")


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
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
