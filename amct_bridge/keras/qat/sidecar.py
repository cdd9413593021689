"""The calibration sidecar of a QAT model: the ranges the ESP-DL export needs, from training.

The post-training callback writes ``record.txt.calib.json`` (:mod:`amct_bridge.records.
calibration`) with each layer's input/output range; the ESP-DL exporter reads the OUTPUT ranges
(a chain's output exponent, Add2D's and the pools' exponents). :func:`qat_stats` builds the same
document from what QAT tracked while training:

* a quantized layer (``QATQuant``): ``input`` = its clip range (EMA or learned, what the record's
  scale_d/offset_d encode); ``output`` = the EMA of its output's min/max. A SeparableConv2D's
  two entries meet at the depthwise output (its "mid" clip range). A layer with a fused
  activation other than linear / ReLU / ReLU6 (``Dense(activation="softmax")``), at one node,
  also has ``preactivation`` = the EMA of its output before that activation (the logits), as
  the calibration sidecar;
* a folded BatchNormalization: ``output`` = the folded layer's output (the same tensor);
* activations, Add / Concatenate / pools and unfolded BNs (``QATObserve``): ``output`` = EMA;
* any tensor a quantized layer reads gets that layer's clip range as its ``min``/``max`` (the
  network was trained to see it clipped there; ``observed_min``/``observed_max`` keep the
  EMA), as the callback shares one observer per tensor.

A layer called at several nodes gets one entry per node, keyed as the graph and the
calibration sidecar key them (``relu``, ``relu@1``...), each from that node's own range; the
clip of a quantized reader applies to the node it reads. Raw ops (``x + y`` in a functional
model) are not layers and get no entry: the exporter then bounds an Add2D by its inputs
(docs/espdl-export.md). Entries are in execution order; nested models are keyed
``"outer/inner"``.

Power-of-two QAT (``power_of_two=True``): every tensor's ``min`` / ``max`` is the range of the
quantizer that holds it (:func:`amct_bridge.calibration.qat.pow2_tensor_range`: the ESP-DL
export's rule gives back the trained exponent), its EMA the observed range; a value-keeping
layer (ReLU, max pool) gets its input quantizer's range, a layer's input its producer's.

Example:
    >>> import keras, numpy as np
    >>> from amct_bridge.keras.qat import quantize_aware
    >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc"),
    ...                       keras.layers.ReLU(name="r")])
    >>> qat = quantize_aware(m)
    >>> qat.compile(optimizer="sgd", loss="mse")
    >>> _ = qat.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    >>> sorted(qat_stats(qat).layers)
    ['fc', 'r']
"""

from __future__ import annotations

import keras
import numpy as np

from amct_bridge.calibration.qat import (
    algorithm_name,
    clipped,
    pow2_tensor_range,
    site_names,
    tensor_range,
)
from amct_bridge.errors import QuantError
from amct_bridge.keras.layers import class_name
from amct_bridge.keras.qat.layers import (
    FoldedBatchNorm,
    QATObserve,
    QATQuant,
    exponent_of,
    range_values,
)
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange

__all__ = ["input_quantizer", "pow2_quantizers", "qat_stats"]


def _range(variables) -> TensorRange | None:
    return tensor_range(*(float(np.asarray(v)) for v in variables))


def _links(qat_model: keras.Model) -> tuple[dict[str, str], dict[str, str]]:
    """From the model graph: (producer node -> the first quantized node reading it, node ->
    the node producing its first input). Node names are the sidecar keys (``relu@1``)."""
    from amct_bridge.keras.graph import extract_graph_and_operations

    graph, operations = extract_graph_and_operations(qat_model)
    readers: dict[str, str] = {}
    producer_of: dict[str, str] = {}
    for node in graph.nodes:
        producer = graph.producer_of(node.inputs[0]) if node.inputs else None
        if producer is None:
            continue
        producer_of[node.name] = producer.name
        if isinstance(operations.get(node.layer), QATQuant):
            readers.setdefault(producer.name, node.name)
    return readers, producer_of


