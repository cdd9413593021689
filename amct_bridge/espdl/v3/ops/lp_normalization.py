"""LpNormalization: ``dl_module_lp_normalization.hpp`` (``p`` 1, else the L2 path) and
``dl_base_reduce.cpp``'s ``reduce_l2``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, pin_finite, scale

OP_TYPES = ("LpNormalization",)


def _sum_squares_unrolled(rows: np.ndarray) -> np.ndarray:
    """``reduce_l2(float *, n, 1)``: ``sum += ((v0² + v1²) + v2²) + v3²`` per four, then one
    by one."""
    acc = np.zeros(rows.shape[0], np.float32)
    n = rows.shape[1]
    for i in range(0, n - n % 4, 4):
        v = rows[:, i : i + 4]
        acc = acc + (
            ((v[:, 0] * v[:, 0] + v[:, 1] * v[:, 1]) + v[:, 2] * v[:, 2]) + v[:, 3] * v[:, 3]
        )
    for i in range(n - n % 4, n):
        acc = acc + rows[:, i] * rows[:, i]
    return acc


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Along ``axis`` (default -1): ``inv = 1 / sum |x|`` (p 1, a float32 sum in order) or
    ``1 / sqrtf(float(int sum x²))``, 0 for an all-zero line (which then outputs 0);
    ``y = round(x · inv · 2^-e_out)`` saturated (the input's exponent cancels). float32:
    ``x · inv``.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo("x", [2, 2], 3, [-3]),
        ...                                    ValueInfo("y", [2, 2], 3, [-6])])
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([[3, -4], [0, 0]])
        >>> node = Node("n", "LpNormalization", ["x"], ["y"], {"axis": -1, "p": 2})
        >>> compute(ctx, node)[0].tolist()  # 0.6, -0.8 at 2^-6
        [[38, -51], [0, 0]]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    if x.ndim == 0:
        return [np.zeros((), kind)]
    axis = int(node.attributes.get("axis", -1))
    if not -x.ndim <= axis < x.ndim:
        raise ctx.refuse(node, f"axis {axis} is out of range for rank {x.ndim}")
    last = axis % x.ndim == x.ndim - 1
    moved = np.moveaxis(x, axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    values = rows.astype(np.float32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if int(node.attributes.get("p", 2)) == 1:
            total = fold(values, lambda acc, v: acc + np.abs(v), 0.0)
            inv = np.float32(1.0) / total
        else:
            if kind.kind == "f":  # the 4-way unrolled float loop on a contiguous line only
                total = (
                    _sum_squares_unrolled(values)
                    if last
                    else fold(values, lambda acc, v: acc + v * v, 0.0)
                )
            else:
                wide = rows.astype(np.int64)
                total = (wide * wide).sum(axis=1).astype(np.float32)  # exact integer sum
            inv = np.float32(1.0) / np.sqrt(total)
    inv = np.where(total > 0, inv, np.float32(0.0)).astype(np.float32)[:, None]
    if kind.kind == "f":
        out = np.where(inv > 0, values * inv, np.float32(0.0))
        return [np.moveaxis(out.reshape(moved.shape), -1, axis)]
    out_scale = scale(-ctx.exponent(node.outputs[0], node))
    if last:  # inv_norm *= output_scale, tested > 0, then x · inv_norm
        inv = inv * out_scale
        value = values * inv
    else:  # inv_norm tested > 0, then (x · inv_norm) · output_scale
        value = values * inv * out_scale
    ints = round_float(pin_finite(value, kind), ctx.half_even)
    ints = np.where(inv > 0, ints, 0)
    return [np.moveaxis(saturate(ints, kind).reshape(moved.shape), -1, axis)]
