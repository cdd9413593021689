"""Lowerings of the model input and of the layers with a filter: Conv2D / DepthwiseConv2D /
Dense chains (:class:`~amct_bridge.espdl.plan.Chain`: a folded BatchNormalization, a fused
ReLU), their 1-D and dilated forms, and Conv2DTranspose as ``InsertZeros`` + ``Conv``.

Example:
    >>> transpose_pads(4, 3, 2, "same"), transpose_pads(4, 3, 2, "valid")
    ((8, 2, 1), (9, 2, 2))
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import ExportError, QuantError
from amct_bridge.espdl.checks import as_float32
from amct_bridge.espdl.plan import Chain
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.exponents import (
    FIXED_RANGES,
    bias_bits,
    interval_bound,
    keep_mac_shift,
    preactivation_range,
)
from amct_bridge.espdl.v3.lowering.activation import ACTIVATION_OPS, activation
from amct_bridge.espdl.v3.lowering.emitter import Emitter, no_lowering, pair, same_pads
from amct_bridge.espdl.v3.model import filter_file_order
from amct_bridge.espdl.v3.ops.conv import PER_CHANNEL_TARGETS
from amct_bridge.quant.espdl import auto_exponent, channel_exponents
from amct_bridge.quant.fold import fold_batchnorm

__all__ = ["HOST_KINDS", "lower_chain", "lower_conv_transpose", "lower_input", "transpose_pads"]

#: Input preprocessing the host applies before quantizing the input.
HOST_KINDS = ("Rescaling", "Normalization")


def lower_input(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """A model input: its exponent from the first calibrated range reading it."""
    dims = tuple(layer.attrs.get("shape") or ())
    if any(d is None or int(d) < 1 for d in dims):  # keras.Input((None, 10)): a variable length
        raise ExportError(
            f"model input {layer.name!r}: shape {dims} has a dimension of unknown size; the "
            "ESP-DL v3 runtime runs fixed shapes: build the model for export with a fixed "
            "size (e.g. keras.Input((steps, features)))"
        )
    shape = [1, *[int(s) for s in dims]]
    probe, seen = layer.name, {layer.name}
    while True:  # host preprocessing: the chip input is its output
        users = em.consumers.get(probe, [])
        if len(users) == 1 and users[0].kind in HOST_KINDS and users[0].name not in seen:
            probe = users[0].name
            seen.add(probe)
            continue
        break
    found = em.found(probe)
    if found is None:
        readers = ", ".join(f"{u.name!r} ({u.kind or u.op})" for u in em.consumers.get(probe, []))
        raise ExportError(
            f"model input {layer.name!r}: no calibrated range for it (no sidecar input "
            "range of a layer reading it, no record scale_d): pass the calibration sidecar"
            + (
                f"; the layers reading it ({readers}) have neither: were they calibrated "
                "(a layer the calibration does not quantize gets no entry)?"
                if readers
                else ""
            )
        )
    em.tensor(layer.name, found[0], found[1], shape, found[2])
    em.tensor_of[layer.name] = layer.name
    em.inputs.append(layer.name)
    em.host.append(layer.name)
    em.done(layer, "exported")


def lower_host(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Rescaling / Normalization right after the input: applied on the host."""
    if len(layer.inputs) != 1 or layer.inputs[0] not in em.host:
        em.refuse(layer, no_lowering(layer))  # on the host only right after the input
        return
    em.host.append(layer.name)
    em.tensor_of[layer.name] = ins[0]
    em.done(layer, "host")
    em.notes.append(
        f"layer {layer.name!r} ({layer.kind}) runs on the host: it is applied before the "
        "input is quantized (the .espdl input is its output)"
    )