def qat_stats(qat_model: keras.Model) -> CalibrationStats:
    """The calibration sidecar (:class:`CalibrationStats`) of a trained QAT model.

    Raises:
        QuantError: the model has no QAT layer (use :func:`quantize_aware`).

    Example:
        >>> stats = qat_stats(qat)  # doctest: +SKIP
        >>> stats.layers["relu1"].output.max  # doctest: +SKIP
        3.91
    """
    if any(isinstance(x, QATQuant) and x.power_of_two for _, x in _walk(qat_model, "")):
        return _pow2_stats(qat_model)
    stats = CalibrationStats(algorithm="qat", batches=0)
    readers, producer_of = _links(qat_model)
    found: list[QATQuant] = []
    clip_at: dict[str, TensorRange | None] = {}  # node of a quantized layer -> its clip
    for key, layer in _walk(qat_model, ""):
        if isinstance(layer, QATQuant):
            found.append(layer)
            clip = tensor_range(*layer.input_clip())
            clip_at.update(dict.fromkeys(site_names(key, layer.sites), clip))
    if not found:
        raise QuantError(f"model {qat_model.name!r} has no QAT layer: use quantize_aware(model)")
    clip_of = {p: clip_at[r] for p, r in readers.items() if r in clip_at}
    outputs: dict[str, TensorRange | None] = {}
    for key, layer in _walk(qat_model, ""):
        if isinstance(layer, (QATQuant, QATObserve)):
            rows = range_values(layer.output_range)
            for k, (site, row) in enumerate(zip(site_names(key, layer.sites), rows, strict=True)):
                outputs[site] = clipped(tensor_range(*row), clip_of.get(site))
                if isinstance(layer, QATQuant):
                    _quant_entries(layer, site, k, outputs[site], stats)
                else:
                    stats.layers[site] = LayerStats(class_name(layer.layer), output=outputs[site])
        elif isinstance(layer, FoldedBatchNorm):
            own = outputs.get(producer_of.get(key, ""))
            outputs[key] = clipped(own, clip_of.get(key))
            stats.layers[key] = LayerStats("BatchNormalization", output=outputs[key])
    stats.algorithm = algorithm_name({layer.activation_range for layer in found})
    stats.batches = max(int(layer.input_clip()[2]) for layer in found)
    return stats


def pow2_quantizers(qat_model: keras.Model) -> dict[str, tuple]:
    """Node -> ``(log2t weight, (lo, hi, seen) EMA weights)`` of every power-of-two quantizer
    of a QAT model, by the node whose output it quantizes (a quantized layer's input
    quantizer under ``"<key>:input"``, a separable conv's depthwise output under
    ``"<key>:mid"``).

    Example:
        >>> # pow2_quantizers(qat)["c1"] -> the output quantizer of layer c1
    """
    found = {}
    for key, layer in _walk(qat_model, ""):
        if isinstance(layer, QATQuant) and layer.power_of_two:
            for name, var in layer.log2t.items():
                rng = layer.output_range if name == "output" else layer.ranges[name]
                found[key if name == "output" else f"{key}:{name}"] = (var, rng)
        elif isinstance(layer, QATObserve) and layer.quantize_output:
            found[key] = (layer.output_log2t, layer.output_range)
    return found


def input_quantizer(key: str, layer: QATQuant, quantizers: dict) -> tuple:
    """The quantizer of a power-of-two QAT layer's input: its own, or its producer's.

    Example:
        >>> # input_quantizer("c2", qat.get_layer("c2"), pow2_quantizers(qat))
    """
    name = f"{key}:input" if layer.input_source is None else layer.input_source
    return quantizers[name]


def _walk(model: keras.Model, prefix: str):
    """``(key, layer)`` of every layer, nested models' inside (``"outer/inner"``), in order."""
    for layer in model.layers:
        key = prefix + layer.name
        if isinstance(layer, keras.Model):
            yield from _walk(layer, key + "/")
        else:
            yield key, layer


