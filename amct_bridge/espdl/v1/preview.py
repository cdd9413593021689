"""Predict, in numpy, exactly what ESP-DL v1.1.0's convert.py writes for a config.json + npy set.

The convert tool is a closed binary for CPython 3.6-3.9 only; this module reproduces its integers
bit for bit (checked against the tool's real outputs in tests/data/espdl_v1_golden):

- filter exponent: config ``filter_exponent`` (JSON int) or automatic
  ``ceil(log2(max|w| / (2^(b-1)-1)))``;
  per-channel (``-q 1``): one automatic exponent per output channel, clamped to >= -15;
- elements: ``clip(round_half_even(x / 2^e), -2^(b-1), 2^(b-1) - 1)``;
- bias: per-tensor at the feature width with ``output_exponent``; per-channel int16 with
  ``input_exponent + filter_exponent[c] + 4``;
- activation alpha: own automatic exponent (or the config's ``exponent``), feature width;
- element order: NHWC (depthwise HWC) on esp32/esp32s2/esp32c3, blocks of 16 (s8) / 8 (s16) output
  channels on esp32s3.

Example:
    >>> import numpy as np
    >>> entry = {"operation": "conv2d", "feature_type": "s8", "bias": "True", "output_exponent": -5}
    >>> arrays = {"c_filter": np.full((1, 1, 2, 2), 0.5, np.float32),
    ...           "c_bias": np.array([0.1, 5.0], np.float32)}
    >>> p = preview_layer("c", entry, arrays)
    >>> p.filter.exponent, p.bias.values.tolist(), p.bias.saturated
    (-7, [3, 127], 1)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1 import layout, spec
from amct_bridge.quant.espdl import auto_exponent, channel_exponents, quantize_pow2


@dataclass
class QuantizedTensor:
    """One C array the tool writes: integers in chip element order and their exponent(s).

    ``exponent`` is an int, or one int per output channel (per-channel filters and biases);
    ``saturated`` counts elements clipped to the integer range, ``zeroed`` nonzero floats that
    became 0.
    """

    name: str
    ctype: str
    values: np.ndarray
    exponent: int | np.ndarray
    shape: tuple[int, ...]
    saturated: int = 0
    zeroed: int = 0

    @property
    def saturated_share(self) -> float:
        """Fraction of elements clipped (0.0 for an empty tensor)."""
        return self.saturated / self.values.size if self.values.size else 0.0


@dataclass
class LayerPreview:
    """What the tool produces for one config.json entry."""

    name: str
    operation: str
    feature_type: str
    filter: QuantizedTensor
    bias: QuantizedTensor | None = None
    activation_type: str | None = None
    activation: QuantizedTensor | None = None
    input_exponent: int | None = None
    output_exponent: int | None = None


def quantize_tensor(
    x: np.ndarray, exponent: int | np.ndarray, bits: int, axis: int | None = None
) -> tuple[np.ndarray, int, int]:
    """Quantize ``x`` like the tool: returns (integers, saturated count, zeroed count).

    ``exponent`` is a scalar, or one value per index of ``axis``.

    Example:
        >>> quantize_tensor(np.array([0.5, -3.0, 0.001]), -7, 8)[0].tolist()
        [64, -128, 0]
    """
    x = np.asarray(x, dtype=np.float64)
    exp = np.asarray(exponent, dtype=np.int64)
    q = quantize_pow2(x, exp, bits, axis=axis if exp.ndim else None).astype(np.int64)
    if exp.ndim:
        shape = [1] * x.ndim
        shape[axis] = exp.size
        exp = exp.reshape(shape)
    saturated = int(np.count_nonzero(np.rint(np.ldexp(x, -exp)) != q))
    zeroed = int(np.count_nonzero((q == 0) & (x != 0)))
    return q, saturated, zeroed


def filter_exponent(
    w: np.ndarray, operation: str, bits: int, per_channel: bool, explicit: object = None
) -> int | np.ndarray:
    """The tool's filter exponent: explicit int, automatic, or per channel clamped to >= -15.

    Example:
        >>> filter_exponent(np.ones((1, 1, 1, 2), np.float32), "conv2d", 8, False)
        -6
    """
    if per_channel:
        axis = spec.OPERATIONS[operation].channel_axis
        return channel_exponents(w, axis, bits, min_exponent=spec.PER_CHANNEL_MIN_EXPONENT)
    # The tool ignores a filter_exponent that is not a JSON int (bool is not an int there either).
    if isinstance(explicit, int) and not isinstance(explicit, bool):
        return explicit
    return auto_exponent(w, bits)


def _filter_array(name: str, arrays: dict[str, np.ndarray], operation: str) -> np.ndarray:
    w = arrays.get(f"{name}_filter", arrays.get(f"{name}_kernel"))
    if w is None:
        raise ExportError(f"layer {name!r}: no {name}_filter.npy (or {name}_kernel.npy)")
    w = np.asarray(w)
    if operation == "fully_connected" and w.ndim == 2:
        w = w.reshape((1, 1) + w.shape)
    if w.ndim != 4:
        raise ExportError(f"layer {name!r}: filter must be 4-D, got shape {w.shape}")
    return w


def _preview_bias(
    name: str, b: np.ndarray, entry: dict, ftype: str, f_exp: int | np.ndarray, per_channel: bool
) -> QuantizedTensor:
    b = np.asarray(b).reshape(-1)
    if per_channel:
        in_exp = entry.get("input_exponent")
        if not isinstance(in_exp, int):
            raise ExportError(f"layer {name!r}: per-channel bias needs an int input_exponent")
        exp = in_exp + np.asarray(f_exp) + spec.PER_CHANNEL_BIAS_SHIFT
        q, sat, zero = quantize_tensor(b, exp, 16, axis=0)
        return QuantizedTensor(f"{name}_bias", "int16_t", q, exp, (b.size,), sat, zero)
    out_exp = entry.get("output_exponent")
    if not isinstance(out_exp, int):
        raise ExportError(f"layer {name!r}: must provide output_exponent for quantization of bias")
    q, sat, zero = quantize_tensor(b, out_exp, spec.FEATURE_BITS[ftype])
    return QuantizedTensor(f"{name}_bias", spec.CTYPE[ftype], q, out_exp, (b.size,), sat, zero)


def _preview_activation(
    name: str, act: dict, arrays: dict[str, np.ndarray], ftype: str
) -> QuantizedTensor | None:
    kind = act.get("type")
    if kind not in spec.ACTIVATIONS:
        raise ExportError(
            f"layer {name!r}: activation type {kind!r} is not one of ReLU/LeakyReLU/PReLU"
        )
    if not spec.ACTIVATIONS[kind]:
        return None
    alpha = arrays.get(f"{name}_activation")
    if alpha is None:
        raise ExportError(f"layer {name!r}: {kind} needs {name}_activation.npy")
    alpha = np.asarray(alpha).reshape(-1)
    bits = spec.FEATURE_BITS[ftype]
    explicit = act.get("exponent")
    exp = explicit if isinstance(explicit, int) else auto_exponent(alpha, bits)
    q, sat, zero = quantize_tensor(alpha, exp, bits)
    return QuantizedTensor(
        f"{name}_activation", spec.CTYPE[ftype], q, exp, (alpha.size,), sat, zero
    )


def preview_layer(
    name: str,
    entry: dict,
    arrays: dict[str, np.ndarray],
    *,
    target: str = "esp32",
    per_channel: bool = False,
) -> LayerPreview:
    """Predict the tool's output for one config.json entry (``arrays`` keyed by npy file stem).

    Example:
        >>> w = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
        >>> p = preview_layer("d", {"operation": "conv2d", "feature_type": "s8"}, {"d_filter": w})
        >>> p.filter.exponent, p.filter.values.tolist()
        (-5, [0, 32, 64, 96])
    """
    operation = entry.get("operation")
    if operation not in spec.OPERATIONS:
        raise ExportError(
            f"layer {name!r}: operation {operation!r} is not implemented by convert.py"
        )
    ftype = entry.get("feature_type")
    if ftype not in spec.FEATURE_BITS:
        raise ExportError(f"layer {name!r}: feature_type {ftype!r} is not s8 or s16")
    if target not in spec.TARGETS:
        raise ExportError(f"target {target!r} is not one of {', '.join(spec.TARGETS)}")
    if per_channel and ftype != "s8":
        raise ExportError(f"layer {name!r}: per-channel quantization needs s8 (runtime has no s16)")
    bits = spec.FEATURE_BITS[ftype]
    w = _filter_array(name, arrays, operation)
    f_exp = filter_exponent(w, operation, bits, per_channel, entry.get("filter_exponent"))
    axis = spec.OPERATIONS[operation].channel_axis
    q, sat, zero = quantize_tensor(w, f_exp, bits, axis=axis)
    values = layout.element_order(q, operation, target, ftype)
    preview = LayerPreview(
        name,
        operation,
        ftype,
        QuantizedTensor(f"{name}_filter", spec.CTYPE[ftype], values, f_exp, w.shape, sat, zero),
        input_exponent=entry.get("input_exponent"),
        output_exponent=entry.get("output_exponent"),
    )
    if entry.get("bias"):  # the tool loads a bias for any truthy value, "False" included
        b = arrays.get(f"{name}_bias")
        if b is None:
            raise ExportError(f"layer {name!r}: bias is set but {name}_bias.npy is missing")
        preview.bias = _preview_bias(name, b, entry, ftype, f_exp, per_channel)
    act = entry.get("activation")
    if act:
        preview.activation_type = act.get("type")
        preview.activation = _preview_activation(name, act, arrays, ftype)
    return preview


def preview_set(
    config: dict, arrays: dict[str, np.ndarray], *, target: str = "esp32", per_channel: bool = False
) -> list[LayerPreview]:
    """Predict the tool's output for a whole config (entries in JSON order).

    Example:
        >>> cfg = {"a": {"operation": "fully_connected", "feature_type": "s16"}}
        >>> [p.filter.exponent for p in preview_set(cfg, {"a_filter": np.ones((3, 2))})]
        [-14]
    """
    return [
        preview_layer(name, entry, arrays, target=target, per_channel=per_channel)
        for name, entry in config.items()
    ]


def load_set(directory: str | Path, config_name: str = "config.json") -> tuple[dict, dict]:
    """Read a convert.py input set: (config dict, {npy stem: array}).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "config.json").write_text("{}")
        >>> load_set(d)
        ({}, {})
    """
    directory = Path(directory)
    config = read_json_object(directory / config_name, "a JSON object of layers")
    arrays = {p.stem: _load_npy(p) for p in sorted(directory.glob("*.npy"))}
    return config, arrays


def read_json_object(path: str | Path, what: str = "a JSON object") -> dict:
    """The JSON object in ``path``; an ExportError naming the file (and line:column of a syntax
    error) if it cannot be read, is not JSON, or is not an object (``what`` was expected).

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "c.json"
        >>> _ = p.write_text('[1]')
        >>> read_json_object(p)
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: .../c.json: expected a JSON object
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as err:
        raise ExportError(f"{path}: cannot read: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ExportError(f"{path}:{err.lineno}:{err.colno}: not JSON: {err.msg}") from None
    if not isinstance(doc, dict):
        raise ExportError(f"{path}: expected {what}")
    return doc


def _load_npy(path: Path) -> np.ndarray:
    """One coefficient array; never unpickled (an object array could run code when loaded)."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        why = "holds pickled Python objects, never loaded" if "pickle" in str(err) else err
        raise ExportError(f"{path}: not a numeric .npy array: {why}") from None


def _shape_text(shape: tuple[int, ...]) -> str:
    return "{" + ", ".join(str(int(s)) for s in shape) + "}"


def _filter_args(t: QuantizedTensor) -> str:
    if isinstance(t.exponent, np.ndarray):
        exp = f"{t.name}_exponent, {t.exponent.size}"
    else:
        exp = str(int(t.exponent))
    return f"{t.name}_element, {exp}, {_shape_text(t.shape)}, {{1, 1}}"


def tool_output(previews: list[LayerPreview]) -> dict:
    """Render previews as the C arrays and constructor arguments convert.py writes to the .cpp.

    Same structure as the golden files: ``{"arrays": {name: {"ctype", "values"}},
    "constants": {name: {"kind", "ctype", "args"}}}``.

    Example:
        >>> w = np.ones((1, 1, 1, 1), np.float32)
        >>> out = tool_output([preview_layer("a", {"operation": "conv2d", "feature_type": "s8"},
        ...                                  {"a_filter": w})])
        >>> out["constants"]["a_filter"]["args"]
        'a_filter_element, -6, {1, 1, 1, 1}, {1, 1}'
    """
    arrays: dict[str, dict] = {}
    constants: dict[str, dict] = {}
    for p in previews:
        f = p.filter
        if isinstance(f.exponent, np.ndarray):
            arrays[f"{f.name}_exponent"] = {"ctype": "int8_t", "values": f.exponent.tolist()}
        arrays[f"{f.name}_element"] = {"ctype": f.ctype, "values": f.values.tolist()}
        constants[f.name] = {"kind": "Filter", "ctype": f.ctype, "args": _filter_args(f)}
        if p.bias is not None:
            b = p.bias
            arrays[f"{b.name}_element"] = {"ctype": b.ctype, "values": b.values.tolist()}
            exp = (
                spec.PER_CHANNEL_BIAS_PLACEHOLDER
                if isinstance(b.exponent, np.ndarray)
                else int(b.exponent)
            )
            args = f"{b.name}_element, {exp}, {{{b.values.size},}}"
            constants[b.name] = {"kind": "Bias", "ctype": b.ctype, "args": args}
        if p.activation_type is not None:
            name = f"{p.name}_activation"
            args = p.activation_type
            a = p.activation
            if a is not None:
                arrays[f"{name}_element"] = {"ctype": a.ctype, "values": a.values.tolist()}
                args += f", {name}_element, {int(a.exponent)}, {{{a.values.size},}}"
            constants[name] = {
                "kind": "Activation",
                "ctype": spec.CTYPE[p.feature_type],
                "args": args,
            }
    return {"arrays": arrays, "constants": constants}
