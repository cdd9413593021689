"""ESP-DL export: record + weights -> an ESP-DL model, with an exact preview and a chip simulator.

Layout: this package holds what every ESP-DL format shares: the framework-free model
(:mod:`~amct_bridge.espdl.source`), the plan of conv/dense chains (:mod:`~amct_bridge.espdl.plan`),
exponents from the record and the calibration sidecar (:mod:`~amct_bridge.espdl.exponents`,
:mod:`~amct_bridge.espdl.exponent_groups`), the checks (:mod:`~amct_bridge.espdl.checks`,
:mod:`~amct_bridge.espdl.consistency`), C identifiers (:mod:`~amct_bridge.espdl.naming`), the
all-at-once directory writer (:mod:`~amct_bridge.espdl.writer`) and the accuracy comparison
(:mod:`~amct_bridge.espdl.evaluation`). :mod:`amct_bridge.espdl.v1` is ESP-DL v1 (convert.py
input, C++ files, chip simulator); :mod:`amct_bridge.espdl.v3` reads and writes ESP-DL v3's
``.espdl`` models and simulates them. The names below are v1's, re-exported (``__all__``).

Framework-free: :func:`export` takes the model as a list of
:class:`~amct_bridge.espdl.source.SourceLayer` only. Adapters translate their models and offer
their own entry (``amct_bridge.keras.export_espdl(model, record, out_dir, ...)``); the core never
imports them. :mod:`amct_bridge.espdl.v1.preview` predicts convert.py's integers,
:func:`convert_set` writes convert.py's C++ coefficient files from any convert.py input set, and
:func:`simulate_chip` runs an export (directory, :class:`ExportResult` or :func:`load_network`)
as the ESP-DL v1 chip computes it, bit for bit (docs/espdl-export.md, "Chip simulator").

Example:
    >>> import numpy as np, tempfile, pathlib
    >>> from amct_bridge.espdl import SourceLayer, export
    >>> from amct_bridge.records import LayerFactors, Record
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> w = np.ones((4, 2), np.float32)
    >>> layers = [SourceLayer("in", "input"),
    ...           SourceLayer("fc", "dense", ["in"], weights={"kernel": w})]
    >>> rec = Record({"fc": LayerFactors(scale_d=1 / 255, offset_d=-128)})  # input in [0, 1]
    >>> stats = CalibrationStats(layers={"fc": LayerStats("Dense", output=TensorRange(-4.0, 4.0))})
    >>> res = export(rec, layers, None, stats=stats)  # out_dir None: compute, write nothing
    >>> res.config["fc"]["input_exponent"], res.config["fc"]["output_exponent"]
    (-6, -4)
    >>> chip = simulate_chip(res, np.full((1, 4), 0.5, np.float32))  # the chip's integers
    >>> chip.output.values.tolist(), chip.output.exponent  # 4 * 0.5 = 2.0 = 32 * 2^-4
    ([[32, 32]], -4)
"""

from __future__ import annotations

import os
from pathlib import Path

from amct_bridge.errors import ExportError
from amct_bridge.espdl.exponent_search import CalibrationData, check_rule
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v1 import (
    ChipResult,
    ChipTensor,
    ExportedLayer,
    ExportResult,
    LayerPreview,
    Network,
    convert_set,
    export_layers,
    load_network,
    load_set,
    preview_layer,
    preview_set,
    simulate_chip,
    tool_output,
)
from amct_bridge.espdl.writer import check_output_path
from amct_bridge.records.calibration import CalibrationStats, load_stats, sidecar_path
from amct_bridge.records.model import Record

__all__ = [
    "ChipResult",
    "ChipTensor",
    "ExportResult",
    "ExportedLayer",
    "LayerPreview",
    "Network",
    "SourceLayer",
    "convert_set",
    "export",
    "export_layers",
    "load_network",
    "load_set",
    "preview_layer",
    "preview_set",
    "simulate_chip",
    "tool_output",
]


