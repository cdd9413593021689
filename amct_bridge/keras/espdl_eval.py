"""The simulated ESP-DL v1 chip next to the float and fake-quantized Keras model.

The model and the chip both run NHWC. Every chip layer is compared with the float output of the
layer it computes: a Keras layer, a SeparableConv2D's part (``sep/pointwise`` is the layer's
output, ``sep/depthwise`` its depthwise convolution, computed from the layer's input with its
kernel), a layer inside a nested model (``outer/inner``: the nested model is probed on the
input it gets in the outer one). A model output skipped at export is run in float on the host
from the chip's output when the model can be cut there (:func:`host_rest`).

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

from amct_bridge.errors import ExportError
from amct_bridge.espdl.evaluation import Evaluation, chip_network, evaluate_export
from amct_bridge.espdl.v3.evaluation import evaluate_espdl_model, is_espdl_file
from amct_bridge.keras.espdl_weights import chip_input
from amct_bridge.keras.float_outputs import float_outputs, output_of
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
    v3 = is_espdl_file(export_dir)  # ESP-DL v3: the .espdl file and its simulator
    if v3 and input_exponent is not None:
        raise ExportError(f"{export_dir}: an .espdl file runs at its own input exponent")
    # v1: the chip graph before the model meets data of another shape
    net = None if v3 else chip_network(export_dir, x)
    reasons: dict[str, str] = {}  # why a chip layer / tensor has no float counterpart
    float_scores = forward_batches(model, [x], batch_size)[0]
    fq_scores = None
    if record is not None:
        fq_scores = forward_batches(simulate(model, record), [x], batch_size)[0]
    common = dict(
        float_scores=float_scores,
        fake_quant_scores=fq_scores,
        floats=lambda names: float_outputs(model, x, names, batch_size, reasons),
        output=model.outputs[0]._keras_history.operation.name,
        target=target,
        batch_size=batch_size,
        missing_reasons=reasons,
    )
    if v3:
        return evaluate_espdl_model(export_dir, chip_input(model, x), y, **common)
    return evaluate_export(
        net,
        x,
        y,
        input_exponent=input_exponent,
        host_rest=lambda name, values: host_rest(model, name, values, batch_size),
        **common,
    )


def host_rest(model: keras.Model, name: str, values: np.ndarray, batch: int = 64):
    """The model's first output computed in float from layer ``name``'s output ``values``, or
    None when the model cannot be cut there (other inputs reach the output, or no such layer).

    Example:
        >>> x = keras.Input((2,)); h = keras.layers.Dense(2, name="h")(x)
        >>> m = keras.Model(x, keras.layers.Softmax(name="sm")(h))
        >>> host_rest(m, "h", np.zeros((1, 2), np.float32)).tolist()
        [[0.5, 0.5]]
    """
    try:
        tensor = output_of(model.get_layer(name))
        rest = keras.Model(tensor, model.outputs[0])
    except (ValueError, AttributeError, KeyError, TypeError):
        return None  # nested, shared, or other inputs reach the output: cannot cut there
    shaped = np.asarray(values, np.float32).reshape((len(values), *tensor.shape[1:]))
    return forward_batches(rest, [shaped], batch)[0]
