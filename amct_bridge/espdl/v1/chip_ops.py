"""Integer kernels of the ESP-DL v1 chip simulator (numpy, vectorised, batch axis first).

Every function takes and returns integer-valued arrays shaped ``(N, *chip_shape)`` (HWC
tensors: ``(N, H, W, C)``): int64, or float32/float64 holding integers exactly (cheaper; the
dtype is chosen by :func:`work_dtype` from a bound on the values, so nothing is ever rounded).
The arithmetic follows docs/espdl-export.md, "Chip simulator": ``floor_shift`` is an arithmetic
shift (floor, never rounded); dot products are exact integers (BLAS in float32/float64 only
when every partial sum provably fits the mantissa, else an int64 ``einsum``).

Example:
    >>> import numpy as np
    >>> floor_shift(np.array([-3, 3, 5]), 1).tolist(), floor_shift(np.array([3]), -2).tolist()
    ([-2, 1, 2], [12])
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from amct_bridge.errors import ExportError


def floor_shift(v: np.ndarray, s: int | np.ndarray, inplace: bool = False) -> np.ndarray:
    """⌊v / 2^s⌋ for s > 0 (arithmetic right shift), ``v · 2^-s`` for s <= 0; ``s`` may be
    per channel (broadcast on the last axis). ``v`` holds integers: int64, or floats with
    integer values (exact: scaling by a power of two and ``floor`` lose nothing below 2^53).

    Example:
        >>> floor_shift(np.array([[-5, 5]]), np.array([1, -1])).tolist()
        [[-3, 10]]
        >>> floor_shift(np.array([-5.0, 5.0]), 1).tolist()
        [-3.0, 2.0]
    """
    v = np.asarray(v)
    # Degenerate exponents (an all-zero kernel, a 1e-9 output range) give shifts such as -128:
    # 2^128 overflows float32 (0 · inf = NaN) and int64 shifts past 63 are undefined. Every
    # shift result is saturated to 8/16 bits, so clamping the shift changes no output: a right
    # shift of 62 already floors every |v| < 2^53 to 0 or -1, a left one of 62 saturates any v != 0.
    s = np.clip(np.asarray(s, dtype=np.int64), -SHIFT_LIMIT, SHIFT_LIMIT)
    if v.dtype.kind == "f":
        if s.ndim == 0 and int(s) == 0:
            return v
        out = v if inplace else None  # ``inplace``: ``v`` is a temporary the caller owns
        scaled = np.multiply(v, np.exp2(-s).astype(v.dtype), out=out)
        return np.floor(scaled, out=scaled) if (s.ndim or int(s) > 0) else scaled
    v = v.astype(np.int64, copy=False)
    left = np.maximum(-s, 0)
    if np.any(left > 0):  # clip first so that v << k cannot wrap: 2^(62-k) << k saturates
        bound = np.left_shift(np.int64(1), SHIFT_LIMIT - left)
        v = np.clip(v, -bound, bound)  # bound << k = 2^62 still fits int64
    if s.ndim == 0:
        k = int(s)
        return v >> k if k > 0 else v << -k
    return (v >> np.maximum(s, 0)) << left


#: Largest shift :func:`floor_shift` applies (see the comment there).
SHIFT_LIMIT = 62


def saturate(v: np.ndarray, bits: int, inplace: bool = False) -> np.ndarray:
    """Clip to the signed ``bits``-bit range.

    Example:
        >>> saturate(np.array([200, -200, 5]), 8).tolist()
        [127, -128, 5]
    """
    out = v if inplace and v.dtype.kind == "f" else None
    return np.clip(v, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1, out=out)


def same_pads(size: int, k: int, stride: int, begin: bool) -> tuple[int, int, int]:
    """(out, before, after) of TF "same" padding (SAME_END: extra pixel after; SAME_BEGIN:
    before).

    Example:
        >>> same_pads(13, 3, 2, False), same_pads(4, 2, 2, False), same_pads(6, 3, 2, True)
        ((7, 1, 1), (2, 0, 0), (3, 1, 0))
    """
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    small = total // 2
    return (out, total - small, small) if begin else (out, small, total - small)


def pads_of(shape: tuple[int, int], kernel: tuple[int, int], attrs: dict, what: str) -> list[int]:
    """[top, bottom, left, right] zero pads of a window op on an (H, W) input.

    Example:
        >>> pads_of((13, 13), (3, 3), {"padding": "SAME_END", "strides": [2, 2]}, "c")
        [1, 1, 1, 1]
    """
    padding = attrs.get("padding", "VALID")
    sy, sx = attrs.get("strides", (1, 1))
    if padding == "VALID":
        pads = [0, 0, 0, 0]
    elif padding in ("SAME_END", "SAME_BEGIN"):
        begin = padding == "SAME_BEGIN"
        _, t, b = same_pads(shape[0], kernel[0], int(sy), begin)
        _, left, r = same_pads(shape[1], kernel[1], int(sx), begin)
        pads = [t, b, left, r]
    else:
        pads = [int(p) for p in attrs.get("pads", ())]
        if len(pads) != 4:
            raise ExportError(f"chip layer {what}: PADDING_NOT_SET needs pads [t, b, l, r]")
    h, w = shape[0] + pads[0] + pads[1], shape[1] + pads[2] + pads[3]
    if h < kernel[0] or w < kernel[1]:
        raise ExportError(f"chip layer {what}: input {shape} smaller than the window {kernel}")
    return pads


def _pad_hw(x: np.ndarray, pads: list[int], value: int = 0) -> np.ndarray:
    if not any(pads):
        return x
    t, b, left, r = pads
    return np.pad(x, ((0, 0), (t, b), (left, r), (0, 0)), constant_values=value)


def _windows(x: np.ndarray, k: tuple[int, int], strides: tuple[int, int]) -> np.ndarray:
    """(N, Ho, Wo, C, kh, kw) strided view of the (already padded) input."""
    win = sliding_window_view(x, k, axis=(1, 2))
    return win[:, :: strides[0], :: strides[1]]


def work_dtype(bound: float) -> type:
    """The cheapest dtype holding every integer of magnitude <= ``bound`` exactly
    (float32 below 2^24, float64 below 2^53, else int64).

    Example:
        >>> work_dtype(2.0**20), work_dtype(2.0**40), work_dtype(2.0**60)
        (<class 'numpy.float32'>, <class 'numpy.float64'>, <class 'numpy.int64'>)
    """
    if bound < 2.0**24:
        return np.float32
    if bound < 2.0**53:
        return np.float64
    return np.int64


def _absmax(a: np.ndarray, known: float | None) -> float:
    return float(np.abs(a).max(initial=0)) if known is None else known


def exact_matmul(a: np.ndarray, b: np.ndarray, a_max: float | None = None) -> np.ndarray:
    """``a @ b`` on integers, exact: float32/float64 BLAS when ``K·max|a|·max|b|`` fits the
    mantissa (every partial sum is then an exactly representable integer), else int64.
    ``a_max`` bounds ``|a|`` when known (saves a pass over ``a``).

    Example:
        >>> exact_matmul(np.array([[2**30, 1]]), np.array([[2**30], [1]])).tolist()
        [[1152921504606846977]]
    """
    bound = a.shape[-1] * _absmax(a, a_max) * float(np.abs(b).max(initial=0))
    dtype = work_dtype(bound)
    if dtype is np.int64:
        return np.einsum("...k,kn->...n", a.astype(np.int64), b.astype(np.int64))
    return a.astype(dtype, copy=False) @ b.astype(dtype)


def conv2d_acc(
    x: np.ndarray, w: np.ndarray, attrs: dict, what: str, x_max: float | None = None
) -> np.ndarray:
    """Σ x·w of a Conv2D: ``x`` (N, H, W, C), ``w`` HWCN -> (N, Ho, Wo, N_out) integers.

    Example:
        >>> x = np.arange(4).reshape(1, 2, 2, 1); w = np.ones((2, 2, 1, 1), np.int64)
        >>> conv2d_acc(x, w, {}, "c").ravel().tolist()  # float32 holds these integers exactly
        [6.0]
    """
    kh, kw, c, n = w.shape
    if x.shape[-1] != c:
        raise ExportError(f"chip layer {what}: input has {x.shape[-1]} channels, filter {c}")
    strides = tuple(int(s) for s in attrs.get("strides", (1, 1)))
    pads = pads_of(x.shape[1:3], (kh, kw), attrs, what)
    xp = _pad_hw(x, pads)
    if (kh, kw) == (1, 1):
        cols = xp[:, :: strides[0], :: strides[1], :]
        return exact_matmul(cols, w.reshape(c, n), x_max)
    win = _windows(xp, (kh, kw), strides)  # (N, Ho, Wo, C, kh, kw)
    cols = win.reshape(win.shape[:3] + (c * kh * kw,))
    return exact_matmul(cols, w.transpose(2, 0, 1, 3).reshape(c * kh * kw, n), x_max)


def depthwise_acc(
    x: np.ndarray, w: np.ndarray, attrs: dict, what: str, x_max: float | None = None
) -> np.ndarray:
    """Σ x·w of a DepthwiseConv2D (multiplier 1): ``w`` (H, W, C, 1) -> (N, Ho, Wo, C).

    Example:
        >>> x = np.ones((1, 3, 3, 2), np.int64); w = np.ones((3, 3, 2, 1), np.int64)
        >>> depthwise_acc(x, w, {"padding": "SAME_END"}, "d")[0, 0, 0].tolist()
        [4.0, 4.0]
    """
    kh, kw, c, _ = w.shape
    if x.shape[-1] != c:
        raise ExportError(f"chip layer {what}: input has {x.shape[-1]} channels, filter {c}")
    sy, sx = (int(s) for s in attrs.get("strides", (1, 1)))
    pads = pads_of(x.shape[1:3], (kh, kw), attrs, what)
    xp = _pad_hw(x, pads)
    ho = (xp.shape[1] - kh) // sy + 1
    wo = (xp.shape[2] - kw) // sx + 1
    dtype = work_dtype(kh * kw * _absmax(x, x_max) * float(np.abs(w).max(initial=0)))
    xp = xp.astype(dtype, copy=False)
    wd = w.astype(dtype)
    acc = np.empty((x.shape[0], ho, wo, c), dtype=dtype)
    tmp = np.empty_like(acc)
    for t in range(kh * kw):  # a loop over the kernel taps, each a whole-tensor multiply-add
        i, j = divmod(t, kw)
        tap = xp[:, i : i + (ho - 1) * sy + 1 : sy, j : j + (wo - 1) * sx + 1 : sx, :]
        np.multiply(tap, wd[i, j, :, 0], out=acc if t == 0 else tmp)  # in place: no temporaries
        if t:
            acc += tmp
    return acc


def fully_connected_acc(
    x: np.ndarray, w: np.ndarray, flatten: bool, what: str, x_max: float | None = None
) -> np.ndarray:
    """Σ x·w of a FullyConnected, ``w`` (1, 1, in, out); flatten: any input of size ``in``.

    Example:
        >>> fully_connected_acc(np.ones((1, 2, 2)), np.ones((1, 1, 4, 3), np.int64), True,
        ...                     "f").tolist()
        [[4.0, 4.0, 4.0]]
    """
    n_in, n_out = w.shape[2], w.shape[3]
    a = x.reshape(x.shape[0], -1) if flatten else x
    if a.shape[-1] != n_in:
        raise ExportError(f"chip layer {what}: input {x.shape[1:]} does not give {n_in} inputs")
    return exact_matmul(a, w.reshape(n_in, n_out), x_max)


def pool_windows(x: np.ndarray, attrs: dict, what: str, pad_value: int) -> np.ndarray:
    """(N, Ho, Wo, C, kh, kw) windows of a pooling layer (``pool`` [h, w]; pads ``pad_value``).

    Example:
        >>> pool_windows(np.ones((1, 4, 4, 1)), {"pool": [2, 2], "strides": [2, 2]}, "p",
        ...              0).shape
        (1, 2, 2, 1, 2, 2)
    """
    kh, kw = (int(k) for k in attrs["pool"])
    strides = tuple(int(s) for s in attrs.get("strides", (kh, kw)))
    pads = pads_of(x.shape[1:3], (kh, kw), {**attrs, "strides": strides}, what)
    return _windows(_pad_hw(x, pads, pad_value), (kh, kw), strides)


def border_ratios(hw: tuple[int, int], attrs: dict) -> np.ndarray:
    """Per output position of an average pool on an (H, W) map: real cells / window cells,
    i.e. the chip's value over the model's for a constant map (1 inside, < 1 at the border).

    Example:
        >>> border_ratios((2, 2), {"pool": [2, 2], "strides": [2, 2], "padding": "SAME_END"})
        array([[1.]])
    """
    ones = np.ones((1, int(hw[0]), int(hw[1]), 1))
    windows = pool_windows(ones, attrs, "border", 0)
    return windows.sum(axis=(-2, -1))[0, :, :, 0] / (windows.shape[-1] * windows.shape[-2])


def calculate_exponent(n: int, max_value: int) -> int:
    """Largest k with ⌊2^k / n⌋ < max_value (ESP-DL ``dl::tool::calculate_exponent``).

    Example:
        >>> calculate_exponent(9, 16384), calculate_exponent(1, 64)
        (17, 5)
    """
    k = 0
    while (2 ** (k + 1)) // n < max_value:
        k += 1
    return k


def average(total: np.ndarray, n: int, e_in: int, e_out: int, bits: int) -> np.ndarray:
    """Sum of ``n`` elements -> their mean at ``e_out``: ``Σx·⌊2^k/n⌋`` floor-shifted by
    ``e_out − e_in + k`` (k from :func:`calculate_exponent`, max 16384 s16 / 64 s8), saturated.
    APPROXIMATE: this is ESP-DL v3's esp32s3 rule; v1's is not published.

    Example:
        >>> average(np.array([40]), 4, 0, 0, 16).tolist()
        [10]
    """
    k = calculate_exponent(n, 16384 if bits == 16 else 64)
    inv = (2**k) // n
    return saturate(floor_shift(total * inv, e_out - e_in + k), bits)
