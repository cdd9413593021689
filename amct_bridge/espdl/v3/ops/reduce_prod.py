"""ReduceProd: ``dl_module_reduce_prod.hpp`` (a product of the scaled inputs, in order: float32
for int8, double for int16)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, pin_finite, rows_of, scale

OP_TYPES = ("ReduceProd",)


def round_double(value: np.ndarray, half_even: bool) -> np.ndarray:
    """``tool::round(double)`` (dl_tool.cpp): ``floor(v + 0.5)``, or on half-even targets
    ``round_half_even(double)``: ``v ± 0.5`` truncated, one step back to zero when that is odd
    and within 1e-6 of the truncation (so a value just past a half can round down too).

    Example:
        >>> round_double(np.float64([2.5, 3.5, -2.5, 2.5000004, 2.4]), True).tolist()
        [2, 4, -2, 2, 2]
        >>> round_double(np.float64([2.5, -2.5]), False).tolist()
        [3, -2]
    """
    value = np.asarray(value, np.float64)
    if not half_even:
        return np.floor(value + 0.5).astype(np.int64)
    shifted = np.where(value < 0, value - 0.5, value + 0.5)
    whole = np.trunc(shifted)
    odd_tie = (np.abs(shifted - whole) < 1e-6) & (whole.astype(np.int64) % 2 != 0)
    back = np.where(value < 0, 1, -1)
    return (whole + np.where(odd_tie, back, 0)).astype(np.int64)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``round(prod(x · 2^e_in) · 2^-e_out)`` saturated, the product taken in order from 1
    (float32 for int8, double of float32 factors for int16); float32: the product in order.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo("x", [3], 3, [-1]),
        ...                                    ValueInfo("y", [1], 3, [-2])])
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([3, -4, 5])
        >>> compute(ctx, Node("n", "ReduceProd", ["x"], ["y"]))[0].tolist()  # -7.5 at 2^-2
        [-30]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    rows, shape = rows_of(ctx, node, x)
    with np.errstate(over="ignore", invalid="ignore"):
        if kind.kind == "f":
            return [fold(rows, lambda acc, v: acc * v, 1.0).reshape(shape)]
        factors = rows.astype(np.float32) * scale(ctx.exponent(node.inputs[0], node))
        out_scale = scale(-ctx.exponent(node.outputs[0], node))
        if kind == np.int8:
            product = fold(factors, lambda acc, v: acc * v, 1.0)
            value = round_float(pin_finite(product * out_scale, kind), ctx.half_even)
        else:
            product = fold(factors.astype(np.float64), lambda acc, v: acc * v, 1.0, np.float64)
            value = round_double(pin_finite(product * np.float64(out_scale), kind), ctx.half_even)
    return [saturate(value, kind).reshape(shape)]
