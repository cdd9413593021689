"""Per-layer quantization report: the table, the ranking and the kept-in-float result.

The core never runs a model. A framework adapter (:mod:`amct_bridge.keras.report`) implements
:class:`ReportRunner`: it lists the record's layers and runs the model on the report data with a
given record simulated (or float, ``record=None``), returning the outputs of the layers asked for
and the model's output. :func:`build_report` then needs ``N + 3`` runs for ``N`` quantized layers:
float, everything quantized (the cumulative SNR of every layer at once, since a layer's output
depends only on the layers before it), one per layer quantized alone, and the record without
the top-K layers.

Example:
    >>> import numpy as np
    >>> from amct_bridge.records import LayerFactors, Record
    >>> class Scale:  # y = 3x, one "layer" keyed "fc"; its input is quantized with scale_d
    ...     x = np.linspace(-1, 1, 101, dtype=np.float32)
    ...     def layers(self):
    ...         return [LayerInfo("fc", "fc", "Dense")]
    ...     def run(self, record, keys):
    ...         f = record.layers.get("fc") if record else None
    ...         x = self.x if f is None else np.round(self.x / f.scale_d) * f.scale_d
    ...         return RunResult(final=3 * x[:, None], outputs={"fc": 3 * x},
    ...                          inputs={} if record else {"fc": self.x})
    >>> rep = build_report(Record({"fc": LayerFactors(scale_d=0.5, offset_d=0)}), Scale(), top_k=1)
    >>> rep.rows[0].clip_max, rep.rows[0].saturated, rep.skip_layers
    (63.5, 0.0, ['fc'])
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from amct_bridge.errors import RecordError
from amct_bridge.quant.factors import bits_of
from amct_bridge.records.calibration import CalibrationStats
from amct_bridge.records.model import LayerFactors, Record
from amct_bridge.report import metrics

#: Bins of the input histograms drawn for the worst layers.
HIST_BINS = 100

log = logging.getLogger(__name__)


@dataclass
class LayerInfo:
    """One quantized part of the model, as the adapter names it.

    Args:
        key: the record key ("conv1", "sep/depthwise", "outer/inner").
        layer: the framework layer it belongs to (the name ``skip_layers`` takes).
        kind: the layer's class name ("Conv2D", "Conv2d"...).
        channel_axis: channel axis of its input (DMQ factors divide along it).

    Example:
        >>> LayerInfo("sep/depthwise", "sep", "SeparableConv2D").channel_axis
        -1
    """

    key: str
    layer: str
    kind: str
    channel_axis: int = -1


@dataclass
class RunResult:
    """What one run of the model on the report data gives.

    Args:
        final: the model's (first) output, one row per sample.
        outputs: record key -> the output of its layer (keys the adapter cannot observe, e.g.
            inside a nested model, are absent).
        inputs: record key -> the layer part's float input (float runs only).

    Example:
        >>> import numpy as np
        >>> RunResult(final=np.zeros((2, 3))).outputs
        {}
    """

    final: np.ndarray
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


class ReportRunner(Protocol):
    """What a framework adapter provides (see the module docstring's example)."""

    def layers(self) -> list[LayerInfo]:
        """The model's quantizable parts in execution order."""
        ...

    def run(self, record: Record | None, keys: Sequence[str]) -> RunResult:
        """Run on the report data with ``record`` simulated (None: float); outputs of ``keys``
        (and, for a float run, their inputs)."""
        ...


@dataclass
class LayerRow:
    """One row of the report (None: not applicable or not observable). See docs/report.md.

    Example:
        >>> LayerRow("fc", "fc", "Dense").to_dict()["key"]
        'fc'
    """

    key: str
    layer: str
    kind: str
    input_min: float | None = None  # float input over the report data (after DMQ division)
    input_max: float | None = None
    calib_min: float | None = None  # raw extremes the calibration saw (sidecar), if known
    calib_max: float | None = None
    clip_min: float | None = None  # what scale_d / offset_d represent
    clip_max: float | None = None
    saturated: float | None = None  # share of input values outside [clip_min, clip_max]
    scale_d: float | None = None
    offset_d: int | None = None
    bits: int | None = None
    scale_w: list[float] = field(default_factory=list)
    scale_spread: float | None = None  # max(scale_w) / min(scale_w)
    snr_alone: float | None = None  # dB, layer output, only this part quantized
    snr_cumulative: float | None = None  # dB, layer output, every part quantized
    snr_model: float | None = None  # dB, model output, only this part quantized
    accuracy_drop: float | None = None  # float accuracy - accuracy with only this part quantized
    rank: int = 0  # 1 = most sensitive

    def to_dict(self) -> dict:
        """JSON-ready dict (infinite SNR as the string "inf")."""
        return {k: _json_number(v) for k, v in asdict(self).items()}


@dataclass
class Report:
    """The whole report: rows in execution order, top-K, config fragment, model-level numbers.

    Example:
        >>> Report(rows=[], samples=0).to_dict()["top"]
        []
    """

    rows: list[LayerRow]
    samples: int
    top: list[str] = field(default_factory=list)  # record keys, most sensitive first
    skip_layers: list[str] = field(default_factory=list)  # their layers, for skip_layers
    fragment: str = ""  # AMCT simple-config text
    float_accuracy: float | None = None
    quantized_accuracy: float | None = None
    kept_float_accuracy: float | None = None  # with skip_layers kept in float
    #: with labels: all quantized, the accuracy is already the float one, so no layer is
    #: suggested for float (skip_layers empty, no kept-float run)
    no_drop: bool = False
    snr_model_quantized: float | None = None  # dB, model output, every part quantized
    snr_model_kept_float: float | None = None
    #: with labels the model output is not a class vector for (an autoencoder scored with 0/1
    #: anomaly labels): why no accuracy is given; the MSEs below are the regression figures
    no_accuracy: str = ""
    mse_model_quantized: float | None = None  # model output against the float one
    mse_model_kept_float: float | None = None
    #: record key -> (counts, bin edges) of its float input, for the top layers.
    histograms: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready dict (rows as :meth:`LayerRow.to_dict`)."""
        doc = {k: _json_number(v) for k, v in asdict(self).items() if k not in ("rows",)}
        doc["rows"] = [r.to_dict() for r in self.rows]
        doc["histograms"] = {k: {"counts": c, "edges": e} for k, (c, e) in self.histograms.items()}
        return doc


def read_record(
    record: Record | str | os.PathLike, stats: CalibrationStats | None = None
) -> tuple[Record, CalibrationStats | None]:
    """``record`` as a Record, and ``stats``, else the sidecar of the file it was read from.

    Example:
        >>> read_record(Record({}))[1] is None
        True
    """
    from amct_bridge.records import load
    from amct_bridge.records.calibration import load_stats, sidecar_path

    path = record.source if isinstance(record, Record) else record  # read from a file?
    if stats is None and path and Path(sidecar_path(path)).is_file():
        stats = load_stats(sidecar_path(path))
    return (record if isinstance(record, Record) else load(record)), stats


def build_report(
    record: Record,
    runner: ReportRunner,
    labels: np.ndarray | None = None,
    *,
    top_k: int = 3,
    stats: CalibrationStats | None = None,
) -> Report:
    """Measure every quantized part of ``record`` with ``runner`` (see the module docstring).

    Args:
        record: the record (parts without scale_d/scale_w, e.g. prune-only, are left out).
        runner: the framework adapter, already holding the model and the data.
        labels: class labels of the data (accuracy columns: class indices or one-hot), or
            None. Labels the model output is not a class vector for give no accuracy:
            ``Report.no_accuracy`` says why, the model output's SNR and MSE stand instead.
        top_k: how many of the most sensitive layers to keep in float in the fragment.
        stats: the calibration sidecar, for the ranges the calibration saw (optional).

    Returns:
        A :class:`Report`; rows are ranked by ``snr_model`` (lowest = rank 1).

    Example:
        >>> # see the module docstring
    """
    from amct_bridge.report.fragment import config_fragment  # sibling, no cycle at import

    infos = [i for i in runner.layers() if _quantized(record.layers.get(i.key))]
    known = {i.key for i in runner.layers()}
    missing = [k for k, f in record.layers.items() if _quantized(f) and k not in known]
    if missing:
        hints = [difflib.get_close_matches(k, sorted(known), n=1) for k in missing]
        said = ", ".join(
            f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "")
            for k, h in zip(missing, hints, strict=True)
        )
        raise RecordError(
            f"record keys {said} name no quantizable layer of the model; it has: "
            + (", ".join(sorted(known)) or "none")
        )
    if not infos:
        raise RecordError("the record has no quantized layer (no scale_d/scale_w) to report on")
    keys = [i.key for i in infos]
    quant = Record({k: record.layers[k] for k in keys}, flavor=record.flavor)
    start = time.perf_counter()
    # one pass per layer, plus float, all-quantized and kept-float: say so on a large model
    log.info("report: %d layers, %d passes over the data", len(infos), len(infos) + 3)
    floating = runner.run(None, keys)
    _check_finite(floating, infos)
    full = runner.run(quant, keys)
    # an output that is not a class vector for the labels gives no accuracy (its arg max
    # against them would be a number about another tensor): regression figures instead
    problem = "" if labels is None else metrics.classification_problem(floating.final, labels)
    acc = None if problem else _accuracy_fn(labels)
    rows = [_static_row(i, record.layers[i.key], floating, stats) for i in infos]
    for n, (info, row) in enumerate(zip(infos, rows, strict=True), 1):
        log.info(
            "report: layer %d/%d %r alone (%.1f s so far)",
            n,
            len(infos),
            info.key,
            time.perf_counter() - start,
        )
        ref = floating.outputs.get(info.key)
        row.snr_cumulative = _snr(ref, full.outputs.get(info.key))
        alone = runner.run(Record({info.key: record.layers[info.key]}), [info.key])
        row.snr_alone = _snr(ref, alone.outputs.get(info.key))
        row.snr_model = metrics.snr_db(floating.final, alone.final)
        if acc:
            row.accuracy_drop = acc(floating.final) - acc(alone.final)
    order = sorted(range(len(rows)), key=lambda i: (rows[i].snr_model, _low(rows[i].snr_alone)))
    for rank, i in enumerate(order, 1):
        rows[i].rank = rank
    report = Report(rows=rows, samples=len(floating.final))
    if problem:
        report.no_accuracy = f"the model output is not a class vector for these labels: {problem}"
    for i in order:
        if len(report.skip_layers) < top_k or rows[i].layer in report.skip_layers:
            report.top.append(rows[i].key)
            if rows[i].layer not in report.skip_layers:
                report.skip_layers.append(rows[i].layer)
    report.snr_model_quantized = metrics.snr_db(floating.final, full.final)
    report.mse_model_quantized = metrics.mse(floating.final, full.final)
    if acc:
        report.float_accuracy = acc(floating.final)
        report.quantized_accuracy = acc(full.final)
    if report.float_accuracy is not None and report.quantized_accuracy >= report.float_accuracy:
        # nothing to win back: suggest no layer for float (the ranking still says who is worst)
        report.skip_layers = []
        report.no_drop = True
    kept = Record({k: f for k, f in quant.layers.items() if k not in report.top})
    if report.skip_layers:
        rest = runner.run(kept, []) if kept.layers else floating
        report.snr_model_kept_float = metrics.snr_db(floating.final, rest.final)
        report.mse_model_kept_float = metrics.mse(floating.final, rest.final)
        if acc:
            report.kept_float_accuracy = acc(rest.final)
    elif not report.no_drop:  # top_k 0: nothing kept in float, the record as it is
        report.snr_model_kept_float = report.snr_model_quantized
        report.mse_model_kept_float = report.mse_model_quantized
        report.kept_float_accuracy = report.quantized_accuracy
    for key in report.top:
        row = rows[keys.index(key)]
        values = floating.inputs.get(key)
        if values is not None and values.size and row.clip_min is not None:
            axis = infos[keys.index(key)].channel_axis
            values = metrics.balanced(values, record.layers[key].tensor_balance_factor, axis)
            report.histograms[key] = _histogram(values, row)
    report.fragment = config_fragment(report)
    return report


def _check_finite(floating: RunResult, infos: list[LayerInfo]) -> None:
    """RecordError naming the first layer whose float input is NaN/Inf on the report data
    (SNRs and histograms of such data mean nothing), or the model output."""
    for info in infos:
        values = floating.inputs.get(info.key)
        if values is not None and not np.isfinite(values).all():
            bad = np.unravel_index(np.flatnonzero(~np.isfinite(values))[0], values.shape)
            raise RecordError(
                f"layer {info.key!r}: its float input over the report data contains NaN or Inf "
                f"(sample {bad[0]}): check the data (or the model's float output)"
            )
    if not np.isfinite(floating.final).all():
        sample = np.argwhere(~np.isfinite(floating.final))[0][0]
        raise RecordError(
            f"the model's float output contains NaN or Inf on the report data (sample {sample})"
        )


def _quantized(f: LayerFactors | None) -> bool:
    return f is not None and (f.scale_d is not None or bool(f.scale_w))


def _static_row(
    info: LayerInfo, f: LayerFactors, floating: RunResult, stats: CalibrationStats | None
) -> LayerRow:
    """Everything that needs only the record, the sidecar and the float input."""
    row = LayerRow(info.key, info.layer, info.kind, scale_w=[float(s) for s in f.scale_w])
    row.scale_spread = metrics.scale_spread(f.scale_w)
    entry = stats.layers.get(info.key) or stats.layers.get(info.layer) if stats else None
    if entry is not None and entry.input is not None:
        row.calib_min = _first(entry.input.observed_min, entry.input.min)
        row.calib_max = _first(entry.input.observed_max, entry.input.max)
    values = floating.inputs.get(info.key)
    if values is not None:
        values = metrics.balanced(values, f.tensor_balance_factor, info.channel_axis)
        if values.size:
            row.input_min, row.input_max = float(np.min(values)), float(np.max(values))
    if f.scale_d is not None:
        row.scale_d, row.offset_d = float(f.scale_d), int(f.offset_d or 0)
        row.bits = bits_of(f.dst_type or f.act_type or "INT8")
        row.clip_min, row.clip_max = metrics.clip_range(row.scale_d, row.offset_d, row.bits)
        if values is not None:
            row.saturated = metrics.saturated_share(values, row.clip_min, row.clip_max)
    return row


def _histogram(values: np.ndarray, row: LayerRow) -> tuple[list, list]:
    """Counts over a range that holds both the data and the clip range (both are drawn)."""
    f_values = values.astype(np.float64).reshape(-1)
    lo = min(float(f_values.min()), row.clip_min)
    hi = max(float(f_values.max()), row.clip_max)
    counts, edges = np.histogram(f_values, bins=HIST_BINS, range=(lo, hi if hi > lo else lo + 1))
    return [int(c) for c in counts], [float(e) for e in edges]


def _snr(ref: np.ndarray | None, test: np.ndarray | None) -> float | None:
    return None if ref is None or test is None else metrics.snr_db(ref, test)


def _low(value: float | None) -> float:
    return math.inf if value is None else value


def _first(*values):
    return next((v for v in values if v is not None), None)


def _accuracy_fn(labels):
    if labels is None:
        return None
    return lambda outputs: metrics.top1_accuracy(outputs, labels)


def _json_number(value):
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, list):
        return [_json_number(v) for v in value]
    return value
