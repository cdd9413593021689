"""Pad: the stored tensor padded as ONNX's Pad, no rescaling.

Runtime: ``dl_module_pad.hpp``, ``dl_base_pad.cpp``: ``pads`` is ``[begin..., end...]``
(non-negative), ``mode`` ``constant`` (the quantized ``constant_value`` input, default 0),
``edge`` or ``reflect``.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input

OP_TYPES = ("Pad",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``np.pad`` of the integers with ONNX's ``pads`` and ``mode`` (``dl_base_pad.cpp``).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> c = {"p": Tensor("p", np.int64([2, 1]), [0]), "v": Tensor("v", np.int8([9]), [-3])}
        >>> ctx = Context(EspdlModel([], c), "c")
        >>> ctx.values["x"] = np.int8([1, 2, 3])
        >>> compute(ctx, Node("n", "Pad", ["x", "p", "v"], ["y"]))[0].tolist()
        [9, 9, 1, 2, 3, 9]
        >>> compute(ctx, Node("n", "Pad", ["x", "p"], ["y"], {"mode": "reflect"}))[0].tolist()
        [3, 2, 1, 2, 3, 2]
    """
    x = ctx.value(node.inputs[0], node)
    pads = ints_input(ctx, node, 1)
    if pads is None or len(pads) != 2 * x.ndim or min(pads) < 0:
        raise ctx.refuse(node, f"pads {pads} for a tensor of rank {x.ndim} (non-negative)")
    width = list(zip(pads[: x.ndim], pads[x.ndim :], strict=True))
    ctx.check_elements(
        node, [d + a + b for d, (a, b) in zip(x.shape, width, strict=True)], "output"
    )
    mode = node.attributes.get("mode", "constant")
    if mode == "constant":
        value = ints_input(ctx, node, 2)
        return [np.pad(x, width, constant_values=value[0] if value else 0)]
    if mode in ("edge", "reflect"):
        return [np.pad(x, width, mode=mode)]
    raise ctx.refuse(node, f"mode {mode!r} (constant, edge, reflect are simulated)")
