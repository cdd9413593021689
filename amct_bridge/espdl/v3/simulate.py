"""Bit-exact integer simulation of an ESP-DL v3 model, as the runtime computes it on the chip.

Each op follows esp-dl's kernels (``esp-dl/dl/base/dl_base_*.cpp`` for the arithmetic,
``dl/module/include/dl_module_*.hpp`` for the attributes, ``dl/tool/src/dl_tool.cpp`` for
rounding), vectorised in numpy with int64 intermediates. Activations are channel-last
(``NWC`` / ``NHWC``), as esp-ppq exported them. The rounding depends on the target:

- ``esp32p4``: half to even (``CONFIG_ROUND_HALF_EVEN_ENABLED``; float roundings use ``rne``);
- ``esp32s3`` and ``c``: half up (``(x + 2^(s-1)) >> s``; floats ``floor(x + 0.5)``).

The target is the caller's, else the file's ``metadata_props`` ``target`` (esp-ppq writes it),
else guessed from the filter layout notes: a blocked ``(N/16)...`` / ``N16...`` layout means
esp32s3 or esp32p4 and esp32s3 is assumed, a plain one means ``c``
(:func:`infer_target` returns the reason). docs/espdl-v3.md lists each op's formula.

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.v3.model import EspdlModel, Node, Tensor, ValueInfo
    >>> w = Tensor("w", np.array([[[[2, -1]]]], np.int8), [-1], "layout ==> NHWC")  # 1 in, 2 out
    >>> m = EspdlModel(
    ...     [Node("fc", "Gemm", ["x", "w"], ["y"], {"activation": "Relu", "quant_type": "S8"})],
    ...     {"w": w}, inputs=[ValueInfo("x", [1, 1], 3, [0])],
    ...     outputs=[ValueInfo("y", [1, 2], 3, [0])], metadata={"target": "c"})
    >>> r = simulate_espdl(m, {"x": np.array([[3]], np.int8)})
    >>> r.outputs["y"].tolist()  # 3*2*2^-1 = 3; 3*-1*2^-1 = -1.5 -> relu 0
    [[3, 0]]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from amct_bridge.espdl.v3.model import EspdlError, EspdlModel, Node, Tensor, filter_nhwc

__all__ = [
    "TARGETS",
    "SimulationResult",
    "infer_target",
    "simulate_espdl",
    "shift_round",
    "round_float",
    "supported_ops",
]

#: The targets the runtime distinguishes (``c``: esp32, esp32s2, c2, c3, c5, c6 and others).
TARGETS = ("esp32s3", "esp32p4", "c")
_INT = {"S8": np.dtype(np.int8), "S16": np.dtype(np.int16)}


@dataclass
class SimulationResult:
    """Integers of every tensor the simulation computed, the graph outputs, and the target used.

    Example:
        >>> r = SimulationResult({"y": np.array([1])}, {"y": np.array([1])}, {"y": -3}, "c", "")
        >>> r.outputs["y"].tolist(), r.exponents["y"]
        ([1], -3)
    """

    outputs: dict[str, np.ndarray]
    values: dict[str, np.ndarray]
    exponents: dict[str, int]
    target: str
    target_reason: str
    notes: list[str] = field(default_factory=list)


def infer_target(model: EspdlModel, target: str | None = None) -> tuple[str, str]:
    """(target, why): the caller's, the file's ``target`` metadata, else a layout guess.

    Example:
        >>> infer_target(EspdlModel([], {}, metadata={"target": "esp32p4"}))
        ('esp32p4', "the file's metadata_props target")
        >>> infer_target(EspdlModel([], {}))
        ('esp32s3', 'no target in the file and no filter layout: esp32s3 assumed')
    """
    if target is not None:
        if target not in TARGETS:
            raise EspdlError(f"unknown target {target!r}, expected one of {', '.join(TARGETS)}")
        return target, "given by the caller"
    meta = model.target
    if meta in TARGETS:
        return meta, "the file's metadata_props target"
    layouts = {t.layout for t in model.initializers.values() if t.layout and t.layout != "UNK"}
    if any("/16)" in s or "/8)" in s or s.startswith(("N16", "N8")) for s in layouts):
        return "esp32s3", (
            "no target in the file; blocked filter layouts (esp32s3 or esp32p4): esp32s3 assumed"
        )
    if layouts:
        return "c", "no target in the file; plain filter layouts: the c target"
    return "esp32s3", "no target in the file and no filter layout: esp32s3 assumed"


def shift_round(x: np.ndarray, shift: int | np.ndarray, half_even: bool) -> np.ndarray:
    """x · 2^-shift rounded like esp-dl's ``shift_and_round_half_up`` / ``_half_even``.

    A shift ≤ 0 is a left shift (exact). int64 in, int64 out; the caller saturates.

    Example:
        >>> shift_round(np.array([5, 6, 7, -5, -6, -7]), 2, half_even=False).tolist()
        [1, 2, 2, -1, -1, -2]
        >>> shift_round(np.array([2, 6, -2, -6]), 2, half_even=True).tolist()
        [0, 2, 0, -2]
    """
    x = np.asarray(x, np.int64)
    if np.ndim(shift) == 0:  # one shift for the whole tensor: scalar arithmetic, in place
        s = int(shift)
        if s <= 0:
            return np.left_shift(x, -s)
        if not half_even:
            out = x + np.int64(1 << (s - 1))
            np.right_shift(out, s, out=out)
            return out
        floor = np.right_shift(x, s)
        rem = x & np.int64((1 << s) - 1)
        half = np.int64(1 << (s - 1))
        up = (rem > half) | ((rem == half) & ((floor & 1) == 1))
        floor += up
        return floor
    shift = np.broadcast_to(np.asarray(shift, np.int64), x.shape)
    right = np.maximum(shift, 1)
    half = np.left_shift(np.int64(1), right - 1)
    if half_even:
        floor = np.right_shift(x, right)
        rem = x & ((np.int64(1) << right) - 1)
        up = (rem > half) | ((rem == half) & ((floor & 1) == 1))
        rounded = floor + up
    else:
        rounded = np.right_shift(x + half, right)
    return np.where(shift > 0, rounded, np.left_shift(x, np.maximum(-shift, 0)))


def round_float(x: np.ndarray, half_even: bool) -> np.ndarray:
    """esp-dl's ``tool::round`` of float32 values: ``rne`` on esp32p4, ``floor(x + 0.5)`` else.

    Example:
        >>> round_float(np.float32([0.5, 1.5, -0.5, -1.5]), False).tolist()
        [1, 2, 0, -1]
        >>> round_float(np.float32([0.5, 1.5, -0.5, -1.5]), True).tolist()
        [0, 2, 0, -2]
    """
    x = np.asarray(x, np.float32)
    if half_even:
        return np.rint(x).astype(np.int64)
    # floorf(value + 0.5): the sum is a double, converted to float by floorf's parameter
    return np.floor((x.astype(np.float64) + 0.5).astype(np.float32)).astype(np.int64)


def _saturate(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(x, info.min, info.max).astype(dtype)


class _Context:
    def __init__(self, model: EspdlModel, target: str) -> None:
        self.model = model
        self.target = target
        self.half_even = target == "esp32p4"
        self.values: dict[str, np.ndarray] = {}
        self.notes: list[str] = []
        self.infos = {v.name: v for v in (*model.value_info, *model.outputs, *model.inputs)}

    def exponent(self, name: str, node: Node) -> int:
        tensor = self.model.initializers.get(name)
        if tensor is not None:
            return tensor.exponent
        info = self.infos.get(name)
        if info is None or not info.exponents:
            raise EspdlError(
                f"{self.model.source}: node {node.name!r} ({node.op_type}): tensor {name!r} has "
                "no exponent in value_info"
            )
        return info.exponent

    def value(self, name: str, node: Node) -> np.ndarray:
        if name in self.values:
            return self.values[name]
        tensor = self.model.initializers.get(name)
        if tensor is not None:
            return tensor.data
        raise EspdlError(
            f"{self.model.source}: node {node.name!r} ({node.op_type}) reads {name!r}, which no "
            "earlier node, input or initializer provides"
        )

    def initializer(self, name: str, node: Node) -> Tensor:
        tensor = self.model.initializers.get(name)
        if tensor is None:
            raise EspdlError(
                f"{self.model.source}: node {node.name!r} ({node.op_type}): {name!r} must be a "
                "constant (initializer)"
            )
        return tensor

    def value_dtype(self, name: str, node: Node) -> np.dtype:
        """The element type value_info gives ``name`` (float32, int8, int16), else quant_type's."""
        info = self.infos.get(name)
        if info is not None and info.elem_type in (1, 3, 5):
            return np.dtype({1: np.float32, 3: np.int8, 5: np.int16}[info.elem_type])
        return self.out_dtype(node)

    def out_dtype(self, node: Node) -> np.dtype:
        quant = node.attributes.get("quant_type", "S8")
        if quant not in _INT:
            raise EspdlError(
                f"{self.model.source}: node {node.name!r} ({node.op_type}): quant_type "
                f"{quant!r} is not simulated (S8 and S16 are)"
            )
        return _INT[quant]

    def refuse(self, node: Node, why: str) -> EspdlError:
        return EspdlError(f"{self.model.source}: node {node.name!r} ({node.op_type}): {why}")


