"""What Equal, Greater, GreaterOrEqual, Less and LessOrEqual share: integers compared as stored.

Runtime: ``dl_module_equal.hpp`` (and ``_greater``, ``_greater_or_equal``, ``_less``,
``_less_or_equal``), ``dl_base_equal.cpp`` (and the others), ``dl_base_elemwise.cpp`` for the
broadcast, ``isa/{tie728,esp32p4}/dl_*_s{8,16}_<op>.S``. Every kernel, C and assembly, compares
the stored int8 / int16 values of both inputs as they are (the assembly's comment: "input0 exp
= input1 exp = output exp"): there is no rescaling when the two exponents differ; esp-ppq aligns
them before export (``TYPES_FOR_ALIGNMENT['LogicalElementwise']``). The output is bool (one byte
each, 0 or 1), exponent 0. The broadcast is ONNX's multidirectional one, which the runtime runs
after merging the two shapes into at most 4 dimensions (``get_elemwise_operation_args``, which
asserts ``merged_dims <= 4``).

Example:
    >>> merged_dims([1, 4, 5, 1], [1, 4, 5, 16])
    2
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

__all__ = ["compare", "merged_dims"]


def merged_dims(shape0: list[int], shape1: list[int]) -> int:
    """How many dimensions ``get_elemwise_operation_args`` leaves after merging two shapes.

    Neighbouring dimensions merge while both inputs agree on them, or while one input is 1 on
    both (``dl_base_elemwise.cpp``); the runtime handles at most 4 merged dimensions.

    Example:
        >>> merged_dims([2, 3, 4, 5, 6], [2, 3, 4, 5, 6]), merged_dims([2, 1, 3], [1, 4, 1])
        (1, 3)
    """
    dims = max(len(shape0), len(shape1))
    a = [1] * (dims - len(shape0)) + [int(d) for d in shape0]
    b = [1] * (dims - len(shape1)) + [int(d) for d in shape1]
    merged = dims
    for i in range(dims):
        j = i + 1
        while j < dims:
            if a[i] == b[i] and a[j] == b[j]:
                a[i], b[i], a[j], b[j] = a[i] * a[j], b[i] * b[j], 1, 1
            elif a[i] == 1 and a[j] == 1:
                b[i], b[j] = b[i] * b[j], 1
            elif b[i] == 1 and b[j] == 1:
                a[i], a[j] = a[i] * a[j], 1
            else:
                break
            j += 1
        if j == dims:
            merged = i + 1
            break
    return merged


def compare(
    ctx: Context, node: Node, relation: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> list[np.ndarray]:
    """``relation`` of the node's two inputs' stored integers, broadcast, as a bool array."""
    ctx.out_dtype(node)  # the module exists for S8 and S16 only: anything else is refused here
    a, b = (np.asarray(ctx.value(n, node)) for n in node.inputs[:2])
    try:
        out_shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError as exc:
        raise ctx.refuse(
            node, f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast"
        ) from exc
    if merged_dims(list(a.shape), list(b.shape)) > 4:
        raise ctx.refuse(
            node,
            f"shapes {list(a.shape)} and {list(b.shape)} merge into more than 4 dimensions, "
            "which the runtime's element-wise loop does not handle (dl_base_elemwise.cpp)",
        )
    e0, e1 = (ctx.exponent(n, node) for n in node.inputs[:2])
    if e0 != e1:
        ctx.notes.append(
            f"node {node.name!r} ({node.op_type}): input exponents {e0} and {e1} differ; the "
            "runtime compares the stored integers without rescaling, and so does this simulation"
        )
    out = relation(a.astype(np.int64), b.astype(np.int64))
    return [np.broadcast_to(out, out_shape).astype(np.bool_)]
