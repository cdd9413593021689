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

from amct_bridge.lazy import lazy_exports

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

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
