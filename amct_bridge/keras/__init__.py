"""Keras adapter: calibration callback, simulated accuracy, QAT, graph extraction, freezing,
ESP-DL export (v1, or v3 ``.espdl`` with ``export_espdl(..., format="espdl")``). It translates
Keras objects for the framework-free core
(:mod:`amct_bridge.calibration`, :mod:`amct_bridge.graph`, :mod:`amct_bridge.espdl`).

Importing this package imports TensorFlow/Keras (the core packages never do).

Example:
    >>> from amct_bridge.keras import QuantCalibration, calibrate
    >>> QuantCalibration.__name__
    'QuantCalibration'
"""

from amct_bridge.keras.calibrate import calibrate
from amct_bridge.keras.espdl_eval import evaluate_espdl
from amct_bridge.keras.espdl_weights import export_espdl
from amct_bridge.keras.freeze import freeze_model
from amct_bridge.keras.graph import extract_graph
from amct_bridge.keras.prune import (
    apply_selective_masks,
    prune_discovery,
    prune_record,
    selective_masks,
)
from amct_bridge.keras.qat import qat_record, quantize_aware, save_qat_record, strip_qat
from amct_bridge.keras.quant_calibration import QuantCalibration
from amct_bridge.keras.relu6 import replace_relu6
from amct_bridge.keras.selective_prune_callback import SelectivePruneCallback
from amct_bridge.keras.simulate import simulate

__all__ = [
    "QuantCalibration",
    "SelectivePruneCallback",
    "apply_selective_masks",
    "calibrate",
    "evaluate_espdl",
    "export_espdl",
    "extract_graph",
    "freeze_model",
    "prune_discovery",
    "prune_record",
    "qat_record",
    "quantize_aware",
    "replace_relu6",
    "save_qat_record",
    "selective_masks",
    "simulate",
    "strip_qat",
]
