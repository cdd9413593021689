"""Simulated (fake-quantized) inference of a Keras model with a record's factors.

``simulate(model, record)`` returns a copy of ``model`` in which every layer named in the record
computes on quantized -> dequantized values, as the deployed integer model will:

* its input: ``scale_d`` / ``offset_d`` with ``dst_type``'s bit width if set (QAT records: INT4 or
  INT8), else ``act_type``'s (INT8 default, INT16);
* its kernels: ``scale_w`` / ``offset_w`` (one value or one per output channel) with ``dst_type``'s
  bit width if set, else 8 (``wts_type``). Kernels are quantized once, in numpy, when the copy is
  made; when AMCT would fuse a following BatchNormalization into the layer (Conv/Dense -> BN, no
  ``skip_fusion``), the FUSED kernel ``W * gamma / sqrt(var + eps)`` is quantized, as the record's
  scale_w was computed on it, and the BN layer is kept (the kernel is divided back by the BN
  factor), so the copy keeps the original's structure and layer names.

DMQ records (``tensor_balance_factor``, one factor ``f_c`` per input channel) run as AMCT runs
them: the layer input is divided by ``f`` per channel before it is quantized with scale_d /
offset_d (which were computed on the divided input), and the kernel is multiplied by ``f`` per
input channel (after BN fusion) before ARQ quantization with scale_w. The copy's kernel keeps that
balanced form, so the layer computes ``conv(fq(x / f), fq(W * f))`` exactly as deployed.

Layers without a record entry stay float. Biases stay float (the deployed int32 bias has an error
far below one activation step). Record keys are Keras layer names ("outer/inner" inside nested
models); a SeparableConv2D ``sep`` has two entries, ``sep/depthwise`` (input + depthwise kernel)
and ``sep/pointwise`` (the depthwise output + pointwise kernel). Records keyed by TF op names
(``keys="tf_op"``, for ``convert_model``) work too: the model is traced to map each op back to its
layer. A key that names no quantizable layer is an error
(:class:`~amct_bridge.errors.RecordError`), like AMCT's "find <layer> failure".

Example:
    >>> import keras, numpy as np
    >>> from amct_bridge.records import LayerFactors, Record
    >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="fc")])
    >>> m.set_weights([np.float32([[0.5], [0.25]]), np.float32([0.0])])
    >>> rec = Record({"fc": LayerFactors(scale_d=0.5, offset_d=0, scale_w=[0.25], offset_w=[0])})
    >>> float(simulate(m, rec).predict(np.float32([[1.2, 0.4]]), verbose=0)[0, 0])  # 1*.5+.5*.25
    0.625
"""

from __future__ import annotations

import difflib
import os

import keras
import numpy as np

from amct_bridge.errors import RecordError
from amct_bridge.keras.fake_quant import (
    divide_exact,
    fake_quant,
    finish,
    layer_spec,
)
from amct_bridge.keras.rewrite import (
    batchnorm_after,
    bn_scale,
    clone_with,
    copy_weights,
    plain_copy,
    quantizable_layers,
)
from amct_bridge.quant.arq import fake_quantize_weights
from amct_bridge.quant.factors import bits_of, quant_limits
from amct_bridge.quant.layouts import get_layout, out_channel_shape
from amct_bridge.records.model import LayerFactors, Record


