"""The core stays framework-free and its docstring examples run; amct_bridge.espdl has no import
cycle and keeps ESP-DL v1 in amct_bridge.espdl.v1."""

import ast
import doctest
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import amct_bridge
import amct_bridge.espdl

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


def test_the_quantization_math_does_not_know_the_record_format():
    """amct_bridge.quant is numpy math: record entries (LayerFactors, the record format) are
    built by amct_bridge.calibration (issue 33 §11: quant/qat.py built the QAT entries)."""
    root = Path(importlib.import_module("amct_bridge.quant").__path__[0])
    graph = import_graph(root.parent, "amct_bridge")
    offenders = {
        module: sorted(t for t in targets if t.startswith("amct_bridge.records"))
        for module, targets in graph.items()
        if module.startswith("amct_bridge.quant")
    }
    assert {m: t for m, t in offenders.items() if t} == {}


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


# --- amct_bridge.espdl: what the formats share at the top, ESP-DL v1 in v1/, v3 in v3/ ---

ESPDL = "amct_bridge.espdl"
#: Generated packages (FlatBuffers, protobuf; not linted either): imported, never parsed.
GENERATED = {"_fb", "_pb"}
ESPDL_ROOT = Path(amct_bridge.espdl.__path__[0])
#: ESP-DL v1 only: convert.py input and preview, C++ writers, chip graph and simulator.
V1_MODULES = (
    "spec layout preview coefficients runtime checks result export report network chip_graph "
    "chip chip_ops cpp cpp_app cpp_coefficients cpp_model cpp_render cpp_types search head border "
    "height1"
).split()
#: What every format shares (besides the package itself, which re-exports v1's names).
SHARED_MODULES = (
    "source plan exponents exponent_groups exponent_search checks consistency naming writer "
    "evaluation refusals"
).split()
#: Shared modules allowed to reach into a format, and where: the evaluation runs the v1 chip
#: simulator (a lazy import inside evaluate_export / chip_network; nothing in v1 imports it).
SHARED_INTO_FORMAT = {("amct_bridge.espdl.evaluation", "amct_bridge.espdl.v1.chip")}
#: Everything ``amct_bridge.espdl`` exported before v1/ existed: it must keep exporting it.
ESPDL_PUBLIC = (
    "ChipResult ChipTensor ExportResult ExportedLayer LayerPreview Network SourceLayer "
    "convert_set export export_layers load_network load_set preview_layer preview_set "
    "simulate_chip tool_output"
).split()


def _module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` (rooted at ``root``) it imports, counting every
    import: module level, under ``if TYPE_CHECKING:`` and inside functions (a lazy import
    hides a cycle from Python, not from the design). ``from pkg import name`` counts as an
    import of ``pkg.name`` when that is a module, else of ``pkg``."""
    files = {_module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        if GENERATED & set(path.relative_to(root).parts):
            continue  # flatc's / protoc's code (lazy imports among its tables): a leaf here
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - node.level + 1]
                    base = ".".join([*here, base] if base else here)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                    for alias in node.names
                ]
            else:
                continue
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) for every back edge a depth-first walk meets."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_espdl_has_no_import_cycle():
    graph = import_graph(ESPDL_ROOT, ESPDL)
    assert f"{ESPDL}.v1" in graph[ESPDL] and f"{ESPDL}.v1.export" in graph[f"{ESPDL}.v1"]
    cycles = find_cycles(graph)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_cycle_check_finds_lazy_and_type_checking_cycles(tmp_path):
    """The check above is not vacuous: a cycle through a TYPE_CHECKING import, one through a
    function-level import and one through ``from pkg import module`` are all found."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
    )
    (pkg / "b.py").write_text("from pkg.a import A\n")
    (pkg / "c.py").write_text("def f():\n    from pkg.sub import d\n")
    (pkg / "sub" / "d.py").write_text("from .. import c\n")
    (pkg / "e.py").write_text("import pkg.a\n")
    cycles = find_cycles(import_graph(pkg, "pkg"))
    assert sorted(cycles) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.c", "pkg.sub.d", "pkg.c"]]


def test_espdl_v1_holds_the_v1_modules():
    v1 = importlib.import_module(f"{ESPDL}.v1")
    found = {info.name for info in pkgutil.iter_modules(v1.__path__)}
    assert sorted(set(V1_MODULES) - found) == []
    assert sorted(found - set(V1_MODULES)) == [], "a new v1 module: list it in V1_MODULES"
    # moved, not copied: no v1-only module is left at the top (checks exists at both levels)
    top = {info.name for info in pkgutil.iter_modules(amct_bridge.espdl.__path__)}
    assert sorted((top & set(V1_MODULES)) - {"checks"}) == []
    assert sorted(top - set(SHARED_MODULES) - {"v1", "v3"}) == [], "list it in SHARED_MODULES"


def test_shared_espdl_modules_reach_into_no_format():
    """The top-level modules (what the formats share) import neither v1 nor v3 (the package
    itself re-exports v1, evaluation runs v1's simulator: SHARED_INTO_FORMAT), and the two
    formats do not import each other."""
    graph = import_graph(ESPDL_ROOT, ESPDL)
    formats = (f"{ESPDL}.v1", f"{ESPDL}.v3")

    def fmt(name: str) -> str | None:
        return next((f for f in formats if name == f or name.startswith(f + ".")), None)

    bad = sorted(
        (src, dst)
        for src, targets in graph.items()
        for dst in targets
        if src != ESPDL
        and fmt(dst) is not None
        and fmt(src) != fmt(dst)
        and (src, dst) not in SHARED_INTO_FORMAT
    )
    assert bad == []
    assert all(dst in graph[src] for src, dst in SHARED_INTO_FORMAT), "allowance no longer used"


def test_espdl_public_names_stay():
    import amct_bridge.espdl.v1 as v1

    assert sorted(set(ESPDL_PUBLIC) - set(amct_bridge.espdl.__all__)) == []
    for name in ESPDL_PUBLIC:
        value = getattr(amct_bridge.espdl, name)
        assert name in ("SourceLayer", "export") or value is getattr(v1, name), name


def test_version():
    assert amct_bridge.__version__
