"""Checks of the exported arrays (dtype, NaN/Inf, shapes, bias and alpha lengths: convert.py makes
none of them), of the record's keys, and that every layer is accounted for. The ESP-DL v1 checks
(saturation, Concat exponents) are in :mod:`amct_bridge.espdl.v1.checks`.

convert.py silently writes ``None`` exponents for integer arrays, reads past the end of a short
PReLU alpha or bias at run time, and saturates float32 overflow; every array we write goes
through :func:`as_float32` and the shape checks first. :func:`unaccounted` makes sure nothing
the model computes is silently missing from an export: every layer is exported, fused into an
exported or runtime layer, a runtime layer, a pass-through (Dropout...), an input, or skipped
with a reason.

Example:
    >>> import numpy as np
    >>> as_float32(np.array([1, 2], np.float64), "conv1", "bias").dtype
    dtype('float32')
"""

from __future__ import annotations

import difflib
import math
from typing import TYPE_CHECKING

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.source import PASS_THROUGH, SourceLayer
from amct_bridge.records.calibration import record_lacks

if TYPE_CHECKING:
    from amct_bridge.records.calibration import CalibrationStats
    from amct_bridge.records.model import Record


def as_float32(x: np.ndarray, layer: str, what: str) -> np.ndarray:
    """``x`` as a C-contiguous float32 array; refuses non-float dtypes and NaN/Inf.

    Example:
        >>> as_float32(np.array([1, 2]), "fc", "kernel")
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: layer 'fc': kernel has dtype int64, expected floating point
    """
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ExportError(f"layer {layer!r}: {what} has dtype {arr.dtype}, expected floating point")
    with np.errstate(over="ignore"):  # overflow to Inf is reported just below
        out = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.all(np.isfinite(out)):
        bad = "NaN" if np.isnan(out).any() else "Inf (or a value beyond float32)"
        raise ExportError(f"layer {layer!r}: {what} contains {bad}")
    return out


def check_shape(arr: np.ndarray, expected: tuple, layer: str, what: str) -> None:
    """Fail unless ``arr.shape`` matches ``expected`` (``None`` = any size on that axis).

    Example:
        >>> check_shape(np.zeros((3, 3, 2, 1)), (None, None, 4, 1), "dw", "filter HWC1")
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: layer 'dw': filter HWC1 has shape (3, 3, 2, 1), expected ...
    """
    ok = len(arr.shape) == len(expected) and all(
        e is None or e == s for s, e in zip(arr.shape, expected, strict=True)
    )
    if not ok:
        want = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
        raise ExportError(f"layer {layer!r}: {what} has shape {tuple(arr.shape)}, expected {want}")


def channel_vector(x: np.ndarray, channels: int, layer: str, what: str) -> np.ndarray:
    """A per-channel vector of length ``channels`` (a scalar or size-1 array is broadcast).

    Example:
        >>> channel_vector(np.array([[[0.1]]]), 3, "p", "PReLU alpha").tolist()
        [0.10000000149011612, 0.10000000149011612, 0.10000000149011612]
    """
    arr = as_float32(x, layer, what)
    if arr.size == 1:
        return np.full((channels,), arr.reshape(()), np.float32)
    flat = arr.reshape(-1)
    if flat.size != channels:
        raise ExportError(
            f"layer {layer!r}: {what} has {flat.size} values, expected {channels} (one per channel)"
        )
    return flat


def check_record_keys(record: Record | None, layers: list[SourceLayer]) -> None:
    """Refuse a record with keys that name no layer of the model (another model's record).

    Example:
        >>> from amct_bridge.records.model import LayerFactors, Record
        >>> check_record_keys(Record({"x": LayerFactors()}), [SourceLayer("in", "input")])
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: record layers not found in the model (...): 'x'
    """
    if record is None:
        return
    known = [layer.name for layer in layers]
    missing = [key for key in record.layers if key not in set(known)]
    if missing:
        raise ExportError(
            "record layers not found in the model (is this the model the record was made "
            f"for?): {', '.join(repr(k) + _did_you_mean(k, known) for k in missing)}"
        )
    for key, factors in record.layers.items():  # exponents may come from these scales
        for name, values in (("scale_d", [factors.scale_d]), ("scale_w", factors.scale_w)):
            for i, value in enumerate(values):
                if value is not None and not (math.isfinite(value) and value > 0):
                    raise ExportError(
                        f"{_where(record, key, name, i)}layer {key!r}: {name} {value}: scales "
                        "must be finite and > 0 (amct-bridge validate lists every problem)"
                    )


def _sidecar_names(layers: list[SourceLayer]) -> set[str]:
    # a call site (``relu@1``) has its own entry or shares its layer's (``relu``)
    return {x.name for x in layers} | {x.name.split("@")[0] for x in layers}


