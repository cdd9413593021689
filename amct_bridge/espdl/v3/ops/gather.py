"""Gather: ``dl_module_gather.hpp`` (a copy of whole rows, no arithmetic).

The module reads ``axis`` and a constant ``indices`` tensor (``get_operation_parameter(node,
1)``: an initializer, int64 or int32) and copies, for every outer block and every index, the
``inner_size`` elements of row ``indices[i]`` of the stored tensor. ``axis`` counts on the
stored shape: esp-ppq restores the ONNX layout in front of a Gather (``OTHER_OP_SET``,
``RestoreOriginLayoutPattern``), so it is ONNX's axis. The runtime uses an index as it is: a
negative index (ONNX counts it from the end) or one past the axis reads outside the row, so
this simulation refuses such indices instead of guessing memory.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("Gather",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Rows ``indices`` of the input along ``axis``; output shape: indices' shape in place of
    the axis.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> ctx = Context(EspdlModel([], {"i": Tensor("i", np.int64([[0, 1], [1, 2]]), [0])}), "c")
        >>> ctx.values["x"] = np.int8([[1, 2], [3, 4], [5, 6]])
        >>> compute(ctx, Node("g", "Gather", ["x", "i"], ["y"], {"axis": 0}))[0].tolist()
        [[[1, 2], [3, 4]], [[3, 4], [5, 6]]]
    """
    x = np.asarray(ctx.value(node.inputs[0], node))
    indices = ctx.initializer(node.inputs[1], node).data
    if indices.dtype not in (np.int64, np.int32):
        raise ctx.refuse(node, f"indices are {indices.dtype}; the runtime reads int64 or int32")
    axis = int(node.attributes.get("axis", 0))
    if axis < 0:
        axis += x.ndim
    if not 0 <= axis < x.ndim:
        raise ctx.refuse(node, f"axis {node.attributes.get('axis')} for a rank-{x.ndim} input")
    size = x.shape[axis]
    bad = indices[(indices < 0) | (indices >= size)]
    if bad.size:
        raise ctx.refuse(
            node,
            f"index {int(bad.reshape(-1)[0])} on an axis of {size}: the runtime uses indices as "
            "they are (no wrap of negative ones), so it would read outside the row",
        )
    ctx.check_elements(node, (*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :]), "output")
    return [np.take(x, indices.astype(np.int64), axis=axis)]
