"""Docstring examples of the report's adapter and command modules run (the core's run in
tests/test_architecture.py)."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["amct_bridge.keras.report", "amct_bridge.commands.report"])
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    failures, tried = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert failures == 0 and tried > 0
