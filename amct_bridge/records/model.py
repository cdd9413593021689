"""The record model: an ordered mapping layer name -> factors, plus pruning records.

Fields mirror AMCT's ``InnerSingleLayerRecord`` (TF inner flavor), the superset of all flavors.
An optional field that is ``None`` is absent from the file (proto2 presence is kept, so a record
round-trips byte for byte).

Example:
    >>> from amct_bridge.records.model import LayerFactors, Record
    >>> rec = Record()
    >>> rec.layers["conv1"] = LayerFactors(scale_d=1 / 255, offset_d=-128, scale_w=[0.01],
    ...                                    offset_w=[0])
    >>> list(rec.layers)
    ['conv1']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

#: AMCTProto.AttrType names, in enum order.
ATTR_TYPES = ("UNDEFINED", "FLOAT", "INT", "STRING", "FLOATS", "INTS", "STRINGS")

AttrValue = Union[float, int, str, bytes, list]  # noqa: UP007 (a runtime alias on 3.10)


@dataclass
class LayerFactors:
    """Quantization factors of one layer (all AMCT fields; ``None`` / ``[]`` = not written).

    Example:
        >>> LayerFactors(scale_d=0.5, offset_d=0).scale_w
        []
    """

    scale_d: float | None = None
    offset_d: int | None = None
    scale_w: list[float] = field(default_factory=list)
    offset_w: list[int] = field(default_factory=list)
    shift_bit: list[int] = field(default_factory=list)
    cluster: list[int] = field(default_factory=list)
    skip_fusion: bool | None = None
    dst_type: str | None = None
    prune_producer: list[str] = field(default_factory=list)
    prune_consumer: list[str] = field(default_factory=list)
    tensor_balance_factor: list[float] = field(default_factory=list)
    act_type: str | None = None
    wts_type: str | None = None


@dataclass
class Attr:
    """One ``AMCTProto.AttrProto``: a name, its AttrType name and the value of the matching field.

    Example:
        >>> Attr("begin", "INT", 0)
        Attr(name='begin', type='INT', value=0)
    """

    name: str
    type: str
    value: AttrValue


@dataclass
class PruneNode:
    """A node of a PruneRecord (``PruneNode { name; repeated attr }``).

    Example:
        >>> n = PruneNode.channel("conv1", "Conv2D", 0, 64)
        >>> n.get("end")
        64
    """

    name: str
    attrs: list[Attr] = field(default_factory=list)

    @classmethod
    def channel(cls, name: str, op_type: str, begin: int, end: int, **extra: Attr) -> PruneNode:
        """A producer/consumer node with AMCT's ``type``/``begin``/``end`` attrs (+ extra Attrs)."""
        attrs = [
            Attr("type", "STRING", op_type),
            Attr("begin", "INT", begin),
            Attr("end", "INT", end),
        ]
        attrs.extend(extra.values())
        return cls(name, attrs)

    def get(self, name: str, default: AttrValue | None = None) -> AttrValue | None:
        """Value of attr ``name`` (the first one), or ``default``."""
        for attr in self.attrs:
            if attr.name == name:
                return attr.value
        return default


@dataclass
class PruneRecord:
    """One pruning group: producers, consumers, or a selective (2:4) node.

    Example:
        >>> PruneRecord([PruneNode.channel("c1", "Conv2D", 0, 8)], []).producers[0].name
        'c1'
    """

    producers: list[PruneNode] = field(default_factory=list)
    consumers: list[PruneNode] = field(default_factory=list)
    selective_prune: PruneNode | None = None


@dataclass
class Record:
    """A whole record file: ``layers`` (ordered, key -> factors) and ``prune_records``.

    ``flavor`` is "inner" (AMCTTensorflow.InnerScaleOffsetRecord), "tf" (convert_model's
    ScaleOffsetRecord) or "mindspore".

    Example:
        >>> Record(flavor="tf").flavor
        'tf'
    """

    layers: dict[str, LayerFactors] = field(default_factory=dict)
    prune_records: list[PruneRecord] = field(default_factory=list)
    flavor: str = "inner"
    #: Where the record was read from (for messages); not part of equality.
    source: str | None = field(default=None, compare=False, repr=False)
    #: Line positions of the text it was parsed from (a SourceMap), if any.
    source_map: object | None = field(default=None, compare=False, repr=False)
