"""Div: ``dl_module_div.hpp``, ``dl_base_div.cpp`` (the C kernels run on every target).

The element-wise ops share ``get_elemwise_operation_args`` (``dl_base_elemwise.cpp``): it
merges the broadcast shapes into at most 4 dimensions and runs one kernel on each innermost
row (``d0``); the kernel is chosen from the merged rows' lengths, which :func:`elemwise_rows`
gives. The merged loops broadcast as numpy does (checked on every shape pair of rank <= 5
with sizes 1..3), so the values here are broadcast by numpy and only the kernel choice
follows the merge.

Integer Div, with ``rescale = 2^(e0 - e1 - e_out)`` (a float32 power of two, exact):

- ``n_n`` and ``1_n``: ``(a * rescale) / b`` in float32;
- ``n_1`` (``b`` one value per row): ``a * (rescale / b)``, two float32 roundings;
- ``a == 0`` gives 0, else ``b == 0`` gives the type's maximum (``a > 0``) or minimum;
- int8 with one input of a single value builds a 256-entry table once (``create_div_lut``):
  ``round(i * (rescale / b))`` with 0 at ``i = 0``, or ``round((a * rescale) / i)`` with, at
  ``i = 0``, 127 when ``a * rescale > 0`` and -128 otherwise (``a = 0`` too);
- each quotient goes through ``tool::round`` and saturates.

float32: ``a / b``, ``a * (1.0 / b)`` for ``n_1``.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, elemwise_rows
from amct_bridge.espdl.v3.ops.lut import is_float, round_saturate

OP_TYPES = ("Div",)


def _kernel(ctx: Context, node: Node, a: np.ndarray, b: np.ndarray, integer: bool) -> str:
    """The kernel ``elemwise_div`` picks: n_n, n_1, 1_n, lut_n_1 or lut_1_n."""
    d0_a, d0_b, _, dims = elemwise_rows(a.shape, b.shape)
    if dims > 4:
        raise ctx.refuse(
            node,
            f"shapes {a.shape} and {b.shape} merge into {dims} dimensions "
            "(the element-wise kernels run 4 at most)",
        )
    if integer and a.dtype == np.int8:
        # create_div_lut: a table when one input holds a single value (int8 only)
        table = a.size == 1 or b.size == 1
        if d0_a == 1:
            return "lut_1_n" if table else "1_n"
        if d0_b == 1:
            return "lut_n_1" if table else "n_1"
        return "n_n"
    if d0_b == 1:  # int16 and float32 test input1 first
        return "n_1"
    return "1_n" if d0_a == 1 else "n_n"


def _int8_table(kernel: str, a0: int, b0: int, rescale: np.float32, half_even: bool):
    """create_div_lut's 256 entries, indexed by the other input + 128."""
    i = np.arange(-128, 128, dtype=np.int64)
    f = np.float32(i)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if kernel == "lut_n_1":
            scale = np.float32(rescale / np.float32(b0))
            table = round_saturate(f * scale, np.dtype(np.int8), half_even)
            table[128] = 0
        else:
            a_float = np.float32(np.float32(a0) * rescale)
            table = round_saturate(a_float / f, np.dtype(np.int8), half_even)
            table[128] = 127 if a_float > 0 else -128
    return table


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Div as ``dl_base_div.cpp`` computes it (see the module docstring).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("a", [4], 5, [-2]),
        ...                                ValueInfo("b", [4], 5, [-2])],
        ...                value_info=[ValueInfo("y", [4], 5, [-1])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["a"] = np.array([5, -5, 0, 7], np.int16)
        >>> ctx.values["b"] = np.array([4, 4, 0, 0], np.int16)
        >>> compute(ctx, Node("d", "Div", ["a", "b"], ["y"], {"quant_type": "S16"}))[0].tolist()
        [3, -2, 0, 32767]
    """
    a = ctx.value(node.inputs[0], node)
    b = ctx.value(node.inputs[1], node)
    if is_float(node):
        kernel = _kernel(ctx, node, a, b, False)
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            if kernel == "n_1":  # rescale = 1.0 / b: a double division, stored as float
                return [a32 * (1.0 / b.astype(np.float64)).astype(np.float32)]
            return [a32 / b32]
    dtype = ctx.out_dtype(node)
    e0, e1 = ctx.exponent(node.inputs[0], node), ctx.exponent(node.inputs[1], node)
    rescale = np.float32(2.0 ** (e0 - e1 - ctx.exponent(node.outputs[0], node)))
    kernel = _kernel(ctx, node, a, b, True)
    if kernel == "lut_n_1":
        table = _int8_table(kernel, 0, int(b.reshape(-1)[0]), rescale, ctx.half_even)
        index = np.broadcast_arrays(a, b)[0].astype(np.int64) + 128
        return [table[index]]
    if kernel == "lut_1_n":
        table = _int8_table(kernel, int(a.reshape(-1)[0]), 0, rescale, ctx.half_even)
        index = np.broadcast_arrays(a, b)[1].astype(np.int64) + 128
        return [table[index]]
    a_b, b_b = np.broadcast_arrays(a.astype(np.int64), b.astype(np.int64))
    fa, fb = a_b.astype(np.float32), b_b.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if kernel == "n_1":
            q = fa * (rescale / fb).astype(np.float32)
        else:
            q = (fa * rescale).astype(np.float32) / fb
    out = round_saturate(q, dtype, ctx.half_even)
    info = np.iinfo(dtype)
    out = np.where(b_b == 0, np.where(a_b > 0, info.max, info.min), out)
    return [np.where(a_b == 0, 0, out).astype(dtype)]
