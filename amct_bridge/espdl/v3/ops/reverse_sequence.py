"""ReverseSequence: ``dl_module_reverse_sequence.hpp`` (stored values swapped in place).

The output starts as a copy of the input; for every batch ``b`` (along ``batch_axis``, default
1) with ``len = sequence_lens[b]`` (read as int64) above 1, the first ``len`` steps along
``time_axis`` (default 0) are reversed by swapping step ``t`` with ``len - 1 - t``, each step
being the ``prod(shape[2:])`` contiguous values that follow it. That is ONNX's rule for the
only layouts ONNX allows (time and batch axes 0 and 1, either order; esp-ppq keeps the ONNX
layout, ``OTHER_OP_SET``); other axes, or a length past the time axis (the runtime would swap
outside the tensor), are refused.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("ReverseSequence",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """The first ``sequence_lens[b]`` steps of every batch reversed, the rest kept.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor
        >>> ctx = Context(EspdlModel([], {"n": Tensor("n", np.int64([3]), [0])}), "c")
        >>> ctx.values["x"] = np.int8([[1, 2, 3, 4, 5]])
        >>> attrs = {"batch_axis": 0, "time_axis": 1}
        >>> compute(ctx, Node("r", "ReverseSequence", ["x", "n"], ["y"], attrs))[0].tolist()
        [[3, 2, 1, 4, 5]]
    """
    x = np.asarray(ctx.value(node.inputs[0], node))
    lengths = np.asarray(ctx.value(node.inputs[1], node)).reshape(-1)
    batch_axis = int(node.attributes.get("batch_axis", 1))
    time_axis = int(node.attributes.get("time_axis", 0))
    if x.ndim < 2 or {batch_axis, time_axis} != {0, 1}:
        raise ctx.refuse(
            node,
            f"batch_axis {batch_axis}, time_axis {time_axis} on a rank-{x.ndim} input: the "
            "runtime's step size assumes axes 0 and 1 (as ONNX requires)",
        )
    if lengths.dtype != np.int64:
        raise ctx.refuse(node, f"sequence_lens are {lengths.dtype}; the runtime reads int64")
    batches, steps = x.shape[batch_axis], x.shape[time_axis]
    if lengths.size < batches:
        raise ctx.refuse(node, f"{lengths.size} sequence lengths for {batches} batches")
    if (lengths[:batches] > steps).any():
        raise ctx.refuse(
            node, f"a sequence length {int(lengths.max())} past the {steps} steps of the time axis"
        )
    out = np.moveaxis(x, (batch_axis, time_axis), (0, 1)).copy()
    for b in range(batches):
        n = int(lengths[b])
        if n > 1:  # 1, 0 and negative lengths leave the batch as it is
            out[b, :n] = out[b, :n][::-1].copy()
    return [np.ascontiguousarray(np.moveaxis(out, (0, 1), (batch_axis, time_axis)))]
