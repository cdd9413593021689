"""Docstring examples of the Keras calibration modules run (the core's are run elsewhere)."""

import doctest
import importlib

import pytest

MODULES = [
    "amct_bridge.config",
    "amct_bridge.keras.calibrate",
    "amct_bridge.keras.freeze",
    "amct_bridge.keras.instrument",
    "amct_bridge.keras.layers",
    "amct_bridge.keras.native",
    "amct_bridge.keras.plan",
    "amct_bridge.keras.quant_calibration",
    "amct_bridge.keras.session",
    "amct_bridge.keras.weights",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert failures == 0
