"""Slice: a strided part of the stored tensor, values unchanged.

Runtime: ``dl_module_slice.hpp``: ONNX's ``starts``, ``ends`` and optional ``axes`` and
``steps``, all constant inputs, clamped as ONNX clamps them.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, ints_input

OP_TYPES = ("Slice",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``x[start:end:step]`` along each of ``axes`` (default: the first ``len(starts)`` axes).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> c = {k: Tensor(k, np.int64([v]), [0]) for k, v in zip("beas", [-1, -10, 1, -1])}
        >>> ctx = Context(EspdlModel([], c), "c")
        >>> ctx.values["x"] = np.arange(6, dtype=np.int8).reshape(2, 3)
        >>> compute(ctx, Node("n", "Slice", ["x", "b", "e", "a", "s"], ["y"]))[0].tolist()
        [[2, 1, 0], [5, 4, 3]]
    """
    x = ctx.value(node.inputs[0], node)
    starts, ends = ints_input(ctx, node, 1), ints_input(ctx, node, 2)
    if starts is None or ends is None:
        raise ctx.refuse(node, "starts and ends must be given as inputs")
    axes = ints_input(ctx, node, 3) or list(range(len(starts)))
    steps = ints_input(ctx, node, 4) or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        dim = x.shape[axis]
        # ONNX clamps as slice.indices does (INT64_MAX: to the end); a stop of -1 there means
        # "past index 0", which a slice can only say as None
        first, stop, step = slice(start, end, step).indices(dim)
        index[axis] = slice(first, stop if stop >= 0 else None, step)
    return [np.ascontiguousarray(x[tuple(index)])]