@keras.saving.register_keras_serializable(package="amct_bridge")
class SimulatedQuant(keras.layers.Wrapper):
    """Wraps a layer whose kernels were already fake-quantized; fake-quantizes its input.

    Args:
        layer: the wrapped layer (its kernels hold dequantized integer values).
        input_quant: ``[scale, offset, bits]`` for the input, or None (input stays float).
        mid_quant: ``[scale, offset, bits]`` for a SeparableConv2D's depthwise output, or None.
        input_balance: DMQ ``tensor_balance_factor`` of the input (one per channel): the input is
            divided by it before ``input_quant``; None: no balancing.
        mid_balance: the same for the depthwise output (``mid_quant``).

    Example:
        >>> import keras
        >>> w = SimulatedQuant(keras.layers.Dense(2), input_quant=[0.1, 0, 8], name="fc")
        >>> w.get_config()["input_quant"]
        [0.1, 0, 8]
    """

    def __init__(
        self,
        layer,
        input_quant=None,
        mid_quant=None,
        input_balance=None,
        mid_balance=None,
        **kwargs,
    ):
        super().__init__(layer, **kwargs)
        self.input_quant = None if input_quant is None else list(input_quant)
        self.mid_quant = None if mid_quant is None else list(mid_quant)
        self.input_balance = None if input_balance is None else [float(v) for v in input_balance]
        self.mid_balance = None if mid_balance is None else [float(v) for v in mid_balance]

    def build(self, input_shape=None):
        super().build(input_shape)
        # The factors are variables, not constants: Grappler would rewrite a division by a
        # constant as a multiplication by its reciprocal, which rounds differently from AMCT.
        self._factors = {}
        for name, quant in (("input", self.input_quant), ("mid", self.mid_quant)):
            if quant is not None:
                self._factors[name] = [
                    self.add_weight(
                        name=f"{name}_{what}",
                        shape=(),
                        initializer=keras.initializers.Constant(value),
                        trainable=False,
                        autocast=False,  # factors stay float32 under mixed precision
                    )
                    for what, value in (("scale", quant[0]), ("offset", quant[1]))
                ] + [int(quant[2])]
        self._balance = {}
        for name, factors in (("input", self.input_balance), ("mid", self.mid_balance)):
            if factors is not None:
                self._balance[name] = self.add_weight(
                    name=f"{name}_balance",
                    shape=(len(factors),),
                    initializer=keras.initializers.Constant(factors),
                    trainable=False,
                    autocast=False,
                )

    def _quant(self, x, name: str):
        """DMQ division (if any), then fake quantization (if any) of input/mid tensor ``x``."""
        factors = self._balance.get(name)
        if factors is not None:
            dtype = x.dtype
            shape = [1] * len(x.shape)
            first = getattr(self.layer, "data_format", "channels_last") == "channels_first"
            shape[1 if first and len(shape) > 2 else -1] = -1
            x = keras.ops.cast(divide_exact(x, keras.ops.reshape(factors, shape)), dtype)
        return x if name not in self._factors else fake_quant(x, *self._factors[name])

    def call(self, inputs):
        x = self._quant(inputs, "input")
        if self.mid_quant is None and self.mid_balance is None:
            return self.layer(x)
        spec = layer_spec(self.layer)
        kernels = {attr: getattr(self.layer, attr) for attr, _ in spec.kernels}
        mid = lambda y: self._quant(y, "mid")  # noqa: E731
        return finish(self.layer, spec.op(self.layer, x, kernels, mid))

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def get_config(self):
        return {
            **super().get_config(),
            "input_quant": self.input_quant,
            "mid_quant": self.mid_quant,
            "input_balance": self.input_balance,
            "mid_balance": self.mid_balance,
        }


def simulate(model: keras.Model, record: Record | str | os.PathLike) -> keras.Model:
    """A copy of ``model`` that applies ``record``'s quantization (see the module docstring).

    Args:
        model: a built Sequential or functional Keras model (nested models allowed). Not modified.
        record: a :class:`~amct_bridge.records.Record` or the path of a record file (keys: Keras
            layer names or the TF op names of ``keys="tf_op"``).

    Returns:
        A new ``keras.Model`` (same inputs/outputs, layer names) to ``predict``/``evaluate``.

    Raises:
        RecordError: a key names no quantizable layer, or a layer's factors do not fit it.

    Example:
        >>> sim = simulate(model, "record.txt")  # doctest: +SKIP
        >>> sim.compile(metrics=["accuracy"]); sim.evaluate(x, y)  # doctest: +SKIP
    """
    if not isinstance(record, Record):
        from amct_bridge.records import load

        record = load(record)
    _require_factors(record)
    parts = _record_parts(model, record)
    fused = batchnorm_after(model)

    def make_layer(key, layer):
        new = plain_copy(layer)
        mine = parts.get(key)
        if mine is None or not any(f is not None for f in mine.values()):
            return new
        attrs = [attr for attr, _ in layer_spec(layer).kernels] or [""]
        first = mine[attrs[0]]
        last = mine[attrs[1]] if len(attrs) > 1 else None  # a separable conv's pointwise part
        return SimulatedQuant(
            new,
            input_quant=_input_quant(first, key) if first is not None else None,
            mid_quant=_input_quant(last, key) if last is not None else None,
            input_balance=_balance(first),
            mid_balance=_balance(last),
            name=layer.name,
        )

    clone, pairs = clone_with(model, make_layer)
    for key, (orig, new) in pairs.items():
        inner = new.layer if isinstance(new, SimulatedQuant) else new
        copy_weights(orig, inner)
        if key in parts:
            _quantize_kernels(inner, parts[key], fused.get(key), key)
    return clone


