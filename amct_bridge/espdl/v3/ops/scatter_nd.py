"""ScatterND: ``dl_module_scatter_nd.hpp`` (stored integers copied or combined, in order).

The output starts as a copy of ``data``; then, slice after slice in the order of ``indices``
(read as int64), the ``updates`` slice is written at the flat offset ``sum(index[i] ·
stride[i])`` of ``data``'s (stored, ONNX-ordered: esp-ppq restores the layout, ``OTHER_OP_SET``)
shape: replaced (``reduction`` "none"), or combined element by element with the current value:
"add" and "mul" on the stored integers, saturated to int8 / int16, "max", "min". Nothing is
rescaled: ``updates`` is taken at ``data``'s exponent as it is (esp-ppq inserts a
RequantizeLinear in front when they differ), and "mul" multiplies the stored integers without
any shift. Later slices see earlier ones, so repeated indices behave as on the chip. Indices
are not wrapped: a negative one or one past its axis is refused (the runtime would write outside
the slice).
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("ScatterND",)

_REDUCTIONS = ("none", "add", "mul", "max", "min")


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``data`` with the ``updates`` slices written (or reduced) at ``indices``.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor, ValueInfo
        >>> i = Tensor("i", np.int64([[1], [1]]), [0])
        >>> vi = [ValueInfo(n, [3], 3, [-4]) for n in "du"]
        >>> ctx = Context(EspdlModel([], {"i": i}, value_info=vi), "c")
        >>> ctx.values.update(d=np.int8([1, 100, 3]), u=np.int8([20, 30]))
        >>> n = Node("s", "ScatterND", ["d", "i", "u"], ["y"], {"reduction": "add"})
        >>> compute(ctx, n)[0].tolist()  # 100 + 20 + 30 saturates at 127
        [1, 127, 3]
    """
    dtype = ctx.out_dtype(node)  # S8 / S16; float32 models are not simulated
    data = np.asarray(ctx.value(node.inputs[0], node))
    indices = np.asarray(ctx.value(node.inputs[1], node))
    updates = np.asarray(ctx.value(node.inputs[2], node))
    reduction = str(node.attributes.get("reduction", "none"))
    if reduction not in _REDUCTIONS:
        raise ctx.refuse(node, f"reduction {reduction!r} (the runtime knows {_REDUCTIONS})")
    if indices.dtype != np.int64:  # the module reads the buffer as int64_t whatever its type
        raise ctx.refuse(node, f"indices are {indices.dtype}; the runtime reads them as int64")
    depth = indices.shape[-1] if indices.ndim else 0
    if not 1 <= depth <= data.ndim:
        raise ctx.refuse(node, f"indices of last dimension {depth} for a rank-{data.ndim} data")
    e_data, e_upd = ctx.exponent(node.inputs[0], node), ctx.exponent(node.inputs[2], node)
    if e_data != e_upd:
        ctx.notes.append(
            f"node {node.name!r} (ScatterND): updates at 2^{e_upd}, data at 2^{e_data}; the "
            "runtime writes the stored integers without rescaling, and so does this simulation"
        )
    slices = indices.reshape(-1, depth).astype(np.int64)
    slice_shape = data.shape[depth:]
    slice_size = int(np.prod(slice_shape, dtype=np.int64))
    if updates.size < len(slices) * slice_size:
        raise ctx.refuse(node, f"updates hold {updates.size} values, {len(slices)} slices needed")
    bad = (slices < 0) | (slices >= np.array(data.shape[:depth]))
    if bad.any():
        where = np.argwhere(bad)[0]
        raise ctx.refuse(
            node,
            f"index {int(slices[tuple(where)])} on an axis of {data.shape[where[1]]}: the "
            "runtime does not wrap indices, it would write outside the slice",
        )
    out = data.astype(np.int64).reshape(data.shape[:depth] + (slice_size,))
    rows = updates.astype(np.int64).reshape(-1)[: len(slices) * slice_size]
    info = np.iinfo(dtype)
    for k, index in enumerate(slices):  # in order: a repeated index sees the earlier writes
        update = rows[k * slice_size : (k + 1) * slice_size]
        current = out[tuple(index)]
        if reduction == "none":
            new = update
        elif reduction == "add":
            new = np.clip(current + update, info.min, info.max)
        elif reduction == "mul":
            new = np.clip(current * update, info.min, info.max)
        elif reduction == "max":
            new = np.maximum(current, update)
        else:
            new = np.minimum(current, update)
        out[tuple(index)] = new
    return [out.reshape(data.shape).astype(data.dtype)]
