"""What the Reduce modules share: ``dl_module_reduce_base.hpp``'s axes, shape and loop order.

``ReduceBase::get_attributes`` reads the axes from the node's second input only (esp-ppq's
exporter turns an ``axes`` attribute into that input); none or an empty one reduces every axis,
unless ``noop_with_empty_axes``. ``forward_template`` merges neighbouring axes that are both
reduced or both kept and handles at most four merged axes; each output element is one call of
the module's ``reduce`` over its reduced elements in C order (the order a float sum follows).
When every axis is reduced and ``keepdims`` is 0 the output shape is ``[1]``.

Example:
    >>> rows, shape = grouped(np.arange(6).reshape(2, 3), (1,), keepdims=True)
    >>> rows.tolist(), shape
    ([[0, 1, 2], [3, 4, 5]], (2, 1))
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input

__all__ = [
    "element_type",
    "fold",
    "grouped",
    "pin_finite",
    "reduce_axes",
    "rows_of",
    "scale",
]

_INT = {"S8": np.dtype(np.int8), "S16": np.dtype(np.int16)}


def element_type(ctx: Context, node: Node, x: np.ndarray) -> np.dtype:
    """float32, int8 or int16: the module's path (``quant_type``), checked against the input.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> element_type(ctx, Node("n", "ReduceMax", ["x"], ["y"], {"quant_type": "F32"}),
        ...              np.float32([1.0])).name
        'float32'
    """
    quant = node.attributes.get("quant_type", "S8")
    if quant == "F32":
        if x.dtype.kind != "f":
            raise ctx.refuse(node, f"quant_type F32 but the input holds {x.dtype}")
        return np.dtype(np.float32)
    if quant not in _INT:
        raise ctx.refuse(node, f"quant_type {quant!r} is not simulated (S8, S16 and F32 are)")
    if x.dtype.kind == "f":
        raise ctx.refuse(node, f"quant_type {quant} but the input holds float32")
    return _INT[quant]


def reduce_axes(ctx: Context, node: Node, x: np.ndarray) -> tuple[int, ...]:
    """The reduced axes as the runtime takes them, sorted; refuses what it cannot compute.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> m = EspdlModel([], {"a": Tensor("a", np.int64([-1, 0]), [0])})
        >>> reduce_axes(Context(m, "c"), Node("n", "ReduceSum", ["x", "a"], ["y"]),
        ...             np.zeros((2, 3, 4)))
        (0, 2)
    """
    rank = x.ndim
    axes = ints_input(ctx, node, 1)
    if not axes:
        attribute = node.attributes.get("axes")
        if attribute and sorted({int(a) % rank for a in attribute}) != list(range(rank)):
            # ReduceBase::get_attributes never reads the attribute: the chip reduces every axis
            raise ctx.refuse(
                node,
                f"axes {list(attribute)} given as an attribute: the runtime reads axes from the "
                "second input only and would reduce every axis",
            )
        if node.attributes.get("noop_with_empty_axes", 0):
            # no axis flagged: forward_template reduces the whole input into output[0] only,
            # leaving the rest of the output buffer as it was
            raise ctx.refuse(
                node, "noop_with_empty_axes with no axes: the runtime writes only output[0]"
            )
        return tuple(range(rank))
    for a in axes:
        if not -rank <= a < rank:
            raise ctx.refuse(node, f"axis {a} is out of range for rank {rank}")
    flags = [i in {a % rank for a in axes} for i in range(rank)]
    merged = [f for i, f in enumerate(flags) if i == 0 or f != flags[i - 1]]
    if len(merged) > 4:
        raise ctx.refuse(
            node,
            f"axes {axes} of a rank-{rank} input alternate into {len(merged)} groups: the "
            "runtime's forward_template computes up to 4 (it leaves the output unwritten)",
        )
    return tuple(i for i in range(rank) if flags[i])


def grouped(
    x: np.ndarray, axes: tuple[int, ...], keepdims: bool
) -> tuple[np.ndarray, tuple[int, ...]]:
    """``(rows, out_shape)``: one row per output element (C order), its reduced elements in the
    runtime's order (C order over the reduced axes), and the output shape.

    Example:
        >>> rows, shape = grouped(np.arange(8).reshape(2, 2, 2), (0, 2), keepdims=False)
        >>> rows.tolist(), shape
        ([[0, 1, 4, 5], [2, 3, 6, 7]], (2,))
    """
    kept = [i for i in range(x.ndim) if i not in axes]
    moved = np.transpose(x, kept + list(axes))
    outer = int(np.prod([x.shape[i] for i in kept]))
    rows = moved.reshape(outer, -1)
    if keepdims:
        shape = tuple(1 if i in axes else x.shape[i] for i in range(x.ndim))
    else:
        shape = tuple(x.shape[i] for i in kept) or (1,)  # ReduceBase: all reduced gives [1]
    return rows, shape


def rows_of(ctx: Context, node: Node, x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """:func:`grouped` with the node's axes (:func:`reduce_axes`) and ``keepdims`` (default 1)."""
    axes = reduce_axes(ctx, node, x)
    return grouped(x, axes, bool(node.attributes.get("keepdims", 1)))


def fold(
    rows: np.ndarray,
    step: Callable[[np.ndarray, np.ndarray], np.ndarray],
    start: float,
    dtype: type = np.float32,
) -> np.ndarray:
    """``ReduceBase::reduce``'s loop: ``acc = step(acc, element)`` over each row in order, the
    accumulator of type ``dtype`` (float32, or float64 for a ``double``), from ``start``.

    Example:
        >>> fold(np.float32([[1e8, 1.0, -1e8]]), lambda a, v: a + v, 0.0).tolist()
        [0.0]
    """
    acc = np.full(rows.shape[0], start, dtype)
    for j in range(rows.shape[1]):
        acc = step(acc, rows[:, j]).astype(dtype, copy=False)
    return acc


def pin_finite(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float result clipped to ``dtype``'s range before ``tool::round`` (the same integers as
    rounding then ``tool::truncate``), ±inf to the ends and NaN to the top, as RISC-V's
    ``fcvt.w.s`` converts it (a log of 0 is -inf).

    Example:
        >>> pin_finite(np.float32([-np.inf, np.nan, 3.25]), np.dtype(np.int8)).tolist()
        [-128.0, 127.0, 3.25]
    """
    info = np.iinfo(dtype)
    value = np.where(np.isnan(value), info.max, value)
    return np.clip(value, info.min, info.max).astype(value.dtype)


def scale(exponent: int) -> np.float32:
    """``DL_SCALE(exponent)`` = 2^exponent as the float the runtime multiplies by (``DL_RESCALE(e)``
    is ``scale(-e)``).

    Example:
        >>> float(scale(-3)), float(scale(2))
        (0.125, 4.0)
    """
    return np.float32(2.0**exponent)
