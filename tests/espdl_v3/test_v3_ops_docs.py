"""docs/espdl-v3.md's "Arithmetic per op" table names every op the simulator computes, and every
op module says which runtime files it follows."""

from __future__ import annotations

import re
from pathlib import Path

from amct_bridge.espdl.v3.ops import MODULES, OPS

DOCS = Path(__file__).parent.parent.parent / "docs" / "espdl-v3.md"


def _documented_ops() -> set[str]:
    text = DOCS.read_text(encoding="utf-8")
    table = text.split("### Arithmetic per op", 1)[1].split("\n\n", 2)[1]
    names: set[str] = set()
    for line in table.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            names.update(re.findall(r"\b[A-Z][A-Za-z0-9]+\b", line.split("|")[1]))
    return names


def test_every_simulated_op_is_in_the_docs_table():
    missing = sorted(set(OPS) - _documented_ops())
    assert not missing, f"ops without a row in docs/espdl-v3.md: {missing}"


def test_every_op_module_names_the_runtime_files_it_follows():
    for module in MODULES:
        doc = module.__doc__ or ""
        assert re.search(r"dl_(module|base)_\w+\.(hpp|cpp)", doc), module.__name__
        assert module.compute.__doc__, f"{module.__name__}.compute has no docstring"


def test_every_op_module_is_registered():
    """A module under ops/ that is not in NAMES would never run: the simulator would refuse
    its op types."""
    import pkgutil

    import amct_bridge.espdl.v3.ops as ops

    found = sorted(m.name for m in pkgutil.iter_modules(ops.__path__) if m.name[0] != "_")
    assert found == list(ops.NAMES)
