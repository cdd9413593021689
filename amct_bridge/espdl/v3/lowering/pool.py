"""Lowerings of pools: ``MaxPool``, ``AveragePool``, ``GlobalAveragePool`` (1-D pools as the
runtime's native 1-D ops); a global max pool is a ``MaxPool`` over the whole map (the runtime
has no GlobalMaxPool).

Example:
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> pool = SourceLayer("p", "runtime", attrs={"pool_size": 2})
    >>> attrs, out = pool_geometry(pool, [1, 4, 4, 3])
    >>> attrs["kernel_shape"], attrs["strides"], out
    ([2, 2], [2, 2], [1, 2, 2, 3])
"""

from __future__ import annotations

from amct_bridge.errors import ExportError
from amct_bridge.espdl.source import AVERAGE_KINDS, SourceLayer
from amct_bridge.espdl.v3.lowering.emitter import Emitter, pair, same_pads

__all__ = ["lower_avgpool", "lower_global_pool", "lower_maxpool", "pool_geometry"]


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


def lower_avgpool(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """AveragePooling1D/2D: ``AveragePool`` (refused where "same" padding pads)."""
    attrs, shape = pool_geometry(layer, em.shapes[ins[0]])
    if any(attrs["pads"]):
        em.refuse(
            layer,
            "AveragePooling2D with 'same' padding that pads: the v3 runtime's AveragePool "
            "reads no count_include_pad and divides by the whole kernel at the borders "
            "(dl_module_average_pool.hpp, dl_base_pool2d.hpp avg_pool_area), Keras by the "
            "real cells only (use 'valid' padding)",
        )
        return
    attrs["count_include_pad"] = 1
    x = ins[0]
    e, src, rng = em.out_exp(layer, (em.exps[x], f"the input's ({x!r})"))
    em.node(layer.name, "AveragePool", [x], [layer.name], attrs)
    em.tensor(layer.name, e, src, shape, rng)
    em.output(layer, layer.name)


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
