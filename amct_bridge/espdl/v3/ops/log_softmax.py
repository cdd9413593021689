"""LogSoftmax: ``dl_module_log_softmax.hpp`` (a float32 output)."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, expf, logf
from amct_bridge.espdl.v3.ops._reduce import element_type, fold, scale
from amct_bridge.espdl.v3.ops.reduce_log_sum_exp import exp_table

OP_TYPES = ("LogSoftmax",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """float32 along ``axis`` (default -1). int8 (``forward_lut``): ``x · 2^e_in - logf(sum)``
    with the sum of ``expf(2^e_in · x)`` read from a table, no maximum subtracted; int16 and
    float32 (``forward_float``): ``t = x · 2^e_in``, ``(t - max) - logf(sum expf(t - max))``.
    The sums run in float32 in order along the axis.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo("x", [1, 2], 3, [0])])
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.int8([[0, 0]])
        >>> node = Node("n", "LogSoftmax", ["x"], ["y"], {"quant_type": "S8"})
        >>> compute(ctx, node)[0].tolist()  # -ln 2
        [[-0.6931471824645996, -0.6931471824645996]]
    """
    x = ctx.value(node.inputs[0], node)
    kind = element_type(ctx, node, x)
    if x.ndim == 0:
        return [np.zeros((), np.float32)]
    axis = int(node.attributes.get("axis", -1))
    if not -x.ndim <= axis < x.ndim:
        raise ctx.refuse(node, f"axis {axis} is out of range for rank {x.ndim}")
    moved = np.moveaxis(x, axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    if kind == np.int8:
        e_in = ctx.exponent(node.inputs[0], node)
        terms = exp_table(e_in)[rows.astype(np.int64) + 128]
        log_sum = logf(fold(terms, lambda acc, v: acc + v, 0.0))
        out = rows.astype(np.float32) * scale(e_in) - log_sum[:, None]
    else:
        t = rows.astype(np.float32)
        if kind == np.int16:
            t = t * scale(ctx.exponent(node.inputs[0], node))
        shifted = t - t.max(axis=1, keepdims=True)
        log_sum = logf(fold(expf(shifted), lambda acc, v: acc + v, 0.0))
        out = shifted - log_sum[:, None]
    return [np.moveaxis(out.reshape(moved.shape), -1, axis)]
