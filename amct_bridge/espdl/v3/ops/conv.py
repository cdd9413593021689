"""Conv (1-D and 2-D, plain and depthwise): ``dl_module_conv.hpp``, ``dl_base_conv2d.cpp``,
``dl_base_depthwise_conv2d.cpp``, ``dl_base_activate_buffer.hpp``. Gemm and MatMul run through
:func:`conv_core` as the runtime runs them as 1x1 convolutions.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node, Tensor, filter_nhwc
from amct_bridge.espdl.v3.ops._base import Context, saturate, shift_round

OP_TYPES = ("Conv",)


def fused_activation(ctx: Context, node: Node) -> str:
    act = node.attributes.get("activation", "Linear")
    if act not in ("Linear", "Relu"):
        # dl_base.hpp's ConvOpArgs leaves LeakyReLU/PReLU parameters unset ("do not support")
        raise ctx.refuse(node, f"fused activation {act!r} is not simulated (Linear, Relu are)")
    return act


def requant_output(
    ctx: Context, node: Node, acc: np.ndarray, shift: int, act: str, dtype: np.dtype
) -> np.ndarray:
    out = shift_round(acc, shift, ctx.half_even)
    if act == "Relu":
        out = np.maximum(out, 0)
    return saturate(out, dtype)


def _bias(ctx: Context, node: Node, n: int, depthwise: bool) -> np.ndarray | None:
    if len(node.inputs) < 3 or not node.inputs[2]:
        return None
    bias = ctx.initializer(node.inputs[2], node).data.reshape(-1).astype(np.int64)
    if bias.size != n:
        raise ctx.refuse(node, f"bias has {bias.size} values for {n} output channels")
    if ctx.target == "esp32s3" and ctx.out_dtype(node) == np.int8:
        # reset_bias_layout (dl_tensor_base.cpp) keeps 20 bits per lane for the QACC: the
        # aligned channels (all of a depthwise conv) wrap to signed 20 bits
        count = n if depthwise else n // 16 * 16
        low = bias[:count] & 0xFFFFF
        bias[:count] = np.where(low >= 1 << 19, low - (1 << 20), low)
    return bias


def per_tensor_filter(ctx: Context, node: Node, filt: Tensor) -> None:
    """Refuse per-channel filter exponents (esp-ppq writes them for esp32p4 Conv/Gemm, ESP-DL
    >= 3.3.1): only the esp32p4 assembly computes them. The C fallback's per-channel branch
    (dl_base_activate_buffer.hpp) reads ``filter_channel_factor``, which nothing sets
    (dl_base.hpp fills ``tie_filter_channel_factor`` for the assembly), and its loaders are never
    called (dl_base_conv2d.cpp), so there is no C reference to follow bit for bit."""
    if len(filt.exponents) > 1:
        raise ctx.refuse(
            node,
            f"filter {filt.name!r} has {len(filt.exponents)} per-channel exponents: only the "
            "esp32p4 assembly kernels compute per-channel Conv/Gemm (ESP-DL >= 3.3.1), the C "
            "reference has no working path for them, so they are not simulated",
        )


def conv_core(ctx: Context, node: Node, x: np.ndarray, rank: int) -> np.ndarray:
    act = fused_activation(ctx, node)
    filt = ctx.initializer(node.inputs[1], node)
    per_tensor_filter(ctx, node, filt)
    group = int(node.attributes.get("group", 1))
    channels = x.shape[-1]
    if group not in (1, channels):
        raise ctx.refuse(node, f"group {group} (the runtime has plain and depthwise convs only)")
    depthwise = group != 1
    w = filter_nhwc(filt, group, ctx.target).astype(np.int64)  # [N, kh, kw, C]
    if rank == 1:
        w = w[:, None]  # [N, 1, kw, C]
        x = x[:, None]  # [B, 1, W, C]
    kernel = node.attributes.get("kernel_shape") or list(w.shape[1:3])
    strides = list(node.attributes.get("strides") or [1] * rank)
    dilations = list(node.attributes.get("dilations") or [1] * rank)
    pads = list(node.attributes.get("pads") or [0] * (2 * rank))
    if rank == 1:
        strides, dilations = [1, *strides], [1, *dilations]
        pads = [0, pads[0], 0, pads[1]]  # ONNX [begin..., end...] -> [top, left, bottom, right]
    if list(w.shape[1:3]) != [1] * (2 - len(kernel)) + [int(k) for k in kernel]:
        raise ctx.refuse(node, f"kernel_shape {kernel} does not match the filter {filt.dims}")
    if (depthwise and w.shape[0] != channels) or (not depthwise and w.shape[-1] != channels):
        raise ctx.refuse(node, f"filter {filt.dims} does not fit input channels {channels}")
    top, left, bottom, right = pads
    xp = np.pad(x.astype(np.int64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    kh, kw = w.shape[1], w.shape[2]
    (sh, sw), (dh, dw) = strides, dilations
    ho = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    n = w.shape[0]
    # float64 sums are exact while every partial sum stays below 2^53: then BLAS computes the
    # integer sums (the int64 matmul of numpy has no BLAS and is ~20x slower)
    bound = 1 << (8 * x.dtype.itemsize - 1) if x.dtype.kind == "i" else int(np.abs(x).max())
    reach = bound * int(np.abs(w).max(initial=0))  # the type's bound: no pass over the data
    exact = reach * kh * kw * (1 if depthwise else w.shape[-1]) < 2**53
    work = np.float64 if exact else np.int64
    acc = np.zeros((x.shape[0], ho, wo, n), work)
    xw, ww = xp.astype(work, copy=False), w.astype(work, copy=False)
    for i in range(kh):
        for j in range(kw):
            patch = xw[
                :,
                i * dh : i * dh + sh * (ho - 1) + 1 : sh,
                j * dw : j * dw + sw * (wo - 1) + 1 : sw,
            ]
            if depthwise:
                acc += patch * ww[:, i, j, 0]
            else:
                acc += patch @ ww[:, i, j, :].T
    acc = acc.astype(np.int64) if exact else acc
    bias = _bias(ctx, node, n, depthwise)
    if bias is not None:
        acc += bias
    if ctx.target == "esp32s3" and ctx.out_dtype(node) == np.int8:
        # the TIE728 kernels accumulate the aligned channels in 20-bit QACC lanes; the exact
        # int64 sums here may then differ from the chip's: say so rather than guess the wrap
        lanes = acc if depthwise else acc[..., : n // 16 * 16]
        peak = max(int(lanes.max(initial=0)), -int(lanes.min(initial=0)))
        if peak >= 1 << 19:
            ctx.notes.append(
                f"node {node.name!r} ({node.op_type}): an accumulator reaches {peak}, beyond the "
                "20-bit QACC lanes of esp32s3; the chip's result may differ there"
            )
    shift = ctx.exponent(node.outputs[0], node) - filt.exponent - ctx.exponent(node.inputs[0], node)
    out = requant_output(ctx, node, acc, shift, act, ctx.out_dtype(node))
    return out[:, 0] if rank == 1 else out


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    if x.ndim not in (3, 4):
        raise ctx.refuse(node, f"input of rank {x.ndim} (1-D NWC or 2-D NHWC expected)")
    return [conv_core(ctx, node, x, x.ndim - 2)]
