"""Bit-exact simulator of the ESP-DL v1 runtime: what the chip computes, layer by layer, in numpy.

:func:`simulate_chip` runs a :class:`~amct_bridge.espdl.v1.network.Network` (or an export
directory / :class:`~amct_bridge.espdl.v1.result.ExportResult`) on integer inputs and returns every
layer's integer output and exponent. The arithmetic (docs/espdl-export.md, "Chip simulator"):

- Conv2D / DepthwiseConv2D / FullyConnected: exact ``acc = Σ x·w``; esp32s3 clips ``acc`` to its
  accumulator lanes (40 bits for int16, 20 bits for int8); per-tensor
  ``y = sat(floor_shift(acc, e_out − e_in − e_w) + b)``; int8 per-channel two-stage
  ``t = sat16(⌊acc/16⌋ + b16[c])``, ``y = sat8(floor_shift(t, d_c))`` (0 when ``d_c > 12``);
- the fused activation after saturation (ReLU; LeakyReLU/PReLU ``floor_shift(y·α, −e_α)``,
  saturated again);
- Add2D: the finer input floor-shifted to the coarser exponent, summed, shifted to ``e_out``;
- MaxPool2D, GlobalMaxPool2D, Concat, Flatten, Reshape, Pad, ReLU, LeakyReLU, PReLU, Max2D,
  Min2D, Transpose: exact, exponent kept;
- APPROXIMATE (no ESP-DL v1 source fixes them, allow ±1 LSB and watch the flag):
  AvgPool2D, GlobalAveragePool2D (ESP-DL v3's ``Σx·⌊2^k/n⌋`` rule, padded cells counted),
  Sub2D (Add2D's alignment), Mul2D (``sat(floor_shift(x0·x1, e_out − e0 − e1))``).

Inputs: integers (any int dtype, in the feature range) with ``input_exponent`` (default: the
network's), or floats quantized as ``sat(round_half_even(x · 2^-e))`` — numpy ``rint``, the rule
of the generated ``app_main.cpp`` (``nearbyintf``) and of ESP-DL's evaluator. (ESP-DL's own
tutorials truncate toward zero; pass integers to reproduce them.)

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.v1.network import Network, NetLayer, IntTensor, INPUT
    >>> fc = NetLayer("fc", "FullyConnected", [INPUT], -1,
    ...               filter=IntTensor(np.array([[[[64], [-64]]]]), -7))
    >>> net = Network("s8", False, [fc], input_exponent=0, outputs=["fc"])
    >>> out = simulate_chip(net, np.array([[3, 0], [0, 3]], np.int8))
    >>> out["fc"].values.tolist(), out["fc"].exponent
    ([[3], [-3]], -1)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1 import chip_ops as ops
from amct_bridge.espdl.v1 import spec
from amct_bridge.espdl.v1.network import INPUT, Network, load_network, network_from_result

if TYPE_CHECKING:
    from amct_bridge.espdl.v1.network import NetLayer
    from amct_bridge.espdl.v1.result import ExportResult

#: esp32s3 accumulator lanes (QACC): int16 40-bit, int8 20-bit.
S3_ACC_BITS = {16: 40, 8: 20}
_DTYPE = {8: np.int8, 16: np.int16}


class ChipTensor:
    """One layer's output on the chip: integers (batch axis first) and their exponent.

    ``approximate`` is True when this layer or one it reads uses arithmetic no v1 source fixes.
    The simulator keeps integers in float32 internally (exact for int8/int16); ``values``
    converts them to ``dtype`` (int8/int16) on first use.

    Example:
        >>> ChipTensor(np.array([3, -2], np.int8), -1).to_float().tolist()
        [1.5, -1.0]
    """

    def __init__(
        self, values: np.ndarray, exponent: int, approximate: bool = False, dtype: type = None
    ) -> None:
        self._raw = values
        self._dtype = dtype or values.dtype
        self._values = values if values.dtype == self._dtype else None
        self.exponent = int(exponent)
        self.approximate = bool(approximate)

    @property
    def values(self) -> np.ndarray:
        """The integers (int8 for s8, int16 for s16)."""
        if self._values is None:
            self._values = self._raw.astype(self._dtype)
        return self._values

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of ``values``."""
        return self._raw.shape

    def to_float(self) -> np.ndarray:
        """The real values the integers stand for (``values · 2^exponent``)."""
        return np.ldexp(self._raw.astype(np.float64), self.exponent)

    def __repr__(self) -> str:
        return f"ChipTensor(shape={self.shape}, exponent={self.exponent})"


