"""Test helper: a calibration sidecar computed directly from a Keras model's activations.

Independent of amct_bridge.keras.calibrate: every layer's input and output min/max over the
given data, obtained with a probe ``keras.Model(inputs, [layer outputs])``; nested models are
probed recursively on their own inputs (keys ``"outer/inner"``).
"""

from __future__ import annotations

import keras
import numpy as np

from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange


def layer_activations(model: keras.Model, data: np.ndarray, prefix: str = "") -> dict:
    """key -> (input array, output array) for every non-input layer (nested: recursed)."""
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    probe = keras.Model(model.inputs, [layer.output for layer in layers])
    outs = probe.predict(data, verbose=0)
    outs = outs if isinstance(outs, list) else [outs]
    by_name = {layer.name: out for layer, out in zip(layers, outs, strict=True)}
    result = {}

    def value_of(tensor):
        producer = tensor._keras_history.operation
        return data if isinstance(producer, keras.layers.InputLayer) else by_name[producer.name]

    for layer in layers:
        if isinstance(layer.input, list):  # Add / Concatenate: the range over all inputs
            inp = np.concatenate([value_of(t).ravel() for t in layer.input])
        else:
            inp = value_of(layer.input)
        if isinstance(layer, keras.Model):
            result.update(layer_activations(layer, inp, f"{prefix}{layer.name}/"))
        result[prefix + layer.name] = (inp, by_name[layer.name])
    return result


def sidecar_from(acts: dict) -> CalibrationStats:
    """min/max ranges of :func:`layer_activations` as a CalibrationStats."""
    stats = CalibrationStats(algorithm="minmax", batches=1)
    for name, (inp, out) in acts.items():
        stats.layers[name] = LayerStats(
            "Layer",
            TensorRange(float(inp.min()), float(inp.max())),
            TensorRange(float(out.min()), float(out.max())),
        )
    return stats
