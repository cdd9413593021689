"""Small helpers shared by the Keras graph tests: summarise a discovery for exact comparisons."""

from __future__ import annotations

import keras

from amct_bridge.graph import Discovery, discover_groups
from amct_bridge.keras.graph import extract_graph


def discover(model: keras.Model) -> Discovery:
    return discover_groups(extract_graph(model))


def entry(m) -> tuple:
    """(name, op_type, begin, end[, attrs dict]) of a Member; attrs only when present."""
    base = (m.name, m.op_type, m.begin, m.end)
    return (*base, dict(m.attrs)) if m.attrs else base


def groups(d: Discovery) -> dict[tuple, list[tuple]]:
    """{producer entries (tuple): consumer entries (list, record order)}."""
    return {
        tuple((p.name, p.begin, p.end) for p in g.producers): [entry(c) for c in g.consumers]
        for g in d.groups
    }


def refusals(d: Discovery) -> dict[tuple, str]:
    """{(layer, begin, end): reason code}."""
    return {(r.layer, r.begin, r.end): r.reason.value for r in d.refusals}


def head(x: keras.KerasTensor, name: str = "fc") -> keras.KerasTensor:
    """GAP -> Dense(2): a closing consumer that is not part of the pattern under test."""
    gap = keras.layers.GlobalAveragePooling2D(name="gap" if name == "fc" else f"{name}_gap")
    return keras.layers.Dense(2, name=name)(gap(x))


def kname(t: keras.KerasTensor) -> str:
    """Keras' own name of the op (layer or raw op such as ``x + y``) that produced ``t``: the
    name ``model.operations`` lists, which the graph IR and every output must use."""
    return t._keras_history.operation.name