@dataclass
class ChipResult:
    """Every layer's output (execution order), the quantized input, the outputs' names.

    Example:
        >>> r = ChipResult("esp32", ChipTensor(np.zeros(1, np.int8), 0), {}, [])
        >>> r.approximate_layers
        []
    """

    target: str
    input: ChipTensor
    layers: dict[str, ChipTensor]
    outputs: list[str]
    approximate_layers: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> ChipTensor:
        if name == INPUT:
            return self.input
        try:
            return self.layers[name]
        except KeyError:
            raise ExportError(f"chip result: no layer {name!r}") from None

    @property
    def output(self) -> ChipTensor:
        """The (first) model output."""
        return self.layers[self.outputs[0]]


def border_ratios(hw: tuple[int, int], attrs: dict) -> np.ndarray:
    """Per output position of a same-padded AvgPool2D on an (H, W) map: real cells / window
    cells, the chip's value over the model's on a constant map (see
    :mod:`amct_bridge.espdl.v1.border`).

    Example:
        >>> border_ratios((3, 3), {"pool": [3, 3], "strides": [1, 1], "padding": "SAME_END"})[1, 1]
        1.0
    """
    return ops.border_ratios(hw, attrs)


def quantize_input(x: np.ndarray, exponent: int, bits: int) -> np.ndarray:
    """Float input -> chip integers: ``sat(rint(x · 2^-exponent))`` (round half to even).

    Example:
        >>> quantize_input(np.array([0.5, 1.5, 300.0, -0.26]), -1, 8).tolist()
        [1, 3, 127, -1]
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size and not np.all(np.isfinite(x)):
        raise ExportError("chip input: contains NaN or Inf")
    return ops.saturate(np.rint(np.ldexp(x, -int(exponent))), bits).astype(np.int64)


def as_network(model: Network | ExportResult | str | os.PathLike) -> Network:
    """The chip graph :func:`simulate_chip` runs for ``model`` (a network, an export directory
    or an ``ExportResult``).

    Example:
        >>> as_network("/nonexistent")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: ...
    """
    if isinstance(model, Network):
        return model
    if isinstance(model, str | os.PathLike):
        return load_network(model)
    return network_from_result(model)


def _activation(y: np.ndarray, layer: NetLayer, bits: int) -> np.ndarray:
    """Fused activation on the saturated output, saturated again."""
    kind = layer.activation
    if kind is None:
        return y
    if kind == "ReLU":
        return np.maximum(y, 0, out=y if y.dtype.kind == "f" else None)  # y: a fresh array
    if layer.alpha is None:
        raise ExportError(f"chip layer {layer.describe()}: {kind} without its alpha")
    return _leaky(y, layer.alpha.values, int(layer.alpha.exponent), bits)


def _leaky(y: np.ndarray, alpha: np.ndarray, alpha_exp: int, bits: int) -> np.ndarray:
    alpha = np.asarray(alpha, np.float64)  # y·α reaches 2^30: float64 keeps it exact
    scaled = y.astype(np.float64) * (alpha if alpha.size > 1 else alpha.reshape(()))
    neg = ops.floor_shift(scaled, -alpha_exp)
    return ops.saturate(np.where(y < 0, neg, y), bits)


def _acc_bound(layer: NetLayer, bits: int) -> float:
    """max |Σ x·w| over inputs in the feature range: K · 2^(bits-1) · max|w|."""
    w = layer.filter.values
    k = w.shape[0] * w.shape[1] * (1 if layer.kind == "DepthwiseConv2D" else w.shape[2])
    return float(k * 2 ** (bits - 1) * np.abs(w).max(initial=0))


def _requantize(acc: np.ndarray, layer: NetLayer, e_in: int, bits: int, target: str) -> np.ndarray:
    """Accumulators (a fresh array: changed in place) -> the layer's saturated, activated output."""
    if target == "esp32s3":
        lane = 2 ** (S3_ACC_BITS[bits] - 1)
        if _acc_bound(layer, bits) >= lane:  # only then can the 40/20-bit lanes saturate
            acc = np.clip(acc, -lane, lane - 1)
    e_w = layer.filter.exponent
    e_out = layer.output_exponent
    bias = None if layer.bias is None else layer.bias.values.astype(acc.dtype)
    if isinstance(e_w, np.ndarray):  # int8 per-channel: two stages through int16
        t = ops.floor_shift(acc, 4, inplace=True)
        t = ops.saturate(t if bias is None else t + bias, 16, inplace=True)
        d = e_out - (e_in + e_w + spec.PER_CHANNEL_BIAS_SHIFT)
        y = ops.floor_shift(t, np.minimum(d, 12), inplace=True)
        if np.any(d > 12):  # m_c = ⌊2^(12 − d)⌋ = 0
            y = np.where(d > 12, 0, y)
    else:
        y = ops.floor_shift(acc, e_out - e_in - e_w, inplace=True)
        if bias is not None:
            y = y + bias
    return _activation(ops.saturate(y, bits, inplace=True), layer, bits)


