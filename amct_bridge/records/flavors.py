"""The three record flavors: which protobuf message each uses and which fields it may hold.

* ``inner``: ``AMCTTensorflow.InnerScaleOffsetRecord`` (calibration, QAT, DMQ, pruning);
* ``tf``: ``AMCTTensorflow.ScaleOffsetRecord`` (what ``convert_model`` reads);
* ``mindspore``: ``ScaleOffsetRecord`` without package (AMCT for MindSpore).

Text format is read by field NAME and an unknown name fails AMCT's parser, so each flavor's field
set is also the set of fields a record of that flavor may contain.

Example:
    >>> sorted(FLAVORS["inner"].fields - FLAVORS["tf"].fields)[:3]
    ['cluster', 'dst_type', 'prune_consumer']
"""

from __future__ import annotations

from dataclasses import dataclass

from amct_bridge.errors import RecordError
from amct_bridge.records._pb import inner_scale_offset_record_pb2 as _inner_pb
from amct_bridge.records._pb import mindspore_scale_offset_record_pb2 as _ms_pb
from amct_bridge.records._pb import scale_offset_record_pb2 as _tf_pb


@dataclass(frozen=True)
class Flavor:
    """A flavor: name, top-level message class, layer fields, whether it holds prune records."""

    name: str
    message: type
    fields: frozenset[str]
    has_prune_records: bool

    def new_message(self):
        """An empty top-level protobuf message of this flavor."""
        return self.message()


def _layer_fields(top: type) -> frozenset[str]:
    entry = top.DESCRIPTOR.fields_by_name["record"].message_type
    return frozenset(entry.fields_by_name["value"].message_type.fields_by_name)


FLAVORS: dict[str, Flavor] = {
    f.name: f
    for f in (
        Flavor(
            "inner",
            _inner_pb.InnerScaleOffsetRecord,
            _layer_fields(_inner_pb.InnerScaleOffsetRecord),
            True,
        ),
        Flavor("tf", _tf_pb.ScaleOffsetRecord, _layer_fields(_tf_pb.ScaleOffsetRecord), False),
        Flavor(
            "mindspore", _ms_pb.ScaleOffsetRecord, _layer_fields(_ms_pb.ScaleOffsetRecord), False
        ),
    )
}

#: Order from the widest schema to the narrowest (each accepts a subset of the previous one).
WIDEST_FIRST = ("inner", "tf", "mindspore")

#: Fields a flavor has in its schema but that its consumer refuses when filled.
UNSUPPORTED_FIELDS: dict[str, frozenset[str]] = {
    "inner": frozenset(),
    "tf": frozenset({"shift_bit"}),  # reserved in convert_model's schema, not supported
    "mindspore": frozenset({"shift_bit"}),
}


def a_record(flavor: str) -> str:
    """``flavor`` as a noun phrase with its article: "an 'inner' record", "a 'tf' record".

    Example:
        >>> a_record("inner"), a_record("mindspore")
        ("an 'inner' record", "a 'mindspore' record")
    """
    article = "an" if str(flavor)[:1].lower() in "aeiou" else "a"
    return f"{article} {flavor!r} record"


def get_flavor(name: str) -> Flavor:
    """The :class:`Flavor` called ``name``, or a RecordError listing the valid names.

    Example:
        >>> get_flavor("tf").message.DESCRIPTOR.full_name
        'AMCTTensorflow.ScaleOffsetRecord'
    """
    try:
        return FLAVORS[name]
    except KeyError:
        raise RecordError(
            f"unknown record flavor {name!r}; expected one of {list(FLAVORS)}"
        ) from None