def check_sidecar_keys(stats: CalibrationStats | None, layers: list[SourceLayer]) -> None:
    """Refuse a sidecar none of whose layers exist in the model (another model's sidecar), as
    :func:`check_record_keys` refuses such a record. A sidecar that names only some layers is
    noted, not refused (the export's ``_sidecar_strangers``).

    Example:
        >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats
        >>> check_sidecar_keys(CalibrationStats(layers={"x": LayerStats("Dense")}),
        ...                    [SourceLayer("in", "input"), SourceLayer("fc", "dense", ["in"])])
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: calibration sidecar: its one layer does not exist in ...
    """
    if stats is None or not stats.layers:
        return
    names = _sidecar_names(layers)
    if any(key in names or key.split("/")[0] in names for key in stats.layers):
        return
    known = sorted(names)
    shown = [repr(k) + _did_you_mean(k, known) for k in list(stats.layers)[:5]]
    more = f" and {len(stats.layers) - 5} more" if len(stats.layers) > 5 else ""
    where = f"{stats.source}: " if stats.source else ""
    count = len(stats.layers)
    none = f"none of its {count} layers exist" if count > 1 else "its one layer does not exist"
    raise ExportError(
        f"{where}calibration sidecar: {none} in this model (is it the sidecar of another "
        f"model?): {', '.join(shown)}{more}; pass the "
        "sidecar the calibration of this model wrote (<record>.calib.json, or --stats / stats=)"
    )


def check_sidecar_model(stats: CalibrationStats | None, layers: list[SourceLayer]) -> None:
    """Refuse a calibration sidecar written for another model, by layer name: the sidecar's
    ``model`` (written by the calibration since issue 33) lists the calibrated model's layers
    and each weighted part's kernel shape. A weighted layer here that the calibrated model did
    not have, one of the calibrated model's weighted layers that this model lacks, and a kernel
    with other output channels or another size are each named, with how they differ. Kernels
    are compared by output channels and size, which do not depend on the framework's layout
    (the export's are HWIO; MindSpore calibrates OIHW). A sidecar without ``model`` (written
    before) is not checked here: its names are only compared (a warning, as before).

    Example:
        >>> from amct_bridge.records.calibration import CalibrationStats, LayerShape
        >>> stats = CalibrationStats(model={"fc": LayerShape("Dense", (4, 2), "IO")})
        >>> fc = SourceLayer("fc", "dense", ["in"], "Dense", {"kernel": np.zeros((4, 3))})
        >>> try:
        ...     check_sidecar_model(stats, [SourceLayer("in", "input"), fc])
        ... except ExportError as err:
        ...     print(err)  # doctest: +ELLIPSIS
        calibration sidecar: written for another model: layer 'fc' (Dense): kernel (4, 3) here,
        3 output channels and 12 weights; (4, 2) IO when calibrated, 2 output channels and 8
        weights; calibrate this model ...
    """
    if stats is None or stats.model is None:
        return
    from amct_bridge.quant.layouts import LAYOUTS

    model = stats.model
    problems, matched = [], set()
    for layer in layers:
        kernel = layer.weights.get("kernel")
        if layer.op not in ("conv2d", "depthwise_conv2d", "dense") or kernel is None:
            continue
        names = [layer.name, str(layer.attrs.get("record_key", "")), layer.name.split("@")[0]]
        key = next((n for n in names if n in model), None)
        if key is None:
            problems.append(
                f"layer {layer.describe()} (kernel {tuple(kernel.shape)}) is not in the "
                "calibrated model"
            )
            continue
        matched.add(key)
        shape = model[key]
        if shape.kernel is None:
            continue  # the calibration saw it without weights of its own (not quantizable)
        spec = LAYOUTS.get(str(shape.layout).upper())  # unknown: the sizes alone
        size = math.prod(shape.kernel)
        out = None
        if spec is not None and spec.ndim == len(shape.kernel):
            out = math.prod(shape.kernel[a] for a in spec.out_axis)
        here_out = layer.out_channels
        if size != kernel.size or (out is not None and here_out is not None and out != here_out):
            problems.append(
                f"layer {layer.describe()}: kernel {tuple(kernel.shape)} here, {here_out} output "
                f"channels and {kernel.size} weights; {shape.kernel} {shape.layout} when "
                f"calibrated, {out if out is not None else '?'} output channels and {size} weights"
            )
    here = {layer.name for layer in layers} | {layer.name.split("@")[0] for layer in layers}
    here |= {str(layer.attrs.get("record_key")) for layer in layers if "record_key" in layer.attrs}
    for key, shape in model.items():
        if shape.kernel is None or key in matched or key in here:
            continue
        problems.append(
            f"layer {key!r} ({shape.kind}, kernel {shape.kernel} {shape.layout}) of the "
            "calibrated model is not in this model"
        )
    if not problems:
        return
    where = f"{stats.source}: " if stats.source else ""
    shown = "; ".join(problems[:8]) + (
        f"; and {len(problems) - 8} more" if len(problems) > 8 else ""
    )
    raise ExportError(
        f"{where}calibration sidecar: written for another model: {shown}; calibrate this model "
        "(its record and sidecar), or pass the sidecar its calibration wrote (<record>.calib.json, "
        "or --stats / stats=)"
    )


