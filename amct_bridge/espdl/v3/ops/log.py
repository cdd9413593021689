"""Log: ``dl_module_log.hpp``.

An int8 node with a table (attribute ``lut``) runs as the ``LUT`` module. Otherwise, int8 or
int16: ``round(logf(x · 2^e_in) · 2^-e_out)`` in float32 (``tool::round``; log 0 = -inf
saturates to the type's minimum, a negative input's NaN to its maximum as RISC-V converts it);
float32: ``logf(x)``.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, logf
from amct_bridge.espdl.v3.ops.lut import unary

OP_TYPES = ("Log",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Log: the node's int8 table, else ``logf`` in float32.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("x", [3], 3, [-2])],
        ...                value_info=[ValueInfo("y", [3], 3, [-4])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["x"] = np.array([0, 4, 8], np.int8)  # 0, 1, 2
        >>> compute(ctx, Node("l", "Log", ["x"], ["y"], {"quant_type": "S8"}))[0].tolist()
        [-128, 0, 11]
    """
    return [unary(ctx, node, logf)]
