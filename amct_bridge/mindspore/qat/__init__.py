"""Quantization-aware training for MindSpore (docs/mindspore.md, "Quantization-aware
training"; docs/qat.md), the counterpart of :mod:`amct_bridge.keras.qat`.

Modules: ``model`` (:func:`quantize_aware`, :func:`qat_record`, :func:`qat_stats`,
:func:`save_qat_record`), ``cells`` (QATQuant, QATObserve), ``strip`` (:func:`strip_qat`) and
``fake_quant`` (the in-graph ops). The math both adapters share is in :mod:`amct_bridge.quant.qat`
and :mod:`amct_bridge.calibration.qat`. Names load on first use (MindSpore is imported then).

Example:
    >>> from amct_bridge.mindspore.qat import quantize_aware
    >>> quantize_aware.__module__
    'amct_bridge.mindspore.qat.model'
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "QATObserve": "amct_bridge.mindspore.qat.cells",
    "QATQuant": "amct_bridge.mindspore.qat.cells",
    "qat_record": "amct_bridge.mindspore.qat.model",
    "qat_stats": "amct_bridge.mindspore.qat.model",
    "quantize_aware": "amct_bridge.mindspore.qat.model",
    "save_qat_record": "amct_bridge.mindspore.qat.model",
    "strip_qat": "amct_bridge.mindspore.qat.strip",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'amct_bridge.mindspore.qat' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