def _record_parts(model: keras.Model, record: Record) -> dict[str, dict[str, LayerFactors | None]]:
    """Layer key -> {kernel attribute ("" for pooling): factors or None}; unknown keys raise."""
    layers = quantizable_layers(model)
    wanted: dict[str, tuple[str, str]] = {}
    for key, layer in layers.items():
        spec = layer_spec(layer)
        attrs = [attr for attr, _ in spec.kernels] or [""]  # "": average pooling, input only
        for i, attr in enumerate(attrs):
            wanted[spec.key(key, i)] = (key, attr)
    entries = record.layers
    if any(k not in wanted for k in entries):
        entries = _by_keras_keys(model, entries)
    unknown = [k for k in entries if k not in wanted]
    if unknown:
        raise RecordError(_unknown_message(model, unknown, list(wanted)))
    parts: dict[str, dict[str, LayerFactors | None]] = {}
    for rkey, factors in entries.items():
        key, attr = wanted[rkey]
        _check_factors(rkey, layers[key], attr, factors)
        parts.setdefault(key, {a: None for a, _ in layer_spec(layers[key]).kernels} or {"": None})
        parts[key][attr] = factors
    return parts


def _require_factors(record: Record) -> None:
    """A record with nothing to simulate (e.g. prune-only) is a mistake, not a float copy."""
    if any(f.scale_d is not None or f.scale_w for f in record.layers.values()):
        return
    n, p = len(record.layers), len(record.prune_records)
    what = f"{n} layer entr{'y' if n == 1 else 'ies'} without scale_d/scale_w" if n else "no layers"
    if p:
        what += f" and {p} prune record{'' if p == 1 else 's'}"
    source = f"record {record.source}" if record.source else "the record"
    raise RecordError(
        f"{source} has no quantization factors ({what}); simulate() needs scale_d/scale_w "
        "from a calibration or QAT record"
    )


def _by_keras_keys(model: keras.Model, entries: dict) -> dict[str, LayerFactors]:
    """Entries keyed by TF op names (``keys="tf_op"``) re-keyed by Keras layer names, by
    tracing the model as :func:`~amct_bridge.keras.freeze.freeze_model` does for the record.

    A shared layer has one op per call, so several TF keys map to one layer; simulation has
    one set of factors per layer, so they must agree (they do in records this package wrote).
    Keys that name no op are left as they are (and reported by the caller).
    """
    from amct_bridge.keras.freeze import freeze_model

    layer_of = {op: key for key, ops in freeze_model(model).op_names.items() for op in ops}
    out: dict[str, LayerFactors] = {}
    sources: dict[str, str] = {}
    for rkey, factors in entries.items():
        key = layer_of.get(rkey, rkey)
        if key in out and out[key] != factors:
            raise RecordError(
                f"record keys {sources[key]!r} and {rkey!r} are ops of the same layer {key!r} "
                "(called twice) with different factors; a simulated layer has one set"
            )
        out[key], sources[key] = factors, rkey
    return out


def _unknown_message(model: keras.Model, unknown: list[str], known: list[str]) -> str:
    lines = [f"record keys name no quantizable layer of model {model.name!r}:"]
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        lines.append(f"  find {key} failure in model. Please match{hint}")
    lines.append("quantizable layers: " + (", ".join(known) or "none"))
    return "\n".join(lines)


def _bits(factors: LayerFactors, field: str) -> int:
    if factors.dst_type is not None:
        return bits_of(factors.dst_type)
    if field == "act_type":
        return bits_of(factors.act_type or "INT8")
    # wts_type INT4..INT8: ARQ scales already map the kernel into the narrower range, so
    # clipping at 8 bits is exact (AMCT stores INT6/INT7 results as INT8 too).
    return 8


