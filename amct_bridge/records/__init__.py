"""AMCT record files: model, text/binary I/O, flavors, validation, conversion, sidecar.

Example:
    >>> from amct_bridge.records import LayerFactors, Record, dumps, loads, validate
    >>> rec = loads('record { key: "conv1" value { scale_d: 0.0039215689 offset_d: -128 } }')
    >>> rec.flavor, validate(rec)
    ('tf', [])
"""

from amct_bridge.records.codec import detect_flavor, from_proto, to_proto
from amct_bridge.records.convert import convert
from amct_bridge.records.io import dumps, load, loads, save
from amct_bridge.records.model import Attr, LayerFactors, PruneNode, PruneRecord, Record
from amct_bridge.records.validate import Problem, validate

__all__ = [
    "Attr",
    "LayerFactors",
    "Problem",
    "PruneNode",
    "PruneRecord",
    "Record",
    "convert",
    "detect_flavor",
    "dumps",
    "from_proto",
    "load",
    "loads",
    "save",
    "to_proto",
    "validate",
]