_Op = Callable[[_Context, Node], list[np.ndarray]]
_OPS: dict[str, _Op] = {}


def _op(*names: str) -> Callable[[_Op], _Op]:
    def register(fn: _Op) -> _Op:
        for name in names:
            _OPS[name] = fn
        return fn

    return register


def supported_ops() -> list[str]:
    """The op types :func:`simulate_espdl` simulates; any other is refused by name.

    Example:
        >>> {"Conv", "Gemm", "Sigmoid"} <= set(supported_ops())
        True
    """
    return sorted(_OPS)


def simulate_espdl(
    model: EspdlModel,
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray | None = None,
    target: str | None = None,
) -> SimulationResult:
    """Run ``model`` on integer ``inputs`` (by name, in input order, or one array; None: the
    file's test inputs) as the ESP-DL runtime of ``target`` computes it.

    Example:
        >>> from amct_bridge.espdl.v3.model import Node, ValueInfo
        >>> m = EspdlModel([Node("r", "Relu", ["x"], ["y"], {"quant_type": "S8"})], {},
        ...                inputs=[ValueInfo("x", [3], 3, [-2])],
        ...                outputs=[ValueInfo("y", [3], 3, [-2])])
        >>> simulate_espdl(m, np.array([-1, 0, 5], np.int8), "c").outputs["y"].tolist()
        [0, 0, 5]
        >>> simulate_espdl(EspdlModel([Node("n", "Foo", ["x"], ["y"])], {},
        ...     inputs=[ValueInfo("x", [1], 3, [0])]), [np.zeros(1, np.int8)], "c")
        Traceback (most recent call last):
        ...
        amct_bridge.espdl.v3.model.EspdlError: <memory>: node 'n': op 'Foo' is not simulated
    """
    target, reason = infer_target(model, target)
    ctx = _Context(model, target)
    for name, array in _named_inputs(model, inputs).items():
        ctx.values[name] = array
    for node in model.nodes:
        fn = _OPS.get(node.op_type)
        if fn is None:
            raise EspdlError(
                f"{model.source}: node {node.name!r}: op {node.op_type!r} is not simulated"
            )
        results = fn(ctx, node)
        for name, value in zip(node.outputs, results, strict=False):
            if name:
                ctx.values[name] = value
    outputs = {}
    for info in model.outputs:
        if info.name not in ctx.values:
            raise EspdlError(f"{model.source}: no node computes the graph output {info.name!r}")
        outputs[info.name] = ctx.values[info.name]
    exponents = {}
    for name in ctx.values:
        info = ctx.infos.get(name)
        if info is not None and len(info.exponents) == 1:
            exponents[name] = info.exponent
    return SimulationResult(outputs, dict(ctx.values), exponents, target, reason, ctx.notes)


