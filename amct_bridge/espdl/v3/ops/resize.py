"""Resize: ``dl_module_resize.hpp``, ``dl_base_resize.hpp`` / ``.cpp``, ``isa/*/dl_*_s8_resize.S``.

The module reads ``mode``, ``coordinate_transformation_mode`` (only "align_corners" changes
anything) and the constant ``scales`` (input 2) or ``sizes`` (input 3, which wins), both in
ONNX's NCW / NCHW order, while the data is NWC / NHWC; it resizes the W (3-D) or H and W (4-D)
axes of the first batch only (the kernel never looks past it): a model whose input declares a
larger batch is refused, while several samples given to a batch-1 model (an evaluation) are
resized one by one, as separate runs. Output sizes: ``sizes`` as given, else ``(int)(in ·
scale)`` in float32.

- ``nearest`` (every coordinate mode: the runtime always uses "asymmetric" with floor, as
  PyTorch's default): ``in = min((int)(out · (1 / scale)), in_len - 1)`` in float32. A value is
  rescaled from the input's exponent to the output's by ``2^k`` (``k = e_in - e_out > 0``) or a
  rounded right shift: on esp32s3 / esp32p4 in the PIE kernels (the factor is a broadcast int8
  byte, the shift rounds per target, the result saturates), in C on the ``c`` target
  (``tool::round`` of the float, converted to int8 without saturation, as C wraps it).
- ``linear`` (no PIE kernel on any chip: ``resize_linear_c1``), in float32: ``fx = (out + 0.5)
  · (1 / scale) - 0.5`` ("half_pixel"; ``out · (1 / scale)`` with ``scale = (out_len - 1) /
  (in_len - 1)`` for "align_corners"), ``in = floor(fx)``, ``r1 = fx - in``, clamped to ``in =
  0, r1 = 0`` below and ``in = in_len - 2, r1 = 1`` at the end, ``r0 = 1 - r1``; each pair of
  neighbours (values dequantized exactly, ``int · 2^e_in``) gives ``v0 · r0 + v1 · r1``: along W
  first (one cached row per input row), then along H; the result, times ``2^-e_out``, is rounded
  by ``tool::round`` and saturated. esp-dl is built with ``-O3 -ffast-math`` (its
  ``CMakeLists.txt``), so on the chips with a hardware FPU (esp32s3: ``madd.s``; esp32p4:
  ``fmadd.s``) GCC fuses ``v0 · r0 + (v1 · r1)`` and ``(out + 0.5) · inv - 0.5`` into single
  rounding multiply-adds (checked on GCC's RISC-V output for the same code); the ``c`` target
  is simulated without fusion (the soft-float chips; esp32's FPU would fuse too). ``1 / scale``
  is taken correctly rounded. The suite's files (scales 2 and 3) do not tell fused from unfused;
  non-dyadic scales such as 3.5 do (see the tests).
- int16: ``resize<int16_t>`` is empty in the runtime (it computes nothing): only a resize by 1
  at one exponent (the module's ``output->assign(input)``, a copy) is simulated.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate, shift_round

OP_TYPES = ("Resize",)

_F32 = np.float32
#: Targets whose linear kernel runs on a hardware FPU with fused multiply-add.
_FUSED_TARGETS = ("esp32s3", "esp32p4")


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a · b + c`` rounded once to float32 (the FPU's fused multiply-add), element-wise.

    The float64 product of two float32 values is exact; the float64 sum's own rounding error is
    recovered exactly (TwoSum) and decides the float32 rounding when the sum falls on a tie.

    Example:
        >>> a, c = np.float32(1 + 2.0**-12), np.float32(-(1 + 2.0**-11))
        >>> float(fma32(a, a, c)) == 2.0**-24, float(a * a + c)  # a·a rounds to even, unfused
        (True, 0.0)
    """
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c64 = np.asarray(c, np.float64)
    s = p + c64
    bv = s - p
    err = (p - (s - bv)) + (c64 - bv)  # exact: p + c == s + err
    r = s.astype(_F32)
    toward = np.nextafter(r, np.where(s > r.astype(np.float64), _F32(np.inf), _F32(-np.inf)))
    diff = s - r.astype(np.float64)
    tie = (diff != 0) & (np.abs(diff) * 2 == np.abs(toward.astype(np.float64) - r))
    # on a tie the exact value lies past the midpoint when err points the same way as diff
    return np.where(tie & (err != 0) & ((err > 0) == (diff > 0)), toward, r).astype(_F32)