def _check_factors(key: str, layer, attr: str, f: LayerFactors) -> None:
    where = f"record key {key!r} ({type(layer).__name__})"
    if (f.scale_d is None) != (f.offset_d is None):
        raise RecordError(f"{where}: scale_d and offset_d must be given together")
    if f.scale_d is not None:
        qmin, qmax = quant_limits(_bits(f, "act_type"))
        if not (np.isfinite(f.scale_d) and f.scale_d > 0):
            raise RecordError(f"{where}: scale_d {f.scale_d} must be finite and > 0")
        if not qmin <= f.offset_d <= qmax:
            raise RecordError(f"{where}: offset_d's value should be in [{qmin}, {qmax}]")
    if not attr:
        if f.scale_w:
            raise RecordError(f"{where}: average pooling has no weights, but scale_w is set")
        if f.tensor_balance_factor:
            raise RecordError(f"{where}: tensor_balance_factor is not allowed on average pooling")
        return
    if f.tensor_balance_factor:
        shape = tuple(getattr(layer, attr).shape)
        layout = dict(layer_spec(layer).kernels)[attr]
        cin = int(shape[get_layout(np.empty(shape), layout, key).in_axis])
        if len(f.tensor_balance_factor) != cin:
            raise RecordError(
                f"{where}: tensor_balance_factor's length {len(f.tensor_balance_factor)} should "
                f"be equal to the channel length of inputs of layer {key}: {cin} (Cin)"
            )
        if not all(np.isfinite(v) and v > 0 for v in f.tensor_balance_factor):
            raise RecordError(f"{where}: every tensor_balance_factor must be finite and > 0")
    if not f.scale_w:
        return
    channels = _out_channels(getattr(layer, attr).shape, layer_spec(layer), attr)
    if len(f.scale_w) not in (1, channels):
        raise RecordError(f"{where}: scale_w has {len(f.scale_w)} values, expected 1 or {channels}")
    if f.offset_w and len(f.offset_w) != len(f.scale_w):
        raise RecordError(
            f"{where}: offset_w has {len(f.offset_w)} values, scale_w {len(f.scale_w)}"
        )
    if any(o != 0 for o in f.offset_w):
        raise RecordError(f"{where}: offset_w's value should be 0")
    if not all(np.isfinite(s) and s > 0 for s in f.scale_w):
        raise RecordError(f"{where}: every scale_w must be finite and > 0")


def _input_quant(f: LayerFactors, key: str) -> list | None:
    if f.scale_d is None:
        return None
    return [float(np.float32(f.scale_d)), int(f.offset_d), _bits(f, "act_type")]


def _balance(f: LayerFactors | None) -> list[float] | None:
    """The DMQ factors of a part, as float32 values (the record's precision), or None."""
    if f is None or not f.tensor_balance_factor:
        return None
    return [float(v) for v in np.float32(f.tensor_balance_factor)]


def _out_channels(kernel_shape, spec, attr) -> int:
    layout = dict(spec.kernels)[attr]
    return int(np.prod(out_channel_shape(np.empty(tuple(kernel_shape)), layout)))


def _quantize_kernels(layer, parts: dict, bn, key: str) -> None:
    """Replace each kernel of ``layer`` named in ``parts`` by its dequantized integer values."""
    spec = layer_spec(layer)
    for attr, layout in spec.kernels:
        f = parts.get(attr)
        if f is None or not (f.scale_w or f.tensor_balance_factor):
            continue
        var = getattr(layer, attr)
        w = np.asarray(var, dtype=np.float32)
        shape = out_channel_shape(w, layout, key)
        # BN folds into the last kernel only (the pointwise one of a separable conv).
        fold = bn is not None and not f.skip_fusion and attr == spec.kernels[-1][0]
        k = bn_scale(bn).reshape(shape) if fold else np.ones(shape)
        # DMQ: AMCT multiplies the BN-fused kernel per input channel before ARQ; the simulated
        # input is divided by the same factors, so the copy's kernel stays balanced.
        in_shape = [1] * w.ndim
        in_shape[get_layout(w, layout, key).in_axis] = -1
        balance = np.float32(f.tensor_balance_factor or 1.0).reshape(in_shape)
        fused = (w * k).astype(np.float32) * balance
        wq = (
            fake_quantize_weights(fused, layout, f.scale_w, num_bits=_bits(f, "wts_type"), name=key)
            if f.scale_w
            else fused
        )
        # Divide the BN factor back out: the kept BN multiplies it in again. A zero factor
        # makes the kernel irrelevant, so keep the float one there.
        wq = np.where(k == 0, w * balance, wq / np.where(k == 0, 1.0, k))
        var.assign(wq.astype(var.dtype))