def _resolve_record(record: Record | str | os.PathLike | None) -> Record | None:
    if record is None or isinstance(record, Record):
        return record
    from amct_bridge.records import load

    return load(record)


def _resolve_stats(
    stats: CalibrationStats | str | os.PathLike | None, record: object
) -> CalibrationStats | None:
    if isinstance(stats, CalibrationStats):
        return stats
    if stats is not None:
        return load_stats(stats)
    # a record file, or a Record read from one (``load``, ``calibrate()``'s return value)
    path = record if isinstance(record, (str, os.PathLike)) else getattr(record, "source", None)
    if path and sidecar_path(path).is_file():
        return load_stats(sidecar_path(path))
    return None


def _resolve_layers(model_or_weights: object) -> list[SourceLayer]:
    if isinstance(model_or_weights, (list, tuple)) and all(
        isinstance(x, SourceLayer) for x in model_or_weights
    ):
        return list(model_or_weights)
    # the core never imports an adapter: framework models go through the adapter's own entry
    raise ExportError(
        f"cannot export a {type(model_or_weights).__name__}: pass a Keras model to "
        "amct_bridge.keras.export_espdl, or a list of amct_bridge.espdl.SourceLayer here"
    )


def export(
    record: Record | str | os.PathLike | None,
    model_or_weights: object,
    out_dir: str | os.PathLike | None,
    *,
    stats: CalibrationStats | str | os.PathLike | None = None,
    feature_type: str = "s8",
    granularity: str = "per-tensor",
    target: str = "esp32",
    skip_unsupported: bool = False,
    overwrite: bool = False,
    cpp: str | None = None,
    exponents: str = "max",
    calibration: CalibrationData | None = None,
) -> ExportResult:
    """Export a model as ESP-DL v1 convert.py input in ``out_dir`` (None: compute only).

    Args:
        record: AMCT record (object or path); None to rely on the sidecar alone.
        model_or_weights: a list of SourceLayer in execution order (framework models: the
            adapter's entry, e.g. ``amct_bridge.keras.export_espdl(model, record, out_dir)``).
        out_dir: directory to create (built beside it, then renamed: never half-written).
        stats: calibration sidecar (object or path). Default: ``<record>.calib.json`` when
            ``record`` is a path, or a Record read from one, and that file exists.
        feature_type, granularity, target, skip_unsupported, overwrite, cpp: see
            :func:`amct_bridge.espdl.v1.export.export_layers` (``cpp="NAME"`` also writes the C++
            coefficient files, model class and app_main.cpp).
        exponents: "max" (the range rule: each exponent covers its calibrated range) or
            "search" (the exponents and bias corrections with the smallest chip output error
            on ``calibration``, :func:`amct_bridge.espdl.v1.search.search_tuning`; the
            adapters' ``calibration_data=`` makes it the default there).
        calibration: the inputs and float outputs the search scores on.

    Example:
        >>> export(None, "model.keras", None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: cannot export a str: pass a Keras model to ...
    """
    if out_dir is not None:  # before a search of minutes, not after
        check_output_path(out_dir)
    layers = _resolve_layers(model_or_weights)
    check_rule(exponents, calibration)
    options = {
        "record": _resolve_record(record),
        "stats": _resolve_stats(stats, record),
        "feature_type": feature_type,
        "granularity": granularity,
        "target": target,
        "skip_unsupported": skip_unsupported,
    }
    tuning = None
    if exponents == "search":
        from amct_bridge.espdl.v1.search import search_tuning

        tuning = search_tuning(
            layers,
            calibration.x,
            calibration.floats,
            output=calibration.output,
            given=calibration.given,
            **options,
        )
    return export_layers(
        layers,
        Path(out_dir) if out_dir is not None else None,
        overwrite=overwrite,
        cpp=cpp,
        tuning=tuning,
        **options,
    )
