"""Sqrt: ``dl_module_sqrt.hpp``.

An int8 node with a table (attribute ``lut``) runs as the ``LUT`` module. Otherwise, int8 or
int16: ``round(sqrtf(x · 2^e_in) · 2^-e_out)`` in float32 (``tool::round``; a negative input's
NaN saturates to the type's maximum as RISC-V converts it); float32: ``sqrtf(x)``.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops.lut import unary

OP_TYPES = ("Sqrt",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Sqrt: the node's int8 table, else ``sqrtf`` in float32.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("x", [3], 3, [-4])],
        ...                value_info=[ValueInfo("y", [3], 3, [-4])])
        >>> ctx = Context(m, "esp32p4")
        >>> ctx.values["x"] = np.array([0, 4, 16], np.int8)  # 0, 0.25, 1
        >>> compute(ctx, Node("s", "Sqrt", ["x"], ["y"], {"quant_type": "S8"}))[0].tolist()
        [0, 8, 16]
    """
    return [unary(ctx, node, np.sqrt)]
