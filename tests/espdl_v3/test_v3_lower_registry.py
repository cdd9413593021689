"""The lowering registry (amct_bridge.espdl.v3.lowering.registry.LOWERINGS) and docs/espdl-v3.md's
"What each layer becomes" table say the same: every registered kind has a row naming every v3
op its lowering writes, and every kind and op the table names is registered. The registry
dispatches by op for the ops adapters resolve, else by kind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.lowering import LOWERINGS, lowering_for
from amct_bridge.espdl.v3.lowering.activation import ACTIVATION_OPS
from amct_bridge.espdl.v3.ops import OPS

DOCS = Path(__file__).parent.parent.parent / "docs" / "espdl-v3.md"
_NAME = re.compile(r"`([A-Z][A-Za-z0-9]*)`")


def _rows() -> list[tuple[set[str], set[str], str]]:
    """(kinds in backticks in the Keras / MindSpore columns, ops in backticks in the v3 column,
    the row's text) per row of the mapping table."""
    text = DOCS.read_text(encoding="utf-8")
    table = text.split("| Keras layer | MindSpore cell / op | v3 op(s) |", 1)[1].split("\n\n")[0]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 3, line
        rows.append((set(_NAME.findall(cells[0] + cells[1])), set(_NAME.findall(cells[2])), line))
    return rows


def test_every_registered_kind_has_a_row_naming_its_ops():
    rows = _rows()
    for entry in LOWERINGS:
        for kind in entry.kinds:
            named = [ops for kinds, ops, _ in rows if kind in kinds]
            assert named, f"{kind} has no row in docs/espdl-v3.md's mapping table"
        documented = set().union(*(ops for kinds, ops, _ in rows if kinds & set(entry.kinds)))
        missing = set(entry.v3_ops) - documented
        assert not missing, f"{entry.kinds}: rows do not name {sorted(missing)}"


def test_every_kind_and_op_in_the_table_is_registered():
    registered = {kind for entry in LOWERINGS for kind in entry.kinds}
    for kinds, ops, line in _rows():
        assert kinds, f"a row names no layer kind in backticks: {line}"
        unknown = kinds - registered
        assert not unknown, f"not in the registry: {sorted(unknown)} ({line})"
        written = set().union(*(set(e.v3_ops) for e in LOWERINGS if set(e.kinds) & kinds))
        assert ops <= written, f"{line}: names {sorted(ops - written)}, not written for it"


def test_every_v3_op_written_is_one_the_simulator_runs_and_activation_names_are_listed():
    for entry in LOWERINGS:
        assert set(entry.v3_ops) <= set(OPS), entry.kinds
    text = DOCS.read_text(encoding="utf-8")
    table = text.split("| Keras layer | MindSpore cell / op | v3 op(s) |", 1)[1].split("\n\n")[0]
    missing = [name for name in ACTIVATION_OPS if f'"{name}"' not in table]
    assert not missing, f"activation names not in the table: {missing}"


@pytest.mark.parametrize(
    ("layer", "expected"),
    [
        (SourceLayer("c", "conv2d", kind="Conv2D"), "lower_chain"),
        (SourceLayer("r", "relu", kind="Activation"), "lower_relu"),  # Activation("relu")
        (SourceLayer("a", "unsupported", kind="Activation"), "lower_activation"),  # "gelu"
        (SourceLayer("l", "runtime", kind="Activation"), "lower_activation"),  # "linear"
        (SourceLayer("k", "runtime", kind="Cropping2D"), "lower_cropping"),
        (SourceLayer("g", "unsupported", kind="Conv2D"), None),  # the adapter refused it
        (SourceLayer("x", "unsupported", kind="Conv3D"), None),
    ],
)
def test_dispatch_by_op_then_by_kind(layer, expected):
    entry = lowering_for(layer)
    assert (entry.lower.__name__ if entry else None) == expected


def test_kinds_are_unique_among_kind_dispatched_entries():
    seen: dict[str, tuple] = {}
    for entry in LOWERINGS:
        if entry.source_ops:
            continue
        for kind in entry.kinds:
            assert kind not in seen, f"{kind} in {seen.get(kind)} and {entry.kinds}"
            seen[kind] = entry.kinds