def _align_sum(xs: list[np.ndarray], exps: list[int], sign: int) -> tuple[np.ndarray, int]:
    if xs[0].shape != xs[1].shape:
        raise ExportError(f"two-input layer: shapes {xs[0].shape[1:]} and {xs[1].shape[1:]}")
    e_hi = max(exps)
    a, b = (ops.floor_shift(x, e_hi - e) for x, e in zip(xs, exps, strict=True))
    return a + sign * b, e_hi


def _run(layer: NetLayer, xs: list[np.ndarray], exps: list[int], bits: int, target: str):
    """One layer: inputs (integers in float32, batch first) -> output integers."""
    k, a, what = layer.kind, layer.attrs, layer.describe()
    x, e_in = xs[0], exps[0]
    top = 2.0 ** (bits - 1)  # bound on |x|: every tensor is saturated to the feature range
    if k in ("Conv2D", "DepthwiseConv2D", "FullyConnected"):
        w = layer.filter.values
        if k == "Conv2D":
            acc = ops.conv2d_acc(x, w, a, what, top)
        elif k == "DepthwiseConv2D":
            acc = ops.depthwise_acc(x, w, a, what, top)
        else:
            acc = ops.fully_connected_acc(x, w, bool(a.get("flatten", True)), what, top)
        return _requantize(acc, layer, e_in, bits, target)
    if k in ("Add2D", "Sub2D"):
        total, e_hi = _align_sum(xs, exps, 1 if k == "Add2D" else -1)
        y = ops.saturate(ops.floor_shift(total, layer.output_exponent - e_hi), bits)
        return _activation(y, layer, bits)
    if k == "Mul2D":
        prod = xs[0].astype(np.float64) * xs[1]  # up to 2^30: exact in float64
        y = ops.saturate(ops.floor_shift(prod, layer.output_exponent - exps[0] - exps[1]), bits)
        return _activation(y, layer, bits)
    if k in ("Max2D", "Min2D"):
        return (np.maximum if k == "Max2D" else np.minimum)(xs[0], xs[1])
    if k == "AvgPool2D":
        win = ops.pool_windows(x, a, what, 0)
        n = win.shape[-1] * win.shape[-2]
        total = win.sum(axis=(-2, -1), dtype=np.float64)
        return ops.average(total, n, e_in, layer.output_exponent, bits)
    if k == "GlobalAveragePool2D":
        n = x.shape[1] * x.shape[2]
        total = x.sum(axis=(1, 2), keepdims=True, dtype=np.float64)
        return ops.average(total, n, e_in, layer.output_exponent, bits)
    if k == "MaxPool2D":
        return ops.pool_windows(x, a, what, -(2 ** (bits - 1))).max(axis=(-2, -1))
    if k == "GlobalMaxPool2D":
        return x.max(axis=(1, 2), keepdims=True)
    if k == "Concat":
        axis = int(a.get("axis", -1))
        axis = axis + x.ndim if axis < 0 else axis + 1
        return np.concatenate(xs, axis=axis)
    if k == "Flatten":
        return x.reshape(x.shape[0], -1)
    if k == "Reshape":
        return x.reshape((x.shape[0], *(int(s) for s in a["shape"])))
    if k == "Pad":
        t, b, left, r = (int(p) for p in a["paddings"])
        widths = ((0, 0), (t, b), (left, r), (0, 0))
        return np.pad(x, widths, constant_values=int(a.get("constant", 0)))
    if k == "Transpose":
        perm = a.get("perm") or list(range(x.ndim - 2, -1, -1))
        return x.transpose(0, *(int(p) + 1 for p in perm))
    if k == "ReLU":
        return np.maximum(x, 0)
    if k in ("LeakyReLU", "PReLU"):
        return _leaky(x, np.asarray(a["alpha"]), int(a["alpha_exponent"]), bits)
    if k == "Squeeze":
        axis = a.get("axis")
        return x.squeeze() if axis is None else x.squeeze(int(axis) + (1 if axis >= 0 else 0))
    if k == "ExpandDims":
        return np.expand_dims(x, tuple(int(v) + 1 if v >= 0 else v for v in a["axis"]))
    raise ExportError(f"chip layer {what}: the simulator has no kernel for {k}")


