"""Kernel layouts: which axis holds output and input channels, per framework layer type.

A table, not branches: ``LAYOUTS[name] = Layout(out_axis, in_axis, per_tensor_only)``.
``HWCM`` (Keras DepthwiseConv2D, ``(H, W, C, M)``) and its 1-D twin ``WCM`` (Keras
DepthwiseConv1D, ``(W, C, M)``) are the layouts whose output channels span two axes: channel
``c * M + m`` (Keras order), i.e. the last two axes flattened. A 1-D layout is its 2-D twin with
height 1 (``WIO`` kernel ``[k, cin, cout]`` is HWIO ``[1, k, cin, cout]``), so every per-channel
result (ARQ scales, BN folding, DMQ factors) is the one AMCT's Conv2D rules give.

=========  ==============================================  ===========  ==========
layout     used by                                          out axis     in axis
=========  ==============================================  ===========  ==========
HWIO       Keras Conv2D                                     3            2
HWCM       Keras DepthwiseConv2D                            (2, 3)       2
HWOI       Keras Conv2DTranspose                            2            3
WIO        Keras Conv1D, SeparableConv1D pointwise          2            1
WCM        Keras DepthwiseConv1D (separable: depthwise)     (1, 2)       1
DHWIO      Keras Conv3D                                     4            3
IO         Keras Dense (per tensor only)                    1            0
OIHW       MindSpore Conv2d, Conv1d (depthwise: group = C)  0            1
IOHW       MindSpore Conv2dTranspose                        1            0
OI         MindSpore Dense (per tensor only)                0            1
=========  ==============================================  ===========  ==========

Example:
    >>> import numpy as np
    >>> out_major(np.zeros((3, 3, 4, 2)), "HWCM").shape  # C * M = 8 channels
    (8, 9)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from amct_bridge.errors import QuantError


class Layout(NamedTuple):
    """Axes of one kernel layout (``out_axis`` is a tuple when channels span axes)."""

    ndim: int
    out_axis: tuple[int, ...]
    in_axis: int
    per_tensor_only: bool = False


LAYOUTS: dict[str, Layout] = {
    "HWIO": Layout(4, (3,), 2),
    "HWCM": Layout(4, (2, 3), 2),
    "HWOI": Layout(4, (2,), 3),
    "WIO": Layout(3, (2,), 1),
    "WCM": Layout(3, (1, 2), 1),
    "DHWIO": Layout(5, (4,), 3),
    "IO": Layout(2, (1,), 0, per_tensor_only=True),
    "OIHW": Layout(4, (0,), 1),
    "IOHW": Layout(4, (1,), 0),
    "OI": Layout(2, (0,), 1, per_tensor_only=True),
}


def get_layout(kernel: np.ndarray, layout: str, name: str = "kernel") -> Layout:
    """Look up ``layout`` and check the kernel's rank against it.

    Example:
        >>> get_layout(np.zeros((3, 3, 2, 4)), "HWIO").out_axis
        (3,)
    """
    spec = LAYOUTS.get(str(layout).upper())
    if spec is None:
        raise QuantError(
            f"{name}: unknown kernel layout {layout!r}; expected one of {sorted(LAYOUTS)}"
        )
    if np.ndim(kernel) != spec.ndim:
        raise QuantError(
            f"{name}: layout {layout} needs a {spec.ndim}-D kernel, got shape {np.shape(kernel)}"
        )
    return spec


def out_major(kernel: np.ndarray, layout: str, name: str = "kernel") -> np.ndarray:
    """The kernel as ``(output channels, rest)`` in the framework's channel order.

    Example:
        >>> out_major(np.arange(6.0).reshape(2, 3), "IO").tolist()
        [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """
    spec = get_layout(kernel, layout, name)
    k = np.asarray(kernel)
    rest = [a for a in range(k.ndim) if a not in spec.out_axis]
    moved = np.transpose(k, list(spec.out_axis) + rest)
    n_out = int(np.prod([k.shape[a] for a in spec.out_axis]))
    return moved.reshape(n_out, -1)


def out_channel_shape(kernel: np.ndarray, layout: str, name: str = "kernel") -> tuple[int, ...]:
    """Shape that broadcasts a per-output-channel vector against the kernel.

    Example:
        >>> out_channel_shape(np.zeros((3, 3, 4, 2)), "HWCM")
        (1, 1, 4, 2)
    """
    spec = get_layout(kernel, layout, name)
    shape = [1] * spec.ndim
    for a in spec.out_axis:
        shape[a] = np.shape(kernel)[a]
    return tuple(shape)


def in_channel_absmax(kernel: np.ndarray, layout: str, name: str = "kernel") -> np.ndarray:
    """``max |W|`` per input channel (DMQ's weight statistic).

    Example:
        >>> in_channel_absmax(np.array([[1.0, -3.0], [0.5, 0.25]]), "IO").tolist()
        [3.0, 0.5]
    """
    spec = get_layout(kernel, layout, name)
    k = np.abs(np.asarray(kernel, dtype=np.float32))
    axes = tuple(a for a in range(spec.ndim) if a != spec.in_axis)
    return k.max(axis=axes)
