"""Lookup tables and float activations: ``dl_module_lut.hpp``, ``dl_base_lut.cpp`` and the
activation modules (``dl_module_sigmoid.hpp``, ``_tanh``, ``_swish``, ``_hard_sigmoid``,
``_hard_swish``, ``_leaky_relu``, ``_gelu``, ``_elu``).

Every activation module's ``deserialize()`` builds a ``LUT`` module instead of itself when the
node is int8 and carries a table (attribute ``lut``); an int16 node keeps its own module and its
table is never read, even when esp-ppq wrote one (only the op type ``LUT`` reads an int16 table).
The helpers here (:func:`node_table`, :func:`round_saturate`, :func:`float_unary`) are shared
with the other element-wise modules (Exp, Log, Sqrt, Relu, PRelu, Pow, Mod, Div).

Example:
    >>> round_saturate(np.float32([2.5, 200.0, -np.inf]), np.dtype(np.int8), False).tolist()
    [3, 127, -128]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate, shift_round, sigmoid

__all__ = [
    "OP_TYPES",
    "compute",
    "float_unary",
    "is_float",
    "node_table",
    "round_saturate",
    "table_lookup",
]

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

#: ``tool::round`` returns an int: a float beyond it converts to INT_MAX / INT_MIN (RISC-V
#: ``fcvt.w.s`` and Xtensa ``trunc.s`` saturate; NaN gives INT_MAX on RISC-V).
_INT_LIMIT = np.float32(2.0**31)


def is_float(node: Node) -> bool:
    """True when the node runs in float32 (``quant_type`` F32).

    Example:
        >>> is_float(Node("n", "Log", ["x"], ["y"], {"quant_type": "F32"}))
        True
    """
    return node.attributes.get("quant_type") == "F32"


def node_table(ctx: Context, node: Node) -> np.ndarray | None:
    """The table the runtime looks values up in for this node, or None when it computes.

    An op type ``LUT`` always reads its table (attribute ``lut``, else its second input); any
    other op reads it only in int8 (each module's ``deserialize()``: ``QUANT_TYPE_SYMM_8BIT``
    and ``get_operation_lut``).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> t = Tensor("t", np.arange(256).astype(np.int8), [-4])
        >>> ctx = Context(EspdlModel([], {"t": t}), "c")
        >>> node_table(ctx, Node("r", "Relu", ["x"], ["y"], {"lut": "t", "quant_type": "S8"}))[:3]
        array([0, 1, 2], dtype=int8)
        >>> node_table(ctx, Node("r", "Relu", ["x"], ["y"], {"lut": "t", "quant_type": "S16"}))
    """
    name = node.attributes.get("lut")
    if node.op_type == "LUT":
        if not name and len(node.inputs) > 1:
            name = node.inputs[1]
    elif node.attributes.get("quant_type", "S8") != "S8":
        return None
    if not name:
        return None
    return ctx.initializer(name, node).data.reshape(-1)


def table_lookup(ctx: Context, node: Node, table: np.ndarray) -> np.ndarray:
    """``table[x + 128]`` (int8), or the int16 table's nearest step (``dl_base_lut.cpp``).

    An int16 table of ``65536 / step + 1`` entries is indexed by ``x + 32768`` rounded to the
    nearest step: half up, or half to even on esp32p4 (``lut_index``).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> ctx.values["x"] = np.array([-128, 0, 127], np.int8)
        >>> t = np.arange(256).astype(np.int16)
        >>> table_lookup(ctx, Node("n", "LUT", ["x"], ["y"]), t).tolist()
        [0, 128, 255]
    """
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


def round_saturate(q: np.ndarray, dtype: np.dtype, half_even: bool) -> np.ndarray:
    """``tool::truncate(out, tool::round(q))`` of float32 values, infinities and NaN included.

    ``tool::round`` (``dl_tool.cpp``) is ``rne`` on esp32p4 and ``floorf(q + 0.5)`` elsewhere;
    its int result saturates at ±2^31 (so ±inf give the type's bounds) and a NaN converts to
    INT_MAX as RISC-V's ``fcvt.w.s`` does (Xtensa's is not documented here).

    Example:
        >>> q = np.float32([0.5, 1.5, -2.5, np.nan, 1e20])
        >>> round_saturate(q, np.dtype(np.int16), True).tolist()
        [0, 2, -2, 32767, 32767]
        >>> round_saturate(q, np.dtype(np.int16), False).tolist()
        [1, 2, -2, 32767, 32767]
    """
    q = np.asarray(q, np.float32)
    with np.errstate(invalid="ignore"):
        q = np.where(np.isnan(q), _INT_LIMIT, np.clip(q, -_INT_LIMIT, _INT_LIMIT))
    return saturate(round_float(q.astype(np.float32), half_even), dtype)


def unary(ctx: Context, node: Node, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """What Exp, Log and Sqrt modules do alike: a float32 node ``fn(x)``; an int8 node with a
    ``lut`` its table; else :func:`float_unary` (``fn`` gets and returns float32 arrays).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("x", [2], 1, [])])
        >>> ctx = Context(m, "c"); ctx.values["x"] = np.float32([4.0, 9.0])
        >>> unary(ctx, Node("n", "Sqrt", ["x"], ["y"], {"quant_type": "F32"}), np.sqrt).tolist()
        [2.0, 3.0]
    """
    if is_float(node):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return fn(ctx.value(node.inputs[0], node).astype(np.float32))
    table = node_table(ctx, node)
    if table is not None:
        return table_lookup(ctx, node, table)
    return float_unary(ctx, node, fn)


def float_unary(ctx: Context, node: Node, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The modules' integer forward in float32: ``round(fn(x · 2^e_in) · 2^-e_out)``.

    As ``dl_module_exp.hpp`` / ``_log`` / ``_sqrt`` / ``_sigmoid`` compute it:
    ``temp = x * DL_SCALE(e_in)``, ``fn(temp)``, ``truncate(round(temp * DL_RESCALE(e_out)))``,
    every step in float32. ``fn`` gets and returns float32 arrays.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("x", [2], 3, [-2])],
        ...                value_info=[ValueInfo("y", [2], 3, [-4])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["x"] = np.array([4, 9], np.int8)  # 1.0 and 2.25
        >>> n = Node("n", "Sqrt", ["x"], ["y"], {"quant_type": "S8"})
        >>> float_unary(ctx, n, np.sqrt).tolist()  # 1.0 * 16, 1.5 * 16
        [16, 24]
    """
    x = ctx.value(node.inputs[0], node)
    in_scale = np.float32(2.0 ** ctx.exponent(node.inputs[0], node))
    out_scale = np.float32(2.0 ** -ctx.exponent(node.outputs[0], node))
    temp = x.astype(np.float32) * in_scale
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scaled = fn(temp).astype(np.float32) * out_scale
    return round_saturate(scaled, ctx.out_dtype(node), ctx.half_even)


