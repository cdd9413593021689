"""The simulated ESP-DL v1 chip next to the float and fake-quantized Keras model.

The model and the chip both run NHWC. Every layer output the model names is compared with the
chip layer of the same name; nested names (``outer/inner``) have no float reference.

Example:
    >>> # from amct_bridge.espdl.evaluation import format_evaluation
    >>> # ev = evaluate_espdl("espdl_out", model, x_val, y_val, record="record.txt")
    >>> # print(format_evaluation(ev))
"""

from __future__ import annotations

import os
from pathlib import Path

import keras
import numpy as np

from amct_bridge.espdl.evaluation import Evaluation, chip_network, evaluate_export
from amct_bridge.espdl.v3.evaluation import evaluate_espdl_model, is_espdl_file
from amct_bridge.keras.espdl_weights import chip_input
from amct_bridge.keras.simulate import forward_batches, simulate
from amct_bridge.records.model import Record


def evaluate_espdl(
    export_dir: str | Path,
    model: keras.Model,
    x: np.ndarray,
    y: np.ndarray,
    *,
    record: Record | str | os.PathLike | None = None,
    target: str | None = None,
    input_exponent: int | None = None,
    batch_size: int = 64,
) -> Evaluation:
    """Float, fake-quant (if ``record``) and chip accuracy of ``model`` / its export on (x, y).

    Args:
        export_dir: the ``export_espdl`` output directory (or its ExportResult), or an
            ESP-DL v3 ``.espdl`` file (``format="espdl"``: its simulator, the chip's input
            after any host-side Rescaling / Normalization).
        model: the float Keras model that was exported (not modified).
        x: inputs, NHWC as the model and the chip take them; y: class indices.
        record: the AMCT record: adds the fake-quant accuracy (:func:`simulate`).
        target, input_exponent, batch_size: as :func:`amct_bridge.espdl.simulate_chip`.

    Example:
        >>> # see the module docstring
    """
    if is_espdl_file(export_dir):  # ESP-DL v3: the .espdl file and its simulator
        float_scores = forward_batches(model, [x], batch_size)[0]
        fq_scores = None
        if record is not None:
            fq_scores = forward_batches(simulate(model, record), [x], batch_size)[0]
        return evaluate_espdl_model(
            export_dir,
            chip_input(model, x),
            y,
            float_scores=float_scores,
            fake_quant_scores=fq_scores,
            floats=lambda names: _float_outputs(model, x, names, batch_size),
            output=model.outputs[0]._keras_history.operation.name,
            target=target,
            batch_size=batch_size,
        )
    net = chip_network(export_dir, x)  # before the model meets data of another shape
    float_scores = forward_batches(model, [x], batch_size)[0]
    fq_scores = None
    if record is not None:
        fq_scores = forward_batches(simulate(model, record), [x], batch_size)[0]
    return evaluate_export(
        net,
        x,
        y,
        float_scores=float_scores,
        fake_quant_scores=fq_scores,
        floats=lambda names: _float_outputs(model, x, names, batch_size),
        output=model.outputs[0]._keras_history.operation.name,
        target=target,
        input_exponent=input_exponent,
        batch_size=batch_size,
    )


def _float_outputs(model, x: np.ndarray, names: list[str], batch: int) -> dict[str, np.ndarray]:
    found = {}
    for name in names:
        try:
            found[name] = model.get_layer(name).output
        except ValueError:
            continue  # nested ("outer/inner") or not a layer: no float reference
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs  # as the model is called
    probe = keras.Model(inputs, list(found.values()))
    return dict(zip(found, forward_batches(probe, [x], batch), strict=True))
