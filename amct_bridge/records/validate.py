"""AMCT's record checks, with one :class:`Problem` per violation (file, line, layer, field).

The rules are those of AMCT's record parser (RecordManager.check_layer_params_range and friends)
plus the flavor rules: a field that a flavor's schema lacks makes AMCT fail the whole file.

Example:
    >>> from amct_bridge.records import LayerFactors, Record
    >>> bad = Record({"conv1": LayerFactors(scale_d=0.1, offset_d=300)})
    >>> [str(p) for p in validate(bad)]
    ["<record>: layer 'conv1': offset_d: offset_d's value should be in [-128, 127] (INT8), got 300"]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from amct_bridge.records.codec import used_fields
from amct_bridge.records.flavors import FLAVORS, UNSUPPORTED_FIELDS, a_record, get_flavor
from amct_bridge.records.model import ATTR_TYPES, LayerFactors, PruneNode, Record

FLT_EPSILON = float(np.finfo(np.float32).eps)
OFFSET_RANGES = {"INT4": (-8, 7), "INT8": (-128, 127), "INT16": (-32768, 32767)}
ACT_TYPES = ("INT8", "INT16")
WTS_TYPES = ("INT4", "INT6", "INT7", "INT8")
DST_TYPES = ("INT8", "INT4")
_QUANT_FIELDS = ("scale_d", "offset_d", "scale_w", "offset_w", "shift_bit")


@dataclass
class Problem:
    """One rule violation. ``str(problem)`` is ``FILE:LINE: layer 'x': field: why``."""

    message: str
    layer: str | None = None
    field: str | None = None
    source: str = "<record>"
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        parts = [where]
        if self.layer is not None:
            parts.append(f"layer {self.layer!r}")
        if self.field is not None:
            parts.append(self.field)
        return ": ".join(parts + [self.message])


def validate(
    record: Record, flavor: str | None = None, *, input_channels: Mapping[str, int] | None = None
) -> list[Problem]:
    """Every problem AMCT would reject ``record`` for, as a ``flavor`` record (default: its own).

    ``input_channels`` (layer -> Cin), when known, lets the tensor_balance_factor length be checked.

    Example:
        >>> from amct_bridge.records import LayerFactors, Record
        >>> validate(Record({"a": LayerFactors(scale_d=0.1, offset_d=0)}))
        []
    """
    flav = get_flavor(flavor or record.flavor)
    source = record.source or "<record>"
    sm = record.source_map
    problems: list[Problem] = []

    def add(message: str, layer: str | None = None, field: str | None = None) -> None:
        line = sm.line_of(layer, field) if (sm is not None and layer is not None) else None
        problems.append(Problem(message, layer, field, source, line))

    for key, factors in record.layers.items():
        for field, message in _layer_problems(factors, flav.name):
            add(message, key, field)
        if input_channels and key in input_channels and factors.tensor_balance_factor:
            cin = input_channels[key]
            if len(factors.tensor_balance_factor) != cin:
                add(
                    f"tensor_balance_factor's length {len(factors.tensor_balance_factor)} should "
                    "be "
                    f"equal to the channel length of inputs of layer {key}: {cin} (Cin)",
                    key,
                    "tensor_balance_factor",
                )
    if record.prune_records and not flav.has_prune_records:
        add(
            f"prune_record is not part of {a_record(flav.name)} (AMCT's parser would fail the file)"
        )
    for index, prune in enumerate(record.prune_records):
        for message in _prune_problems(prune):
            add(f"prune_record[{index}]: {message}")
    return problems


def _layer_problems(f: LayerFactors, flavor: str):
    allowed = FLAVORS[flavor].fields
    for name in used_fields(f):
        if name not in allowed:
            yield (
                name,
                (
                    f"not part of {a_record(flavor)} (AMCT's parser fails the whole file on an "
                    "unknown field); convert the record first"
                ),
            )
        elif name in UNSUPPORTED_FIELDS[flavor]:
            yield name, f"{name} is not supported in {a_record(flavor)}, please delete it"
    if f.act_type is not None and f.act_type not in ACT_TYPES:
        yield "act_type", f"act_type must be one of {list(ACT_TYPES)}, got {f.act_type!r}"
    if f.wts_type is not None and f.wts_type not in WTS_TYPES:
        yield "wts_type", f"wts_type must be one of {list(WTS_TYPES)}, got {f.wts_type!r}"
    if f.dst_type is not None and f.dst_type not in DST_TYPES:
        yield "dst_type", f"dst_type must be one of {list(DST_TYPES)}, got {f.dst_type!r}"
    yield from _factor_problems(f)
    if f.cluster:
        if len(f.cluster) not in (16, 32):
            yield "cluster", f"the length of cluster center is 16 or 32, but is {len(f.cluster)}"
        if any(not -128 <= c <= 127 for c in f.cluster):
            yield "cluster", "cluster center should be between [-128, 127]"
    if f.tensor_balance_factor:
        lo, hi = FLT_EPSILON, 1 / FLT_EPSILON
        bad = [v for v in f.tensor_balance_factor if not (math.isfinite(v) and lo <= v <= hi)]
        if bad:
            yield (
                "tensor_balance_factor",
                (
                    "tensor_balance_factor's value should be in [FLT_EPSILON, 1/FLT_EPSILON], "
                    f"got {bad[0]}"
                ),
            )


def _factor_problems(f: LayerFactors):
    has_quant = any(
        (getattr(f, n) is not None) if n in ("scale_d", "offset_d") else getattr(f, n)
        for n in _QUANT_FIELDS
    )
    if not has_quant:
        return
    for name in ("scale_d", "offset_d"):
        if getattr(f, name) is None:
            yield (
                name,
                f"cannot find {name} of the layer, please check the data calibration process",
            )
    if f.scale_d is not None and not (math.isfinite(f.scale_d) and f.scale_d > 0):
        yield (
            "scale_d",
            f"scale_d's value should be in the positive range of float32, got {f.scale_d}",
        )
    if f.offset_d is not None:
        type_name = (
            "INT4" if f.dst_type == "INT4" else (f.act_type if f.act_type == "INT16" else "INT8")
        )
        lo, hi = OFFSET_RANGES[type_name]
        if not lo <= f.offset_d <= hi:
            yield (
                "offset_d",
                f"offset_d's value should be in [{lo}, {hi}] ({type_name}), got {f.offset_d}",
            )
    bad_w = [s for s in f.scale_w if not (math.isfinite(s) and s > 0)]
    if bad_w:
        yield (
            "scale_w",
            f"scale_w's value should be in the positive range of float32, got {bad_w[0]}",
        )
    if any(o != 0 for o in f.offset_w):
        yield "offset_w", "offset_w's value should be 0"
    if len(f.offset_w) != len(f.scale_w):
        yield (
            "offset_w",
            (
                f"scale_w's length ({len(f.scale_w)}) and offset_w's length "
                f"({len(f.offset_w)}) should be equal"
            ),
        )
    if f.shift_bit:
        if len(f.shift_bit) != len(f.scale_w):
            yield (
                "shift_bit",
                (
                    f"shift_bit's length ({len(f.shift_bit)}) should equal scale_w's "
                    f"length ({len(f.scale_w)})"
                ),
            )
        if not (all(s == 0 for s in f.shift_bit) or all(1 <= s <= 16 for s in f.shift_bit)):
            yield "shift_bit", "shift_bit's value should be in [1, 16] or all be 0"


_PY_TYPES = {
    "FLOAT": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "INT": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "STRING": lambda v: isinstance(v, (str, bytes)),
    "FLOATS": lambda v: isinstance(v, list) and all(isinstance(x, (int, float)) for x in v),
    "INTS": lambda v: isinstance(v, list) and all(isinstance(x, int) for x in v),
    "STRINGS": lambda v: isinstance(v, list) and all(isinstance(x, (str, bytes)) for x in v),
}


def _node_problems(node: PruneNode, role: str, channel_node: bool):
    label = f"{role} {node.name!r}"
    if not node.name:
        yield f"{role}: name is required"
    for attr in node.attrs:
        if attr.type not in ATTR_TYPES[1:]:
            yield (
                f"{label}: attr {attr.name!r}: type must be one of {list(ATTR_TYPES[1:])}, "
                f"got {attr.type!r}"
            )
        elif attr.value is None or not _PY_TYPES[attr.type](attr.value):
            yield (
                f"{label}: attr {attr.name!r}: type {attr.type} does not match the filled field "
                f"(value {attr.value!r})"
            )
    if channel_node:
        begin, end = node.get("begin"), node.get("end")
        if node.get("type") is None:
            yield f"{label}: attr 'type' (STRING, the op type) is missing"
        if not isinstance(begin, int) or not isinstance(end, int):
            yield f"{label}: attrs 'begin' and 'end' (INT) are required"
        elif not 0 <= begin < end:
            yield f"{label}: begin ({begin}) must be >= 0 and < end ({end})"


def _prune_problems(prune):
    if not prune.producers and prune.selective_prune is None:
        yield "a prune record needs at least one producer (or a selective_prune node)"
    for node in prune.producers:
        yield from _node_problems(node, "producer", True)
    for node in prune.consumers:
        yield from _node_problems(node, "consumer", True)
    if prune.selective_prune is not None:
        node = prune.selective_prune
        yield from _node_problems(node, "selective_prune", False)
        shape = node.get("mask_shape")
        if (
            not isinstance(shape, list)
            or not shape
            or any(not isinstance(d, int) or d <= 0 for d in shape)
        ):
            yield (
                f"selective_prune {node.name!r}: attr 'mask_shape' (INTS, the weight shape) "
                "is required"
            )
