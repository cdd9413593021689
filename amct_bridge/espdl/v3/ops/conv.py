"""Conv (1-D and 2-D, plain and depthwise): ``dl_module_conv.hpp``, ``dl_base_conv2d.cpp``,
``dl_base_depthwise_conv2d.cpp``, ``dl_base_activate_buffer.hpp``. Gemm and MatMul run through
:func:`conv_core` / :func:`requant_output` as the runtime runs them as 1x1 convolutions.

Per-channel filters (one exponent per output channel, what esp-ppq writes for esp32p4 and
esp32s31, ESP-DL >= 3.3.1): the accumulator of output channel ``c`` (bias included) is shifted
right by its own ``e_out - e_w[c] - e_in`` and rounded like the per-tensor shift (half to even on
esp32p4). From the sources: ``ConvOpArgs`` (``dl_base.hpp``, ``CONFIG_PIE_V2_BOOST``) fills
``tie_filter_channel_factor[c]`` with exactly that shift, and the esp32p4 kernels
(``dl_esp32p4_s8_conv2d.S`` and the s16 / unaligned / depthwise twins) apply it per lane with
``esp.srcmb.s{8,16}.q.qacc`` (the per-tensor kernels use ``esp.srcmb.s{8,16}.qacc`` with one
shift) and, for the channels beyond the last full vector, ``esp.srs.s.xacc`` with the channel's
shift: a shift, no multiply. The bias is added as stored (at ``e_in + e_w[c]``) before it.
From the files: that the per-channel shift rounds half to even. 178 accumulators of the
esp32p4_8 / esp32s31_8 suite files lie exactly half-way with an even value below, where half up
and half to even part, and half up fails 10 of those files; with half to even every per-channel
Conv, Gemm and ConvTranspose file of the suite is equal (int8 exact; int16 within the chip's
±1, each int16 miss within 0.003 of a half step, esp-ppq's float32 reference). No suite file
has a per-channel shift <= 0 or a per-channel MatMul: a shift <= 0 is computed as an exact
left shift, as the per-tensor path does, with a note that no file pins the chip there. Other
chips have no per-channel kernel (``ConvOpArgs`` leaves the factors NULL): refused.

Example:
    >>> shifts = np.array([1, 2])  # e_out - e_w[c] - e_in of two output channels
    >>> requant(np.array([[6, 6], [10, 10], [-6, -6]]), shifts, None, True, np.dtype(np.int8))
    array([[ 3,  2],
           [ 5,  2],
           [-3, -2]], dtype=int8)
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node, Tensor, filter_nhwc
from amct_bridge.espdl.v3.ops._base import Context, saturate, shift_round

OP_TYPES = ("Conv",)


#: The chips whose kernels compute per-channel filters (PIE-V2: ``CONFIG_PIE_V2_BOOST``).
PER_CHANNEL_TARGETS = ("esp32p4", "esp32s31")


def fused_activation(ctx: Context, node: Node) -> str:
    """The node's fused ``activation`` (Linear or Relu); the others are refused.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> fused_activation(Context(EspdlModel([], {}), "c"), Node("n", "Conv", [], []))
        'Linear'
    """
    act = node.attributes.get("activation", "Linear")
    if act not in ("Linear", "Relu"):
        # dl_base.hpp's ConvOpArgs leaves LeakyReLU/PReLU parameters unset ("do not support")
        raise ctx.refuse(node, f"fused activation {act!r} is not simulated (Linear, Relu are)")
    return act


def requant(
    acc: np.ndarray,
    shift: int | np.ndarray,
    act: str | None,
    half_even: bool,
    dtype: np.dtype,
) -> np.ndarray:
    """The output stage of a conv: ``acc · 2^-shift`` rounded, ReLU'd, saturated to ``dtype``.

    ``shift`` is one int (per-tensor) or one per output channel (the last axis of ``acc``).

    Example:
        >>> requant(np.array([2, 6, -6, 300]), 2, "Relu", True, np.dtype(np.int8)).tolist()
        [0, 2, 0, 75]
    """
    out = shift_round(acc, shift, half_even)
    if act == "Relu":
        np.maximum(out, 0, out=out)
    return saturate(out, dtype)


def requant_output(
    ctx: Context, node: Node, acc: np.ndarray, shift: int | np.ndarray, act: str, dtype: np.dtype
) -> np.ndarray:
    """:func:`requant` with the target's rounding (half to even on esp32p4).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "esp32s3")
        >>> requant_output(ctx, Node("n", "Conv", [], []), np.array([2, 6]), 2, "Linear",
        ...                np.dtype(np.int8)).tolist()
        [1, 2]
    """
    return requant(acc, shift, act, ctx.half_even, dtype)


def note_qacc_reach(ctx: Context, node: Node, lanes: np.ndarray) -> None:
    """Note an esp32s3 int8 accumulator beyond the 20-bit QACC lanes (``lanes``: the channels
    the TIE728 kernels sum in QACC): the exact int64 sums may differ from the chip's there, and
    the note says so rather than guess the wrap.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "esp32s3")
        >>> node = Node("n", "Conv", [], [], {"quant_type": "S8"})
        >>> note_qacc_reach(ctx, node, np.array([1 << 19])); ctx.notes[0][:40]
        "node 'n' (Conv): an accumulator reaches "
    """
    if ctx.target != "esp32s3" or ctx.out_dtype(node) != np.int8:
        return
    peak = max(int(lanes.max(initial=0)), -int(lanes.min(initial=0)))
    if peak >= 1 << 19:
        ctx.notes.append(
            f"node {node.name!r} ({node.op_type}): an accumulator reaches {peak}, beyond the "
            "20-bit QACC lanes of esp32s3; the chip's result may differ there"
        )


def _bias(ctx: Context, node: Node, n: int, depthwise: bool) -> np.ndarray | None:
    # the integers as stored (at e_in + e_w, per channel for a per-channel filter): the kernels
    # load them into the accumulator unscaled
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


def filter_shift(ctx: Context, node: Node, filt: Tensor, n: int) -> int | np.ndarray:
    """``e_out - e_w - e_in``: one int, or one per output channel for a per-channel filter.

    Per-channel filters run on the PIE-V2 chips only (``ConvOpArgs`` in ``dl_base.hpp`` fills
    ``tie_filter_channel_factor`` under ``CONFIG_PIE_V2_BOOST``); elsewhere they are refused.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("x", [1], 3, [-5])],
        ...                outputs=[ValueInfo("y", [1], 3, [-3])])
        >>> node = Node("c", "Conv", ["x", "w"], ["y"])
        >>> w = Tensor("w", np.zeros(2, np.int8), [-7, -9])
        >>> filter_shift(Context(m, "esp32p4"), node, w, 2).tolist()
        [9, 11]
    """
    base = ctx.exponent(node.outputs[0], node) - ctx.exponent(node.inputs[0], node)
    if len(filt.exponents) == 1:
        return base - filt.exponent
    if ctx.target not in PER_CHANNEL_TARGETS:
        raise ctx.refuse(
            node,
            f"filter {filt.name!r} has {len(filt.exponents)} per-channel exponents: only the "
            "PIE-V2 chips (esp32p4, esp32s31) compute per-channel Conv/Gemm/MatMul (ESP-DL >= "
            f"3.3.1); on {ctx.target} the runtime has no per-channel kernel (dl_base.hpp)",
        )
    if len(filt.exponents) != n:
        raise ctx.refuse(
            node,
            f"filter {filt.name!r} has {len(filt.exponents)} exponents for {n} output channels",
        )
    shift = base - np.asarray(filt.exponents, np.int64)
    if (shift <= 0).any():
        ctx.notes.append(
            f"node {node.name!r} ({node.op_type}): a per-channel shift <= 0 "
            f"({int(shift.min())}) is computed as an exact left shift; no test file pins what "
            "the esp32p4 kernel does there"
        )
    if (shift == shift[0]).all():  # one value: the scalar path, same arithmetic
        return int(shift[0])
    return shift


def conv_core(ctx: Context, node: Node, x: np.ndarray, rank: int) -> np.ndarray:
    """The Conv of ``x`` (``rank`` 1: NWC, 2: NHWC) by the node's filter, bias and activation.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> w = Tensor("w", np.array([1, 1], np.int8).reshape(1, 1, 1, 2), [-1, -2], "NHWC")
        >>> m = EspdlModel([], {"w": w}, inputs=[ValueInfo("x", [3, 1, 1, 1], 3, [0])],
        ...                outputs=[ValueInfo("y", [3, 1, 1, 2], 3, [0])])
        >>> ctx = Context(m, "esp32p4")
        >>> x = np.array([6, 10, -6], np.int8).reshape(3, 1, 1, 1)
        >>> y = conv_core(ctx, Node("c", "Conv", ["x", "w"], ["y"]), x, 2)
        >>> y[:, 0, 0].tolist()  # channel 0: x/2, channel 1: x/4 (2.5 -> 2, half to even)
        [[3, 2], [5, 2], [-3, -2]]
    """
    act = fused_activation(ctx, node)
    filt = ctx.initializer(node.inputs[1], node)
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
    shift = filter_shift(ctx, node, filt, w.shape[0])  # refuses before the sums
    if len(pads) != 4 or len(strides) != 2 or len(dilations) != 2:
        raise ctx.refuse(
            node, f"pads {pads}, strides {strides}, dilations {dilations} for a rank-{rank} conv"
        )
    top, left, bottom, right = pads
    kh, kw = w.shape[1], w.shape[2]
    (sh, sw), (dh, dw) = strides, dilations
    padded = (x.shape[0], x.shape[1] + top + bottom, x.shape[2] + left + right, x.shape[3])
    ctx.check_elements(node, padded, "padded input")
    ho = (padded[1] - dh * (kh - 1) - 1) // sh + 1
    wo = (padded[2] - dw * (kw - 1) - 1) // sw + 1
    if ho < 1 or wo < 1:
        raise ctx.refuse(node, f"the dilated kernel is larger than the padded input {padded[1:3]}")
    # the gathered windows (few input channels) or the per-position products
    ctx.check_elements(node, (x.shape[0], ho, wo, max(w.shape[0], channels) * kh * kw), "windows")
    xp = np.pad(x.astype(np.int64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    n = w.shape[0]
    # float sums of integers are exact, in any order, while every partial sum stays below
    # 2^24 (float32) or 2^53 (float64): then BLAS computes the integer sums (the int64 matmul
    # of numpy has no BLAS and is ~20x slower); float32 where it is exact (most int8 convs)
    bound = 1 << (8 * x.dtype.itemsize - 1) if x.dtype.kind == "i" else int(np.abs(x).max())
    reach = bound * int(np.abs(w).max(initial=0))  # the type's bound: no pass over the data
    total = reach * kh * kw * (1 if depthwise else w.shape[-1])
    exact = total < 2**53
    work = np.float32 if total < 2**24 else np.float64 if exact else np.int64
    acc = np.zeros((x.shape[0], ho, wo, n), work)
    xw, ww = xp.astype(work, copy=False), w.astype(work, copy=False)
    patches = [
        xw[:, i * dh : i * dh + sh * (ho - 1) + 1 : sh, j * dw : j * dw + sw * (wo - 1) + 1 : sw]
        for i in range(kh)
        for j in range(kw)
    ]
    if depthwise:
        product = np.empty_like(acc)  # one buffer for the products: no temporary per position
        for k, patch in enumerate(patches):
            np.multiply(patch, ww[:, k // kw, k % kw, 0], out=product)
            acc += product
    elif len(patches) > 1 and w.shape[-1] * len(patches) <= 256:
        # few input channels (a first conv on RGB): one matmul over the gathered windows
        # instead of kh*kw thin ones; the sums are the same integers
        acc += np.concatenate(patches, axis=-1) @ ww.transpose(1, 2, 3, 0).reshape(-1, n)
    else:
        for k, patch in enumerate(patches):
            acc += patch @ ww[:, k // kw, k % kw, :].T
    acc = acc.astype(np.int64) if exact else acc
    bias = _bias(ctx, node, n, depthwise)
    if bias is not None:
        acc += bias
    note_qacc_reach(ctx, node, acc if depthwise else acc[..., : n // 16 * 16])
    out = requant_output(ctx, node, acc, shift, act, ctx.out_dtype(node))
    return out[:, 0] if rank == 1 else out


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """A Conv node: input NWC or NHWC, filter in the target's file order, optional bias.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> w = Tensor("w", np.array([1, 2, 1], np.int8).reshape(3, 1, 1), [0], "NWC")  # k=3
        >>> m = EspdlModel([], {"w": w}, inputs=[ValueInfo("x", [1, 4, 1], 3, [0])],
        ...                outputs=[ValueInfo("y", [1, 2, 1], 3, [1])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["x"] = np.array([1, 2, 3, 4], np.int8).reshape(1, 4, 1)
        >>> node = Node("c", "Conv", ["x", "w"], ["y"], {"kernel_shape": [3]})
        >>> compute(ctx, node)[0][0, :, 0].tolist()  # (1+4+3)/2 = 4, (2+6+4)/2 = 6
        [4, 6]
    """
    x = ctx.value(node.inputs[0], node)
    if x.ndim not in (3, 4):
        raise ctx.refuse(node, f"input of rank {x.ndim} (1-D NWC or 2-D NHWC expected)")
    return [conv_core(ctx, node, x, x.ndim - 2)]