def record_coverage(
    heads: list[str], record: Record | None, stats: CalibrationStats | None
) -> list[str]:
    """Notes on exported weight layers (``heads``) that the record has no entry for.

    When the sidecar lists the keys of the record written with it (``record_keys``), entries
    it has and the record lacks are one note saying so (a record cut short or edited: blaming
    skip_layers misled before), and the other heads without an entry were left out by the
    calibration (skip_layers), a note each. An older sidecar cannot tell the two apart.

    Example:
        >>> from amct_bridge.records.calibration import CalibrationStats
        >>> from amct_bridge.records.model import LayerFactors, Record
        >>> rec = Record({"a": LayerFactors(scale_d=0.1)}, source="r.txt")
        >>> record_coverage(["a", "b"], rec, CalibrationStats(record_keys=["a", "b"]))
        ... # doctest: +ELLIPSIS
        ["r.txt: the record lacks 1 layer that the sidecar says were calibrated (truncated ...
    """
    if record is None:
        return []
    keys = set(record.layers)
    absent = [h for h in heads if h not in keys and not any(k.startswith(h + "/") for k in keys)]
    written = stats.record_keys if stats is not None else None
    if written is not None and not any(k in keys for k in written):
        written = None  # another key space (keys="tf_op", renamed back by the adapter)
    notes, why = [], "skip_layers at calibration?"
    if written is not None:
        lacking = [k for k in written if k not in keys]
        if lacking:
            notes.append(record_lacks(lacking, record.source, stats.source))
        calibrated = set(written)
        absent = [
            h
            for h in absent
            if h not in calibrated and not any(k.startswith(h + "/") for k in calibrated)
        ]
        why = "skip_layers at calibration: the sidecar says it was not calibrated"
    return notes + [
        f"layer {name!r} has no record entry ({why}): ESP-DL v1 has no float layers, so it is "
        "exported quantized too (coefficient exponents from its weights, feature exponents "
        "from the sidecar ranges); check its accuracy with espdl-eval"
        for name in absent
    ]


def sidecar_of_another_record(record: Record | None, stats: CalibrationStats | None) -> list[str]:
    """A note when the record has entries the sidecar's ``record_keys`` (the keys of the record
    written with it) lack: the sidecar comes from another calibration (``--stats`` of another
    run), so the exponents are taken from ranges that may describe other weights or data.

    Example:
        >>> from amct_bridge.records.calibration import CalibrationStats
        >>> from amct_bridge.records.model import LayerFactors, Record
        >>> rec = Record({"a": LayerFactors(), "b": LayerFactors()}, source="r.txt")
        >>> sidecar_of_another_record(rec, CalibrationStats(record_keys=["a"], source="s.json"))
        ... # doctest: +ELLIPSIS
        ["s.json: this calibration sidecar was written with another record: it lists no 'b' ...
    """
    written = stats.record_keys if stats is not None else None
    if record is None or written is None or not any(k in record.layers for k in written):
        return []  # unknown, or another key space (keys="tf_op", renamed by the adapter)
    extra = [k for k in record.layers if k not in set(written)]
    if not extra:
        return []
    shown = ", ".join(map(repr, extra[:5])) + (f" and {len(extra) - 5} more" * (len(extra) > 5))
    where = f"{stats.source}: " if stats.source else ""
    rec = f" ({record.source})" if record.source else ""
    return [
        f"{where}this calibration sidecar was written with another record: it lists no "
        f"{shown} of the record{rec}, so the exponents come from another calibration's ranges; "
        "pass the sidecar written with this record (<record>.calib.json)"
    ]


def _where(record: Record, key: str, name: str, occurrence: int) -> str:
    line = record.source_map.line_of(key, name, occurrence) if record.source_map else None
    return f"{record.source}:{line}: " if record.source and line else ""


def _did_you_mean(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def passthrough(layers: list[SourceLayer]) -> list[dict]:
    """export.json's ``passthrough`` list: layers that compute nothing at inference (Dropout, a
    linear Activation, a folded-BN identity) and the layer their readers read instead.

    Example:
        >>> passthrough([SourceLayer("d", "runtime", ["c"], "Dropout")])
        [{'layer': 'd', 'kind': 'Dropout', 'reads': 'c'}]
    """
    return [
        {"layer": x.name, "kind": x.kind, "reads": x.inputs[0] if x.inputs else None}
        for x in layers
        if x.op == "runtime" and x.kind in PASS_THROUGH
    ]


def unaccounted(layers: list[SourceLayer], report: dict) -> list[str]:
    """Layers of ``layers`` that export.json (``report``) does not account for: each must be an
    input, the source or a ``fused`` member of an exported or runtime layer, a pass-through, or
    skipped. An empty list means nothing the model computes is silently missing.

    Example:
        >>> unaccounted([SourceLayer("r", "relu", ["c"])], {"layers": [], "runtime_layers": []})
        ['r']
    """
    seen = set(report.get("inputs", []))
    for entry in [*report.get("layers", []), *report.get("runtime_layers", [])]:
        seen.add(entry["source"])
        seen.update(entry.get("fused") or [])
    seen.update(p["layer"] for p in report.get("passthrough", []))
    seen.update(p["layer"] for p in report.get("skipped", []))
    return [x.name for x in layers if x.name not in seen]
