"""The core stays framework-free and its docstring examples run."""

import doctest
import importlib
import pkgutil
import subprocess
import sys

import pytest

import amct_bridge

CORE = ("amct_bridge.records", "amct_bridge.quant", "amct_bridge.graph", "amct_bridge.espdl")


def _core_modules():
    names = ["amct_bridge", "amct_bridge.errors", "amct_bridge.cli"]
    for package in CORE:
        module = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if "._pb" not in info.name:
                names.append(info.name)
    return names


def test_core_imports_no_framework():
    code = (
        "import sys\n"
        f"for name in {_core_modules()!r}:\n"
        "    __import__(name)\n"
        "bad = [m for m in ('tensorflow', 'keras', 'mindspore') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"core imported a framework: {result.stdout}"


@pytest.mark.parametrize("name", _core_modules())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert failures == 0


def test_version():
    assert amct_bridge.__version__
