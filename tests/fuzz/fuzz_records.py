"""Hypothesis strategies of AMCT records (model objects in each flavor's schema) and corruptions.

Example:
    >>> from hypothesis import given
    >>> from fuzz_records import records
    >>> records("tf").example().flavor  # doctest: +SKIP
    'tf'
"""

from __future__ import annotations

from hypothesis import strategies as st

from amct_bridge.records.flavors import FLAVORS
from amct_bridge.records.model import ATTR_TYPES, Attr, LayerFactors, PruneNode, PruneRecord, Record

INT32 = st.one_of(st.integers(-300, 300), st.integers(-(2**31), 2**31 - 1))
UINT32 = st.one_of(st.integers(0, 20), st.integers(0, 2**32 - 1))
INT64 = st.one_of(st.integers(-5, 100), st.integers(-(2**63), 2**63 - 1))
FLOAT32 = st.one_of(
    st.floats(2.0**-20, 10.0, width=32),
    st.floats(width=32),  # any float32: NaN, +-inf, -0.0, subnormals
)
NAMES = st.one_of(
    st.from_regex(r"[a-z][a-z0-9_]{0,6}(/[a-z0-9_]{1,4})?(\.[0-9])?", fullmatch=True),
    st.text(max_size=8),  # quotes, backslashes, newlines, any unicode
)
TYPE_NAMES = st.one_of(
    st.sampled_from(["INT8", "INT16", "INT4", "INT6", "INT7"]), st.text(max_size=5)
)

_LIST_FIELDS = {
    "scale_w": FLOAT32,
    "offset_w": INT32,
    "shift_bit": UINT32,
    "cluster": INT32,
    "prune_producer": NAMES,
    "prune_consumer": NAMES,
    "tensor_balance_factor": FLOAT32,
}
_SCALAR_FIELDS = {
    "scale_d": FLOAT32,
    "offset_d": INT32,
    "skip_fusion": st.booleans(),
    "dst_type": TYPE_NAMES,
    "act_type": TYPE_NAMES,
    "wts_type": TYPE_NAMES,
}


@st.composite
def layer_factors(draw, flavor: str = "inner") -> LayerFactors:
    """Factors using only fields of ``flavor``'s schema (values valid or not for AMCT)."""
    allowed = FLAVORS[flavor].fields
    factors = LayerFactors()
    for name, values in _SCALAR_FIELDS.items():
        if name in allowed and draw(st.booleans()):
            setattr(factors, name, draw(values))
    for name, values in _LIST_FIELDS.items():
        if name in allowed and draw(st.integers(0, 3)) == 0:
            setattr(factors, name, draw(st.lists(values, max_size=6)))
    return factors


_ATTR_VALUES = {
    "FLOAT": FLOAT32,
    "INT": INT64,
    "STRING": NAMES,
    "FLOATS": st.lists(FLOAT32, max_size=4),
    "INTS": st.lists(INT64, max_size=4),
    "STRINGS": st.lists(NAMES, max_size=3),
}


@st.composite
def attrs(draw) -> Attr:
    """An AttrProto: usually type and value agree; sometimes they do not, or the value is None."""
    name = draw(st.sampled_from(["type", "begin", "end", "mask_shape", "multiplier"]) | NAMES)
    type_name = draw(st.sampled_from(ATTR_TYPES))
    value_type = type_name if draw(st.integers(0, 4)) else draw(st.sampled_from(ATTR_TYPES))
    value = None if value_type == "UNDEFINED" else draw(_ATTR_VALUES[value_type])
    return Attr(name, type_name, value)


@st.composite
def prune_nodes(draw) -> PruneNode:
    """A producer/consumer node: a channel node (type/begin/end) or arbitrary attrs."""
    name = draw(NAMES)
    if draw(st.booleans()):
        begin = draw(st.integers(-2, 64))
        node = PruneNode.channel(
            name,
            draw(st.sampled_from(["Conv2D", "MatMul"])),
            begin,
            begin + draw(st.integers(-1, 64)),
        )
        node.attrs += draw(st.lists(attrs(), max_size=1))
        return node
    return PruneNode(name, draw(st.lists(attrs(), max_size=3)))


prune_records = st.builds(
    PruneRecord,
    st.lists(prune_nodes(), max_size=2),
    st.lists(prune_nodes(), max_size=2),
    st.none() | prune_nodes(),
)


@st.composite
def records(draw, flavor: str | None = None) -> Record:
    """A Record of ``flavor`` (drawn if None) whose fields all fit that flavor's schema."""
    flavor = flavor or draw(st.sampled_from(sorted(FLAVORS)))
    keys = draw(st.lists(NAMES, max_size=5, unique=True))
    layers = {k: draw(layer_factors(flavor)) for k in keys}
    prunes = draw(st.lists(prune_records, max_size=2)) if FLAVORS[flavor].has_prune_records else []
    return Record(layers, prunes, flavor=flavor)


@st.composite
def corrupt_text(draw, text: str) -> str:
    """``text`` after 1-3 edits: cut, insert (record syntax or any text), replace, repeat a line."""
    pieces = [
        '"',
        "{",
        "}",
        ":",
        "record {",
        "key: ",
        "value {",
        "scale_d: ",
        "offset_d: ",
        "nan",
        "-inf",
        "1e999",
        "99999999999",
        "\\",
        "\n",
        "prune_record {",
        "attr {",
        "type: INTS",
        "bogus: 1",
        "0x7fffffff",
        "'",
        "#",
    ]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        edit = draw(st.sampled_from(["cut", "insert", "replace", "repeat"]))
        if edit == "cut":
            text = text[:i] + text[j:]
        elif edit == "insert":
            text = text[:i] + draw(st.sampled_from(pieces) | st.text(max_size=4)) + text[i:]
        elif edit == "replace":
            text = text[:i] + draw(st.text(max_size=3)) + text[j:]
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                k = draw(st.integers(0, len(lines) - 1))
                text = "".join(lines[: k + 1] + lines[k:])
    return text


@st.composite
def corrupt_bytes(draw, data: bytes) -> bytes:
    """``data`` after 1-3 edits: truncate, flip a byte, insert or delete bytes."""
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
        if edit == "truncate":
            del data[i:]
        elif edit == "flip" and i < len(data):
            data[i] = draw(st.integers(0, 255))
        elif edit == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        else:
            del data[i : i + draw(st.integers(1, 4))]
    return bytes(data)
