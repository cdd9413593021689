"""Exp: ``dl_module_exp.hpp``.

An int8 node with a table (attribute ``lut``) runs as the ``LUT`` module (esp-ppq writes one
for every int8 Exp; its int16 Exp nodes are exported as op type ``LUT``, see :mod:`.lut`).
Otherwise, int8 or int16: ``round(expf(x · 2^e_in) · 2^-e_out)`` in float32 (``tool::round``);
float32: ``expf(x)``.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, expf
from amct_bridge.espdl.v3.ops.lut import unary

OP_TYPES = ("Exp",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Exp: the node's int8 table, else ``expf`` in float32.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("x", [3], 5, [-4])],
        ...                value_info=[ValueInfo("y", [3], 5, [-8])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["x"] = np.array([-16, 0, 16], np.int16)  # -1, 0, 1
        >>> compute(ctx, Node("e", "Exp", ["x"], ["y"], {"quant_type": "S16"}))[0].tolist()
        [94, 256, 696]
    """
    return [unary(ctx, node, expf)]
