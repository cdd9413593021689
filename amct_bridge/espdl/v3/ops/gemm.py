"""Gemm: ``dl_module_gemm.hpp``, the input viewed as ``[1, 1, rows, C]`` and run as a 1x1 conv.

The conv's rules apply unchanged (:mod:`~amct_bridge.espdl.v3.ops.conv`), per-channel filters
on esp32p4 / esp32s31 included (``dl_module_gemm.hpp`` builds the same ``ConvOpArgs``); the
suite's per-channel Gemm files are equal under them.

Example:
    >>> OP_TYPES
    ('Gemm',)
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops.conv import conv_core

OP_TYPES = ("Gemm",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """A Gemm node: ``x @ W`` (+ bias), the conv's output stage; leading dims kept.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor, ValueInfo
        >>> w = Tensor("w", np.array([1, 1, 1, -1], np.int8).reshape(1, 1, 2, 2), [0])
        >>> m = EspdlModel([], {"w": w}, inputs=[ValueInfo("x", [1, 2], 3, [0])],
        ...                outputs=[ValueInfo("y", [1, 2], 3, [1])])
        >>> ctx = Context(m, "c")  # c target: the filter is stored [N, C]: [[1, 1], [1, -1]]
        >>> ctx.values["x"] = np.array([[5, 2]], np.int8)
        >>> compute(ctx, Node("fc", "Gemm", ["x", "w"], ["y"]))[0].tolist()  # [7, 3] / 2
        [[4, 2]]
    """
    if node.attributes.get("transA", 0) or node.attributes.get("transB", 0):
        raise ctx.refuse(node, "transA/transB must be 0 (esp-ppq transposes the weight)")
    x = ctx.value(node.inputs[0], node)
    rows = x.reshape(1, 1, -1, x.shape[-1])
    out = conv_core(ctx, node, rows, 2)
    return [out.reshape(*x.shape[:-1], out.shape[-1])]
