"""Docstring examples of the Keras adapter modules the core split created or reshaped run
(the core's own run in tests/test_architecture.py)."""

import doctest
import importlib

import pytest

MODULES = [
    "amct_bridge.keras.espdl_weights",
    "amct_bridge.keras.float_outputs",
    "amct_bridge.keras.instrument_buffers",
    "amct_bridge.keras.qat.layers",
    "amct_bridge.keras.qat.sidecar",
    "amct_bridge.keras.qat.strip",
    "amct_bridge.keras.record_builder",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    failures, tried = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert failures == 0 and tried > 0