def _weights(chain: Chain, kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Folded float64 filter as [N, kh, kw, C] and bias [N] (or None); ``kernel`` HWIO
    (dense: IO; depthwise: HWCM)."""
    head = chain.head
    kernel = as_float32(kernel, head.name, "kernel").astype(np.float64)
    if head.op == "dense":
        kernel = kernel.reshape(1, 1, *kernel.shape)
    if kernel.ndim != 4:
        raise ExportError(f"layer {head.name!r}: kernel of shape {kernel.shape}, expected 4-D")
    depthwise = head.op == "depthwise_conv2d"
    bias = head.weights.get("bias")
    if bias is not None:
        bias = as_float32(bias, head.name, "bias").astype(np.float64)
    if chain.bn is not None:
        w = chain.bn.weights
        if "mean" not in w or "variance" not in w:
            raise ExportError(f"layer {chain.bn.name!r}: BatchNormalization without stats")
        params = {k: as_float32(v, chain.bn.name, f"BN {k}") for k, v in w.items()}
        try:
            kernel, bias = fold_batchnorm(
                kernel,
                bias,
                params.get("gamma"),
                params.get("beta"),
                params["mean"],
                params["variance"],
                float(chain.bn.attrs.get("epsilon", 1e-3)),
                "HWCM" if depthwise else "HWIO",
                name=chain.bn.name,
            )
        except QuantError as err:
            raise ExportError(f"layer {chain.bn.name!r}: cannot fold: {err}") from None
        kernel = np.asarray(kernel, np.float64)
    if depthwise:
        return kernel.transpose(2, 0, 1, 3), bias  # (H, W, C, 1) -> (C, H, W, 1)
    return kernel.transpose(3, 0, 1, 2), bias  # HWIO -> (O, H, W, I)


def _geometry(chain: Chain, shape: list[int], kh: int, kw: int):
    """ONNX pads ``[t, l, b, r]``, strides, dilations and the output size of a 2-D conv."""
    head = chain.head
    sh, sw = pair(head.attrs.get("strides"), 1)
    dh, dw = pair(head.attrs.get("dilations"), 1)
    h, w = shape[1], shape[2]
    if chain.pads is not None:
        top, bottom, left, right = chain.pads
    elif str(head.attrs.get("padding", "valid")).lower() == "same":
        _, top, bottom = same_pads(h, kh, sh, dh)
        _, left, right = same_pads(w, kw, sw, dw)
    else:
        top = bottom = left = right = 0
    ho = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    wo = (w + left + right - (kw - 1) * dw - 1) // sw + 1
    return [top, left, bottom, right], [sh, sw], [dh, dw], ho, wo


def lower_chain(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """A conv / depthwise conv / dense chain (its head is ``layer``): ``Conv`` or ``Gemm``."""
    chain = em.chains[layer.name]
    kernel = layer.weights.get("kernel")
    if kernel is None:
        raise ExportError(f"layer {layer.name!r}: no kernel weights")
    _emit_chain(em, chain, ins[0], kernel)


def _emit_chain(em: Emitter, chain: Chain, x: str, kernel: np.ndarray, geometry=None) -> None:
    head = chain.head
    w, bias = _weights(chain, kernel)
    n, kh, kw, c = w.shape
    in_shape = em.shapes[x]
    e_in = em.exps[x]
    # a 1-D conv (NWC input): the 2-D conv of height 1 it was given as, written as the
    # runtime's native 1-D Conv (esp-ppq's form: kernel_shape [k], filter [k, C, N])
    one_d = head.op != "dense" and len(in_shape) == 3
    if one_d and kh != 1:
        raise ExportError(f"layer {head.name!r}: kernel of height {kh} on a 1-D input {in_shape}")
    depthwise = head.op == "depthwise_conv2d"
    if depthwise and int(head.attrs.get("depth_multiplier", 1)) != 1:
        em.refuse(
            head,
            "depth_multiplier > 1: the ESP-DL v3 runtime's depthwise Conv has one output per "
            "channel (use multiplier 1 and a 1x1 Conv2D after it)",
        )
        return
    if depthwise and n != in_shape[-1] or not depthwise and c != in_shape[-1]:
        raise ExportError(
            f"layer {head.name!r}: filter for {c if not depthwise else n} input channels, "
            f"input has {in_shape[-1]}"
        )
    own = head.attrs.get("activation")
    separate = own if own not in (None, "relu") else None
    if separate is not None and separate not in ACTIVATION_OPS:
        em.refuse(
            head,
            f"activation {separate!r}: no ESP-DL v3 op computes it (the runtime's "
            "activations: see docs/espdl-v3.md); apply it in a layer of its own",
        )
        return
    tuned = em.tuning  # the search's choices (empty: the range rule)
    offset = tuned.bias_offsets.get(head.name)
    if offset is not None:  # corrects the chip's mean error on the calibration data
        bias = (np.zeros(n) if bias is None else bias) + np.asarray(offset, np.float64)
    try:
        e_w = auto_exponent(w, em.bits, name=f"{head.name} filter")
    except QuantError as err:
        raise ExportError(f"layer {head.name!r}: {err}") from None
    e_w = int(tuned.exponents.get((head.name, "filter"), e_w))
    limit = 2 ** (bias_bits(em.target, em.bits) - 1) - 1
    if bias is not None:
        peak = float(np.abs(bias).max(initial=0.0))
        while peak * 2.0 ** -(e_in + e_w) > limit:  # keep the bias inside its lanes
            e_w += 1
            em.notes.append(
                f"layer {head.name!r}: filter exponent raised to {e_w} so the bias fits "
                f"{bias_bits(em.target, em.bits)} bits on {em.target}"
            )
    # output range: after the fused activation, else the separate activation's input
    try:
        found = em.finder.output_exponent(chain)
    except ExportError:
        if separate is None or separate not in FIXED_RANGES:
            raise
        lo, hi = FIXED_RANGES[separate]
        found = (em.range_exp(lo, hi, head.name), f"the range of {separate}", (lo, hi))
    em.notes += em.finder.warnings
    em.finder.warnings.clear()
    flat = w.reshape(n, -1)
    x_lo, x_hi = em.range_of(x)
    bound = interval_bound(flat, bias, x_lo, x_hi)  # depthwise: [N, kh*kw], one channel
    if separate is not None:
        # the output before the activation: measured by the calibration (the sidecar's
        # preactivation), else estimated from the activation's output range (older sidecars)
        measured = em.finder.range_exponent(head.name, "preactivation")
        if measured is not None and measured[2] is not None and chain.bn is None:
            pre = measured[2]
            out_src = f"sidecar pre-activation range of {head.name!r} (before its {separate})"
        else:
            shift = float(np.abs(bias).max(initial=0.0)) if bias is not None else 0.0
            pre = preactivation_range(separate, found[2], bound, shift)
            out_src = f"pre-activation range of {separate} (from {found[1]})"
            if separate == "softmax":
                em.notes.append(
                    f"layer {head.name!r}: the range of its logits (before softmax) is "
                    f"estimated from the calibrated probabilities ({pre[0]:.3g}..{pre[1]:.3g}; "
                    "the sidecar has no measured logit range): calibrate again for a "
                    "measured one"
                )
        e_out = em.range_exp(*pre, head.name)
        out_rng = pre
        if (head.name, "preactivation") in tuned.exponents:
            e_out = int(tuned.exponents[(head.name, "preactivation")])
            out_src = f"searched on the calibration data (pre-activation of {head.name!r})"
    else:
        e_out, out_src, out_rng = found
    e_out, raised = keep_mac_shift(e_in, e_w, e_out)
    if raised:
        out_src += f"; raised to {e_out} for mac_shift >= 0 (e_in {e_in} + e_w {e_w})"
    if head.name in tuned.per_channel:
        e_w = _channel_exponents(em, head.name, w, bias, e_in, e_w, e_out, limit)
    wq = em.quantize(w, np.reshape(e_w, (-1, 1, 1, 1)))
    stored, note = filter_file_order(wq[:, 0] if one_d else wq, n if depthwise else 1, em.target)
    name = head.name
    fname = em.init(f"{name}/filter", stored, e_w, note)
    inputs = [x, fname]
    if bias is not None:
        bdt = np.int32 if em.bits == 8 else np.int64
        bq = em.quantize(bias, e_in + e_w, bdt)
        bq = np.clip(bq, -limit - 1, limit).astype(bdt)
        inputs.append(em.init(f"{name}/bias", bq, e_in + e_w))
    out_name = f"{name}/linear" if separate is not None else chain.last
    act = "Relu" if chain.activation == "Relu" else "Linear"
    if head.op == "dense":
        shape = [*in_shape[:-1], n]
        attrs = {"activation": act, "alpha": 1.0, "beta": 1.0, "transB": 0}
        em.node(name, "Gemm", inputs, [out_name], attrs)
    else:
        geo = geometry or _geometry
        if one_d:
            b, width, _ = in_shape
            pads, strides, dilations, _, wo = geo(chain, [b, 1, width, in_shape[2]], kh, kw)
            shape = [b, wo, n]
            pads, strides, dilations = [pads[1], pads[3]], strides[1:], dilations[1:]
            kernel_shape = [kw]  # ONNX 1-D pads [begin, end]: left, right
        else:
            pads, strides, dilations, ho, wo = geo(chain, in_shape, kh, kw)
            shape = [in_shape[0], ho, wo, n]
            kernel_shape = [kh, kw]
        attrs = {
            "activation": act,
            "dilations": dilations,
            "group": n if depthwise else 1,
            "kernel_shape": kernel_shape,
            "pads": pads,
            "strides": strides,
        }
        em.node(name, "Conv", inputs, [out_name], attrs)
    em.tensor(out_name, e_out, out_src, shape, out_rng)
    if separate is not None:
        activation(
            em,
            head,
            separate,
            out_name,
            alpha=head.attrs.get("alpha"),
            found=found,
            node=f"{name}/{separate}",  # node names are unique: the Conv/Gemm is 'name'
        )
    else:
        em.tensor_of[chain.last] = out_name
        em.done(head, "exported", [name])


#: The largest per-channel shift ``e_out - e_w[c] - e_in`` written (the kernels shift 32-bit
#: accumulator lanes; the suite's per-channel files stay below 16).
MAX_CHANNEL_SHIFT = 31


def _channel_exponents(em, name, w, bias, e_in: int, e_w: int, e_out: int, limit: int):
    """One filter exponent per output channel (the PIE-V2 chips' per-channel Conv/Gemm, as
    esp-ppq writes for esp32p4): each channel's automatic exponent, never above the tensor's
    ``e_w`` (so ``mac_shift >= 0`` holds on every channel), its shift at most
    :data:`MAX_CHANNEL_SHIFT`, raised where the channel's bias (at ``e_in + e_w[c]``) would not
    fit its lanes; an all-zero channel takes ``e_w``."""
    if em.target not in PER_CHANNEL_TARGETS:
        raise ExportError(
            f"layer {name!r}: per-channel filter exponents run on "
            f"{', '.join(PER_CHANNEL_TARGETS)} only, not {em.target}"
        )
    flat = w.reshape(w.shape[0], -1)
    lowest = e_out - e_in - MAX_CHANNEL_SHIFT
    exps = channel_exponents(flat, 0, em.bits, min_exponent=lowest, name=f"{name} filter")
    exps = np.where(np.abs(flat).max(axis=1) > 0, np.minimum(exps, e_w), e_w).astype(np.int64)
    if bias is not None:
        peak = np.abs(bias)
        while (over := peak * 2.0 ** -(e_in + exps) > limit).any():  # the lanes' width
            exps = exps + over
    return exps


def transpose_pads(
    size: int, kernel: int, stride: int, padding: str, crops: tuple[int, int] | None = None
) -> tuple[int, int, int]:
    """Keras Conv2DTranspose along one axis as a stride-1 Conv of its input with ``stride - 1``
    zeros between values (InsertZeros): (output size, pad before, pad after).

    The transpose puts ``x[i]·K[h]`` at ``i·stride + h - crop``; "valid" crops nothing, "same"
    crops TF's ``max(kernel - stride, 0) // 2`` in front and keeps ``size·stride`` outputs;
    explicit ``crops`` (before, after), ONNX ConvTranspose's ``pads`` (MindSpore's
    ``pad_mode="pad"``, PyTorch's ``padding``), crop the full output on either side. As a
    correlation with the flipped kernel, the zero-inserted input is padded by
    ``kernel - 1 - crop`` in front and by what makes the output that long behind.

    Example:
        >>> transpose_pads(3, 2, 2, "same")  # out 6: zero-inserted length 5, pads 1 + 1
        (6, 1, 1)
        >>> transpose_pads(3, 3, 2, "valid", (1, 1))  # PyTorch's padding=1: out 2·3 - 1
        (5, 1, 1)
    """
    full = (size - 1) * stride + kernel
    if crops is not None:
        out, crop = full - crops[0] - crops[1], crops[0]
    elif padding == "same":
        out, crop = size * stride, max(kernel - stride, 0) // 2
    else:
        out, crop = full, 0
    before = kernel - 1 - crop
    inserted = (size - 1) * stride + 1
    after = out + kernel - 1 - inserted - before
    return out, before, after


def lower_conv_transpose(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Conv2DTranspose / Conv1DTranspose: ``InsertZeros`` (``stride - 1`` zeros between the
    values, the input's exponent) then a stride-1 ``Conv`` with the flipped kernel, as esp-ppq
    exports a ConvTranspose (dl_module_insert_zeros.hpp)."""
    chain = em.chains[layer.name]
    kernel = layer.weights.get("kernel")
    if kernel is None:
        raise ExportError(f"layer {layer.name!r}: no kernel weights")
    x = ins[0]
    shape = em.shapes[x]
    one_d = len(shape) == 3
    sh, sw = pair(layer.attrs.get("strides"), 1)
    padding = str(layer.attrs.get("padding", "valid")).lower()
    if any(d != 1 for d in pair(layer.attrs.get("dilations"), 1)):
        em.refuse(
            layer,
            f"{layer.kind} with dilation: the ESP-DL v3 runtime's InsertZeros + Conv form of a "
            "transposed conv has no dilated equivalent here (use dilation 1)",
        )
        return
    if layer.attrs.get("output_padding") is not None:
        em.refuse(
            layer,
            f"{layer.kind} with output_padding: not exported (leave output_padding None)",
        )
        return
    # Keras' kernel is (kh, kw, filters, in): flipped and swapped it is the HWIO filter of
    # the correlation on the zero-inserted input
    kernel = np.asarray(kernel)[::-1, ::-1].transpose(0, 1, 3, 2)
    kh, kw = kernel.shape[:2]
    h, w = (1, shape[1]) if one_d else (shape[1], shape[2])
    crops = layer.attrs.get("pads")  # [top, bottom, left, right] cropped off the full output
    crop_h = None if crops is None else (int(crops[0]), int(crops[1]))
    crop_w = None if crops is None else (int(crops[2]), int(crops[3]))
    ho, top, bottom = transpose_pads(h, kh, sh, padding, crop_h)
    wo, left, right = transpose_pads(w, kw, sw, padding, crop_w)
    if crops is not None and (min(top, bottom, left, right) < 0 or min(ho, wo) < 1):
        em.refuse(
            layer,
            f"{layer.kind} with pads {list(crops)} for a {kh}x{kw} kernel, stride {sh}x{sw}: "
            "the ESP-DL v3 runtime's InsertZeros + Conv form pads the zero-inserted input by "
            "kernel - 1 - pad, so each pad must be at most kernel - 1 (and leave an output)",
        )
        return
    if min(top, bottom, left, right) < 0:
        em.refuse(layer, f"{layer.kind}: kernel smaller than the stride with 'same' padding")
        return
    z = x
    if (sh, sw) != (1, 1):
        z = f"{layer.name}/insert_zeros"
        stride = [sw] if one_d else [sh, sw]
        em.node(z, "InsertZeros", [x], [z], {"stride": stride, "output_padding": [0]})
        zshape = [shape[0], (w - 1) * sw + 1, shape[-1]]
        if not one_d:
            zshape = [shape[0], (h - 1) * sh + 1, (w - 1) * sw + 1, shape[-1]]
        src = f"the input's ({x!r}): InsertZeros copies the integers"
        em.tensor(z, em.exps[x], src, zshape, em.ranges.get(x))

    def geometry(chain, in_shape, kh, kw):
        return [top, left, bottom, right], [1, 1], [1, 1], ho, wo

    _emit_chain(em, chain, z, kernel, geometry)