def _quant_entries(layer: QATQuant, key: str, site: int, output, stats: CalibrationStats) -> None:
    """One entry per record part of node ``site`` (keyed ``key``): input = its clip range (with
    the node's own EMA as observed, for a layer at several nodes); the last part's output =
    ``output``."""
    names = list(layer.ranges)  # "input", then "mid" for a separable conv
    kind = class_name(layer.layer)

    def part_input(name):
        clip = tensor_range(*layer.input_clip(name))
        if not layer.site_input:
            return clip
        return clipped(tensor_range(*range_values(layer.ranges[name])[site]), clip)

    for i, name in enumerate(names):
        part_key = layer.spec.key(key, i) if i < len(layer.spec.keys) else key
        last = i + 1 == len(names)
        after = output if last else part_input(names[i + 1])
        stats.layers[part_key] = LayerStats(
            kind, input=part_input(name), output=after, preactivation=_preactivation(layer, last)
        )


def _preactivation(layer: QATQuant, last: bool) -> TensorRange | None:
    """The EMA of a quantized layer's output before its fused activation (its last part's
    ``preactivation``), None when not tracked."""
    values = layer.preactivation_values() if last else None
    return None if values is None else tensor_range(*values)


def _values(variables) -> tuple[float, float, float]:
    return tuple(float(np.max(np.asarray(v))) for v in variables)


def _pow2_range(quantizer, ema) -> TensorRange | None:
    """The range of a tensor held by ``quantizer`` (``(log2t, EMA weights)``), ``ema`` its own
    ``(lo, hi, seen)``."""
    log2t, variables = quantizer
    seen = min(_values(variables)[2], ema[2])
    return pow2_tensor_range(exponent_of(log2t), ema[0], ema[1], seen)


def _pow2_stats(qat_model: keras.Model) -> CalibrationStats:
    """:func:`qat_stats` of a power-of-two QAT model (module docstring)."""
    quantizers = pow2_quantizers(qat_model)
    _, producer_of = _links(qat_model)
    stats = CalibrationStats(algorithm="qat", batches=0)
    outputs: dict[str, TensorRange | None] = {}
    found: list[QATQuant] = []
    for key, layer in _walk(qat_model, ""):
        if isinstance(layer, QATQuant):
            found.append(layer)
            ema_in = range_values(layer.ranges["input"])[0]
            ranges = [_pow2_range(input_quantizer(key, layer, quantizers), ema_in)]
            if "mid" in layer.ranges:
                ranges.append(_pow2_range(quantizers[f"{key}:mid"], _values(layer.ranges["mid"])))
            ema_out = _values(layer.output_range)
            out = (
                _pow2_range(quantizers[key], ema_out)
                if layer.quantize_output
                else tensor_range(*ema_out)
            )
            kind = class_name(layer.layer)
            for i, rng in enumerate(ranges):
                last = i + 1 == len(ranges)
                stats.layers[layer.spec.key(key, i)] = LayerStats(
                    kind,
                    input=rng,
                    output=out if last else ranges[i + 1],
                    preactivation=_preactivation(layer, last),
                )
            outputs[key] = out
        elif isinstance(layer, QATObserve):
            rows = range_values(layer.output_range)
            sources = layer.sources or [None] * len(rows)
            for site, row, source in zip(site_names(key, layer.sites), rows, sources, strict=True):
                if layer.quantize_output:
                    out = _pow2_range(quantizers[key], row)
                elif source is not None:
                    out = _pow2_range(quantizers[source], row)
                else:
                    out = tensor_range(*row)
                stats.layers[site] = LayerStats(class_name(layer.layer), output=out)
                outputs[site] = out
        elif isinstance(layer, FoldedBatchNorm):
            outputs[key] = outputs.get(producer_of.get(key, ""))
            stats.layers[key] = LayerStats("BatchNormalization", output=outputs[key])
    stats.algorithm = algorithm_name({x.activation_range for x in found}, power_of_two=True)
    stats.batches = max(int(_values(x.ranges["input"])[2]) for x in found)
    return stats
