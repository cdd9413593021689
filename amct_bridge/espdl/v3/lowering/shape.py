"""Lowerings of layers that move values: Flatten, Reshape, Permute (``Transpose``), zero
padding (``Pad``), cropping (``Slice``) and upsampling (``Resize``; int16: the exact
equivalents below, since the runtime's int16 Resize computes nothing).

Example:
    >>> cropping_box([1, 8, 8, 3], ((1, 2), (0, 3)))
    ([1, 0], [6, 5], [1, 2])
    >>> triangle(2).tolist()
    [0.25, 0.5, 0.25]
"""

from __future__ import annotations

import re

import numpy as np

from amct_bridge.espdl.source import SourceLayer, zero_padding
from amct_bridge.espdl.v3.lowering.emitter import Emitter, pair
from amct_bridge.espdl.v3.model import filter_file_order
from amct_bridge.quant.espdl import auto_exponent

__all__ = [
    "cropping_box",
    "lower_cropping",
    "lower_flatten",
    "lower_pad",
    "lower_permute",
    "lower_reshape",
    "lower_transpose",
    "lower_upsample",
    "triangle",
]


def lower_flatten(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Flatten: ``Flatten`` (axis 1)."""
    shape = em.shapes[ins[0]]
    em.keep(layer, "Flatten", ins, [shape[0], int(np.prod(shape[1:]))], {"axis": 1})


def lower_reshape(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Reshape: ``Reshape`` (batch dimension 0: copied, dl_module_reshape.hpp allowzero 0)."""
    shape = em.shapes[ins[0]]
    target = [int(v) for v in layer.attrs.get("target_shape") or ()]
    if not target:
        em.refuse(layer, "Reshape without a target shape")
        return
    if -1 in target:
        known = int(np.prod([v for v in target if v != -1]))
        target[target.index(-1)] = int(np.prod(shape[1:])) // known
    out = [shape[0], *target]
    const = em.shape_init(f"{layer.name}/shape", [0, *target])
    em.keep(layer, "Reshape", ins, out, extra=[const])


def lower_permute(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Permute (1-based dims, as Keras): ``Transpose`` with the batch axis first."""
    dims = [int(d) for d in layer.attrs.get("dims") or ()]
    perm = [0, *dims]
    shape = em.shapes[ins[0]]
    em.keep(layer, "Transpose", ins, [shape[p] for p in perm], {"perm": perm})


def lower_transpose(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``keras.ops.transpose`` (``perm`` with the batch axis; None: all axes reversed, which
    moves the batch axis and is refused): ``Transpose``."""
    shape = em.shapes[ins[0]]
    perm = layer.attrs.get("perm")
    perm = [int(p) % len(shape) for p in perm] if perm is not None else None
    if perm is None or sorted(perm) != list(range(len(shape))) or perm[0] != 0:
        em.refuse(
            layer,
            f"transpose with axes {layer.attrs.get('perm')!r}: exported when the batch axis "
            "stays first (give the axes explicitly, e.g. (0, 2, 1))",
        )
        return
    em.keep(layer, "Transpose", ins, [shape[p] for p in perm], {"perm": perm})


def lower_pad(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """ZeroPadding1D/2D that no conv takes as its own pads: ``Pad`` (constant 0)."""
    top, bottom, left, right = zero_padding(layer)
    shape = em.shapes[ins[0]]
    if len(shape) == 3:  # ZeroPadding1D (NWC): left / right of W
        pads = em.init(f"{layer.name}/pads", np.array([0, left, 0, 0, right, 0]))
        out = [shape[0], shape[1] + left + right, shape[2]]
        em.keep(layer, "Pad", ins, out, {"mode": "constant"}, extra=[pads])
        return
    pads = em.init(f"{layer.name}/pads", np.array([0, top, left, 0, 0, bottom, right, 0]))
    out = [shape[0], shape[1] + top + bottom, shape[2] + left + right, shape[3]]
    em.keep(layer, "Pad", ins, out, {"mode": "constant"}, extra=[pads])


def cropping_box(shape: list[int], cropping) -> tuple[list[int], list[int], list[int]]:
    """(starts, ends, axes) of a Cropping1D/2D on an NWC / NHWC ``shape``; ``cropping`` is
    Keras' ``(left, right)`` or ``((top, bottom), (left, right))`` (or the str of one)."""
    numbers = [int(v) for v in re.findall(r"-?\d+", str(cropping))]
    spatial = len(shape) - 2
    if len(numbers) == 1:
        numbers *= 2 * spatial
    if len(numbers) == 2 and spatial == 2:
        numbers = [numbers[0], numbers[0], numbers[1], numbers[1]]
    axes = list(range(1, spatial + 1))
    starts = numbers[0::2]
    ends = [shape[a] - numbers[2 * i + 1] for i, a in enumerate(axes)]
    return starts, ends, axes


def lower_cropping(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Cropping1D/2D: ``Slice`` of the spatial axes (values and exponent unchanged)."""
    shape = em.shapes[ins[0]]
    starts, ends, axes = cropping_box(shape, layer.attrs.get("cropping", 0))
    if len(starts) != len(shape) - 2 or any(e <= s for s, e in zip(starts, ends, strict=True)):
        em.refuse(layer, f"cropping {layer.attrs.get('cropping')!r} of a {shape} input")
        return
    out = list(shape)
    for s, e, a in zip(starts, ends, axes, strict=True):
        out[a] = e - s
    name = layer.name
    extra = [
        em.shape_init(f"{name}/starts", starts),
        em.shape_init(f"{name}/ends", ends),
        em.shape_init(f"{name}/axes", axes),
    ]
    em.keep(layer, "Slice", ins, out, extra=extra)


def triangle(scale: int) -> np.ndarray:
    """The 1-D kernel that turns a nearest upsampling by ``scale`` into half-pixel linear
    interpolation: ``(scale - |j|) / scale²`` for ``|j| < scale`` (a box convolved with itself).
    """
    j = np.arange(-(scale - 1), scale)
    return (scale - np.abs(j)) / float(scale * scale)


def lower_upsample(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """UpSampling2D nearest / bilinear: s8 ``Resize``; s16 ``Concat`` + ``Reshape`` (+ for
    bilinear an edge ``Pad`` and a depthwise ``Conv``)."""
    mode = str(layer.attrs.get("interpolation", "nearest"))
    if mode not in ("nearest", "bilinear"):
        em.refuse(
            layer,
            f"interpolation {mode!r}: the ESP-DL v3 Resize is 'nearest' or 'linear' only (use "
            "'nearest' or 'bilinear')",
        )
        return
    sh, sw = pair(layer.attrs.get("size"), 2)
    x = ins[0]
    shape = em.shapes[x]
    if em.bits == 16:
        if mode == "nearest":
            _upsample_by_concat(em, layer, x, sh, sw, layer.name)
            em.output(layer, layer.name, [])
        else:
            _bilinear_by_conv(em, layer, x, sh, sw)
        return
    scales = em.init(f"{layer.name}/scales", np.float32([1, 1, sh, sw]))
    if mode == "nearest":
        attrs = {
            "coordinate_transformation_mode": "asymmetric",
            "mode": "nearest",
            "nearest_mode": "floor",
        }
        e, src, rng = em.exps[x], f"the input's ({x!r})", em.ranges.get(x)
    else:  # TF's bilinear resize: half-pixel centres, edges clamped (the runtime's linear)
        attrs = {"coordinate_transformation_mode": "half_pixel", "mode": "linear"}
        e, src, rng = em.out_exp(layer, (em.exps[x], f"the input's ({x!r})"))
    name = layer.name
    em.node(name, "Resize", [x, "", scales], [name], attrs)
    em.tensor(name, e, src, [shape[0], shape[1] * sh, shape[2] * sw, shape[3]], rng)
    em.output(layer, name)


def _upsample_by_concat(em: Emitter, layer, x: str, sh: int, sw: int, name: str) -> str:
    """Nearest upsampling of an int16 tensor as Concat + Reshape (exact: integers copied).

    The runtime's int16 Resize computes nothing (``resize<int16_t>`` has an empty body in
    dl_base_resize.cpp; operator_support_state.md lists Resize for int8 only). Repeating
    each pixel ``sw`` times is a Concat of ``sw`` copies on the channel axis read back as
    ``[N, H, W*sw, C]``; the rows likewise on a ``[N, H, 1, W*sw*C]`` view.
    """
    n, h, w, c = em.shapes[x]
    exp, rng = em.exps[x], em.ranges.get(x)
    src = f"the input's ({x!r})"
    base = layer.name

    def concat(tensor: str, out: str, copies: int, axis: int) -> str:
        em.node(out, "Concat", [tensor] * copies, [out], {"axis": axis})
        dims = list(em.shapes[tensor])
        dims[axis] *= copies
        return em.tensor(out, exp, src, dims, rng)

    y = x
    if sw != 1:
        y = concat(y, f"{base}/repeat_w", sw, 3)
        y = em.reshape(y, f"{base}/as_w", [n, h, w * sw, c])
    if sh != 1:
        y = em.reshape(y, f"{base}/rows", [n, h, 1, w * sw * c])
        y = concat(y, f"{base}/repeat_h", sh, 2)
    return em.reshape(y, name, [n, h * sh, w * sw, c])


def _bilinear_by_conv(em: Emitter, layer: SourceLayer, x: str, sh: int, sw: int) -> None:
    """int16 bilinear upsampling, exactly TF's half-pixel interpolation with clamped edges:
    nearest upsampling, an edge ``Pad`` of ``size - 1``, then a depthwise ``Conv`` with the
    separable :func:`triangle` kernel (no bias; output at the input's exponent, which holds
    every interpolated value: they lie between their neighbours)."""
    n, h, w, c = em.shapes[x]
    name = layer.name
    up = _upsample_by_concat(em, layer, x, sh, sw, f"{name}/nearest")
    ph, pw = sh - 1, sw - 1
    pads = em.init(f"{name}/pads", np.array([0, ph, pw, 0, 0, ph, pw, 0]))
    padded = f"{name}/edge"
    em.node(padded, "Pad", [up, pads], [padded], {"mode": "edge"})
    src = f"the input's ({x!r})"
    em.tensor(padded, em.exps[x], src, [n, h * sh + 2 * ph, w * sw + 2 * pw, c], em.ranges.get(x))
    kernel = np.outer(triangle(sh), triangle(sw))
    e_w = auto_exponent(kernel, em.bits, name=f"{name} kernel")
    wq = np.broadcast_to(em.quantize(kernel, e_w)[None, :, :, None], (c, *kernel.shape, 1))
    stored, note = filter_file_order(np.ascontiguousarray(wq), c, em.target)
    filt = em.init(f"{name}/filter", stored, e_w, note)
    attrs = {
        "activation": "Linear",
        "dilations": [1, 1],
        "group": c,
        "kernel_shape": list(kernel.shape),
        "pads": [0, 0, 0, 0],
        "strides": [1, 1],
    }
    em.node(name, "Conv", [padded, filt], [name], attrs)
    e, src, rng = em.exps[x], f"the input's ({x!r}): an interpolation stays in its range", None
    em.tensor(name, e, src, [n, h * sh, w * sw, c], em.ranges.get(x) or rng)
    em.output(layer, name)