def _bias_mismatch(layer: NetLayer, e_in: int) -> list[str]:
    """The chip adds bias integers as they are: say when they were quantized for another scale
    (per-tensor: bias exponent != output exponent; per-channel: input exponent != the tensor's)."""
    if layer.bias is None or layer.filter is None:
        return []
    b_exp = layer.bias.exponent
    if isinstance(b_exp, np.ndarray):
        meant = int(b_exp[0] - layer.filter.exponent[0] - spec.PER_CHANNEL_BIAS_SHIFT)
        if meant == e_in:
            return []
        return [
            f"layer {layer.describe()}: per-channel bias quantized for input exponent {meant}, "
            f"but its input tensor has exponent {e_in}: the chip adds it scaled by 2^{meant - e_in}"
        ]
    if b_exp == layer.output_exponent:
        return []
    return [
        f"layer {layer.describe()}: bias quantized at exponent {b_exp}, output exponent is "
        f"{layer.output_exponent}: the chip adds it scaled by 2^{b_exp - layer.output_exponent}"
    ]


def _input(net: Network, x: np.ndarray, exponent: int | None) -> tuple[np.ndarray, int, bool]:
    exp = net.input_exponent if exponent is None else int(exponent)
    if exp is None:
        raise ExportError(
            "chip input: exponent unknown (the export has no input range): pass input_exponent"
        )
    x = np.asarray(x)
    batched = net.input_shape is None or x.ndim == len(net.input_shape) + 1
    if not batched:
        x = x[None]
    if net.input_shape is not None and tuple(x.shape[1:]) != tuple(net.input_shape):
        raise ExportError(
            f"chip input: shape {x.shape[1:]}, but the exported network takes "
            f"{tuple(net.input_shape)} (HWC)"
        )
    bits = net.bits
    if np.issubdtype(x.dtype, np.integer):
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        if x.size and (x.min() < lo or x.max() > hi):
            raise ExportError(f"chip input: integers outside [{lo}, {hi}] ({net.feature_type})")
        return x.astype(np.float32), exp, batched
    return quantize_input(x, exp, bits).astype(np.float32), exp, batched


def simulate_chip(
    model: Network | ExportResult | str | os.PathLike,
    x: np.ndarray,
    target: str | None = None,
    input_exponent: int | None = None,
) -> ChipResult:
    """Run ``model`` as the ESP-DL v1 chip ``target`` would, on ``x`` (HWC, or N×HWC batch).

    Args:
        model: a :class:`Network`, an export directory, or an ``ExportResult``.
        x: integers (with ``input_exponent``) or floats (quantized by :func:`quantize_input`).
        target: esp32, esp32s2, esp32c3 or esp32s3 (esp32s3 saturates accumulators);
            default the chip the export was made for (export.json), else esp32. Another one
            than the export's gives a warning in the result.
        input_exponent: the input's exponent; default the network's (the first layer's
            input_exponent in the export).

    Returns:
        :class:`ChipResult`: every layer's integers (batch axis kept only if ``x`` had one).

    Example:
        >>> from amct_bridge.espdl.v1.network import Network, NetLayer
        >>> net = Network("s16", False, [NetLayer("r", "ReLU", [INPUT])])
        >>> simulate_chip(net, np.array([-3, 4]), input_exponent=-2)["r"].values.tolist()
        [0, 4]
    """
    if target is not None and target not in spec.TARGETS:
        raise ExportError(f"target {target!r}: expected one of {', '.join(spec.TARGETS)}")
    net = as_network(model)
    made_for = getattr(net, "target", None)
    warnings: list[str] = []
    if target is not None and made_for is not None and target != made_for:
        warnings.append(
            f"the export was made for {made_for}; simulating {target} (esp32s3 saturates its "
            "accumulators, the others do not)"
        )
    target = target or made_for or "esp32"
    q, e_in, batched = _input(net, x, input_exponent)
    bits, dtype = net.bits, _DTYPE[net.bits]
    values: dict[str, np.ndarray] = {INPUT: q}
    exps: dict[str, int] = {INPUT: e_in}
    approx: dict[str, bool] = {INPUT: False}
    result: dict[str, ChipTensor] = {}
    for layer in net.layers:
        xs = [values[s] for s in layer.inputs]
        ins = [exps[s] for s in layer.inputs]
        if layer.kind == "Concat" and len(set(ins)) > 1:
            raise ExportError(
                f"chip layer {layer.describe()}: input exponents {ins} differ (the runtime "
                "asserts they are equal)"
            )
        warnings += _bias_mismatch(layer, ins[0])
        y = _run(layer, xs, ins, bits, target).astype(np.float32, copy=False)  # saturated: exact
        e_out = layer.output_exponent if not layer.keeps_exponent else max(ins)
        values[layer.name], exps[layer.name] = y, int(e_out)
        approx[layer.name] = layer.approximate or any(approx[s] for s in layer.inputs)
        out = y if batched else y[0]
        result[layer.name] = ChipTensor(out, int(e_out), approx[layer.name], dtype)
    inp = ChipTensor(q if batched else q[0], e_in, False, dtype)
    approximate = [x.name for x in net.layers if x.approximate]
    return ChipResult(target, inp, result, list(net.outputs), approximate, warnings)
