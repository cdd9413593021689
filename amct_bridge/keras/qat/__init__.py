"""Quantization-aware training for Keras (docs/qat.md), the counterpart of
:mod:`amct_bridge.mindspore.qat`.

Modules: ``model`` (:func:`quantize_aware`, :func:`qat_record`, :func:`save_qat_record`),
``layers`` (the QATQuant / QATObserve / FoldedBatchNorm layers), ``sidecar``
(:func:`qat_stats`), ``strip`` (:func:`strip_qat`) and ``fake_quant`` (the in-graph quantize ->
dequantize ops and per-layer table, shared with :mod:`amct_bridge.keras.simulate`). The math
both adapters share is in :mod:`amct_bridge.quant.qat` and :mod:`amct_bridge.calibration.qat`.

The names below are loaded on first use: ``fake_quant`` is imported by modules that
``model`` itself imports (``amct_bridge.keras.rewrite``), so an eager import of ``model`` here
would be a cycle. ``layers`` is imported at once: it registers the QAT layers with Keras, so a
saved QAT ``.keras`` loads after ``import amct_bridge.keras.qat``.

Example:
    >>> from amct_bridge.keras.qat import quantize_aware
    >>> quantize_aware.__module__
    'amct_bridge.keras.qat.model'
"""

from __future__ import annotations

from amct_bridge.keras.qat import layers as _layers  # noqa: F401  (Keras registration)
from amct_bridge.lazy import lazy_exports

_LAZY = {
    "RANGE_MODES": "amct_bridge.keras.qat.layers",
    "FoldedBatchNorm": "amct_bridge.keras.qat.layers",
    "QATObserve": "amct_bridge.keras.qat.layers",
    "QATQuant": "amct_bridge.keras.qat.layers",
    "link_quantizers": "amct_bridge.keras.qat.model",
    "qat_record": "amct_bridge.keras.qat.model",
    "quantize_aware": "amct_bridge.keras.qat.model",
    "save_qat_record": "amct_bridge.keras.qat.model",
    "qat_stats": "amct_bridge.keras.qat.sidecar",
    "strip_qat": "amct_bridge.keras.qat.strip",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