def _hard_swish(t: np.ndarray) -> np.ndarray:
    # dl_module_hard_swish.hpp: the 0.166667 and 0.5 literals make it a double expression
    t64 = t.astype(np.float64)
    return (np.maximum(0.0, np.minimum(1.0, 0.166667 * t64 + 0.5)) * t64).astype(np.float32)


def _float_function(ctx: Context, node: Node) -> Callable[[np.ndarray], np.ndarray] | None:
    op = node.op_type
    f32 = np.float32
    if op == "Sigmoid":
        return sigmoid
    if op == "Tanh":
        return lambda t: f32(2) * sigmoid(f32(2) * t) - f32(1)
    if op == "Swish":
        return lambda t: sigmoid(t) * t
    if op == "HardSwish":
        return _hard_swish
    if op == "HardSigmoid":
        alpha = f32(node.attributes.get("alpha", 0.2))
        beta = f32(node.attributes.get("beta", 0.5))
        return lambda t: np.maximum(f32(0), np.minimum(f32(1), alpha * t + beta))
    return None


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """An activation: its table when the runtime reads one, else its float32 forward.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> t = Tensor("t", (np.arange(256) - 128).clip(0, None).astype(np.int8), [-3])
        >>> ctx = Context(EspdlModel([], {"t": t}), "c")
        >>> ctx.values["x"] = np.array([-5, 0, 7], np.int8)
        >>> compute(ctx, Node("n", "Sigmoid", ["x"], ["y"], {"lut": "t"}))[0].tolist()
        [0, 0, 7]
    """
    # int8 models carry a 256-entry table (attribute 'lut', dl_module_lut.hpp); without one the
    # module computes in float32: temp = x * 2^e_in, f(temp), round(f * 2^-e_out)
    table = node_table(ctx, node)
    if table is not None:
        return [table_lookup(ctx, node, table)]
    if node.op_type == "LeakyRelu":
        # dl_module_leaky_relu.hpp: round(temp * out_scale) or round(temp * out_scale * alpha)
        x = ctx.value(node.inputs[0], node)
        in_scale = np.float32(2.0 ** ctx.exponent(node.inputs[0], node))
        out_scale = np.float32(2.0 ** -ctx.exponent(node.outputs[0], node))
        temp = x.astype(np.float32) * in_scale
        alpha = np.float32(node.attributes.get("alpha", 0.01))
        scaled = temp * out_scale
        scaled = np.where(temp >= 0, scaled, scaled * alpha)
        return [round_saturate(scaled, ctx.out_dtype(node), ctx.half_even)]
    fn = _float_function(ctx, node)
    if fn is None:
        raise ctx.refuse(node, "only the lookup-table form (attribute 'lut') is simulated")
    return [float_unary(ctx, node, fn)]
