"""Keras adapter: calibration callback, simulated accuracy, QAT, graph extraction, freezing.

Importing this package imports TensorFlow/Keras (the core packages never do).

Example:
    >>> from amct_bridge.keras import QuantCalibration, calibrate
    >>> QuantCalibration.__name__
    'QuantCalibration'
"""

from amct_bridge.keras.calibrate import calibrate
from amct_bridge.keras.freeze import freeze_model
from amct_bridge.keras.qat import qat_record, quantize_aware, save_qat_record, strip_qat
from amct_bridge.keras.quant_calibration import QuantCalibration
from amct_bridge.keras.simulate import simulate

__all__ = [
    "QuantCalibration",
    "calibrate",
    "freeze_model",
    "qat_record",
    "quantize_aware",
    "save_qat_record",
    "simulate",
    "strip_qat",
]
