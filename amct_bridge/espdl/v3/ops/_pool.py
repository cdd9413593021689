"""Window geometry shared by the pooling ops: ``dl_base_pool2d.hpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context


def pool_geometry(ctx: Context, node: Node, x: np.ndarray):
    rank = x.ndim - 2
    kernel = list(node.attributes.get("kernel_shape") or [])
    if len(kernel) != rank:
        raise ctx.refuse(node, f"kernel_shape {kernel} for an input of rank {x.ndim}")
    strides = list(node.attributes.get("strides") or [1] * rank)
    pads = list(node.attributes.get("pads") or [0] * (2 * rank))
    if node.attributes.get("ceil_mode", 0):
        raise ctx.refuse(node, "ceil_mode 1 (the runtime floors the output size)")
    if len(strides) != rank or len(pads) != 2 * rank:
        raise ctx.refuse(node, f"strides {strides} and pads {pads} for an input of rank {x.ndim}")
    if rank == 1:
        x, kernel, strides, pads = x[:, None], [1, *kernel], [1, *strides], [0, pads[0], 0, pads[1]]
    if x.ndim != 4:
        raise ctx.refuse(node, f"an input of rank {x.ndim} (NWC or NHWC expected)")
    top, left, bottom, right = pads
    padded = (x.shape[1] + top + bottom, x.shape[2] + left + right)
    if kernel[0] > padded[0] or kernel[1] > padded[1]:
        raise ctx.refuse(node, f"kernel_shape {kernel} is larger than the padded input {padded}")
    ctx.check_elements(node, (x.shape[0], *padded, x.shape[-1]), "padded input")
    outputs = [(p - k) // s + 1 for p, k, s in zip(padded, kernel, strides, strict=True)]
    ctx.check_elements(node, (*kernel, x.shape[0], *outputs, x.shape[-1]), "window values")
    return x, kernel, strides, pads


def windows(xp: np.ndarray, kernel: list[int], strides: list[int]):
    """Yield the (i, j) kernel-position slices of a padded NHWC tensor."""
    (kh, kw), (sh, sw) = kernel, strides
    ho = (xp.shape[1] - kh) // sh + 1
    wo = (xp.shape[2] - kw) // sw + 1
    for i in range(kh):
        for j in range(kw):
            yield xp[:, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw]
