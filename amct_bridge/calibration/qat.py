"""QAT record + sidecar from trained ranges, written as one set (framework-free; docs/qat.md).

Both adapters' ``save_qat_record`` collect, per quantized part, its input clip range and kernel
(record entries via :func:`amct_bridge.quant.qat.layer_factors`) and, per observed cell, an
output range; this module turns them into the record and the calibration sidecar
(``<record>.calib.json``) the ESP-DL exporter reads, validates both in memory and writes them
together (temp files, then renamed), so a failure leaves the previous files.

Sidecar rules (the calibration callback's format, ``algorithm: "qat-ema"`` / ``"qat-learned"``):

* a quantized part: ``input`` = its clip range (what scale_d / offset_d encode), ``output`` =
  the EMA of its output;
* a tensor a quantized layer reads gets that reader's clip range as ``min`` / ``max`` and keeps
  the EMA as ``observed_min`` / ``observed_max`` (:func:`clipped`): the network was trained to
  see it clipped there.

Example:
    >>> clipped(TensorRange(-1.0, 9.0), TensorRange(0.0, 6.0)).to_dict()
    {'min': 0.0, 'max': 6.0, 'observed_min': -1.0, 'observed_max': 9.0}
    >>> tensor_range(0.0, 1.0, seen=0) is None
    True
"""

from __future__ import annotations

import os

from amct_bridge.calibration.records import Built, _warn_collapsed, write_outputs
from amct_bridge.errors import QuantError, ValidationError
from amct_bridge.quant.factors import FLT_EPSILON, raw_activation_scale
from amct_bridge.records import dumps, validate
from amct_bridge.records.calibration import CalibrationStats, TensorRange
from amct_bridge.records.model import Record

__all__ = ["algorithm_name", "clipped", "tensor_range", "write_qat_outputs"]


def tensor_range(lo: float, hi: float, seen: float) -> TensorRange | None:
    """The tracked range, or None when no training batch reached it.

    Example:
        >>> tensor_range(-1.0, 2.0, 5)
        TensorRange(min=-1.0, max=2.0, observed_min=None, observed_max=None)
    """
    return TensorRange(float(lo), float(hi)) if seen > 0 else None


def clipped(observed: TensorRange | None, clip: TensorRange | None) -> TensorRange | None:
    """The range of a tensor a quantized reader clips at ``clip`` (the EMA as observed).

    Example:
        >>> clipped(None, TensorRange(0.0, 1.0)).max
        1.0
    """
    if clip is None:
        return observed
    if observed is None:
        return clip
    return TensorRange(clip.min, clip.max, observed.min, observed.max)


def algorithm_name(modes: set[str] | list[str]) -> str:
    """The sidecar's ``algorithm`` for the activation range modes used.

    Example:
        >>> algorithm_name({"ema"})
        'qat-ema'
    """
    return "qat-" + ",".join(sorted(set(modes)))


def write_qat_outputs(
    record: Record, stats: CalibrationStats, path: str | os.PathLike, *, what: str = "model"
) -> Record:
    """Validate ``record`` and write it with its sidecar ``stats`` atomically; return it.

    Raises:
        QuantError: the record is empty (no quantized part); nothing is written.
        ValidationError: the record breaks AMCT's rules; nothing is written.

    Example:
        >>> # save_qat_record(qat, "qat.txt") of either adapter ends here
    """
    if not record.layers:
        raise QuantError(f"{what}: no quantized layer to write; nothing written")
    problems = validate(record)
    if problems:
        raise ValidationError(problems)
    collapsed = _collapsed(record, stats)
    if collapsed:  # as the calibration warns: QAT's forward pass quantized them to one level
        stats.warnings = list(stats.warnings or []) + _warn_collapsed(collapsed)
    write_outputs(Built(record, dumps(record, record.flavor), stats), path)
    return record


def _collapsed(record: Record, stats: CalibrationStats) -> list[tuple[str, tuple, float]]:
    """Layers whose QAT input range gives a scale below FLT_EPSILON, written as 1.0 (AMCT's
    rule): every input value quantizes to one level, in training and on the device."""
    found = []
    for key, factors in record.layers.items():
        entry = stats.layers.get(key)
        rng = entry.input if entry is not None else None
        if rng is None or factors.scale_d != 1.0:
            continue
        bits = factors.dst_type or "INT8"
        raw = raw_activation_scale(rng.min, rng.max, bits, factors.offset_d == 0, name=key)
        if 0.0 < raw < FLT_EPSILON:
            found.append((key, (rng.min, rng.max), raw))
    return found
