"""Mod: ``dl_module_mod.hpp``, ``dl_base_mod.cpp`` (C kernels on every target).

The kernels always compute C's ``fmodf`` (the result takes the dividend's sign), whatever the
node's ``fmod`` attribute says, and give 0 where the divisor is 0. int8 / int16:
``round(fmodf(a · 2^e0, b · 2^e1) · 2^-e_out)`` in float32 (``fmodf`` is exact), through
``tool::round`` and saturation; float32: ``fmodf(a, b)``. Broadcasting as
``get_elemwise_operation_args`` (see :mod:`.div`).
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops.div import elemwise_rows
from amct_bridge.espdl.v3.ops.lut import is_float, round_saturate

OP_TYPES = ("Mod",)


def _fmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``b != 0 ? fmodf(a, b) : 0`` in float32."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, np.fmod(a, b), np.float32(0)).astype(np.float32)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """C ``fmodf`` of the dequantized values, requantized to the output exponent.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("a", [4], 3, [-2]),
        ...                                ValueInfo("b", [4], 3, [-1])],
        ...                value_info=[ValueInfo("y", [4], 3, [-2])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["a"] = np.array([7, -7, 7, 5], np.int8)  # 1.75, -1.75, 1.75, 1.25
        >>> ctx.values["b"] = np.array([1, 1, -1, 0], np.int8)  # 0.5, 0.5, -0.5, 0
        >>> n = Node("m", "Mod", ["a", "b"], ["y"], {"fmod": 1, "quant_type": "S8"})
        >>> compute(ctx, n)[0].tolist()  # 0.25, -0.25, 0.25, 0
        [1, -1, 1, 0]
    """
    a = ctx.value(node.inputs[0], node)
    b = ctx.value(node.inputs[1], node)
    dims = elemwise_rows(a.shape, b.shape)[3]
    if dims > 4:
        raise ctx.refuse(node, f"shapes {a.shape} and {b.shape} merge into {dims} dimensions")
    if node.attributes.get("fmod", 1) != 1:
        ctx.notes.append(
            f"node {node.name!r} (Mod): fmod=0 asks for the divisor's sign; the runtime computes "
            "C's fmodf (the dividend's sign) all the same, and so does this simulation"
        )
    if is_float(node):
        return [_fmod(a.astype(np.float32), b.astype(np.float32))]
    s0 = np.float32(2.0 ** ctx.exponent(node.inputs[0], node))
    s1 = np.float32(2.0 ** ctx.exponent(node.inputs[1], node))
    rescale = np.float32(2.0 ** -ctx.exponent(node.outputs[0], node))
    result = _fmod(a.astype(np.float32) * s0, b.astype(np.float32) * s1) * rescale
    return [round_saturate(result, ctx.out_dtype(node), ctx.half_even)]
