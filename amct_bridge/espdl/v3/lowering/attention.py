"""Lowerings of attention: a matrix product of two activations (``keras.ops.matmul(q, k)``,
attention's scores and context) and Keras ``MultiHeadAttention``.

``MatMul`` is the runtime's batched module (dl_module_matmul.hpp), B an activation stored
row-major (``input1_layout`` ``native_kn``, as esp-ppq writes it), the output through the conv
output stage: ``sat(round_shift(Σ a·b, e_out − e_a − e_b))``.

``MultiHeadAttention`` (:func:`lower_attention`) becomes, with Keras' sublayer names:
``<name>/query``, ``<name>/key``, ``<name>/value`` ``Gemm`` projections of the query, key and
value inputs ``[1, T, D]`` (constant weights ``(D, heads·dim)``; the query's carry Keras'
``1/sqrt(key_dim)``, a linear factor folded into them), each ``Reshape`` d to
``[1, T, heads, dim]`` and ``Transpose`` d per head (the key to ``[1, heads, dim, S]``), the
scores ``MatMul`` ``[1, heads, T, S]``, ``Softmax`` over S (float32) and a ``QuantizeLinear``,
the context ``MatMul`` ``[1, heads, T, dim]``, transposed back and reshaped to
``[1, T, heads·dim]``, and the ``<name>/attention_output`` ``Gemm`` whose output is the layer's.

The calibration observes the layer's input and output only; the ranges of the tensors inside
(the scaled query, key, value, scores, probabilities, context) come from
``layer.attrs["ranges"]`` (the Keras adapter measures them on ``calibration_data`` by running
the layer's sublayers), else from bounds: the projections' interval bounds over the
calibrated input range, ``|q|·|k|·dim`` for the scores, ``[0, 1]`` for the probabilities and
the value's range for the context (a convex combination of value rows), with a note.

Example:
    >>> matmul_shape([1, 4, 6, 8], [1, 4, 8, 6]), matmul_shape([1, 6, 8], [8, 3])
    ([1, 4, 6, 6], [1, 6, 3])
"""

from __future__ import annotations

import math

import numpy as np

from amct_bridge.errors import ExportError, QuantError
from amct_bridge.espdl.checks import as_float32
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.exponents import bias_bits, interval_bound, keep_mac_shift
from amct_bridge.espdl.v3.lowering.emitter import Emitter
from amct_bridge.espdl.v3.model import filter_file_order
from amct_bridge.quant.espdl import auto_exponent

__all__ = ["ATTENTION_RANGES", "lower_attention", "lower_matmul", "matmul_shape"]

#: The tensors inside a MultiHeadAttention whose ranges ``attrs["ranges"]`` may give.
ATTENTION_RANGES = ("query", "key", "value", "scores", "probs", "context")


def matmul_shape(a: list[int], b: list[int]) -> list[int] | None:
    """``np.matmul``'s output shape for operands of rank 2 to 4, or None when they do not
    chain or their batch dimensions do not broadcast."""
    if not (2 <= len(a) <= 4 and 2 <= len(b) <= 4) or a[-1] != b[-2]:
        return None
    try:
        batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    except ValueError:
        return None
    return [*batch, a[-2], b[-1]]


