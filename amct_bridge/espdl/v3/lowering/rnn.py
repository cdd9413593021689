"""Lowering of recurrent layers (Keras ``GRU``, ``LSTM``, ``Bidirectional`` of either) to the
runtime's ``GRU`` / ``LSTM`` modules (``dl_module_gru.hpp``, ``dl_module_lstm.hpp``).

The node is ONNX's, as esp-ppq writes it: ``X`` the layer's input ``[1, seq, I]`` read with
``layout`` 1 (batch 1 first), ``W [dirs, G·H, I]`` and ``R [dirs, G·H, H]`` in the feature
type (one exponent each), ``B`` int16 ``[dirs, 2·G·H]`` (``Wb`` then ``Rb``) at the gate
exponent. Keras' gate blocks are reordered to ONNX's: LSTM i, f, c, o -> i, o, f, c; GRU
z, r, h stays. Keras ``GRU(reset_after=True)`` (the default) is ONNX
``linear_before_reset=1``, the only GRU the runtime runs; an LSTM's single Keras bias is
``Wb`` (``Rb`` zero).

Exponents: the gate exponent is esp-ppq's -9 (``GRU_QUANT_EXPONENT`` / ``LSTM_QUANT_EXPONENT``:
int16 gates up to ±64, finer than the sigmoid / tanh tables need), raised only when a bound on
a gate sum (or an LSTM cell state) would pass int16, where the runtime's caches wrap. ``h`` is
in ``(-1, 1)``; ``Y`` and ``Y_h`` share one exponent (the runtime rounds ``h`` at ``Y``'s and
multiplies it by ``R`` as if at ``Y_h``'s): with ``return_sequences`` the calibrated output
range (every step's ``h``), capped at ``1 − bits`` (``|h| < 1``); without it the calibrated
output is the last step only, so the bound ``|h| < 1`` gives ``1 − bits``. An LSTM's ``Y_c``
is int16 at the gate exponent (the module asserts it).

The output: ``Y [seq, dirs, 1, H]`` reshaped to Keras' ``[1, seq, dirs·H]`` (a Bidirectional's
"concat": forward then backward per step, aligned in time), or ``Y_h [dirs, 1, H]`` to
``[1, dirs·H]``. ``go_backwards`` (a forward layer that reads the sequence backwards and
returns it in that order) is a ``ReverseSequence`` of the input, then the forward node: the
runtime's ``direction="reverse"`` is run forward (its modules walk backwards only in the
second direction of ``bidirectional``).

Example:
    >>> keras_to_onnx_gates(np.arange(8.0), "LSTM", 2).tolist()  # i f c o -> i o f c
    [0.0, 1.0, 6.0, 7.0, 2.0, 3.0, 4.0, 5.0]
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import ExportError, QuantError
from amct_bridge.espdl.checks import as_float32
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.lowering.emitter import Emitter
from amct_bridge.quant.espdl import auto_exponent

__all__ = ["GATE_EXPONENT", "RNN_KINDS", "keras_to_onnx_gates", "lower_rnn"]

#: esp-ppq's gate exponent for GRU and LSTM (``esp_ppq/core/common.py``).
GATE_EXPONENT = -9
#: The runtime's gate count per cell, and Keras' gate blocks in ONNX order.
_GATES = {"GRU": 3, "LSTM": 4}
_ONNX_ORDER = {"GRU": (0, 1, 2), "LSTM": (0, 3, 1, 2)}  # Keras (i, f, c, o) -> (i, o, f, c)
#: The kinds lowered here (a Bidirectional of a GRU / LSTM included).
RNN_KINDS = ("GRU", "LSTM", "Bidirectional")
#: The largest shift ``DL_RESCALE`` takes (``_rnn.mat_vec`` refuses beyond).
_MAX_SHIFT = 30


def keras_to_onnx_gates(m: np.ndarray, cell: str, hidden: int) -> np.ndarray:
    """``m``'s last axis (``G·H``, Keras' gate blocks) in ONNX's gate order."""
    blocks = [m[..., k * hidden : (k + 1) * hidden] for k in _ONNX_ORDER[cell]]
    return np.concatenate(blocks, axis=-1)


