"""A MindSpore net's weights for its Keras twin (same layer names as the cells), converted from
MindSpore's layouts with explicit loops, independently of the adapters: the twin tests
(tests/mindspore/test_espdl_export.py, test_keras_consistency.py,
tests/espdl_v3/test_v3_export_mindspore.py) then check that both compute the same function.
"""

from __future__ import annotations

import keras
import numpy as np
from mindspore import nn


def conv_hwio(w: np.ndarray) -> np.ndarray:
    """Conv2d (O, I, kH, kW) -> Keras Conv2D (kH, kW, I, O), element by element."""
    o, i, kh, kw = w.shape
    out = np.empty((kh, kw, i, o), np.float32)
    for a in range(o):
        for b in range(i):
            out[:, :, b, a] = w[a, b]
    return out


def depthwise_hwc1(w: np.ndarray) -> np.ndarray:
    """Depthwise Conv2d (C, 1, kH, kW) -> Keras DepthwiseConv2D (kH, kW, C, 1)."""
    out = np.empty((w.shape[2], w.shape[3], w.shape[0], 1), np.float32)
    for c in range(w.shape[0]):
        out[:, :, c, 0] = w[c, 0]
    return out


def dense_rows_nhwc(w: np.ndarray, c: int, hw: int) -> np.ndarray:
    """MindSpore Dense (out, c*HW + s) after an NCHW flatten -> Keras (s*C + c, out)."""
    out = np.empty((c * hw, w.shape[0]), np.float32)
    for ch in range(c):
        for s in range(hw):
            out[s * c + ch] = w[:, ch * hw + s]
    return out


def copy_weights(model: keras.Model, net: nn.Cell, flatten_chw=None) -> None:
    """Every weighted Keras layer of ``model`` gets the weights of ``net``'s cell of the same
    name (BatchNorm2d, PReLU, Dense, Conv2d, depthwise Conv2d). ``flatten_chw``: ``(dense name,
    C, H*W)`` of the Dense that reads an NCHW Flatten (its rows reordered for NHWC)."""
    cells = dict(net.cells_and_names())
    for layer in model.layers:
        cell = cells.get(layer.name)
        if cell is None or not layer.weights:
            continue
        if isinstance(cell, nn.BatchNorm2d):
            names = ("gamma", "beta", "moving_mean", "moving_variance")
            layer.set_weights([getattr(cell, n).asnumpy() for n in names])
        elif isinstance(cell, nn.PReLU):
            layer.set_weights([cell.w.asnumpy().reshape(1, 1, -1)])
        elif isinstance(cell, nn.Dense):
            w = cell.weight.asnumpy()
            if flatten_chw and layer.name == flatten_chw[0]:
                kernel = dense_rows_nhwc(w, *flatten_chw[1:])
            else:
                kernel = w.T
            layer.set_weights([kernel, cell.bias.asnumpy()])
        else:
            w = cell.weight.asnumpy()
            kernel = conv_hwio(w) if int(cell.group) == 1 else depthwise_hwc1(w)
            layer.set_weights([kernel] + ([cell.bias.asnumpy()] if cell.has_bias else []))
