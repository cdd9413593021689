"""Lowerings of normalizations over the trailing axes: ``LayerNormalization`` and
``RMSNormalization`` (the runtime computes both in float32 from the integers).

Example:
    >>> trailing_axes([-1], 4), trailing_axes([2, 3], 4), trailing_axes([1], 4)
    ([3], [2, 3], None)
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.lowering.emitter import Emitter
from amct_bridge.quant.espdl import auto_exponent

__all__ = ["lower_layer_norm", "lower_rms_norm", "trailing_axes"]


def trailing_axes(axis, rank: int) -> list[int] | None:
    """The sorted axes when they run from one axis (not the batch) to the last, else None."""
    axes = sorted(int(a) % rank for a in (axis if isinstance(axis, list | tuple) else [axis]))
    if not axes or axes[0] == 0 or axes != list(range(axes[0], rank)):
        return None
    return axes


def lower_layer_norm(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``LayerNormalization`` (dl_module_layer_normalization.hpp): gamma and beta are tensors
    of the feature type, each at its own exponent; the output at the calibrated exponent."""
    if "axis" not in layer.attrs:  # the adapter found no chip equivalent; it says why
        em.refuse(layer, f"no ESP-DL v3 export for {layer.kind}: {layer.attrs.get('reason')}")
        return
    x = ins[0]
    shape = em.shapes[x]
    if layer.attrs.get("rms_scaling"):
        em.refuse(
            layer,
            "LayerNormalization with rms_scaling: Keras then divides by the standard deviation "
            "without subtracting the mean, which neither the ESP-DL v3 LayerNormalization "
            "(subtracts the mean) nor RMSNormalization (divides by the root mean square) "
            "computes; use keras.layers.RMSNormalization (exported as RMSNormalization)",
        )
        return
    axes = trailing_axes(layer.attrs["axis"], len(shape))
    if axes is None:
        em.refuse(
            layer,
            f"LayerNormalization over axes {layer.attrs.get('axis')}: the runtime normalizes "
            "over the trailing axes from one axis to the last",
        )
        return
    inner = int(np.prod(shape[axes[0] :]))
    inputs, peak = [x], 0.0
    for key in ("gamma", "beta"):
        value = layer.weights.get(key)
        if value is None:
            if key == "gamma" and "beta" in layer.weights:
                value = np.ones(inner)  # the runtime takes beta as the third input only
            else:
                continue
        value = np.asarray(value, np.float64).reshape(-1)
        if value.size != inner:
            raise ExportError(
                f"layer {layer.describe()}: {key} has {value.size} values, expected {inner}"
            )
        e = auto_exponent(value, em.bits, name=f"{layer.name} {key}")
        inputs.append(em.init(f"{layer.name}/{key}", em.quantize(value, e), e))
        peak += float(np.max(np.abs(value))) * (np.sqrt(inner) if key == "gamma" else 1.0)
    if len(inputs) == 1:
        peak = float(np.sqrt(inner))
    # |(x - mean) / std| <= sqrt(n - 1): the bound when nothing was calibrated
    fallback = (em.range_exp(-peak, peak, layer.name), "the normalized bound")
    e, src, rng = em.out_exp(layer, fallback)
    attrs = {"axis": axes[0], "epsilon": float(layer.attrs.get("epsilon", 1e-3)), "stash_type": 1}
    em.node(layer.name, "LayerNormalization", inputs, [layer.name], attrs)
    em.tensor(layer.name, e, src, shape, rng)
    em.output(layer, layer.name)


def lower_rms_norm(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Keras ``RMSNormalization``: ``RMSNormalization`` (dl_module_rms_normalization.hpp), its
    scale a float32 tensor (the module reads it so), the output at the calibrated exponent."""
    x = ins[0]
    shape = em.shapes[x]
    axes = trailing_axes(layer.attrs.get("axis", -1), len(shape))
    if axes is None:
        em.refuse(
            layer,
            f"RMSNormalization over axes {layer.attrs.get('axis')}: the runtime normalizes "
            "over the trailing axes from one axis to the last",
        )
        return
    inner = int(np.prod(shape[axes[0] :]))
    scale = np.asarray(layer.weights.get("scale", np.ones(inner)), np.float32).reshape(-1)
    if scale.size != inner:
        raise ExportError(
            f"layer {layer.describe()}: scale has {scale.size} values, expected {inner}"
        )
    peak = float(np.max(np.abs(scale))) * float(np.sqrt(inner))  # |x / rms| <= sqrt(n)
    fallback = (em.range_exp(-peak, peak, layer.name), "the normalized bound")
    e, src, rng = em.out_exp(layer, fallback)
    weight = em.init(f"{layer.name}/scale", scale, 0)
    attrs = {"axis": axes[0], "epsilon": float(layer.attrs.get("epsilon", 1e-6))}
    em.node(layer.name, "RMSNormalization", [x, weight], [layer.name], attrs)
    em.tensor(layer.name, e, src, shape, rng)
    em.output(layer, layer.name)
