"""Checks convert.py does not make: dtype, NaN/Inf, shapes, bias and alpha lengths.

convert.py silently writes ``None`` exponents for integer arrays, reads past the end of a short
PReLU alpha or bias at run time, and saturates float32 overflow; every array we write goes
through :func:`as_float32` and the shape checks first.

Example:
    >>> import numpy as np
    >>> as_float32(np.array([1, 2], np.float64), "conv1", "bias").dtype
    dtype('float32')
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import ExportError


def as_float32(x: np.ndarray, layer: str, what: str) -> np.ndarray:
    """``x`` as a C-contiguous float32 array; refuses non-float dtypes and NaN/Inf.

    Example:
        >>> as_float32(np.array([1, 2]), "fc", "kernel")
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: layer 'fc': kernel has dtype int64, expected floating point
    """
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ExportError(f"layer {layer!r}: {what} has dtype {arr.dtype}, expected floating point")
    with np.errstate(over="ignore"):  # overflow to Inf is reported just below
        out = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.all(np.isfinite(out)):
        bad = "NaN" if np.isnan(out).any() else "Inf (or a value beyond float32)"
        raise ExportError(f"layer {layer!r}: {what} contains {bad}")
    return out


def check_shape(arr: np.ndarray, expected: tuple, layer: str, what: str) -> None:
    """Fail unless ``arr.shape`` matches ``expected`` (``None`` = any size on that axis).

    Example:
        >>> check_shape(np.zeros((3, 3, 2, 1)), (None, None, 4, 1), "dw", "filter HWC1")
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: layer 'dw': filter HWC1 has shape (3, 3, 2, 1), expected ...
    """
    ok = len(arr.shape) == len(expected) and all(
        e is None or e == s for s, e in zip(arr.shape, expected, strict=True)
    )
    if not ok:
        want = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
        raise ExportError(f"layer {layer!r}: {what} has shape {tuple(arr.shape)}, expected {want}")


def channel_vector(x: np.ndarray, channels: int, layer: str, what: str) -> np.ndarray:
    """A per-channel vector of length ``channels`` (a scalar or size-1 array is broadcast).

    Example:
        >>> channel_vector(np.array([[[0.1]]]), 3, "p", "PReLU alpha").tolist()
        [0.10000000149011612, 0.10000000149011612, 0.10000000149011612]
    """
    arr = as_float32(x, layer, what)
    if arr.size == 1:
        return np.full((channels,), arr.reshape(()), np.float32)
    flat = arr.reshape(-1)
    if flat.size != channels:
        raise ExportError(
            f"layer {layer!r}: {what} has {flat.size} values, expected {channels} (one per channel)"
        )
    return flat