def _lerp(v0: np.ndarray, r0: np.ndarray, v1: np.ndarray, r1: np.ndarray, fused: bool):
    """``v0 · r0 + v1 · r1`` in float32, fused as GCC fuses it (the first product)."""
    if fused:
        return fma32(v0, r0, (v1 * r1).astype(_F32))
    return ((v0 * r0).astype(_F32) + (v1 * r1).astype(_F32)).astype(_F32)


def linear_coefficients(
    n_out: int, n_in: int, scale: np.float32, align_corners: bool, fused: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first neighbour, its weight r0, the second's weight r1) per output position.

    ``linear_coeffs`` of ``dl_base_resize.cpp``; the first neighbour is ``n_in - 2`` at the end
    (-1 for a single input position, where its weight is 0: it is read as position 0 here).

    Example:
        >>> i, r0, r1 = linear_coefficients(4, 2, np.float32(2), False, False)
        >>> i.tolist(), r0.tolist(), r1.tolist()
        ([0, 0, 0, 0], [1.0, 0.75, 0.25, 0.0], [0.0, 0.25, 0.75, 1.0])
    """
    inv = _F32(1) / _F32(scale)
    out = np.arange(n_out, dtype=_F32)
    with np.errstate(invalid="ignore", over="ignore"):
        if align_corners:
            fx = (out * inv).astype(_F32)
        elif fused:
            fx = fma32(out + _F32(0.5), inv, _F32(-0.5))
        else:
            fx = ((out + _F32(0.5)) * inv).astype(_F32) - _F32(0.5)
    first = np.floor(fx).astype(np.int64)
    fx = (fx - first.astype(_F32)).astype(_F32)
    low = first < 0
    first, fx = np.where(low, 0, first), np.where(low, _F32(0), fx)
    high = first >= n_in - 1
    first, fx = np.where(high, n_in - 2, first), np.where(high, _F32(1), fx)
    r1 = fx.astype(_F32)
    return np.maximum(first, 0), (_F32(1) - r1).astype(_F32), r1


def _sizes(ctx: Context, node: Node, x: np.ndarray) -> tuple[list[int], list[np.float32]]:
    """Output lengths and float32 scales of the resized axes (W, or H and W)."""
    spatial = list(x.shape[1:-1])
    names = list(node.inputs) + ["", ""]
    if names[3]:
        sizes = [int(v) for v in ctx.initializer(names[3], node).data.reshape(-1)]
        if len(sizes) != x.ndim:
            raise ctx.refuse(node, f"sizes {sizes} for a rank-{x.ndim} input")
        out = sizes[2:]
        return out, [_F32(o) / _F32(i) for o, i in zip(out, spatial, strict=True)]
    if names[2]:
        scales = ctx.initializer(names[2], node).data.reshape(-1).astype(_F32)
        if len(scales) != x.ndim:
            raise ctx.refuse(node, f"scales {scales.tolist()} for a rank-{x.ndim} input")
        scales = list(scales[2:])
        if not all(np.isfinite(scales)) or min(scales, default=1) <= 0:
            raise ctx.refuse(node, f"scales {[float(s) for s in scales]}, expected finite, > 0")
        return [int(_F32(i) * s) for i, s in zip(spatial, scales, strict=True)], scales
    raise ctx.refuse(node, "needs constant scales (input 2) or sizes (input 3)")


def _nearest(ctx: Context, x: np.ndarray, out_len: list[int], scales: list, shift: int):
    """Nearest, asymmetric, floor: the source of each output position, then the rescale."""
    out = x
    for axis, (n_out, scale) in enumerate(zip(out_len, scales, strict=True), start=1):
        inv = _F32(1) / scale
        src = (np.arange(n_out, dtype=_F32) * inv).astype(_F32).astype(np.int64)
        out = np.take(out, np.minimum(src, x.shape[axis] - 1), axis=axis)
    if shift == 0:
        return out
    values = out.astype(np.int64)
    if ctx.target == "c":
        # resize_nearest_c1: tool::round((float)x · 2^k / 2^s), stored without saturation
        rounded = shift_round(values, shift, ctx.half_even)
        return rounded.astype(x.dtype)  # C's conversion to int8 wraps (two's complement)
    # PIE kernels: x times the output_scale byte (ee.vldbc.8 of 2^k), shifted, saturated
    factor = int(np.int64(1 << max(-shift, 0)).astype(np.int8))
    return saturate(shift_round(values * factor, max(shift, 0), ctx.half_even), x.dtype)


def _linear(ctx: Context, node: Node, x, out_len, scales, e_in: int, e_out: int) -> np.ndarray:
    """``resize_linear_c1``: W, then H, in float32 (fused on the FPU chips)."""
    fused = ctx.target in _FUSED_TARGETS
    align = node.attributes.get("coordinate_transformation_mode") == "align_corners"
    in_len = list(x.shape[1:-1])
    if align:
        if any(n < 2 for n in in_len):
            raise ctx.refuse(node, "align_corners with an axis of length 1 (0/0 in the runtime)")
        scales = [_F32(o - 1) / _F32(i - 1) for o, i in zip(out_len, in_len, strict=True)]
    values = x.astype(_F32) * _F32(2.0**e_in)  # dequantize: exact; axis 0: separate runs
    coeffs = [
        linear_coefficients(o, i, s, align, fused)
        for o, i, s in zip(out_len, in_len, scales, strict=True)
    ]
    i0, r0, r1 = coeffs[-1]  # along W (axis -2 of the NWC / HWC values)
    i1 = np.minimum(i0 + 1, in_len[-1] - 1)
    rows = _lerp(values[..., i0, :], r0[:, None], values[..., i1, :], r1[:, None], fused)
    if x.ndim == 4:  # then along H, from the cached rows
        j0, q0, q1 = coeffs[0]
        j1 = np.minimum(j0 + 1, in_len[0] - 1)
        rows = _lerp(rows[:, j0], q0[:, None, None], rows[:, j1], q1[:, None, None], fused)
    scaled = (rows * _F32(2.0**-e_out)).astype(_F32)
    return saturate(round_float(scaled, ctx.half_even), x.dtype)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """The resized NWC / NHWC tensor, at the output's exponent.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor, ValueInfo
        >>> s = Tensor("s", np.float32([1, 1, 2]), [0])
        >>> vi = [ValueInfo("x", [1, 2, 1], 3, [0]), ValueInfo("y", [1, 4, 1], 3, [0])]
        >>> ctx = Context(EspdlModel([], {"s": s}, value_info=vi), "esp32s3")
        >>> ctx.values["x"] = np.int8([[[0], [10]]])
        >>> attrs = {"mode": "linear", "quant_type": "S8"}
        >>> compute(ctx, Node("r", "Resize", ["x", "", "s"], ["y"], attrs))[0].ravel().tolist()
        [0, 3, 8, 10]
    """
    mode = str(node.attributes.get("mode", "nearest"))
    if mode not in ("nearest", "linear"):
        raise ctx.refuse(node, f"mode {mode!r}: the runtime resizes 'nearest' and 'linear' only")
    dtype = ctx.out_dtype(node)
    x = np.asarray(ctx.value(node.inputs[0], node))
    if x.ndim not in (3, 4):
        raise ctx.refuse(node, f"a rank-{x.ndim} input (the runtime resizes NWC or NHWC)")
    info = ctx.infos.get(node.inputs[0])
    declared = info.shape[0] if info is not None and info.shape else 1
    if isinstance(declared, int) and declared > 1:
        raise ctx.refuse(node, f"batch {declared}: the runtime's kernel resizes the first only")
    out_len, scales = _sizes(ctx, node, x)
    if min(out_len, default=1) < 0 or not all(np.isfinite(scales)):
        raise ctx.refuse(node, f"output lengths {out_len} from scales {[float(s) for s in scales]}")
    ctx.check_elements(node, (x.shape[0], *out_len, x.shape[-1]), "output")
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    if dtype == np.int16:
        if all(s == 1 for s in scales) and e_in == e_out:
            return [x.copy()]  # output->assign(input): the int16 kernel itself is empty
        raise ctx.refuse(
            node,
            "int16: the runtime's resize<int16_t> computes nothing (dl_base_resize.cpp; "
            "operator_support_state.md lists Resize for int8 only)",
        )
    if mode == "nearest":
        return [_nearest(ctx, x, out_len, scales, e_out - e_in)]
    return [_linear(ctx, node, x, out_len, scales, e_in, e_out)]
