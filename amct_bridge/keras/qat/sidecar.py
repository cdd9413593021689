"""The calibration sidecar of a QAT model: the ranges the ESP-DL export needs, from training.

The post-training callback writes ``record.txt.calib.json`` (:mod:`amct_bridge.records.
calibration`) with each layer's input/output range; the ESP-DL exporter reads the OUTPUT ranges
(a chain's output exponent, Add2D's and the pools' exponents). :func:`qat_stats` builds the same
document from what QAT tracked while training:

* a quantized layer (``QATQuant``): ``input`` = its clip range (EMA or learned, what the record's
  scale_d/offset_d encode); ``output`` = the EMA of its output's min/max. A SeparableConv2D's
  two entries meet at the depthwise output (its "mid" clip range);
* a folded BatchNormalization: ``output`` = the folded layer's output (the same tensor);
* activations, Add / Concatenate / pools and unfolded BNs (``QATObserve``): ``output`` = EMA;
* any tensor a quantized layer reads gets that layer's clip range as its ``min``/``max`` (the
  network was trained to see it clipped there; ``observed_min``/``observed_max`` keep the
  EMA), as the callback shares one observer per tensor.

Raw ops (``x + y`` in a functional model) are not layers and get no entry: the exporter then
bounds an Add2D by its inputs (docs/espdl-export.md). Entries are in execution order; nested
models are keyed ``"outer/inner"``.

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

from amct_bridge.calibration.qat import algorithm_name, clipped, tensor_range
from amct_bridge.errors import QuantError
from amct_bridge.keras.layers import class_name
from amct_bridge.keras.qat.layers import FoldedBatchNorm, QATObserve, QATQuant
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange

__all__ = ["qat_stats"]


def _range(variables) -> TensorRange | None:
    return tensor_range(*(float(np.asarray(v)) for v in variables))


def _producers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Layers whose outputs ``layer`` reads (in its model's graph; inputs excluded)."""
    found = []
    for node in getattr(layer, "_inbound_nodes", []):
        for tensor in node.input_tensors:
            history = getattr(tensor, "_keras_history", None)
            op = getattr(history, "operation", None)
            if op is not None and not isinstance(op, keras.layers.InputLayer):
                found.append(op)
    return found


def qat_stats(qat_model: keras.Model) -> CalibrationStats:
    """The calibration sidecar (:class:`CalibrationStats`) of a trained QAT model.

    Raises:
        QuantError: the model has no QAT layer (use :func:`quantize_aware`).

    Example:
        >>> stats = qat_stats(qat)  # doctest: +SKIP
        >>> stats.layers["relu1"].output.max  # doctest: +SKIP
        3.91
    """
    stats = CalibrationStats(algorithm="qat", batches=0)
    found = _collect(qat_model, "", stats)
    if not found:
        raise QuantError(f"model {qat_model.name!r} has no QAT layer: use quantize_aware(model)")
    stats.algorithm = algorithm_name({layer.activation_range for layer in found})
    stats.batches = max(int(np.asarray(layer.ranges["input"][2])) for layer in found)
    return stats


def _collect(model: keras.Model, prefix: str, stats: CalibrationStats) -> list[QATQuant]:
    """Add ``model``'s entries to ``stats`` (execution order); returns its QATQuant layers."""
    found: list[QATQuant] = []
    # the clip range each quantized reader applies to a producer's output
    clip_of: dict[int, TensorRange] = {}
    for layer in model.layers:
        if isinstance(layer, QATQuant):
            clip = _range(layer.ranges["input"])
            for producer in _producers(layer):
                if clip is not None:
                    clip_of.setdefault(id(producer), clip)
    outputs: dict[int, TensorRange | None] = {}
    for layer in model.layers:
        key = prefix + layer.name
        if isinstance(layer, keras.Model):
            found += _collect(layer, key + "/", stats)
            continue
        if isinstance(layer, QATQuant):
            found.append(layer)
            outputs[id(layer)] = clipped(_range(layer.output_range), clip_of.get(id(layer)))
            _quant_entries(layer, key, outputs[id(layer)], stats)
        elif isinstance(layer, FoldedBatchNorm):
            folded = _producers(layer)
            own = outputs.get(id(folded[0])) if folded else None
            outputs[id(layer)] = clipped(own, clip_of.get(id(layer)))
            stats.layers[key] = LayerStats("BatchNormalization", output=outputs[id(layer)])
        elif isinstance(layer, QATObserve):
            outputs[id(layer)] = clipped(_range(layer.output_range), clip_of.get(id(layer)))
            stats.layers[key] = LayerStats(class_name(layer.layer), output=outputs[id(layer)])
    return found


def _quant_entries(layer: QATQuant, key: str, output, stats: CalibrationStats) -> None:
    """One entry per record part: input = its clip range; the last part's output = ``output``."""
    names = list(layer.ranges)  # "input", then "mid" for a separable conv
    kind = class_name(layer.layer)
    for i, name in enumerate(names):
        part_key = layer.spec.key(key, i) if i < len(layer.spec.keys) else key
        after = _range(layer.ranges[names[i + 1]]) if i + 1 < len(names) else output
        stats.layers[part_key] = LayerStats(kind, input=_range(layer.ranges[name]), output=after)
