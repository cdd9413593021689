"""Relu: ``dl_module_relu.hpp``, ``dl_base_relu.cpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("Relu",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    return [np.maximum(x, 0).astype(x.dtype)]