def _refusal(layer: SourceLayer, cell: str) -> str | None:
    """Why the runtime cannot compute ``layer`` (in v3 terms), or None."""
    a = layer.attrs
    if cell not in _GATES:
        return (
            f"{layer.kind} of a {cell or 'layer'}: the ESP-DL v3 runtime's recurrent modules are "
            "GRU and LSTM (use keras.layers.GRU or LSTM)"
        )
    if a.get("activation", "tanh") != "tanh" or a.get("recurrent_activation") != "sigmoid":
        return (
            f"{cell} with activation {a.get('activation')!r} and recurrent_activation "
            f"{a.get('recurrent_activation')!r}: the ESP-DL v3 runtime's {cell} always uses its "
            "tanh and sigmoid tables (keep the defaults 'tanh' and 'sigmoid')"
        )
    if cell == "GRU" and not a.get("reset_after", True):
        return (
            "GRU with reset_after=False: the ESP-DL v3 runtime runs only ONNX's "
            "linear_before_reset=1 (dl_module_gru.hpp returns no module otherwise; its GRU is "
            "PyTorch's), which is Keras' reset_after=True (the default): retrain with it"
        )
    if a.get("stateful"):
        return (
            f"stateful {cell}: the ESP-DL v3 runtime starts every inference from a zero state "
            "(stateful=False; keep the state on the host as an input if needed)"
        )
    if a.get("return_state"):
        return (
            f"{cell} with return_state: this ESP-DL v3 export writes the layer's output only "
            "(the last state is the output of return_sequences=False)"
        )
    if layer.kind == "Bidirectional" and a.get("merge_mode", "concat") != "concat":
        return (
            f"Bidirectional with merge_mode {a.get('merge_mode')!r}: the ESP-DL v3 runtime's "
            "bidirectional node writes both directions side by side, which is "
            "merge_mode='concat' (use it, and a Dense layer after to mix them)"
        )
    if layer.kind == "Bidirectional" and a.get("go_backwards"):
        return (
            "Bidirectional of a layer with go_backwards: the ESP-DL v3 runtime's second "
            "direction walks backwards and its first forwards (give the forward layer "
            "go_backwards=False)"
        )
    return None


def _gate_exponent(w, r, b, x_peak: float, cell: str, seq: int) -> tuple[int, str | None]:
    """The gate exponent (esp-ppq's, raised while a bound on a gate sum or an LSTM cell state
    would pass int16: the caches wrap) and the reason it was raised."""
    bound = np.abs(w).sum(axis=-1) * x_peak + np.abs(r).sum(axis=-1)  # |h| < 1
    if b is not None:
        half = b.shape[-1] // 2
        bound = bound + np.abs(b[..., :half]) + np.abs(b[..., half:])
    peak = float(bound.max(initial=0.0))
    what = "a gate sum"
    if cell == "LSTM" and seq > peak:  # c_t = f·c + i·tanh(..): |c| grows by < 1 per step
        peak, what = float(seq), "the cell state"
    gate = GATE_EXPONENT
    while peak >= 32767 * 2.0**gate:
        gate += 1
    if gate == GATE_EXPONENT:
        return gate, None
    return gate, f"{what} may reach {peak:.3g}, beyond int16 at 2^{GATE_EXPONENT}"


def _weights(layer: SourceLayer, cell: str, dirs: int, size: int, hidden: int):
    """W, R (ONNX order and layout, float64) and B ``[dirs, 2·G·H]`` or None."""
    g = _GATES[cell]
    get = layer.weights.get
    kernel, recurrent = get("kernel"), get("recurrent_kernel")
    if kernel is None or recurrent is None:
        raise ExportError(f"layer {layer.describe()}: no kernel / recurrent_kernel weights")
    kernel = as_float32(kernel, layer.name, "kernel").astype(np.float64)
    recurrent = as_float32(recurrent, layer.name, "recurrent_kernel").astype(np.float64)
    if kernel.shape != (dirs, size, g * hidden) or recurrent.shape != (dirs, hidden, g * hidden):
        raise ExportError(
            f"layer {layer.describe()}: kernel {list(kernel.shape)} / recurrent_kernel "
            f"{list(recurrent.shape)}, expected {[dirs, size, g * hidden]} / "
            f"{[dirs, hidden, g * hidden]} for input size {size} and {hidden} units"
        )
    w = keras_to_onnx_gates(kernel, cell, hidden).transpose(0, 2, 1)
    r = keras_to_onnx_gates(recurrent, cell, hidden).transpose(0, 2, 1)
    bias = get("bias")
    if bias is None:
        return w, r, None
    bias = as_float32(bias, layer.name, "bias").astype(np.float64)
    want = (dirs, 2, g * hidden) if cell == "GRU" else (dirs, g * hidden)
    if bias.shape != want:
        raise ExportError(
            f"layer {layer.describe()}: bias {list(bias.shape)}, expected {list(want)}"
        )
    bias = keras_to_onnx_gates(bias, cell, hidden)
    if cell == "GRU":  # reset_after: [input bias, recurrent bias] = ONNX [Wb, Rb]
        return w, r, bias.reshape(dirs, 2 * g * hidden)
    return w, r, np.concatenate([bias, np.zeros_like(bias)], axis=-1)


