"""Keras adapter: calibration callback, simulated accuracy, QAT, graph extraction, freezing.

Importing this package imports TensorFlow/Keras (the core packages never do).

Example:
    >>> from amct_bridge.keras import QuantCalibration, calibrate
    >>> QuantCalibration.__name__
    'QuantCalibration'
"""

from amct_bridge.keras.calibrate import calibrate
from amct_bridge.keras.quant_calibration import QuantCalibration
from amct_bridge.keras.simulate import simulate

__all__ = ["QuantCalibration", "calibrate", "simulate"]
