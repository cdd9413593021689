"""LSTM: ``dl_module_lstm.hpp`` (``forward_template``), ``dl_base_dotprod.cpp`` and the
esp32s3 / esp32p4 ``dotprod`` kernels, ``dl_math.hpp``'s ``SigmoidLUT`` / ``TanhLUT``.

**This op rests on the runtime's sources alone** (esp-dl 12c0616d: ``dl_module_lstm.hpp``,
``dl_base_dotprod.hpp`` / ``.cpp``, ``isa/tie728/dl_tie728_dotprod.S``,
``isa/esp32p4/dl_esp32p4_dotprod.S``, ``dl_math.hpp``, ``dl_tool.cpp``, ``dl_define.hpp``):
esp-ppq 1.3.12 cannot generate LSTM test files, so no file checks it.

Modelled, per direction and time step (gates in ONNX's i, o, f, c order, the module's too):

- ``g = W·x_t + R·h (+ Wb + Rb)``: two int16 matmul results at the gate exponent
  (:func:`~._rnn.mat_vec`) summed as ints and stored back in int16 (wrapping);
- ``i = σ[g_i]``, ``o = σ[g_o]``, ``f = σ[g_f]``, ``c̃ = tanh[g_c]`` (table lookups);
- ``c = round(f · c + i · c̃ · 2^-e_c)`` in float32, stored in int16 without saturation (it
  wraps); the cell state is int16 at the gate exponent (the module asserts Y_c is int16 at
  ``gate_exponent``; esp-ppq quantizes initial_c and Y_c so);
- ``h = saturate(round(o · tanh[c] · 2^-e_Y))`` in float32; Y gets h at every step, Y_h / Y_c
  the last h / c of each direction; h and c start from initial_h / initial_c's integers (or 0).

Not modelled: see :mod:`amct_bridge.espdl.v3.ops._rnn` (float models, ``reverse``,
non-default activations, ``clip``, batch > 1, ``sequence_lens`` other than the sequence length,
fused multiply-adds, which ``expf`` the chip's libc has); ``input_forget=1`` (``deserialize()``
returns no module) and peepholes ``P`` (never read) are refused.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate
from amct_bridge.espdl.v3.ops._rnn import (
    gate_tables,
    int_input,
    mat_vec,
    note_exponent,
    present,
    read_rnn,
    sigmoid_lut,
    steps,
    tanh_lut,
    wrap_int16,
)

OP_TYPES = ("LSTM",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Y ``[seq, dirs, 1, H]``, Y_h ``[dirs, 1, H]`` and Y_c (int16) as ``dl_module_lstm.hpp``
    computes them.

    One step, H = 1: x = 1.0 (64 at 2^-6), W's c row 1.0, the rest 0: ``g = [0, 0, 0, 512]``
    (2^-9), i = o = f = 0.5, c̃ = tanh(1) = 0.7616, ``c = round(0.5 · 0.7616 · 2^9) = 195``,
    ``h = round(0.5 · tanh(195 / 512) · 2^7) = round(0.5 · 0.3635 · 128) = 23``.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor, ValueInfo
        >>> w = Tensor("w", np.array([[[0], [0], [0], [64]]], np.int8), [-6])
        >>> r = Tensor("r", np.zeros((1, 4, 1), np.int8), [-7])
        >>> node = Node("lstm", "LSTM", ["x", "w", "r"], ["y", "yh", "yc"], {"hidden_size": 1,
        ...             "gate_exponent": -9, "quant_type": "S8"})
        >>> m = EspdlModel([node], {"w": w, "r": r}, inputs=[ValueInfo("x", [1, 1, 1], 3, [-6])],
        ...     outputs=[ValueInfo("y", [1, 1, 1, 1], 3, [-7]), ValueInfo("yh", [1, 1, 1], 3, [-7]),
        ...              ValueInfo("yc", [1, 1, 1], 5, [-9])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["x"] = np.array([[[64]]], np.int8)
        >>> [v.tolist() for v in compute(ctx, node)]
        [[[[[23]]]], [[[23]]], [[[195]]]]
    """
    if int(node.attributes.get("input_forget", 0)) == 1:
        raise ctx.refuse(
            node, "input_forget must be 0 (dl_module_lstm.hpp's deserialize() returns no module)"
        )
    if present(node, 7):
        raise ctx.refuse(node, "peepholes (input P) are never read by the runtime: not simulated")
    rnn = read_rnn(ctx, node, 4, ("Sigmoid", "Tanh", "Tanh"))
    hid, dtype, gate = rnn.hidden, rnn.dtype, rnn.gate_exponent
    y_c_name = node.outputs[2]
    e_c = ctx.exponent(y_c_name, node)
    if ctx.value_dtype(y_c_name, node) != np.int16 or e_c != gate:
        raise ctx.refuse(
            node,
            f"Y_c {y_c_name!r} must be int16 at the gate exponent {gate} (the module asserts "
            f"it), not {ctx.value_dtype(y_c_name, node)} at {e_c}",
        )
    initial_c = None
    if present(node, 6):
        c0 = int_input(ctx, node, 6, "initial_c", np.dtype(np.int16))
        if c0.size != rnn.directions * hid:
            raise ctx.refuse(
                node, f"initial_c has {c0.size} values, expected {rnn.directions * hid}"
            )
        note_exponent(ctx, node, 6, gate, "the gate exponent")
        initial_c = c0.reshape(rnn.directions, hid).astype(np.int64)
    sig_table, tanh_table = gate_tables(gate)
    rescale_y = np.float32(2.0**-rnn.y_exponent)
    rescale_c = np.float32(2.0**-e_c)
    seq = rnn.x.shape[0]
    y = np.zeros((seq, rnn.directions, 1, hid), dtype)
    y_h = np.zeros((rnn.directions, 1, hid), dtype)
    y_c = np.zeros((rnn.directions, 1, hid), np.int16)
    for d in range(rnn.directions):
        ic_all = mat_vec(ctx, node, rnn.w[d], rnn.x, rnn.w_shift)  # W·x_t of every step
        if rnn.bias is not None:
            # input_cache[i] += wb[i] + hidden_cache[i] + rb[i]: Wb + Rb summed as ints first
            ic_all = ic_all + rnn.bias[d, : 4 * hid] + rnn.bias[d, 4 * hid :]
        h = rnn.initial_h[d] if rnn.initial_h is not None else np.zeros(hid, np.int64)
        c = initial_c[d] if initial_c is not None else np.zeros(hid, np.int64)
        for t in steps(seq, d):
            hc = mat_vec(ctx, node, rnn.r[d], h[None], rnn.r_shift)[0]
            g = wrap_int16(ic_all[t] + hc)
            i_gate = sigmoid_lut(sig_table, g[:hid])
            o_gate = sigmoid_lut(sig_table, g[hid : 2 * hid])
            f_gate = sigmoid_lut(sig_table, g[2 * hid : 3 * hid])
            c_gate = tanh_lut(tanh_table, g[3 * hid :])
            temp = f_gate * c.astype(np.float32) + i_gate * c_gate * rescale_c
            c = wrap_int16(round_float(temp, ctx.half_even))  # int -> int16_t, no truncate
            temp = o_gate * tanh_lut(tanh_table, c) * rescale_y
            h = saturate(round_float(temp, ctx.half_even), dtype).astype(np.int64)
            y[t, d, 0] = h
        y_h[d, 0] = h
        y_c[d, 0] = c
    return [y, y_h, y_c]
