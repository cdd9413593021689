"""MaxPool: the largest stored integer of each window, no rescaling.

Runtime: ``dl_module_max_pool.hpp``, ``dl_base_max_pool2d.cpp``. The input is NHWC (or NWC for
a 1-D pool); the window geometry is :mod:`._pool`'s, and padding never wins.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops._pool import pool_geometry, windows

OP_TYPES = ("MaxPool",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``max`` over each window, padded positions holding the type's minimum.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> ctx.values["x"] = np.int8([[[-5], [3], [-2]]])  # N, W, C
        >>> n = Node("p", "MaxPool", ["x"], ["y"],
        ...          {"kernel_shape": [2], "strides": [2], "pads": [1, 0]})
        >>> compute(ctx, n)[0].ravel().tolist()  # windows (pad, -5) and (3, -2)
        [-5, 3]
    """
    x0 = ctx.value(node.inputs[0], node)
    x, kernel, strides, (top, left, bottom, right) = pool_geometry(ctx, node, x0)
    low = np.iinfo(x.dtype).min
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=low)
    out = np.maximum.reduce(list(windows(xp, kernel, strides)))
    return [out[:, 0] if x0.ndim == 3 else out]
