"""PRelu: ``dl_module_prelu.hpp``, ``dl_base_prelu.cpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, saturate, shift_round

OP_TYPES = ("PRelu",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    # dl_base.hpp get_activation_args: activation_shift = e_out - e_in - e_alpha;
    # c (dl_base_prelu.cpp prelu_11c): x >= 0 copied as it is, else (x * alpha) >> shift (floor);
    # esp32s3 (dl_tie728_s8_prelu.S): both sides rounded half up, x >= 0 rescaled to e_out
    if ctx.target == "esp32p4":
        raise ctx.refuse(node, "PRelu on esp32p4 (its esp.vprelu rounding is not known here)")
    x = ctx.value(node.inputs[0], node).astype(np.int64)
    alpha_t = ctx.initializer(node.inputs[1], node)
    alpha = alpha_t.data.reshape(-1).astype(np.int64)
    if alpha.size not in (1, x.shape[-1]):
        raise ctx.refuse(node, f"{alpha.size} slopes for {x.shape[-1]} channels")
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    shift = e_out - e_in - alpha_t.exponent
    if ctx.target == "c":
        product = x * alpha
        neg = np.where(shift > 0, product >> max(shift, 0), product << max(-shift, 0))
        out = np.where(x >= 0, x, neg)
    else:
        neg = shift_round(x * alpha, shift, False)
        out = np.where(x < 0, neg, np.where(x > 0, shift_round(x, e_out - e_in, False), 0))
    return [saturate(out, ctx.out_dtype(node))]
