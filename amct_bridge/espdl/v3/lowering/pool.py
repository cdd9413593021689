"""Lowerings of pools: ``MaxPool``, ``AveragePool``, ``GlobalAveragePool`` (1-D pools as the
runtime's native 1-D ops); a global max pool is a ``MaxPool`` over the whole map (the runtime
has no GlobalMaxPool). An average pool whose "same" padding pads is an ``AveragePool`` (which
divides by the whole kernel at the borders) times a constant border factor (``Mul``).

Example:
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> pool = SourceLayer("p", "runtime", attrs={"pool_size": 2})
    >>> attrs, out = pool_geometry(pool, [1, 4, 4, 3])
    >>> attrs["kernel_shape"], attrs["strides"], out
    ([2, 2], [2, 2], [1, 2, 2, 3])
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.source import AVERAGE_KINDS, SourceLayer
from amct_bridge.espdl.v3.lowering.emitter import Emitter, pair, same_pads
from amct_bridge.quant.espdl import auto_exponent

__all__ = [
    "border_counts",
    "lower_avgpool",
    "lower_global_pool",
    "lower_maxpool",
    "pool_geometry",
]


def pool_geometry(layer: SourceLayer, shape: list[int]) -> tuple[dict, list[int]]:
    """The ONNX attributes and output shape of a (1-D or 2-D) pool on ``shape``."""
    if len(shape) == 3:  # a 1-D pool (NWC): its height-1 twin's geometry, as a 1-D node
        attrs, out = pool_geometry(layer, [shape[0], 1, shape[1], shape[2]])
        if out[1] != 1 or attrs["kernel_shape"][0] != 1:
            raise ExportError(f"layer {layer.describe()}: a 2-D pool on a 1-D input {shape}")
        top, left, bottom, right = attrs["pads"]
        attrs.update(
            kernel_shape=attrs["kernel_shape"][1:],
            pads=[left, right],
            strides=attrs["strides"][1:],
        )
        return attrs, [out[0], out[2], out[3]]
    kh, kw = pair(layer.attrs.get("pool_size"), 2)
    sh, sw = pair(layer.attrs.get("strides") or (kh, kw), 1)
    h, w = shape[1], shape[2]
    if str(layer.attrs.get("padding", "valid")).lower() == "same":
        ho, top, bottom = same_pads(h, kh, sh)
        wo, left, right = same_pads(w, kw, sw)
    else:
        top = bottom = left = right = 0
        ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    attrs = {
        "ceil_mode": 0,
        "kernel_shape": [kh, kw],
        "pads": [top, left, bottom, right],
        "strides": [sh, sw],
    }
    return attrs, [shape[0], ho, wo, shape[3]]


def lower_maxpool(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """MaxPooling1D/2D: ``MaxPool`` at the input's exponent."""
    attrs, shape = pool_geometry(layer, em.shapes[ins[0]])
    attrs["dilations"] = [1] * len(attrs["kernel_shape"])
    em.keep(layer, "MaxPool", ins, shape, attrs)


def border_counts(size: int, kernel: int, stride: int, before: int, out: int) -> np.ndarray:
    """How many real (unpadded) cells each output position's window covers along one axis.

    Example:
        >>> border_counts(4, 3, 1, 1, 4).tolist()
        [2, 3, 3, 2]
    """
    start = np.arange(out) * stride - before
    return np.minimum(start + kernel, size) - np.maximum(start, 0)


def _border_ratio(attrs: dict, shape: list[int], out: list[int]) -> np.ndarray:
    """``kernel area / real cells`` per output position, shaped to broadcast over channels:
    ``[1, Ho, Wo, 1]`` (1-D: ``[1, Wo, 1]``)."""
    rank = len(shape) - 2
    pads, kernel, strides = attrs["pads"], attrs["kernel_shape"], attrs["strides"]
    counts = [
        border_counts(shape[1 + i], kernel[i], strides[i], pads[i], out[1 + i]) for i in range(rank)
    ]
    real = counts[0] if rank == 1 else np.outer(counts[0], counts[1])
    ratio = float(np.prod(kernel)) / real
    return ratio.reshape(1, *ratio.shape, 1)


def lower_avgpool(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """AveragePooling1D/2D: ``AveragePool``; with "same" padding that pads, ``AveragePool``
    with the pads (the runtime divides by the whole kernel there) then a ``Mul`` by the
    constant ``kernel area / real cells`` per position (``[1, Ho, Wo, 1]``, broadcast over the
    channels): Keras' average of the real cells. Inside the map the factor is 1 and the
    output is the AveragePool's; at the borders it is rounded twice (at most ``(r + 1) / 2``
    steps off for a factor ``r``)."""
    attrs, shape = pool_geometry(layer, em.shapes[ins[0]])
    attrs["count_include_pad"] = 1  # what the runtime computes, whatever the file says
    x = ins[0]
    e, src, rng = em.out_exp(layer, (em.exps[x], f"the input's ({x!r})"))
    name = layer.name
    if not any(attrs["pads"]):
        em.node(name, "AveragePool", [x], [name], attrs)
        em.tensor(name, e, src, shape, rng)
        em.output(layer, name)
        return
    pooled = f"{name}/pool"
    em.node(pooled, "AveragePool", [x], [pooled], attrs)
    # |sum / area| <= |Keras' average|: the output's exponent never saturates the pool
    em.tensor(pooled, e, f"{src} (the whole-kernel average before the border factor)", shape, rng)
    ratio = _border_ratio(attrs, em.shapes[x], shape)
    e_r = auto_exponent(ratio, em.bits, name=f"{name} border factor")
    factor = em.init(f"{name}/border_factor", em.quantize(ratio, e_r), e_r)
    em.node(name, "Mul", [pooled, factor], [name])
    em.tensor(name, e, src, shape, rng)
    em.output(layer, name, [pooled, name])


def lower_global_pool(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Global average / max pools (+ ``Flatten`` when ``keepdims`` is False)."""
    x = ins[0]
    shape = em.shapes[x]
    keep = bool(layer.attrs.get("keepdims", True))
    name = layer.name
    pooled = name if keep else f"{name}/pool"
    spatial = shape[1:-1]  # [H, W], or [W] of a 1-D (NWC) input
    if layer.kind in AVERAGE_KINDS:
        e, src, rng = em.out_exp(layer, (em.exps[x], f"the input's ({x!r})"))
        em.node(name, "GlobalAveragePool", [x], [pooled])
    else:  # the runtime has no GlobalMaxPool: a MaxPool over the whole map
        e, src, rng = em.exps[x], f"the input's ({x!r})", em.ranges.get(x)
        attrs = {
            "ceil_mode": 0,
            "dilations": [1] * len(spatial),
            "kernel_shape": list(spatial),
            "pads": [0] * (2 * len(spatial)),
            "strides": [1] * len(spatial),
        }
        em.node(name, "MaxPool", [x], [pooled], attrs)
    em.tensor(pooled, e, src, [shape[0], *[1] * len(spatial), shape[-1]], rng)
    nodes = [name]
    if not keep:
        em.node(f"{name}/flatten", "Flatten", [pooled], [name], {"axis": 1})
        em.tensor(name, e, src, [shape[0], shape[-1]], rng)
        nodes.append(f"{name}/flatten")
    em.output(layer, name, nodes)
