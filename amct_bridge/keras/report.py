"""Keras side of the per-layer quantization report (the core is :mod:`amct_bridge.report`).

:class:`KerasReportRunner` lists a model's quantizable parts by record key and runs the model,
float or through :func:`amct_bridge.keras.simulate` with a (partial) record, returning the
outputs of the layers asked for. The report runs one pass per layer, each with a record of that
layer alone: instead of a new simulated copy per pass, one copy of the whole record is made whose
parts can be switched back to float (a 0/1 variable gates each input's fake quantization, and the
kernel variables are assigned their float or quantized values), and it runs in compiled
functions traced once. A record that is not part of the first one gets a copy of its own.

Layer outputs are read from the top-level functional graph, so layers inside a nested model, and
shared layers (several outputs), get model-level columns only. A SeparableConv2D's pointwise
input (the depthwise output) lives inside the layer: its input columns stay empty.

Example:
    >>> import keras, numpy as np
    >>> from amct_bridge.records import LayerFactors, Record
    >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="fc")])
    >>> m.set_weights([np.float32([[0.5], [0.25]]), np.float32([0.0])])
    >>> rec = Record({"fc": LayerFactors(scale_d=0.5, offset_d=0, scale_w=[0.25], offset_w=[0])})
    >>> x = np.float32([[1.2, 0.4], [0.1, -0.3]])
    >>> rep = quant_report(m, rec, x)
    >>> rep.rows[0].key, rep.rows[0].input_max, rep.top
    ('fc', 1.2000000476837158, ['fc'])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from amct_bridge.keras.layers import class_name
from amct_bridge.keras.qat.fake_quant import layer_spec
from amct_bridge.keras.rewrite import quantizable_layers
from amct_bridge.keras.simulate import (
    SimulatedQuant,
    by_keras_keys,
    forward_batches,
    simulate,
    simulated_copy,
)
from amct_bridge.records.calibration import CalibrationStats
from amct_bridge.records.model import Record
from amct_bridge.report import LayerInfo, Report, RunResult, build_report, read_record


class KerasReportRunner:
    """:class:`amct_bridge.report.ReportRunner` for a built Sequential/functional Keras model.

    Args:
        model: the float model (not modified).
        data: its input (one array, or a list of arrays for several inputs), one row per sample.
        batch_size: samples per forward call.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
        >>> KerasReportRunner(m, np.zeros((4, 3), "float32")).layers()[0].key
        'fc'
    """

    def __init__(self, model: keras.Model, data, batch_size: int = 32):
        self.model = model
        self.data = data
        self.batch_size = int(batch_size)
        self._infos: list[LayerInfo] = []
        self._part: dict[str, int] = {}  # record key -> part index in its layer
        self._switched: _Switched | None = None  # the first record's switchable copy
        self._functions: dict = {}  # traced forward functions, by model and tensors
        for key, layer in quantizable_layers(model).items():
            spec = layer_spec(layer)
            first = getattr(layer, "data_format", "channels_last") == "channels_first"
            for i in range(max(len(spec.kernels), 1)):
                rkey = spec.key(key, i)
                self._infos.append(LayerInfo(rkey, key, class_name(layer), 1 if first else -1))
                self._part[rkey] = i

    def layers(self) -> list[LayerInfo]:
        """The quantizable parts in execution order (record keys)."""
        return list(self._infos)

    def run(self, record: Record | None, keys: Sequence[str]) -> RunResult:
        """Forward the data through the float model (``record=None``) or its simulated copy."""
        if record is None:
            return self._compiled(self.model, keys, inputs=True)
        if self._switched is None:
            self._switched = _Switched(self.model, record)
        if self._switched.select(record):
            return self._compiled(self._switched.model, keys, inputs=False)
        return self._eager(simulate(self.model, record), keys)

    def _probed(self, model: keras.Model, keys: Sequence[str], inputs: bool):
        """The tensors of ``keys`` (and float inputs of first parts) in ``model``, and their
        ``("out" | "in", record key)`` names."""
        layer_of = {i.key: i.layer for i in self._infos}
        tensors: list = []
        names: list[tuple[str, str]] = []
        for key in keys:
            out = _single(model, layer_of[key], "output")
            if out is not None:
                tensors.append(out)
                names.append(("out", key))
            if inputs and self._part[key] == 0:
                inp = _single(model, layer_of[key], "input")
                if inp is not None:
                    tensors.append(inp)
                    names.append(("in", key))
        return tensors, names

    def _eager(self, model: keras.Model, keys: Sequence[str]) -> RunResult:
        tensors, names = self._probed(model, keys, inputs=False)
        probe = _probe(model, tensors)
        return _result(forward_batches(probe, self._arrays(), self.batch_size), names)

    def _compiled(self, model: keras.Model, keys: Sequence[str], inputs: bool) -> RunResult:
        """One key: the function of every key's output with a switch on which one is returned
        (traced once for all the per-layer passes); otherwise a function per key set."""
        if len(keys) == 1 and not inputs:
            every = [i.key for i in self._infos]
            fn = self._function(model, every, inputs=False, select=True)
            tensors, names = fn.tensors, fn.names
            want = [n for n in names if n[1] == keys[0]]
            if not want:
                return self._compiled(model, [], inputs=False)
            index = names.index(want[0])
            shape = tuple(tensors[index].shape[1:])
            if all(isinstance(d, int) for d in shape):  # else: a function of its own below
                fn.index.assign(index)
                final, chosen = self._batches(fn)
                return _result([final, chosen.reshape((len(chosen), *shape))], want)
        fn = self._function(model, keys, inputs, select=False)
        return _result(self._batches(fn), fn.names)

    def _function(self, model, keys, inputs: bool, select: bool) -> _Traced:
        cache_key = (id(model), tuple(keys), inputs, select)
        if cache_key in self._functions:
            return self._functions[cache_key]
        tensors, names = self._probed(model, keys, inputs)
        probe = _probe(model, tensors)
        index = tf.Variable(0, trainable=False)

        def step(*batch):
            outs = probe(batch[0] if len(batch) == 1 else list(batch), training=False)
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            if not select:
                return outs
            flat = [tf.reshape(o, [tf.shape(o)[0], -1]) for o in outs[1:]]
            return outs[0], tf.switch_case(index.read_value(), [lambda f=f: f for f in flat])

        arrays = self._arrays()
        specs = [tf.TensorSpec((None, *a.shape[1:]), a.dtype) for a in arrays]
        # a concrete function: tf.function's "frequent retracing" warning counts every
        # function of this code, and a report makes four
        traced = tf.function(step, input_signature=specs, autograph=False)
        fn = _Traced(traced.get_concrete_function(), tensors, names, index)
        self._functions[cache_key] = fn
        return fn

    def _arrays(self) -> list[np.ndarray]:
        return list(self.data) if isinstance(self.data, (list, tuple)) else [self.data]

    def _batches(self, fn) -> list[np.ndarray]:
        arrays = self._arrays()
        chunks = []
        for start in range(0, len(arrays[0]), self.batch_size):
            outs = fn.call(*(tf.constant(a[start : start + self.batch_size]) for a in arrays))
            chunks.append([np.asarray(o) for o in outs])
        return [np.concatenate(parts) for parts in zip(*chunks, strict=True)]


def _probe(model: keras.Model, tensors: list) -> keras.Model:
    """``model``'s output and ``tensors``, from its inputs as one tensor for one input (so it is
    called with one array, as :func:`forward_batches` calls it)."""
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
    return keras.Model(inputs, [model.outputs[0], *tensors])


@dataclass
class _Traced:
    """A traced forward function, the Keras tensors it returns after the model output and
    their names, and the variable choosing the one a per-layer pass returns."""

    call: Callable
    tensors: list
    names: list[tuple[str, str]]
    index: tf.Variable


def _result(values: list[np.ndarray], names: list[tuple[str, str]]) -> RunResult:
    result = RunResult(final=values[0])
    for (what, key), value in zip(names, values[1:], strict=True):
        (result.outputs if what == "out" else result.inputs)[key] = value
    return result


class _SwitchedQuant(SimulatedQuant):
    """:class:`SimulatedQuant` whose input and depthwise-output quantization each have an on/off
    variable (1.0 on): switched off, the tensor passes unchanged."""

    def build(self, input_shape=None):
        super().build(input_shape)
        self.switches = {
            name: self.add_weight(
                name=f"{name}_on",
                shape=(),
                initializer="ones",
                trainable=False,
                autocast=False,
            )
            for name in ("input", "mid")
        }

    def _quant(self, x, name: str):
        y = super()._quant(x, name)
        return x if y is x else keras.ops.where(self.switches[name] > 0.5, y, x)


class _Switched:
    """The simulated copy of a record whose parts switch between quantized and float.

    Per record key: the on/off variable of its input (first part) or depthwise output (second),
    and its kernel variable with the float and the quantized values. :meth:`select` sets them
    for a record whose entries are all the first record's.
    """

    def __init__(self, model: keras.Model, record: Record) -> None:
        self.full = dict(record.layers)
        self.model, pairs, parts = simulated_copy(model, record, _SwitchedQuant)
        self.parts: dict[str, tuple] = {}  # record key -> (switch or None, [(var, float, quant)])
        for key, (orig, new) in pairs.items():
            mine = parts.get(key)
            if not mine:
                continue  # not in the record: a plain copy
            spec = layer_spec(orig)
            inner = new.layer if isinstance(new, SimulatedQuant) else new
            attrs = [attr for attr, _ in spec.kernels] or [""]
            for i, attr in enumerate(attrs):
                f = mine.get(attr)
                if f is None:
                    continue
                switch = None
                if isinstance(new, _SwitchedQuant):
                    switch = new.switches["input" if i == 0 else "mid"]
                kernels = []
                if attr and (f.scale_w or f.tensor_balance_factor):
                    var = getattr(inner, attr)
                    kernels.append((var, np.asarray(getattr(orig, attr)), np.asarray(var)))
                self.parts[spec.key(key, i)] = (switch, kernels)
        self.on = set(self.parts)

    def select(self, record: Record) -> bool:
        """Switch on exactly ``record``'s parts; False if it has an entry the first lacks."""
        if any(self.full.get(k) != f for k, f in record.layers.items()):
            return False
        want = set(record.layers) & set(self.parts)
        for key, (switch, kernels) in self.parts.items():
            on = key in want
            if on == (key in self.on):
                continue
            if switch is not None:
                switch.assign(1.0 if on else 0.0)
            for var, float_value, quant_value in kernels:
                var.assign(quant_value if on else float_value)
        self.on = want
        return True


