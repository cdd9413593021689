"""Relu: ``dl_module_relu.hpp``.

An int8 node with a table (attribute ``lut``) runs as the ``LUT`` module; otherwise the module
copies ``max(x, 0)`` when the input and output exponents are equal, and else rescales the
positive values in float32: ``round(x · 2^e_in · 2^-e_out)`` (``tool::round``), negatives 0.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops.lut import float_unary, is_float, node_table, table_lookup

OP_TYPES = ("Relu",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Relu as ``dl_module_relu.hpp`` computes it (table, copy, or float rescale).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("x", [4], 3, [-2])],
        ...                value_info=[ValueInfo("y", [4], 3, [-1])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["x"] = np.array([-3, 1, 3, 5], np.int8)  # -0.75, 0.25, 0.75, 1.25
        >>> compute(ctx, Node("r", "Relu", ["x"], ["y"], {"quant_type": "S8"}))[0].tolist()
        [0, 1, 2, 3]
    """
    x = ctx.value(node.inputs[0], node)
    if is_float(node):
        return [np.where(x >= 0, x, np.float32(0)).astype(np.float32)]
    table = node_table(ctx, node)
    if table is not None:
        return [table_lookup(ctx, node, table)]
    if ctx.exponent(node.inputs[0], node) == ctx.exponent(node.outputs[0], node):
        return [np.maximum(x, 0).astype(ctx.out_dtype(node))]
    # temp >= 0: truncate(round(temp * 2^-e_out)); else 0 (relu(0) rounds to 0 as well)
    return [float_unary(ctx, node, lambda t: np.maximum(t, np.float32(0)))]
