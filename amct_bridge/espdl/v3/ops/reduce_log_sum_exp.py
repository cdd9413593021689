"""ReduceLogSumExp: ``dl_module_reduce_log_sum_exp.hpp`` (a float32 sum of ``expf`` in order,
then ``logf``; int8 reads ``expf`` from a 256-entry table)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, expf, logf, round_float, saturate
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, pin_finite, rows_of, scale

OP_TYPES = ("ReduceLogSumExp",)


def exp_table(exponent: int) -> np.ndarray:
    """``tool::gen_lut_8bit(table, exponent, expf)``: ``expf(2^exponent · (i - 128))``, float32.

    Example:
        >>> float(exp_table(0)[128]), float(exp_table(-1)[130]), float(exp_table(0)[255])
        (1.0, 2.7182817459106445, inf)
    """
    return expf(scale(exponent) * (np.arange(256, dtype=np.float32) - np.float32(128)))


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``round(logf(sum expf(x · 2^e_in)) · 2^-e_out)`` saturated, no maximum subtracted;
    the sum in float32, in order.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo("x", [2], 3, [0]),
        ...                                    ValueInfo("y", [1], 3, [-4])])
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([0, 0])
        >>> compute(ctx, Node("n", "ReduceLogSumExp", ["x"], ["y"]))[0].tolist()  # ln 2 = 0.693
        [11]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    rows, shape = rows_of(ctx, node, x)
    if kind.kind == "f":
        return [logf(fold(rows, lambda acc, v: acc + expf(v), 0.0)).reshape(shape)]
    e_in = ctx.exponent(node.inputs[0], node)
    if kind == np.int8:
        terms = exp_table(e_in)[rows.astype(np.int64) + 128]
    else:
        terms = expf(rows.astype(np.float32) * scale(e_in))
    log = logf(fold(terms, lambda acc, v: acc + v, 0.0))
    value = pin_finite(log * scale(-ctx.exponent(node.outputs[0], node)), kind)
    return [saturate(round_float(value, ctx.half_even), kind).reshape(shape)]
