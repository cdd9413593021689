"""Lookup tables and float activations: ``dl_module_lut.hpp``, ``dl_base_lut.cpp`` and the
activation modules (``dl_module_sigmoid.hpp``, ``_tanh``, ``_swish``, ``_hard_sigmoid``,
``_hard_swish``, ``_leaky_relu``, ``_gelu``, ``_elu``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate, shift_round

OP_TYPES = (
    "Sigmoid",
    "Tanh",
    "Swish",
    "HardSigmoid",
    "HardSwish",
    "LeakyRelu",
    "Gelu",
    "Elu",
    "LUT",
)


def table_lookup(ctx: Context, node: Node, table: np.ndarray) -> np.ndarray:
    x = ctx.value(node.inputs[0], node)
    if x.dtype == np.int8 or table.size == 256:
        return table[x.astype(np.int64) + 128]
    # int16 table of 65536 / step + 1 entries, index rounded to the nearest step
    step = 65536 // (table.size - 1)
    shift = step.bit_length() - 1
    index = x.astype(np.int64) + 32768
    if shift:
        index = shift_round(index, shift, ctx.half_even)
    return table[index]


def _sigmoid(t: np.ndarray) -> np.ndarray:
    # dl_math.hpp: 1.0 / (1.0 + expf(-x)), expf in float, the division in double
    return (1.0 / (1.0 + np.exp(-t).astype(np.float64))).astype(np.float32)


def _hard_swish(t: np.ndarray) -> np.ndarray:
    # dl_module_hard_swish.hpp: the 0.166667 and 0.5 literals make it a double expression
    t64 = t.astype(np.float64)
    return (np.maximum(0.0, np.minimum(1.0, 0.166667 * t64 + 0.5)) * t64).astype(np.float32)


def _float_function(ctx: Context, node: Node) -> Callable[[np.ndarray], np.ndarray] | None:
    op = node.op_type
    f32 = np.float32
    if op == "Sigmoid":
        return _sigmoid
    if op == "Tanh":
        return lambda t: f32(2) * _sigmoid(f32(2) * t) - f32(1)
    if op == "Swish":
        return lambda t: _sigmoid(t) * t
    if op == "HardSwish":
        return _hard_swish
    if op == "HardSigmoid":
        alpha = f32(node.attributes.get("alpha", 0.2))
        beta = f32(node.attributes.get("beta", 0.5))
        return lambda t: np.maximum(f32(0), np.minimum(f32(1), alpha * t + beta))
    return None


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    # int8 models carry a 256-entry table (attribute 'lut', dl_module_lut.hpp); without one the
    # module computes in float32: temp = x * 2^e_in, f(temp), round(f * 2^-e_out)
    table_name = node.attributes.get("lut")
    if node.op_type == "LUT" and not table_name and len(node.inputs) > 1:
        table_name = node.inputs[1]
    if table_name:
        return [table_lookup(ctx, node, ctx.initializer(table_name, node).data.reshape(-1))]
    x = ctx.value(node.inputs[0], node)
    in_scale = np.float32(2.0 ** ctx.exponent(node.inputs[0], node))
    out_scale = np.float32(2.0 ** -ctx.exponent(node.outputs[0], node))
    temp = x.astype(np.float32) * in_scale
    if node.op_type == "LeakyRelu":
        # dl_module_leaky_relu.hpp: round(temp * out_scale) or round(temp * out_scale * alpha)
        alpha = np.float32(node.attributes.get("alpha", 0.01))
        scaled = temp * out_scale
        scaled = np.where(temp >= 0, scaled, scaled * alpha)
    else:
        fn = _float_function(ctx, node)
        if fn is None:
            raise ctx.refuse(node, "only the lookup-table form (attribute 'lut') is simulated")
        scaled = fn(temp) * out_scale
    return [saturate(round_float(scaled, ctx.half_even), ctx.out_dtype(node))]