def lower_matmul(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``keras.ops.matmul`` of two activations: ``MatMul`` (B ``native_kn``)."""
    if len(ins) != 2:
        em.refuse(
            layer,
            f"{layer.kind} of {len(ins)} activation(s): the ESP-DL v3 MatMul is exported for "
            "two activations (a product with a constant is a Dense layer)",
        )
        return
    a, b = ins
    shape = matmul_shape(em.shapes[a], em.shapes[b])
    if shape is None:
        em.refuse(
            layer,
            f"{layer.kind} of shapes {em.shapes[a]} and {em.shapes[b]}: the ESP-DL v3 MatMul "
            "takes operands of rank 2 to 4 whose batch dimensions broadcast",
        )
        return
    inner = em.shapes[a][-1]
    reach = max(map(abs, em.range_of(a))) * max(map(abs, em.range_of(b))) * inner
    fallback = (em.range_exp(-reach, reach, layer.name), "bound of the product's sum")
    e_out, src, rng = em.out_exp(layer, fallback)
    _matmul(em, layer.name, a, b, shape, e_out, src, rng)
    em.output(layer, layer.name)


def _matmul(em: Emitter, name: str, a: str, b: str, shape, e_out: int, src: str, rng) -> str:
    """A ``MatMul`` node ``name`` of activations ``a`` and ``b`` (B ``native_kn``), its output
    at ``e_out`` raised where ``mac_shift`` would be negative."""
    e_a, e_b = em.exps[a], em.exps[b]
    e_out, raised = keep_mac_shift(e_a, e_b, e_out)
    if raised:
        src += f"; raised to {e_out} for mac_shift >= 0 (e_a {e_a} + e_b {e_b})"
    attrs = {"activation": "Linear", "input1_layout": "native_kn"}
    em.node(name, "MatMul", [a, b], [name], attrs)
    return em.tensor(name, e_out, src, shape, rng)


def _gemm(em: Emitter, name: str, x: str, kernel, bias, e_out: int, src: str, rng, out=None):
    """A ``Gemm`` node ``name``: ``x [..., C]`` times the constant ``kernel (C, N)`` (+ bias),
    filter and bias as a Dense layer's (per-tensor weight exponent, bias at ``e_in + e_w``
    within the target's bias width), the output ``out`` (default ``name``) at ``e_out``
    (raised for mac_shift >= 0)."""
    e_in = em.exps[x]
    try:
        e_w = auto_exponent(kernel, em.bits, name=f"{name} kernel")
    except QuantError as err:
        raise ExportError(f"{name}: {err}") from None
    limit = 2 ** (bias_bits(em.target, em.bits) - 1) - 1
    if bias is not None:
        peak = float(np.abs(bias).max(initial=0.0))
        while peak * 2.0 ** -(e_in + e_w) > limit:  # keep the bias inside its lanes
            e_w += 1
            em.notes.append(f"{name!r}: kernel exponent raised to {e_w} so the bias fits")
    e_out, raised = keep_mac_shift(e_in, e_w, e_out)
    if raised:
        src += f"; raised to {e_out} for mac_shift >= 0 (e_in {e_in} + e_w {e_w})"
    n = kernel.shape[1]
    wq = em.quantize(kernel.T.reshape(n, 1, 1, -1), e_w)  # [N, 1, 1, C], as a Dense's
    stored, note = filter_file_order(wq, 1, em.target)
    inputs = [x, em.init(f"{name}/filter", stored, e_w, note)]
    if bias is not None:
        bdt = np.int32 if em.bits == 8 else np.int64
        bq = np.clip(em.quantize(bias, e_in + e_w, bdt), -limit - 1, limit).astype(bdt)
        inputs.append(em.init(f"{name}/bias", bq, e_in + e_w))
    attrs = {"activation": "Linear", "alpha": 1.0, "beta": 1.0, "transB": 0}
    out = out or name
    em.node(name, "Gemm", inputs, [out], attrs)
    return em.tensor(out, e_out, src, [*em.shapes[x][:-1], n], rng)


def _transpose(em: Emitter, x: str, out: str, perm: list[int]) -> str:
    em.node(out, "Transpose", [x], [out], {"perm": perm})
    shape = [em.shapes[x][p] for p in perm]
    return em.tensor(out, em.exps[x], f"the input's ({x!r})", shape, em.ranges.get(x))


def _attention_refusal(layer: SourceLayer, shapes: list[list[int]]) -> str | None:
    """Why the runtime cannot compute this MultiHeadAttention (in v3 terms), or None."""
    a = layer.attrs
    if a.get("masked"):
        return (
            f"MultiHeadAttention with {a['masked']}: the ESP-DL v3 runtime's Softmax takes no "
            "mask (export the attention without it, or mask on the host)"
        )
    if a.get("use_gate"):
        return (
            "MultiHeadAttention with use_gate: its sigmoid gate is not translated by the "
            "ESP-DL v3 exporter (use_gate=False)"
        )
    if any(len(s) != 3 or s[0] != 1 for s in shapes):
        return (
            f"MultiHeadAttention on inputs of shapes {shapes}: exported for sequences "
            "[1, tokens, features] (batch 1), whose Gemm / MatMul / Softmax the runtime runs"
        )
    out_kernel = layer.weights.get("output_kernel")
    if out_kernel is not None and np.ndim(out_kernel) != 3:
        return (
            f"MultiHeadAttention with output_shape {list(np.shape(out_kernel)[2:])}: exported "
            "for a feature output (output_shape None or an int), one Gemm over the heads"
        )
    if list(a.get("attention_axes") or [1]) != [1]:
        return (
            f"MultiHeadAttention over axes {a.get('attention_axes')}: exported for attention "
            "over the tokens (attention_axes None or (1,))"
        )
    return None


def _weights(layer: SourceLayer, part: str, dims: tuple[int, ...]):
    """Kernel ``(D, heads·dim)`` and bias (or None) of a projection, float64."""
    kernel = layer.weights.get(f"{part}_kernel")
    if kernel is None:
        raise ExportError(f"layer {layer.describe()}: no {part} kernel")
    kernel = as_float32(kernel, layer.name, f"{part} kernel").astype(np.float64)
    if tuple(kernel.shape[1:]) != dims and part != "output":
        raise ExportError(
            f"layer {layer.describe()}: {part} kernel {list(kernel.shape)}, expected "
            f"[D, {', '.join(map(str, dims))}]"
        )
    bias = layer.weights.get(f"{part}_bias")
    if bias is not None:
        bias = as_float32(bias, layer.name, f"{part} bias").astype(np.float64).reshape(-1)
    if part == "output":  # (heads, dim, out) -> (heads·dim, out)
        return kernel.reshape(-1, kernel.shape[-1]), bias
    return kernel.reshape(kernel.shape[0], -1), bias


def lower_attention(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Keras ``MultiHeadAttention``: projections, per-head scores, Softmax, context, output
    projection (module docstring); inputs ``[query]`` (self-attention), ``[query, value]`` or
    ``[query, value, key]``."""
    a = layer.attrs
    if "num_heads" not in a:  # the adapter found nothing to translate; it says why
        em.refuse(layer, f"no ESP-DL v3 export for {layer.kind}: {a.get('reason')}")
        return
    query = ins[0]  # a layer given only a query (other adapters) reads it as all three
    value = ins[1] if len(ins) > 1 else query
    key = ins[2] if len(ins) > 2 else value
    shapes = [em.shapes[t] for t in (query, value, key)]
    why = _attention_refusal(layer, shapes)
    if why is not None:
        em.refuse(layer, why)
        return
    heads, k_dim, v_dim = int(a["num_heads"]), int(a["key_dim"]), int(a["value_dim"])
    name = layer.name
    t_len, s_len = shapes[0][1], shapes[1][1]
    if shapes[2][1] != s_len:
        raise ExportError(f"layer {layer.describe()}: key and value of different lengths")
    wq, bq = _weights(layer, "query", (heads, k_dim))
    wk, bk = _weights(layer, "key", (heads, k_dim))
    wv, bv = _weights(layer, "value", (heads, v_dim))
    wo, bo = _weights(layer, "output", ())
    scale = 1.0 / math.sqrt(float(k_dim))  # Keras scales the projected query
    wq, bq = wq * scale, None if bq is None else bq * scale
    given = a.get("ranges") or {}
    bounds = []

    def rng(what: str, bound: tuple[float, float]) -> tuple[tuple[float, float], str]:
        if what in given:
            lo, hi = given[what]
            return (float(lo), float(hi)), "its range on calibration_data"
        if what == "probs":
            return bound, "the probabilities' range [0, 1]"
        bounds.append(what)
        return bound, "a bound from the calibrated input range"

    def projection(part: str, x: str, w, b, dim: int, perm: list[int]) -> str:
        lo, hi = em.range_of(x)
        r, src = rng(part, interval_bound(w.T, b, lo, hi))
        out = _gemm(em, f"{name}/{part}", x, w, b, em.range_exp(*r, name), src, r)
        split = em.reshape(out, f"{name}/{part}/heads", [1, em.shapes[x][1], heads, dim])
        return _transpose(em, split, f"{name}/{part}/transpose", perm)

    q = projection("query", query, wq, bq, k_dim, [0, 2, 1, 3])  # [1, heads, T, dim]
    k = projection("key", key, wk, bk, k_dim, [0, 2, 3, 1])  # [1, heads, dim, S]
    v = projection("value", value, wv, bv, v_dim, [0, 2, 1, 3])  # [1, heads, S, dim]
    peak = max(map(abs, em.range_of(q))) * max(map(abs, em.range_of(k))) * k_dim
    r, src = rng("scores", (-peak, peak))
    scores = _matmul(em, f"{name}/scores", q, k, [1, heads, t_len, s_len],
                     em.range_exp(*r, name), src, r)  # fmt: skip
    floats = f"{name}/softmax"
    em.node(floats, "Softmax", [scores], [floats], {"axis": 3})
    em.tensor(floats, 0, "float32 output (Softmax)", em.shapes[scores], (0.0, 1.0), elem=1)
    r, src = rng("probs", (0.0, 1.0))
    # p <= 1: 1 - bits saturates only p > 1 - 2^(1-bits), one step, at twice the resolution
    e_p = min(em.range_exp(*r, name), 1 - em.bits)
    probs = f"{name}/probs"
    em.node(probs, "QuantizeLinear", [floats], [probs])
    em.tensor(probs, e_p, src, em.shapes[scores], r)
    r, src = rng("context", em.range_of(v))
    context = _matmul(em, f"{name}/context", probs, v, [1, heads, t_len, v_dim],
                      em.range_exp(*r, name), src, r)  # fmt: skip
    merged = _transpose(em, context, f"{name}/context/transpose", [0, 2, 1, 3])
    merged = em.reshape(merged, f"{name}/context/merge", [1, t_len, heads * v_dim])
    lo, hi = em.range_of(merged)
    bound = interval_bound(wo.T, bo, lo, hi)
    fallback = (em.range_exp(*bound, name), "bound of the output projection")
    e_out, src, out_rng = em.out_exp(layer, fallback)
    # the output projection's tensor is the layer's output (named after the layer)
    _gemm(em, f"{name}/attention_output", merged, wo, bo, e_out, src, out_rng, out=name)
    if bounds:
        em.notes.append(
            f"layer {name!r} (MultiHeadAttention): the ranges of its {', '.join(bounds)} are "
            "bounds from the calibrated input range (the calibration observes the layer's input "
            "and output only); pass calibration_data to export_espdl to measure them"
        )
    em.output(layer, name)
