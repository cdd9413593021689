"""Softmax: integers in, float32 probabilities out.

Runtime: ``dl_module_softmax.hpp``. int8 reads a 256-entry table of ``expf`` (no maximum
subtracted); int16 subtracts the row's maximum first. The sum runs in order along the axis,
in float32.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, expf

OP_TYPES = ("Softmax",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``e / sum(e)`` along ``axis`` in float32, ``e`` being ``exp_table[x + 128]`` for int8 (the
    table ``expf(2^e_in · (i - 128))``) and ``expf(t - max(t))``, ``t = x · 2^e_in``, for int16.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> ctx = Context(EspdlModel([], {}, inputs=[ValueInfo("x", [2, 2], 3, [0])]), "c")
        >>> ctx.values["x"] = np.int8([[3, 3], [0, -128]])  # expf(-128) is 0 in float32
        >>> compute(ctx, Node("s", "Softmax", ["x"], ["y"], {"quant_type": "S8"}))[0].tolist()
        [[0.5, 0.5], [1.0, 0.0]]
    """
    # the float32 sum runs in order on the chip, so it is accumulated element by element here
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
