"""Mul: ``dl_module_mul.hpp``, ``dl_base_mul.cpp`` and the esp32s3 / esp32p4 assembly.

``shift = e_out - e0 - e1``. The assembly (rows of at least 16 int8 / 8 int16 values on
esp32s3 and esp32p4) multiplies exactly in its accumulator and rounds the shift (half up on
esp32s3, half to even on esp32p4). The C kernels (the ``c`` target, and shorter rows on the
others) compute ``(float)(a * b) * 2^-shift`` and ``tool::round``: the same in int8, but an
int16 product beyond 2^24 loses its low bits in the float. Row lengths are
``get_elemwise_operation_args``'s (:func:`.div.elemwise_rows`).
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate, shift_round
from amct_bridge.espdl.v3.ops.div import elemwise_rows

OP_TYPES = ("Mul",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """The rounded, saturated product at the output exponent.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("a", [8], 5, [-8]),
        ...                                ValueInfo("b", [8], 5, [-8])],
        ...                value_info=[ValueInfo("y", [8], 5, [0])])
        >>> ctx = Context(m, "esp32p4")
        >>> n = Node("m", "Mul", ["a", "b"], ["y"], {"quant_type": "S16"})
        >>> # 32767 * 32766 / 2^16 = 16382.50003: exact in the assembly (rows of 8) ...
        >>> ctx.values["a"] = np.full(8, 32767, np.int16)
        >>> ctx.values["b"] = np.full(8, 32766, np.int16)
        >>> compute(ctx, n)[0].tolist()[0]
        16383
        >>> # ... while a row of 2 runs the C kernel: the float32 product is 16382.5, rne 16382
        >>> ctx.values["a"] = np.full(2, 32767, np.int16)
        >>> ctx.values["b"] = np.full(2, 32766, np.int16)
        >>> compute(ctx, n)[0].tolist()
        [16382, 16382]
    """
    a, b = (ctx.value(n, node).astype(np.int64) for n in node.inputs[:2])
    e0, e1 = (ctx.exponent(n, node) for n in node.inputs[:2])
    shift = ctx.exponent(node.outputs[0], node) - e0 - e1
    product = a * b
    dtype = ctx.out_dtype(node)
    if dtype == np.int16 and (ctx.target == "c" or elemwise_rows(a.shape, b.shape)[2] < 8):
        # the C kernel scales the int product as a float: beyond 2^24 it loses low bits
        scaled = product.astype(np.float32) * np.float32(2.0**-shift)
        return [saturate(round_float(scaled, ctx.half_even), np.int16)]
    return [saturate(shift_round(product, shift, ctx.half_even), dtype)]
