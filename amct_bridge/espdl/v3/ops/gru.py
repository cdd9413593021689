"""GRU: ``dl_module_gru.hpp`` (``forward_template``), ``dl_base_dotprod.cpp`` and the esp32s3 /
esp32p4 ``dotprod`` kernels, ``dl_math.hpp``'s ``SigmoidLUT`` / ``TanhLUT``.

**This op rests on the runtime's sources alone** (esp-dl 12c0616d: ``dl_module_gru.hpp``,
``dl_base_dotprod.hpp`` / ``.cpp``, ``isa/tie728/dl_tie728_dotprod.S``,
``isa/esp32p4/dl_esp32p4_dotprod.S``, ``dl_math.hpp``, ``dl_tool.cpp``, ``dl_define.hpp``):
esp-ppq 1.3.12 cannot generate GRU test files, so no file checks it.

Modelled, per direction and time step (gates in ONNX's z, r, h order, the module's too):

- ``ic = W·x_t``, ``hc = R·h`` (int16 caches at the gate exponent, :func:`~._rnn.mat_vec`);
  with B, ``ic += Wb``, ``hc += Rb`` (wrapping int16 stores);
- ``z = σ[ic_z + hc_z]``, ``r = σ[ic_r + hc_r]`` (table lookups of the int sums);
- ``n = tanh[round(ic_h + r · hc_h)]`` in float32: the reset gate multiplies the recurrent
  term after its bias (``linear_before_reset=1``, PyTorch's GRU, the only form the module takes);
- ``h = saturate(round((1 − z) · n · 2^-e_Y + z · h))`` in float32; Y gets h at every step,
  Y_h the last h of each direction; h starts from initial_h's integers (or 0).

Not modelled: see :mod:`amct_bridge.espdl.v3.ops._rnn` (float models, ``reverse``,
non-default activations, ``clip``, batch > 1, ``sequence_lens`` other than the sequence length,
fused multiply-adds, which ``expf`` the chip's libc has); ``linear_before_reset`` 0 or absent is
refused (``deserialize()`` returns no module).
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate
from amct_bridge.espdl.v3.ops._rnn import (
    gate_tables,
    mat_vec,
    read_rnn,
    sigmoid_lut,
    steps,
    tanh_lut,
    wrap_int16,
)

OP_TYPES = ("GRU",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Y ``[seq, dirs, 1, H]`` and Y_h ``[dirs, 1, H]`` as ``dl_module_gru.hpp`` computes them.

    One step, H = 1: x = 1.0 (64 at 2^-6), W's h row 1.0, the rest 0: ``ic = [0, 0, 512]``
    (2^-9), z = r = σ(0) = 0.5, n = tanh[512] = tanh(1) = 0.7616, and
    ``h = round(0.5 · 0.7616 · 2^7) = round(48.74) = 49``.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor, ValueInfo
        >>> w = Tensor("w", np.array([[[0], [0], [64]]], np.int8), [-6])
        >>> r = Tensor("r", np.zeros((1, 3, 1), np.int8), [-7])
        >>> node = Node("gru", "GRU", ["x", "w", "r"], ["y", "yh"], {"hidden_size": 1,
        ...             "linear_before_reset": 1, "gate_exponent": -9, "quant_type": "S8"})
        >>> outs = [ValueInfo("y", [1, 1, 1, 1], 3, [-7]), ValueInfo("yh", [1, 1, 1], 3, [-7])]
        >>> m = EspdlModel([node], {"w": w, "r": r}, inputs=[ValueInfo("x", [1, 1, 1], 3, [-6])],
        ...                outputs=outs)
        >>> ctx = Context(m, "c")
        >>> ctx.values["x"] = np.array([[[64]]], np.int8)
        >>> [v.tolist() for v in compute(ctx, node)]
        [[[[[49]]]], [[[49]]]]
    """
    if int(node.attributes.get("linear_before_reset", 0)) == 0:
        raise ctx.refuse(
            node,
            "linear_before_reset must be 1 (dl_module_gru.hpp's deserialize() returns no module "
            "otherwise: the runtime's GRU is PyTorch's)",
        )
    rnn = read_rnn(ctx, node, 3, ("Sigmoid", "Tanh"))
    hid, dtype = rnn.hidden, rnn.dtype
    sig_table, tanh_table = gate_tables(rnn.gate_exponent)
    rescale = np.float32(2.0**-rnn.y_exponent)
    seq = rnn.x.shape[0]
    y = np.zeros((seq, rnn.directions, 1, hid), dtype)
    y_h = np.zeros((rnn.directions, 1, hid), dtype)
    for d in range(rnn.directions):
        ic_all = mat_vec(ctx, node, rnn.w[d], rnn.x, rnn.w_shift)  # W·x_t of every step
        if rnn.bias is not None:
            ic_all = wrap_int16(ic_all + rnn.bias[d, : 3 * hid])
        h = rnn.initial_h[d] if rnn.initial_h is not None else np.zeros(hid, np.int64)
        for t in steps(seq, d):
            ic = ic_all[t]
            hc = mat_vec(ctx, node, rnn.r[d], h[None], rnn.r_shift)[0]
            if rnn.bias is not None:
                hc = wrap_int16(hc + rnn.bias[d, 3 * hid :])
            gates = sigmoid_lut(sig_table, ic[: 2 * hid] + hc[: 2 * hid])
            z, r = gates[:hid], gates[hid:]
            # index = round(ic_h + r_gate * hc_h): int16 + float * int16, in float32
            pre = ic[2 * hid :].astype(np.float32) + r * hc[2 * hid :].astype(np.float32)
            n = tanh_lut(tanh_table, round_float(pre, ctx.half_even))
            temp = (np.float32(1) - z) * n * rescale + z * h.astype(np.float32)
            h = saturate(round_float(temp, ctx.half_even), dtype).astype(np.int64)
            y[t, d, 0] = h
        y_h[d, 0] = h
    return [y, y_h]
