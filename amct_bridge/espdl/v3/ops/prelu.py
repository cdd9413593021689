"""PRelu: ``dl_module_prelu.hpp``, ``dl_base_prelu.cpp`` and its esp32s3 assembly.

- int8 with a table (attribute ``lut``): the ``LUT`` module, on every target;
- int8 without one: ``prelu<int8_t>``: the C kernel ``prelu_11c`` on ``c``, the esp32s3
  assembly (``dl_tie728_s8_prelu.S``); esp32p4's ``esp.vprelu.s8`` is refused (its rounding
  is not documented here);
- int16: ``prelu<int16_t>``: ``dl_tie728_s16_prelu.S`` on esp32s3, the C kernel elsewhere
  (esp32p4 has no int16 PRelu assembly); a single slope is repeated over the channels
  (``get_output_shape``);
- float32: ``x >= 0 ? x : x * alpha``.

The kernels' slope shift is ``activation_shift = e_out - e_in - e_alpha`` (``dl_base.hpp``
``get_activation_args``).
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, saturate, shift_round
from amct_bridge.espdl.v3.ops.lut import is_float, node_table, table_lookup

OP_TYPES = ("PRelu",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """PRelu as the runtime computes it for the node's type and the target.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor, ValueInfo
        >>> a = Tensor("a", np.array([[[16384]]], np.int16), [-16])  # 0.25
        >>> m = EspdlModel([], {"a": a}, inputs=[ValueInfo("x", [1, 1, 1, 2], 5, [-8])],
        ...                value_info=[ValueInfo("y", [1, 1, 1, 2], 5, [-8])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["x"] = np.array([[[[-6, 6]]]], np.int16)
        >>> n = Node("p", "PRelu", ["x", "a"], ["y"], {"quant_type": "S16"})
        >>> compute(ctx, n)[0].tolist()  # -6 * 16384 >> 16 = -1.5 floored to -2
        [[[[-2, 6]]]]
    """
    x = ctx.value(node.inputs[0], node)
    alpha_t = ctx.initializer(node.inputs[1], node)
    if is_float(node):
        alpha = alpha_t.data.reshape(-1).astype(np.float32)
        return [np.where(x >= 0, x, x * alpha).astype(np.float32)]
    table = node_table(ctx, node)
    if table is not None:
        return [table_lookup(ctx, node, table)]
    dtype = ctx.out_dtype(node)
    if x.ndim != 4:
        # get_activation_args reads shape[1..3] as height, width, channels
        raise ctx.refuse(node, f"a {x.ndim}-D input (the PRelu kernels take NHWC)")
    alpha = alpha_t.data.reshape(-1).astype(np.int64)
    channels = x.shape[-1]
    if alpha.size != channels:
        if dtype == np.int16:  # get_output_shape repeats the first slope over the channels
            alpha = np.full(channels, alpha[0], np.int64)
        else:  # the int8 kernels would read past the slopes
            raise ctx.refuse(node, f"{alpha.size} slopes for {channels} channels in int8")
    x = x.astype(np.int64)
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    shift = e_out - e_in - alpha_t.exponent
    if ctx.target == "esp32s3":
        # EE.VPRELU's shift taken as rounding half up (the TRM's text is not at hand; esp-ppq's
        # esp32s3_16 PRelu values agree, floor would leave a quarter one off); the int8 kernel
        # also rescales x > 0 to e_out (esp.vmulas + srcmb), the int16 one copies x >= 0
        neg = shift_round(x * alpha, shift, False)
        pos = shift_round(x, e_out - e_in, False) if dtype == np.int8 else x
        out = np.where(x < 0, neg, pos)
    elif ctx.target == "esp32p4" and dtype == np.int8:
        raise ctx.refuse(
            node, "PRelu on esp32p4 in int8 without a table (esp.vprelu.s8's rounding is not known)"
        )
    else:
        # prelu_11c: x >= 0 copied as it is, else DL_RIGHT_SHIFT(x * alpha, shift) (floor)
        product = x * alpha
        neg = product >> shift if shift > 0 else product << -shift
        out = np.where(x >= 0, x, neg)
    return [saturate(out, dtype)]