def _exponent(em: Emitter, values: np.ndarray, floor: int, what: str) -> int:
    try:
        e = auto_exponent(values, em.bits, name=what)
    except QuantError as err:
        raise ExportError(f"{what}: {err}") from None
    return max(e, floor)  # DL_RESCALE takes shifts up to 30


def lower_rnn(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Keras GRU / LSTM / Bidirectional(GRU or LSTM): the runtime's ``GRU`` / ``LSTM`` node
    (``ReverseSequence`` first for ``go_backwards``), its output reshaped to Keras' (module
    docstring)."""
    a = layer.attrs
    cell = str(a.get("cell", layer.kind))
    if "units" not in a:  # the adapter found nothing to translate; it says why
        em.refuse(layer, f"no ESP-DL v3 export for {layer.kind}: {a.get('reason')}")
        return
    why = _refusal(layer, cell)
    if why is not None:
        em.refuse(layer, why)
        return
    x = ins[0]
    shape = em.shapes[x]
    if len(shape) != 3 or shape[0] != 1:
        em.refuse(
            layer,
            f"{layer.kind} reading a tensor of shape {shape}: the ESP-DL v3 runtime's "
            f"{cell} reads a sequence [1, steps, features] (batch 1)",
        )
        return
    _, seq, size = shape
    hidden = int(a["units"])
    dirs = 2 if layer.kind == "Bidirectional" else 1
    w, r, b = _weights(layer, cell, dirs, size, hidden)
    name = layer.name
    x_lo, x_hi = em.range_of(x)
    gate, raised = _gate_exponent(w, r, b, max(abs(x_lo), abs(x_hi)), cell, seq)
    if raised:
        em.notes.append(f"layer {name!r}: gate exponent raised to {gate}: {raised}")
    # Y and Y_h: |h| < 1, so 1 - bits saturates only |h| > 1 - 2^(1-bits) (one step)
    cap = 1 - em.bits
    if a.get("return_sequences"):
        fallback = (cap, "the bound |h| < 1")
        e_h, src, rng = em.out_exp(layer, fallback)
        if e_h > cap:
            e_h, src = cap, f"{src}, capped at the bound |h| < 1"
    else:
        e_h, rng = cap, None
        src = "the bound |h| < 1 (the calibrated output is the last step's h only)"
    e_x = em.exps[x]
    e_w = _exponent(em, w, gate - _MAX_SHIFT - e_x, f"layer {name!r} kernel")
    e_r = _exponent(em, r, gate - _MAX_SHIFT - e_h, f"layer {name!r} recurrent_kernel")
    if a.get("go_backwards"):
        lens = em.shape_init(f"{name}/sequence_lens", [seq])
        rev = f"{name}/reverse"
        em.node(rev, "ReverseSequence", [x, lens], [rev], {"batch_axis": 0, "time_axis": 1})
        em.tensor(rev, e_x, f"the input's ({x!r})", shape, em.ranges.get(x))
        x = rev
    inputs = [
        x,
        em.init(f"{name}/W", em.quantize(w, e_w), e_w),
        em.init(f"{name}/R", em.quantize(r, e_r), e_r),
    ]
    if b is not None:
        inputs.append(em.init(f"{name}/B", em.quantize(b, gate, np.int16), gate))
    y, y_h = f"{name}/Y", f"{name}/Y_h"
    outputs = [y, y_h]
    em.tensor(y, e_h, src, [seq, dirs, 1, hidden], rng)
    em.tensor(y_h, e_h, src, [dirs, 1, hidden], rng)
    attrs = {
        "hidden_size": hidden,
        "direction": "bidirectional" if dirs == 2 else "forward",
        "layout": 1,
        "gate_exponent": gate,
    }
    if cell == "GRU":
        attrs["linear_before_reset"] = 1
    else:
        y_c = f"{name}/Y_c"
        em.tensor(y_c, gate, "the gate exponent (the module asserts it)", [dirs, 1, hidden],
                  elem=5)  # fmt: skip
        outputs.append(y_c)
    em.node(name, cell, inputs, outputs, attrs)
    if a.get("return_sequences"):
        source, dims = y, [1, seq, dirs * hidden]
    else:
        source, dims = y_h, [1, dirs * hidden]
    const = em.shape_init(f"{name}/shape", dims)
    em.node(f"{name}/reshape", "Reshape", [source, const], [name])
    em.tensor(name, e_h, src, dims, rng)
    em.output(layer, name)
