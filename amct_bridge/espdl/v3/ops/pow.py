"""Pow: ``dl_module_pow.hpp``, ``dl_base_pow.cpp`` (C kernels on every target).

int8 / int16: ``round(powf(a · 2^e0, b · 2^e1) · 2^-e_out)``, every step in float32 and the
result through ``tool::round`` and saturation; the kernels differ only in which operand is
the row's single value, not in the arithmetic. float32: ``powf(a, b)``. Broadcasting as
``get_elemwise_operation_args`` (see :mod:`.div`).
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, elemwise_rows, powf
from amct_bridge.espdl.v3.ops.lut import is_float, round_saturate

OP_TYPES = ("Pow",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``powf`` on the dequantized values, requantized to the output exponent.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("a", [3], 3, [-2]),
        ...                                ValueInfo("b", [1], 3, [-1])],
        ...                value_info=[ValueInfo("y", [3], 3, [-3])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["a"] = np.array([4, 9, 6], np.int8)  # 1, 2.25, 1.5
        >>> ctx.values["b"] = np.array([1], np.int8)  # 0.5
        >>> compute(ctx, Node("p", "Pow", ["a", "b"], ["y"], {"quant_type": "S8"}))[0].tolist()
        [8, 12, 10]
    """
    a = ctx.value(node.inputs[0], node)
    b = ctx.value(node.inputs[1], node)
    dims = elemwise_rows(a.shape, b.shape)[3]
    if dims > 4:
        raise ctx.refuse(node, f"shapes {a.shape} and {b.shape} merge into {dims} dimensions")
    if is_float(node):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return [powf(a, b)]
    s0 = np.float32(2.0 ** ctx.exponent(node.inputs[0], node))
    s1 = np.float32(2.0 ** ctx.exponent(node.inputs[1], node))
    rescale = np.float32(2.0 ** -ctx.exponent(node.outputs[0], node))
    base = a.astype(np.float32) * s0
    power = b.astype(np.float32) * s1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        result = powf(base, power) * rescale
    return [round_saturate(result, ctx.out_dtype(node), ctx.half_even)]
