"""Layer names -> C identifiers: valid, unique, deterministic, never a path."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from amct_bridge.espdl.naming import c_identifier, c_identifiers, is_c_identifier

# Independent of the module: a C identifier with no reserved "__" or leading "_".
SAFE = re.compile(r"[A-Za-z][A-Za-z0-9]*(_[A-Za-z0-9]+)*\Z")


def test_examples():
    assert c_identifiers(["model/block.1/conv-a", "__x__", "", "int", "3x3", "a//b"]) == {
        "model/block.1/conv-a": "model_block_1_conv_a",
        "__x__": "x",
        "": "layer",
        "int": "l_int",
        "3x3": "l_3x3",
        "a//b": "a_b",
    }


def test_collisions_numbered_in_order():
    assert list(c_identifiers(["a.b", "a-b", "a_b", "a_b_2"]).values()) == [
        "a_b",
        "a_b_2",
        "a_b_3",
        "a_b_2_2",
    ]


def test_is_c_identifier_rejects_unsafe():
    for bad in ["", "_x", "x_", "a__b", "9a", "a/b", "..", "for", "a-b", "é"]:
        assert not is_c_identifier(bad), bad


@given(st.lists(st.text(max_size=12), unique=True, max_size=12))
def test_always_unique_valid_and_deterministic(names):
    mapping = c_identifiers(names)
    idents = list(mapping.values())
    assert len(set(idents)) == len(names)
    for ident in idents:
        assert SAFE.match(ident), ident
        assert is_c_identifier(ident)
    assert c_identifiers(names) == mapping


@given(st.text(max_size=20))
def test_single_identifier_is_safe(name):
    assert SAFE.match(c_identifier(name))