def _single(model: keras.Model, name: str, what: str):
    """The layer's single input/output tensor in ``model``'s top-level graph, or None (nested,
    shared or several tensors)."""
    try:
        tensor = getattr(model.get_layer(name), what)
    except (ValueError, AttributeError):  # not top level, or called more than once
        return None
    return None if isinstance(tensor, (list, tuple, dict)) else tensor


def quant_report(
    model: keras.Model,
    record: Record | str | os.PathLike,
    data,
    labels: np.ndarray | None = None,
    *,
    top_k: int = 3,
    batch_size: int = 32,
    stats: CalibrationStats | None = None,
) -> Report:
    """The per-layer quantization report of ``record`` on ``model`` (see docs/report.md).

    Args:
        model: the float Keras model the record was calibrated on.
        record: a :class:`~amct_bridge.records.Record` or a record file; a file's sidecar
            (``<record>.calib.json``) is read for the calibration's ranges when ``stats`` is None.
        data: report inputs (array or list of arrays), e.g. held-out calibration-like data.
        labels: class labels of ``data`` (index or one-hot) for the accuracy columns, or None.
        top_k: layers kept in float in the config fragment.
        batch_size: samples per forward call.
        stats: calibration sidecar, optional.

    Returns:
        :class:`amct_bridge.report.Report` (``.rows``: one :class:`~amct_bridge.report.LayerRow`
        per quantized part, ``.fragment``: AMCT config text; ``render_html`` / ``text_table``).

    Example:
        >>> rep = quant_report(model, "record.txt", x, y)  # doctest: +SKIP
        >>> [r.key for r in sorted(rep.rows, key=lambda r: r.rank)][:3]  # doctest: +SKIP
    """
    record, stats = read_record(record, stats)
    runner = KerasReportRunner(model, data, batch_size)
    known = {i.key for i in runner.layers()}
    if any(k not in known for k in record.layers):
        # keys="tf_op" records: re-key by layer name, as simulate does
        record = Record(by_keras_keys(model, record.layers), flavor=record.flavor)
    return build_report(record, runner, labels, top_k=top_k, stats=stats)
