"""Float coefficients of one exported chain, in convert.py's layouts, checked.

- conv2d: Keras HWIO is already HWCN; depthwise_conv2d: (H, W, C, 1); dense (in, out) ->
  (1, 1, in, out).
- BatchNorm folded into the preceding layer (per output channel ``s = gamma / sqrt(var + eps)``):
  ``filter' = filter * s``, ``bias' = (bias - mean) * s + beta`` (bias = 0 when the layer has
  none), by :func:`amct_bridge.quant.fold.fold_batchnorm` in float64.
- LeakyReLU alpha -> (1,); PReLU alpha -> (C,) (one per output channel).
All arrays float32, finite, with the lengths the runtime will read.

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.plan import Chain
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> fc = SourceLayer("fc", "dense", weights={"kernel": np.ones((3, 2), np.float32)})
    >>> chain_coefficients(Chain(fc, members=["fc"])).filter.shape
    (1, 1, 3, 2)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from amct_bridge.errors import ExportError, QuantError
from amct_bridge.espdl.checks import as_float32, channel_vector, check_shape
from amct_bridge.espdl.plan import Chain
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.quant.fold import fold_batchnorm


@dataclass
class Coefficients:
    """What goes into ``L_filter.npy``, ``L_bias.npy`` and ``L_activation.npy``."""

    filter: np.ndarray
    bias: np.ndarray | None = None
    alpha: np.ndarray | None = None


def _filter_of(layer: SourceLayer) -> np.ndarray:
    kernel = layer.weights.get("kernel")
    if kernel is None:
        raise ExportError(f"layer {layer.name!r}: no kernel weights")
    kernel = as_float32(kernel, layer.name, "kernel")
    if layer.op == "dense":
        check_shape(kernel, (None, None), layer.name, "Dense kernel (in, out)")
        return kernel.reshape((1, 1) + kernel.shape)
    if layer.op == "depthwise_conv2d":
        check_shape(kernel, (None, None, None, 1), layer.name, "depthwise kernel (H, W, C, 1)")
    else:
        check_shape(kernel, (None, None, None, None), layer.name, "Conv2D kernel HWIO")
    return kernel


def fold_batch_norm(
    filt: np.ndarray, bias: np.ndarray | None, bn: SourceLayer, layout: str
) -> tuple[np.ndarray, np.ndarray]:
    """Fold ``bn`` into ``filt`` (convert.py layout ``layout``: "HWIO" or "HWCM") and ``bias``.

    Uses :func:`amct_bridge.quant.fold.fold_batchnorm` (the folding AMCT's scale_w sees).

    Example:
        >>> bn = SourceLayer("bn", "batch_norm", weights={"gamma": np.array([2.0]),
        ...     "beta": np.array([1.0]), "mean": np.array([0.5]), "variance": np.array([1.0])},
        ...     attrs={"epsilon": 0.0})
        >>> w, b = fold_batch_norm(np.ones((1, 1, 1, 1), np.float32), None, bn, "HWIO")
        >>> float(w.ravel()[0]), float(b[0])
        (2.0, 0.0)
    """
    w = bn.weights
    if "mean" not in w or "variance" not in w:
        raise ExportError(f"layer {bn.name!r}: BatchNormalization without moving mean/variance")
    params = {k: as_float32(w[k], bn.name, f"BN {k}") for k in w}
    try:
        folded, new_bias = fold_batchnorm(
            filt.astype(np.float64),
            bias,
            params.get("gamma"),
            params.get("beta"),
            params["mean"],
            params["variance"],
            float(bn.attrs.get("epsilon", 1e-3)),
            layout,
            name=bn.name,
        )
    except QuantError as err:
        raise ExportError(
            f"layer {bn.name!r}: cannot fold into the previous layer: {err}"
        ) from None
    return as_float32(folded, bn.name, "folded filter"), as_float32(
        new_bias, bn.name, "folded bias"
    )


def _alpha_of(chain: Chain, channels: int) -> np.ndarray | None:
    if chain.activation == "LeakyReLU":
        source = chain.act_layer or chain.head
        alpha = source.attrs.get("alpha")
        if alpha is None:
            raise ExportError(f"layer {source.name!r}: LeakyReLU without its alpha")
        return as_float32(np.array([alpha], np.float64), source.name, "LeakyReLU alpha")
    if chain.activation == "PReLU":
        act = chain.act_layer
        if act is None or "alpha" not in act.weights:
            raise ExportError(f"layer {chain.head.name!r}: PReLU without alpha weights")
        return channel_vector(act.weights["alpha"], channels, act.name, "PReLU alpha")
    return None


def chain_coefficients(chain: Chain) -> Coefficients:
    """Filter (convert.py layout), bias (if any, BN folded) and activation alpha of ``chain``.

    Example:
        >>> conv = SourceLayer("c", "conv2d", weights={"kernel": np.ones((1, 1, 2, 3), np.float32),
        ...                                            "bias": np.zeros(3, np.float32)})
        >>> chain_coefficients(Chain(conv, members=["c"])).bias.shape
        (3,)
    """
    head = chain.head
    filt = _filter_of(head)
    axis = 2 if head.op == "depthwise_conv2d" else 3
    channels = filt.shape[axis]
    bias = head.weights.get("bias")
    if bias is not None:
        bias = as_float32(bias, head.name, "bias")
        check_shape(bias, (channels,), head.name, "bias")
    if chain.bn is not None:
        filt, bias = fold_batch_norm(filt, bias, chain.bn, "HWCM" if axis == 2 else "HWIO")
    return Coefficients(filt, bias, _alpha_of(chain, channels))
