"""Softmax: ``dl_module_softmax.hpp`` (a float32 output)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, expf

OP_TYPES = ("Softmax",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    # dl_module_softmax.hpp: a float32 output. int8: exp_table[x + 128] with the table
    # expf(2^e_in * (i - 128)) (no max subtracted); int16: expf(t - max). The sum runs in order
    # along the axis, in float32, so it is accumulated here element by element too.
    x = ctx.value(node.inputs[0], node)
    axis = int(node.attributes.get("axis", -1)) % max(x.ndim, 1)
    scale = np.float32(2.0 ** ctx.exponent(node.inputs[0], node))
    moved = np.moveaxis(x, axis, -1)
    if ctx.out_dtype(node) == np.int8:
        table = expf(scale * (np.arange(256, dtype=np.float32) - np.float32(128)))
        e = table[moved.astype(np.int64) + 128]
    else:
        t = moved.astype(np.float32) * scale
        e = expf(t - t.max(axis=-1, keepdims=True))
    total = np.zeros(e.shape[:-1], np.float32)
    for i in range(e.shape[-1]):
        total = total + e[..., i]
    return [np.moveaxis(e / total[..., None], -1, axis)]
