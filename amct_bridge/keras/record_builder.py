"""Keras write step: the core's record + sidecar, plus TF op keys and the frozen graph.

:func:`amct_bridge.calibration.records.build_record` builds the record and sidecar from the
session's observers and :class:`~amct_bridge.keras.weights.KerasWeights`; this module adds what
only Keras has: ``keys="tf_op"`` (record keys renamed to the TF op names of the frozen graph)
and ``frozen_graph_path`` (that GraphDef with the Conv+BN folds baked in). Nothing is written
until every piece was built.

Example (``keys="tf_op"``: one record entry per TF op of the layer):
    >>> from amct_bridge.records import LayerFactors
    >>> rec = Record({"c1": LayerFactors(scale_d=0.5, offset_d=0)})
    >>> list(_rekey(rec, {"c1": ["model/c1/convolution"]}).layers)
    ['model/c1/convolution']
"""

from __future__ import annotations

from pathlib import Path

from amct_bridge.calibration.records import (
    Built,
    build_record,
    finish_record,
    search_clip_ranges,
)
from amct_bridge.calibration.records import write_outputs as _write
from amct_bridge.errors import CalibrationError
from amct_bridge.keras import weights as kw
from amct_bridge.records import Record

__all__ = ["Built", "build_outputs", "search_clip_ranges", "write_outputs"]


def build_outputs(session, record_path, flavor: str, keys: str, frozen_graph_path=None) -> Built:
    """Build record + sidecar (+ frozen graph) from a session's observers and the model."""
    record, stats, folded = build_record(session)
    frozen = None
    if keys == "tf_op" or frozen_graph_path is not None:
        from amct_bridge.keras.freeze import freeze_model

        frozen = freeze_model(session.model, [kw.freeze_fold(f) for f in folded])
    if keys == "tf_op":
        record = _rekey(record, frozen.op_names)
    record, text = finish_record(record, flavor)
    built = Built(record, text, stats)
    if frozen_graph_path is not None:
        built.extra[Path(frozen_graph_path)] = frozen.graph_def.SerializeToString(
            deterministic=True
        )
    return built


def write_outputs(
    built: Built, record_path, flavor=None, keys=None, frozen_graph_path=None
) -> None:
    """Write the record, its sidecar and the frozen graph (each atomically)."""
    _write(built, record_path)


def _rekey(record: Record, op_names: dict[str, list[str]]) -> Record:
    out = Record(flavor=record.flavor)
    for key, factors in record.layers.items():
        names = op_names.get(key)
        if not names:
            raise CalibrationError(f"layer {key!r}: no op found in the frozen graph for its record")
        for name in names:
            out.layers[name] = factors
    return out
