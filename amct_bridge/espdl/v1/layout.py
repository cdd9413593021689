"""Element order of quantized filters in convert.py's C arrays, per chip.

esp32 / esp32s2 / esp32c3: conv2d and fully_connected NHWC (``transpose(3, 0, 1, 2)``),
depthwise HWC. esp32s3: output channels in blocks of g = 16 (s8) / 8 (s16): the first
``N // g * g`` channels as (N/g, H, W, C, g), then the remaining channels NHWC; depthwise
(C/g, H, W, g) then the rest HWC. The Filter shape passed to the runtime stays HWCN.

Example:
    >>> import numpy as np
    >>> q = np.arange(4).reshape(1, 1, 2, 2)      # HWCN: C=2, N=2
    >>> element_order(q, "conv2d", "esp32", "s8").tolist()
    [0, 2, 1, 3]
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v1 import spec


def element_order(q: np.ndarray, operation: str, target: str, feature_type: str) -> np.ndarray:
    """Flatten HWCN (HWC1 for depthwise) integers ``q`` in the order the tool writes them.

    Example:
        >>> q = np.arange(18).reshape(1, 1, 1, 18)
        >>> element_order(q, "conv2d", "esp32s3", "s8").tolist()[15:]
        [15, 16, 17]
    """
    g = spec.S3_GROUP[feature_type] if target == "esp32s3" else 0
    if operation == "depthwise_conv2d":
        return _depthwise_order(q[..., 0], g)
    return _conv_order(q, g)


def _conv_order(q: np.ndarray, g: int) -> np.ndarray:
    h, w, c, n = q.shape
    head = n // g * g if g else 0
    blocks = q[..., :head].reshape(h, w, c, head // g if g else 0, g or 1)
    parts = [blocks.transpose(3, 0, 1, 2, 4).ravel(), q[..., head:].transpose(3, 0, 1, 2).ravel()]
    return np.concatenate(parts)


def _depthwise_order(q: np.ndarray, g: int) -> np.ndarray:
    h, w, c = q.shape
    head = c // g * g if g else 0
    blocks = q[..., :head].reshape(h, w, head // g if g else 0, g or 1)
    return np.concatenate([blocks.transpose(2, 0, 1, 3).ravel(), q[..., head:].ravel()])
