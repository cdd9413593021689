"""InsertZeros: ``dl_module_insert_zeros.hpp`` (esp-ppq exports ConvTranspose as InsertZeros +
Conv).

The module copies input position ``i`` of each spatial axis to output position ``i · stride``
and leaves every other position zero: an ``[N, *spatial, C]`` input (1 or 2 spatial axes)
becomes ``[N, *(d + (stride - 1)(d - 1) + output_padding), C]``. The integers are copied as
they are (no requantization: esp-ppq gives the output the input's exponent). A single
``stride`` / ``output_padding`` value applies to every spatial axis, as the module normalises
them. From the sources alone (a copy); the suite's ConvTranspose files, where the Conv reads this
output, are equal on every target.

Example:
    >>> from amct_bridge.espdl.v3.model import EspdlModel
    >>> ctx = Context(EspdlModel([], {}), "c")
    >>> ctx.values["x"] = np.array([[[1], [2], [3]]], np.int8)  # NWC, W=3
    >>> node = Node("z", "InsertZeros", ["x"], ["y"], {"stride": [2], "output_padding": [1]})
    >>> compute(ctx, node)[0][0, :, 0].tolist()
    [1, 0, 2, 0, 3, 0]
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("InsertZeros",)


def _per_axis(ctx: Context, node: Node, name: str, default: int, axes: int) -> list[int]:
    values = node.attributes.get(name)
    values = [default] if values is None or values == [] else values
    values = [int(v) for v in (values if isinstance(values, list) else [values])]
    if len(values) == 1:
        values = values * axes
    if len(values) != axes:
        raise ctx.refuse(node, f"{name} {values} for {axes} spatial axes")
    return values


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """An InsertZeros node: the input spread ``stride`` apart over zeros, then padded.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "esp32p4")
        >>> ctx.values["x"] = np.array([[1, 2], [3, 4]], np.int8).reshape(1, 2, 2, 1)
        >>> y = compute(ctx, Node("z", "InsertZeros", ["x"], ["y"], {"stride": [2]}))[0]
        >>> y[0, :, :, 0].tolist()
        [[1, 0, 2], [0, 0, 0], [3, 0, 4]]
    """
    x = ctx.value(node.inputs[0], node)
    axes = x.ndim - 2
    if axes not in (1, 2):
        # the module computes 1 and 2 spatial axes only ("Unsupported number of spatial dims")
        raise ctx.refuse(node, f"input of rank {x.ndim} ([N, W, C] or [N, H, W, C] expected)")
    stride = _per_axis(ctx, node, "stride", 1, axes)
    padding = _per_axis(ctx, node, "output_padding", 0, axes)
    if min(stride) < 1 or min(padding) < 0:
        raise ctx.refuse(node, f"stride {stride} and output_padding {padding}")
    spatial = x.shape[1:-1]
    shape = [d + (s - 1) * (d - 1) + p for d, s, p in zip(spatial, stride, padding, strict=True)]
    ctx.check_elements(node, (x.shape[0], *shape, x.shape[-1]), "output")
    out = np.zeros((x.shape[0], *shape, x.shape[-1]), x.dtype)
    out[(slice(None), *(slice(0, s * d, s) for s, d in zip(stride, spatial, strict=True)))] = x
    return [out]