def _named_inputs(model: EspdlModel, inputs) -> dict[str, np.ndarray]:
    names = [v.name for v in model.inputs]
    if inputs is None:
        if not model.test_inputs:
            raise EspdlError(f"{model.source}: no inputs given and the file has no test inputs")
        given = {t.name: t.data for t in model.test_inputs}
    elif isinstance(inputs, np.ndarray):
        given = {names[0]: inputs} if len(names) == 1 else {}
        if len(names) != 1:
            raise EspdlError(f"{model.source}: the model has {len(names)} inputs, one array given")
    elif isinstance(inputs, Mapping):
        given = dict(inputs)
    else:
        arrays = list(inputs)
        if len(arrays) != len(names):
            raise EspdlError(
                f"{model.source}: the model has {len(names)} inputs, {len(arrays)} arrays given"
            )
        given = dict(zip(names, arrays, strict=True))
    missing = [n for n in names if n not in given]
    if missing:
        raise EspdlError(f"{model.source}: no value for input(s) {', '.join(missing)}")
    out = {}
    for info in model.inputs:
        array = np.asarray(given[info.name])
        if info.elem_type == 1:  # a float input, quantized by the model's QuantizeLinear
            array = array.astype(np.float32)
        elif array.dtype.kind not in "iu":
            raise EspdlError(
                f"{model.source}: input {info.name!r} must hold integers, got {array.dtype}"
            )
        elif info.elem_type in (3, 5):  # held as the model's int8/int16, as on the chip
            dtype = np.dtype(np.int8 if info.elem_type == 3 else np.int16)
            bounds = np.iinfo(dtype)
            if array.size and (array.min() < bounds.min or array.max() > bounds.max):
                raise EspdlError(
                    f"{model.source}: input {info.name!r} holds {array.min()}..{array.max()}, "
                    f"beyond {dtype}"
                )
            array = array.astype(dtype)
        shape = info.shape
        if shape and all(isinstance(d, int) for d in shape) and int(np.prod(shape)) == array.size:
            array = array.reshape(shape)
        out[info.name] = array
    return out


# --- convolution family: dl_base_conv2d.cpp, dl_base_depthwise_conv2d.cpp, activate_buffer.hpp


def _activation(ctx: _Context, node: Node) -> str:
    act = node.attributes.get("activation", "Linear")
    if act not in ("Linear", "Relu"):
        # dl_base.hpp's ConvOpArgs leaves LeakyReLU/PReLU parameters unset ("do not support")
        raise ctx.refuse(node, f"fused activation {act!r} is not simulated (Linear, Relu are)")
    return act


def _requant_output(
    ctx: _Context, node: Node, acc: np.ndarray, shift: int, act: str, dtype: np.dtype
) -> np.ndarray:
    out = shift_round(acc, shift, ctx.half_even)
    if act == "Relu":
        out = np.maximum(out, 0)
    return _saturate(out, dtype)


def _bias(ctx: _Context, node: Node, n: int, depthwise: bool) -> np.ndarray | None:
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


def _conv_core(ctx: _Context, node: Node, x: np.ndarray, rank: int) -> np.ndarray:
    act = _activation(ctx, node)
    filt = ctx.initializer(node.inputs[1], node)
    _per_tensor_filter(ctx, node, filt)
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
    out = _requant_output(ctx, node, acc, shift, act, ctx.out_dtype(node))
    return out[:, 0] if rank == 1 else out


