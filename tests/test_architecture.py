"""The core stays framework-free and its docstring examples run."""

import doctest
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import amct_bridge

CORE = (
    "amct_bridge.records",
    "amct_bridge.quant",
    "amct_bridge.calibration",
    "amct_bridge.graph",
    "amct_bridge.espdl",
    "amct_bridge.report",
)
ADAPTERS = ("amct_bridge.keras", "amct_bridge.mindspore")


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


def test_core_never_names_an_adapter():
    """Not even a lazy import inside a function: no core source names an adapter package."""
    offenders = []
    for package in CORE:
        root = Path(importlib.import_module(package).__path__[0])
        for path in sorted(root.rglob("*.py")):
            if "_pb" in path.parts:
                continue
            text = path.read_text(encoding="utf-8")
            for lineno, line in enumerate(text.splitlines(), 1):
                code = line.split("#", 1)[0]
                if any(re.search(rf"\b{re.escape(a)}\b", code) for a in ADAPTERS) and (
                    "import" in code or "__import__" in code or "import_module" in code
                ):
                    offenders.append(f"{path.relative_to(root.parent.parent)}:{lineno}: {line}")
    assert offenders == [], "\n".join(offenders)


def test_adapter_check_catches_a_lazy_import(tmp_path):
    """The check above is not vacuous: the pattern finds a lazy import inside a function."""
    line = "    from amct_bridge.keras.espdl_weights import source_layers"
    assert any(re.search(rf"\b{re.escape(a)}\b", line) for a in ADAPTERS) and "import" in line


@pytest.mark.parametrize("name", _core_modules())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert failures == 0


def test_version():
    assert amct_bridge.__version__
