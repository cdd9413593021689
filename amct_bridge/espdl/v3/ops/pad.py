"""Pad: ``dl_module_pad.hpp``, ``dl_base_pad.cpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input

OP_TYPES = ("Pad",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    # dl_module_pad.hpp / dl_base_pad.cpp: ONNX pads [begin..., end...] on the stored tensor;
    # constant (the quantized constant_value input, default 0), edge or reflect
    x = ctx.value(node.inputs[0], node)
    pads = ints_input(ctx, node, 1)
    if pads is None or len(pads) != 2 * x.ndim or min(pads) < 0:
        raise ctx.refuse(node, f"pads {pads} for a tensor of rank {x.ndim} (non-negative)")
    width = list(zip(pads[: x.ndim], pads[x.ndim :], strict=True))
    mode = node.attributes.get("mode", "constant")
    if mode == "constant":
        value = ints_input(ctx, node, 2)
        return [np.pad(x, width, constant_values=value[0] if value else 0)]
    if mode in ("edge", "reflect"):
        return [np.pad(x, width, mode=mode)]
    raise ctx.refuse(node, f"mode {mode!r} (constant, edge, reflect are simulated)")