@_op("Conv")
def _conv(ctx: _Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    if x.ndim not in (3, 4):
        raise ctx.refuse(node, f"input of rank {x.ndim} (1-D NWC or 2-D NHWC expected)")
    return [_conv_core(ctx, node, x, x.ndim - 2)]


@_op("Gemm")
def _gemm(ctx: _Context, node: Node) -> list[np.ndarray]:
    # dl_module_gemm.hpp: the input is viewed as [1, 1, rows, C] and run as a 1x1 conv
    if node.attributes.get("transA", 0) or node.attributes.get("transB", 0):
        raise ctx.refuse(node, "transA/transB must be 0 (esp-ppq transposes the weight)")
    x = ctx.value(node.inputs[0], node)
    rows = x.reshape(1, 1, -1, x.shape[-1])
    out = _conv_core(ctx, node, rows, 2)
    return [out.reshape(*x.shape[:-1], out.shape[-1])]


# --- element-wise: dl_base_add.cpp, dl_base_sub.cpp, dl_base_mul.cpp, dl_base_elemwise.cpp


@_op("Add", "Sub")
def _add(ctx: _Context, node: Node) -> list[np.ndarray]:
    a, b = (ctx.value(n, node).astype(np.int64) for n in node.inputs[:2])
    exps = [ctx.exponent(n, node) for n in (*node.inputs[:2], node.outputs[0])]
    if len(set(exps)) != 1:
        # the v3 kernels add the integers as they are (no rescaling): esp-ppq keeps one exponent
        ctx.notes.append(
            f"node {node.name!r} ({node.op_type}): exponents {exps[0]}, {exps[1]} -> {exps[2]} "
            "differ; the runtime adds the integers without rescaling, and so does this simulation"
        )
    out = a + b if node.op_type == "Add" else a - b
    return [_saturate(out, ctx.out_dtype(node))]


@_op("Mul")
def _mul(ctx: _Context, node: Node) -> list[np.ndarray]:
    a, b = (ctx.value(n, node).astype(np.int64) for n in node.inputs[:2])
    e0, e1 = (ctx.exponent(n, node) for n in node.inputs[:2])
    shift = ctx.exponent(node.outputs[0], node) - e0 - e1
    product = a * b
    if ctx.out_dtype(node) == np.int16 and ctx.target == "c":
        # the C kernel scales the int product as a float: beyond 2^24 it loses low bits
        scaled = product.astype(np.float32) * np.float32(2.0**-shift)
        return [_saturate(round_float(scaled, ctx.half_even), np.int16)]
    return [_saturate(shift_round(product, shift, ctx.half_even), ctx.out_dtype(node))]


# --- lookup tables and activations: dl_module_lut.hpp, dl_base_lut.cpp, dl_base_relu.cpp


def _table_lookup(ctx: _Context, node: Node, table: np.ndarray) -> np.ndarray:
    x = ctx.value(node.inputs[0], node)
    if x.dtype == np.int8 or table.size == 256:
        return table[x.astype(np.int64) + 128]
    # int16 table of 65536 / step + 1 entries, index rounded to the nearest step
    step = 65536 // (table.size - 1)
    shift = step.bit_length() - 1
    index = x.astype(np.int64) + 32768
    if shift:
        index = shift_round(index, shift, ctx.half_even)
    return table[index]


def _sigmoid(t: np.ndarray) -> np.ndarray:
    # dl_math.hpp: 1.0 / (1.0 + expf(-x)), expf in float, the division in double
    return (1.0 / (1.0 + np.exp(-t).astype(np.float64))).astype(np.float32)


def _hard_swish(t: np.ndarray) -> np.ndarray:
    # dl_module_hard_swish.hpp: the 0.166667 and 0.5 literals make it a double expression
    t64 = t.astype(np.float64)
    return (np.maximum(0.0, np.minimum(1.0, 0.166667 * t64 + 0.5)) * t64).astype(np.float32)


def _float_function(ctx: _Context, node: Node) -> Callable[[np.ndarray], np.ndarray] | None:
    op = node.op_type
    f32 = np.float32
    if op == "Sigmoid":
        return _sigmoid
    if op == "Tanh":
        return lambda t: f32(2) * _sigmoid(f32(2) * t) - f32(1)
    if op == "Swish":
        return lambda t: _sigmoid(t) * t
    if op == "HardSwish":
        return _hard_swish
    if op == "HardSigmoid":
        alpha = f32(node.attributes.get("alpha", 0.2))
        beta = f32(node.attributes.get("beta", 0.5))
        return lambda t: np.maximum(f32(0), np.minimum(f32(1), alpha * t + beta))
    return None


@_op("Sigmoid", "Tanh", "Swish", "HardSigmoid", "HardSwish", "LeakyRelu", "Gelu", "Elu", "LUT")
def _activation_op(ctx: _Context, node: Node) -> list[np.ndarray]:
    # int8 models carry a 256-entry table (attribute 'lut', dl_module_lut.hpp); without one the
    # module computes in float32: temp = x * 2^e_in, f(temp), round(f * 2^-e_out)
    table_name = node.attributes.get("lut")
    if node.op_type == "LUT" and not table_name and len(node.inputs) > 1:
        table_name = node.inputs[1]
    if table_name:
        return [_table_lookup(ctx, node, ctx.initializer(table_name, node).data.reshape(-1))]
    x = ctx.value(node.inputs[0], node)
    in_scale = np.float32(2.0 ** ctx.exponent(node.inputs[0], node))
    out_scale = np.float32(2.0 ** -ctx.exponent(node.outputs[0], node))
    temp = x.astype(np.float32) * in_scale
    if node.op_type == "LeakyRelu":
        # dl_module_leaky_relu.hpp: round(temp * out_scale) or round(temp * out_scale * alpha)
        alpha = np.float32(node.attributes.get("alpha", 0.01))
        scaled = temp * out_scale
        scaled = np.where(temp >= 0, scaled, scaled * alpha)
    else:
        fn = _float_function(ctx, node)
        if fn is None:
            raise ctx.refuse(node, "only the lookup-table form (attribute 'lut') is simulated")
        scaled = fn(temp) * out_scale
    return [_saturate(round_float(scaled, ctx.half_even), ctx.out_dtype(node))]


@_op("PRelu")
def _prelu(ctx: _Context, node: Node) -> list[np.ndarray]:
    # dl_base.hpp get_activation_args: activation_shift = e_out - e_in - e_alpha;
    # c (dl_base_prelu.cpp prelu_11c): x >= 0 copied as it is, else (x * alpha) >> shift (floor);
    # esp32s3 (dl_tie728_s8_prelu.S): both sides rounded half up, x >= 0 rescaled to e_out
    if ctx.target == "esp32p4":
        raise ctx.refuse(node, "PRelu on esp32p4 (its esp.vprelu rounding is not known here)")
    x = ctx.value(node.inputs[0], node).astype(np.int64)
    alpha_t = ctx.initializer(node.inputs[1], node)
    alpha = alpha_t.data.reshape(-1).astype(np.int64)
    if alpha.size not in (1, x.shape[-1]):
        raise ctx.refuse(node, f"{alpha.size} slopes for {x.shape[-1]} channels")
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    shift = e_out - e_in - alpha_t.exponent
    if ctx.target == "c":
        product = x * alpha
        neg = np.where(shift > 0, product >> max(shift, 0), product << max(-shift, 0))
        out = np.where(x >= 0, x, neg)
    else:
        neg = shift_round(x * alpha, shift, False)
        out = np.where(x < 0, neg, np.where(x > 0, shift_round(x, e_out - e_in, False), 0))
    return [_saturate(out, ctx.out_dtype(node))]


@_op("Pad")
def _pad(ctx: _Context, node: Node) -> list[np.ndarray]:
    # dl_module_pad.hpp / dl_base_pad.cpp: ONNX pads [begin..., end...] on the stored tensor;
    # constant (the quantized constant_value input, default 0), edge or reflect
    x = ctx.value(node.inputs[0], node)
    pads = _ints_input(ctx, node, 1)
    if pads is None or len(pads) != 2 * x.ndim or min(pads) < 0:
        raise ctx.refuse(node, f"pads {pads} for a tensor of rank {x.ndim} (non-negative)")
    width = list(zip(pads[: x.ndim], pads[x.ndim :], strict=True))
    mode = node.attributes.get("mode", "constant")
    if mode == "constant":
        value = _ints_input(ctx, node, 2)
        return [np.pad(x, width, constant_values=value[0] if value else 0)]
    if mode in ("edge", "reflect"):
        return [np.pad(x, width, mode=mode)]
    raise ctx.refuse(node, f"mode {mode!r} (constant, edge, reflect are simulated)")


@_op("ReduceMean")
def _reduce_mean(ctx: _Context, node: Node) -> list[np.ndarray]:
    # dl_module_reduce_mean.hpp: round(float(sum) * 2^e_in / count * 2^-e_out), float32
    x = ctx.value(node.inputs[0], node)
    axes = _ints_input(ctx, node, 1) or node.attributes.get("axes")
    if not axes:
        if node.attributes.get("noop_with_empty_axes", 0):
            return [x.copy()]
        axes = list(range(x.ndim))
    axes = tuple(sorted(a % x.ndim for a in axes))
    keep = bool(node.attributes.get("keepdims", 1))
    total = x.astype(np.int64).sum(axis=axes, keepdims=keep)
    count = np.float32(int(np.prod([x.shape[a] for a in axes])))
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    scaled = total.astype(np.float32) * np.float32(2.0**e_in) / count * np.float32(2.0**-e_out)
    return [_saturate(round_float(scaled, ctx.half_even), ctx.out_dtype(node))]


@_op("Softmax")
def _softmax(ctx: _Context, node: Node) -> list[np.ndarray]:
    # dl_module_softmax.hpp: a float32 output. int8: exp_table[x + 128] with the table
    # expf(2^e_in * (i - 128)) (no max subtracted); int16: expf(t - max). The sum runs in order
    # along the axis, in float32, so it is accumulated here element by element too.
    x = ctx.value(node.inputs[0], node)
    axis = int(node.attributes.get("axis", -1)) % max(x.ndim, 1)
    scale = np.float32(2.0 ** ctx.exponent(node.inputs[0], node))
    moved = np.moveaxis(x, axis, -1)
    if ctx.out_dtype(node) == np.int8:
        table = np.exp(scale * (np.arange(256, dtype=np.float32) - np.float32(128)))
        e = table[moved.astype(np.int64) + 128]
    else:
        t = moved.astype(np.float32) * scale
        e = np.exp(t - t.max(axis=-1, keepdims=True))
    total = np.zeros(e.shape[:-1], np.float32)
    for i in range(e.shape[-1]):
        total = total + e[..., i]
    return [np.moveaxis(e / total[..., None], -1, axis)]


def sqrt_newton(x: np.ndarray) -> np.ndarray:
    """esp-dl's ``dl::math::sqrt_newton`` (dl_math.hpp) in float32, element by element: start
    at ``x``, ``r = (r + x / r) · 0.5`` until ``|r − r_last| <= 1e-5``; 0 gives 0.

    Example:
        >>> sqrt_newton(np.float32([4.0, 0.0, 2.0])).tolist()
        [2.0, 0.0, 1.4142135381698608]
    """
    x = np.asarray(x, np.float32)
    result = x.copy()
    active = x != 0
    tol = np.float32(0.00001)
    for _ in range(200):  # converges in a few dozen steps from r = x for any float32 x
        if not active.any():
            return result
        last = result[active]
        # (last + x / last) * 0.5: the 0.5 is a double, the product exact, stored as float
        new = ((last + x[active] / last) * np.float32(0.5)).astype(np.float32)
        result[active] = new
        still = np.abs(new - last) > tol
        active[np.flatnonzero(active)[~still]] = False
    if active.any():
        raise EspdlError("sqrt_newton does not settle for some values (the chip would loop)")
    return result


@_op("LayerNormalization")
def _layer_norm(ctx: _Context, node: Node) -> list[np.ndarray]:
    # dl_module_layer_normalization.hpp, its integer path, float32 operation by operation:
    # int sum; mean = float(sum * 1.0 / n) (double); var = sum in order of float(x - mean)^2;
    # mean *= s_in; var *= s_in^2; var /= n; inv = 1 / sqrt_newton(var + eps);
    # y = round(((x * s_in - mean) * inv * (g * s_g) + b * s_b) * 2^-e_out), saturated.
    # The chip's compiler may fuse a*b + c (GCC's -ffp-contract=fast); that is not modelled.
    x = ctx.value(node.inputs[0], node)
    if x.dtype.kind == "f":
        raise ctx.refuse(node, "a float32 LayerNormalization is not simulated")
    axis = int(node.attributes.get("axis", -1)) % x.ndim
    if axis == 0:
        raise ctx.refuse(node, "axis 0 would normalize over the batch")
    inner = int(np.prod(x.shape[axis:]))
    rows = x.reshape(-1, inner)
    eps = np.float32(node.attributes.get("epsilon", 1e-5))
    s_in = np.float32(2.0 ** ctx.exponent(node.inputs[0], node))
    s_out = np.float32(2.0 ** -ctx.exponent(node.outputs[0], node))
    params = []
    for index in (1, 2):
        if len(node.inputs) > index and node.inputs[index]:
            t = ctx.initializer(node.inputs[index], node)
            if t.data.size != inner:
                raise ctx.refuse(node, f"{t.name!r} has {t.data.size} values, expected {inner}")
            scale = np.float32(2.0**t.exponent)
            params.append(t.data.reshape(1, inner).astype(np.float32) * scale)
        else:
            params.append(np.float32(1.0) if index == 1 else np.float32(0.0))
    gamma, beta = params
    total = rows.astype(np.int64).sum(axis=1)  # an int on the chip (overflow not modelled)
    mean = (total.astype(np.float64) / inner).astype(np.float32)
    diff = rows.astype(np.float32) - mean[:, None]
    var = np.add.accumulate(diff * diff, axis=1, dtype=np.float32)[:, -1]  # in order
    mean = mean * s_in
    var = var * (s_in * s_in)
    var = var / np.float32(inner)
    inv = np.float32(1.0) / sqrt_newton(var + eps)
    norm = (rows.astype(np.float32) * s_in - mean[:, None]) * inv[:, None]
    result = norm * gamma + beta
    out = round_float(result * s_out, ctx.half_even)
    return [_saturate(out, ctx.out_dtype(node)).reshape(x.shape)]


@_op("Clip")
def _clip(ctx: _Context, node: Node) -> list[np.ndarray]:
    # dl_module_clip.hpp: clip the integers to min/max (inputs, in the input's quantization),
    # then round(temp * 2^e_in * 2^-e_out)
    x = ctx.value(node.inputs[0], node)
    info = np.iinfo(x.dtype)
    low = _ints_input(ctx, node, 1)
    high = _ints_input(ctx, node, 2)
    temp = np.clip(x, low[0] if low else info.min, high[0] if high else info.max)
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    rescale = np.float32(2.0**e_in) * np.float32(2.0**-e_out)
    out = round_float(temp.astype(np.float32) * rescale, ctx.half_even)
    return [_saturate(out, ctx.out_dtype(node))]


def _per_tensor_filter(ctx: _Context, node: Node, filt: Tensor) -> None:
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


@_op("MatMul")
def _matmul(ctx: _Context, node: Node) -> list[np.ndarray]:
    # dl_module_matmul.hpp: with rank <= 2 operands, a 1x1 conv whose filter is input 1 (a
    # constant that esp-ppq stores in the conv filter layout); no bias
    if node.inputs[1] not in ctx.model.initializers:
        raise ctx.refuse(node, "a MatMul of two activations is not simulated (constant B only)")
    x = ctx.value(node.inputs[0], node)
    filt = ctx.initializer(node.inputs[1], node)
    _per_tensor_filter(ctx, node, filt)
    if x.ndim > 2 or len(filt.dims) > 2:
        raise ctx.refuse(node, "batched MatMul (rank > 2) is not simulated")
    dims = filt.dims if len(filt.dims) == 2 else [filt.dims[0], 1]
    shaped = Tensor(filt.name, filt.data.reshape(dims), filt.exponents)
    w = filter_nhwc(shaped, 1, ctx.target).reshape(dims[1], dims[0]).astype(np.int64)
    acc = np.atleast_2d(x.astype(np.int64)) @ w.T
    shift = ctx.exponent(node.outputs[0], node) - filt.exponent - ctx.exponent(node.inputs[0], node)
    out = _requant_output(ctx, node, acc, shift, _activation(ctx, node), ctx.out_dtype(node))
    if x.ndim == 1:
        out = out[0]
    return [out if len(filt.dims) == 2 else out[..., 0]]


@_op("Relu")
def _relu(ctx: _Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    return [np.maximum(x, 0).astype(x.dtype)]


@_op("RequantizeLinear", "QuantizeLinear", "DequantizeLinear")
def _requantize(ctx: _Context, node: Node) -> list[np.ndarray]:
    # dl_module_requantize_linear.hpp (all three ops): output->assign(input), dl_tensor_base.cpp:
    # float in: round(x * 2^-e_out); float out: x * 2^e_in; one exponent: a saturating copy;
    # else round(x * 2^(e_in - e_out)), as the ISA's rounding shift (dl_base_requantize_linear)
    x = ctx.value(node.inputs[0], node)
    out_type = ctx.value_dtype(node.outputs[0], node)
    if out_type.kind == "f":
        e_in = ctx.exponent(node.inputs[0], node)
        return [(x.astype(np.float32) * np.float32(2.0**e_in)).astype(out_type)]
    e_out = ctx.exponent(node.outputs[0], node)
    if x.dtype.kind == "f":
        scaled = x.astype(np.float32) * np.float32(2.0**-e_out)
        return [_saturate(round_float(scaled, ctx.half_even), out_type)]
    shift = e_out - ctx.exponent(node.inputs[0], node)
    return [_saturate(shift_round(x.astype(np.int64), shift, ctx.half_even), out_type)]


# --- pooling: dl_base_avg_pool2d.cpp, dl_base_max_pool2d.cpp, dl_base_pool2d.hpp


def _pool_geometry(ctx: _Context, node: Node, x: np.ndarray):
    rank = x.ndim - 2
    kernel = list(node.attributes.get("kernel_shape") or [])
    if len(kernel) != rank:
        raise ctx.refuse(node, f"kernel_shape {kernel} for an input of rank {x.ndim}")
    strides = list(node.attributes.get("strides") or [1] * rank)
    pads = list(node.attributes.get("pads") or [0] * (2 * rank))
    if node.attributes.get("ceil_mode", 0):
        raise ctx.refuse(node, "ceil_mode 1 (the runtime floors the output size)")
    if rank == 1:
        return x[:, None], [1, *kernel], [1, *strides], [0, pads[0], 0, pads[1]]
    return x, kernel, strides, pads


def _windows(xp: np.ndarray, kernel: list[int], strides: list[int]):
    """Yield the (i, j) kernel-position slices of a padded NHWC tensor."""
    (kh, kw), (sh, sw) = kernel, strides
    ho = (xp.shape[1] - kh) // sh + 1
    wo = (xp.shape[2] - kw) // sw + 1
    for i in range(kh):
        for j in range(kw):
            yield xp[:, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw]


@_op("AveragePool")
def _avgpool(ctx: _Context, node: Node) -> list[np.ndarray]:
    x0 = ctx.value(node.inputs[0], node)
    x, kernel, strides, (top, left, bottom, right) = _pool_geometry(ctx, node, x0)
    xp = np.pad(x.astype(np.int64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    total = sum(_windows(xp, kernel, strides))
    # CONFIG_ACCURATE_INFER: avgpool2d_hwc on every target, the whole kernel as the area
    # (padding counts, whatever count_include_pad says), one float32 scale
    area = np.float32(1.0) / np.float32(kernel[0] * kernel[1])
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    scale = np.float32(2.0**e_in) * area * np.float32(2.0**-e_out)
    out = round_float(total.astype(np.float32) * scale, ctx.half_even)
    out = _saturate(out, ctx.out_dtype(node))
    return [out[:, 0] if x0.ndim == 3 else out]


@_op("MaxPool")
def _maxpool(ctx: _Context, node: Node) -> list[np.ndarray]:
    x0 = ctx.value(node.inputs[0], node)
    x, kernel, strides, (top, left, bottom, right) = _pool_geometry(ctx, node, x0)
    low = np.iinfo(x.dtype).min
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=low)
    out = np.maximum.reduce(list(_windows(xp, kernel, strides)))
    return [out[:, 0] if x0.ndim == 3 else out]


@_op("GlobalAveragePool")
def _global_avgpool(ctx: _Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    axes = tuple(range(1, x.ndim - 1))
    total = x.astype(np.int64).sum(axis=axes, keepdims=True)
    count = int(np.prod([x.shape[a] for a in axes]))
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    scale = np.float32(2.0**e_in) * (np.float32(1.0) / np.float32(count)) * np.float32(2.0**-e_out)
    out = round_float(total.astype(np.float32) * scale, ctx.half_even)
    return [_saturate(out, ctx.out_dtype(node))]


# --- shape ops: dl_base_shape.cpp and the modules (no arithmetic, exponents pass through)


def _ints_input(ctx: _Context, node: Node, index: int) -> list[int] | None:
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    return [int(v) for v in ctx.value(node.inputs[index], node).reshape(-1)]


@_op("Transpose")
def _transpose(ctx: _Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    perm = node.attributes.get("perm") or list(range(x.ndim))[::-1]
    return [np.ascontiguousarray(np.transpose(x, perm))]


@_op("Slice")
def _slice(ctx: _Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    starts, ends = _ints_input(ctx, node, 1), _ints_input(ctx, node, 2)
    if starts is None or ends is None:
        raise ctx.refuse(node, "starts and ends must be given as inputs")
    axes = _ints_input(ctx, node, 3) or list(range(len(starts)))
    steps = _ints_input(ctx, node, 4) or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        dim = x.shape[axis]
        # ONNX clamps as slice.indices does (INT64_MAX: to the end); a stop of -1 there means
        # "past index 0", which a slice can only say as None
        first, stop, step = slice(start, end, step).indices(dim)
        index[axis] = slice(first, stop if stop >= 0 else None, step)
    return [np.ascontiguousarray(x[tuple(index)])]


@_op("Flatten")
def _flatten(ctx: _Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    axis = int(node.attributes.get("axis", 1)) % max(x.ndim, 1)
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]


@_op("Reshape")
def _reshape(ctx: _Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    shape = _ints_input(ctx, node, 1) or node.attributes.get("shape")
    if shape is None:
        raise ctx.refuse(node, "no target shape")
    shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


@_op("Squeeze", "Unsqueeze")
def _squeeze(ctx: _Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    axes = _ints_input(ctx, node, 1) or node.attributes.get("axes")
    if node.op_type == "Squeeze":
        if axes is None:
            return [x.reshape([d for d in x.shape if d != 1])]
        return [np.squeeze(x, tuple(a % x.ndim for a in axes))]
    if axes is None:
        raise ctx.refuse(node, "no axes")
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(a % rank for a in axes)))]


@_op("Concat")
def _concat(ctx: _Context, node: Node) -> list[np.ndarray]:
    parts = [ctx.value(n, node) for n in node.inputs if n]
    exps = {ctx.exponent(n, node) for n in node.inputs if n} | {ctx.exponent(node.outputs[0], node)}
    if len(exps) != 1:
        ctx.notes.append(
            f"node {node.name!r} (Concat): exponents {sorted(exps)} differ; the runtime copies "
            "the integers, and so does this simulation"
        )
    return [np.concatenate(parts, axis=int(node.attributes.get("axis", 0)))]


@_op("Split")
def _split(ctx: _Context, node: Node) -> list[np.ndarray]:
    x = ctx.value(node.inputs[0], node)
    axis = int(node.attributes.get("axis", 0)) % x.ndim
    sizes = _ints_input(ctx, node, 1) or node.attributes.get("split")
    outputs = len(node.outputs)
    if not sizes:
        dim = x.shape[axis]
        size = -(-dim // outputs)
        sizes = [min(size, dim - i * size) for i in range(outputs)]
    edges = np.cumsum(sizes)[:-1]
    return [np.ascontiguousarray(p) for p in np.split(x, edges, axis=axis)]


@_op("Resize")
def _resize(ctx: _Context, node: Node) -> list[np.ndarray]:
    # nearest, asymmetric, floor: dl_base_resize.cpp repeats each pixel scale times
    if node.attributes.get("mode", "nearest") != "nearest":
        raise ctx.refuse(node, f"mode {node.attributes.get('mode')!r} (nearest is simulated)")
    x = ctx.value(node.inputs[0], node)
    scales = None
    if len(node.inputs) > 2 and node.inputs[2]:
        scales = [float(s) for s in ctx.value(node.inputs[2], node).reshape(-1)]
    if not scales and len(node.inputs) > 3 and node.inputs[3]:
        sizes = _ints_input(ctx, node, 3)
        nchw = [x.shape[0], x.shape[-1], *x.shape[1:-1]]
        scales = [o / i for o, i in zip(sizes, nchw, strict=True)]
    if not scales or len(scales) != x.ndim:
        raise ctx.refuse(node, "needs scales or sizes for every axis")
    # the data is NWC/NHWC but scales/sizes keep ONNX's NCW/NCHW order (dl_module_resize.hpp)
    out = x
    for axis, scale in enumerate(scales[2:], start=1):
        if scale == 1:
            continue
        size = int(x.shape[axis] * np.float32(scale))
        inv = np.float32(1.0) / np.float32(scale)
        src = (np.arange(size, dtype=np.float32) * inv).astype(np.int64)
        out = np.take(out, np.minimum(src, x.shape[axis] - 1), axis=axis)
    e_in, e_out = ctx.exponent(node.inputs[0], node), ctx.exponent(node.outputs[0], node)
    if e_in != e_out:
        out = _saturate(shift_round(out.astype(np.int64), e_out - e_in, ctx.half_even), x.dtype)
    return [out]
