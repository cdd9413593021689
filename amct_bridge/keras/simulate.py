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

from amct_bridge.calibration.simulate import (
    balance_of,
    check_factors,
    input_quant,
    require_factors,
    simulated_kernel,
)
from amct_bridge.errors import RecordError
from amct_bridge.keras.qat.fake_quant import (
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
    return simulated_copy(model, record)[0]


def simulated_copy(
    model: keras.Model, record: Record | str | os.PathLike, wrapper: type | None = None
) -> tuple[keras.Model, dict, dict]:
    """:func:`simulate`'s copy, its layers (``key -> (original layer, new layer)``) and the
    record's factors per layer and kernel attribute (``key -> {attribute: factors}``).

    ``wrapper``: the :class:`SimulatedQuant` subclass that wraps each quantized layer (the
    report's switchable one); default SimulatedQuant.

    Example:
        >>> sim, pairs, parts = simulated_copy(model, "record.txt")  # doctest: +SKIP
    """
    wrapper = wrapper or SimulatedQuant
    if not isinstance(record, Record):
        from amct_bridge.records import load

        record = load(record)
    require_factors(record)
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
        return wrapper(
            new,
            input_quant=input_quant(first) if first is not None else None,
            mid_quant=input_quant(last) if last is not None else None,
            input_balance=balance_of(first),
            mid_balance=balance_of(last),
            name=layer.name,
        )

    clone, pairs = clone_with(model, make_layer)
    for key, (orig, new) in pairs.items():
        inner = new.layer if isinstance(new, SimulatedQuant) else new
        copy_weights(orig, inner)
        if key in parts:
            _quantize_kernels(inner, parts[key], fused.get(key), key)
    return clone, pairs, parts


def forward_batches(model: keras.Model, arrays: list[np.ndarray], batch_size: int) -> list:
    """``model``'s outputs on ``arrays`` (one per model input), called eagerly batch by batch,
    as numpy arrays: one per output. Eager, because a copy made for one pass would cost a
    trace more than its batches.

    Example:
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.set_weights([np.float32([[1.0], [2.0]])])
        >>> forward_batches(m, [np.float32([[1, 1], [0, 1], [1, 0]])], 2)[0].ravel().tolist()
        [3.0, 2.0, 1.0]
    """
    chunks: list[list[np.ndarray]] = []
    for start in range(0, len(arrays[0]), batch_size):
        batch = [a[start : start + batch_size] for a in arrays]
        # one array for a one-input model: Keras warns of a structure mismatch for a list
        outs = model(batch[0] if len(batch) == 1 else batch, training=False)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        chunks.append([np.asarray(keras.ops.convert_to_numpy(o)) for o in outs])
    return [np.concatenate(parts) for parts in zip(*chunks, strict=True)]


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
        entries = by_keras_keys(model, entries)
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


def by_keras_keys(model: keras.Model, entries: dict) -> dict[str, LayerFactors]:
    """Entries keyed by TF op names (``keys="tf_op"``) re-keyed by Keras layer names, by
    tracing the model as :func:`~amct_bridge.keras.freeze.freeze_model` does for the record
    (simulation, the quant report and the ESP-DL export all take such records).

    A shared layer has one op per call, so several TF keys map to one layer; simulation has
    one set of factors per layer, so they must agree (they do in records this package wrote).
    Keys that name no op are left as they are (and reported by the caller).

    Example:
        >>> from amct_bridge.keras.freeze import freeze_model
        >>> x = keras.Input((2,)); m = keras.Model(x, keras.layers.Dense(1, name="fc")(x))
        >>> op = freeze_model(m).op_names["fc"][0]  # the TF op a keys="tf_op" record names
        >>> by_keras_keys(m, {op: "factors", "other": "kept"})
        {'fc': 'factors', 'other': 'kept'}
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


def _check_factors(key: str, layer, attr: str, f: LayerFactors) -> None:
    where = f"record key {key!r} ({type(layer).__name__})"
    if not attr:  # average pooling: data factors only
        check_factors(where, key, f, None, None)
        return
    layout = dict(layer_spec(layer).kernels)[attr]
    check_factors(where, key, f, tuple(getattr(layer, attr).shape), layout)


def _quantize_kernels(layer, parts: dict, bn, key: str) -> None:
    """Replace each kernel of ``layer`` named in ``parts`` by its dequantized integer values
    (:func:`amct_bridge.calibration.simulate.simulated_kernel`)."""
    spec = layer_spec(layer)
    for attr, layout in spec.kernels:
        f = parts.get(attr)
        if f is None or not (f.scale_w or f.tensor_balance_factor):
            continue
        var = getattr(layer, attr)
        w = np.asarray(var, dtype=np.float32)
        # BN folds into the last kernel only (the pointwise one of a separable conv).
        fold = bn is not None and attr == spec.kernels[-1][0]
        wq = simulated_kernel(w, layout, f, bn_scale(bn) if fold else None, key)
        var.assign(wq.astype(var.dtype))
