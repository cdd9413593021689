"""MindSpore adapter: translates MindSpore networks into the core's types.

Importing this package is cheap: MindSpore is imported only when one of the names below is
first used.

- ``extract_graph(net, sample_input)``: the graph IR (:mod:`amct_bridge.mindspore.graph`);
- ``prune_discovery(net, sample_input)``, ``prune_record(net, sample_input, ...)``,
  ``selective_masks``, ``apply_selective_masks`` (:mod:`amct_bridge.mindspore.prune`);
- ``export_espdl(net, record, out_dir, sample_input=...)``: ESP-DL v1 export, or one ESP-DL v3
  ``.espdl`` file with ``format="espdl"``
  (:mod:`amct_bridge.mindspore.espdl_weights`);
- ``QuantCalibration(record_path, ...)``: calibration callback for ``Model.eval`` / ``train``
  / ``fit`` (:mod:`amct_bridge.mindspore.callback`);
- ``calibrate(net, data, record_path, ...)``: calibration without ``Model``
  (:mod:`amct_bridge.mindspore.calibrate`);
- ``simulate(net, record, data, labels=None)``: fake-quantized outputs / accuracy
  (:mod:`amct_bridge.mindspore.simulation`, also the ``simulated`` context manager);
- ``quant_report(net, record, data, labels=None)``: the per-layer quantization report
  (:mod:`amct_bridge.mindspore.report`, docs/report.md);
- ``evaluate_espdl(export_dir, net, x, y, record=None)``: float, fake-quant and simulated-chip
  accuracy and per-layer chip error (:mod:`amct_bridge.mindspore.espdl_eval`);
- ``replace_relu6(net)``: a copy with ReLU6 cells as ReLU, for ESP-DL v1
  (:mod:`amct_bridge.mindspore.relu6`);
- ``SelectivePruneCallback(record_path, masks=None)``: 2:4 masks kept through ``Model.train``,
  and their ``selective_prune`` record (:mod:`amct_bridge.mindspore.selective_prune_callback`);
- ``quantize_aware(net, dst_type, ...)``, ``qat_record``, ``save_qat_record(qat, path)``,
  ``strip_qat(qat)``: quantization-aware training (:mod:`amct_bridge.mindspore.qat`).

Data-parallel runs: :mod:`amct_bridge.mindspore.distributed` (``current()``, ``Group.gather``)
and the framework-free merge, :mod:`amct_bridge.calibration.merge`.

Example:
    >>> import amct_bridge.mindspore as ams
    >>> callable(ams.prune_discovery)
    True
"""

from __future__ import annotations

from amct_bridge.lazy import lazy_exports

_LAZY = {
    "extract_graph": "amct_bridge.mindspore.graph",
    "prune_discovery": "amct_bridge.mindspore.prune",
    "prune_record": "amct_bridge.mindspore.prune",
    "selective_masks": "amct_bridge.mindspore.prune",
    "apply_selective_masks": "amct_bridge.mindspore.prune",
    "export_espdl": "amct_bridge.mindspore.espdl_weights",
    "QuantCalibration": "amct_bridge.mindspore.callback",
    "calibrate": "amct_bridge.mindspore.calibrate",
    "simulate": "amct_bridge.mindspore.simulation",
    "quant_report": "amct_bridge.mindspore.report",
    "evaluate_espdl": "amct_bridge.mindspore.espdl_eval",
    "replace_relu6": "amct_bridge.mindspore.relu6",
    "SelectivePruneCallback": "amct_bridge.mindspore.selective_prune_callback",
    "quantize_aware": "amct_bridge.mindspore.qat.model",
    "qat_record": "amct_bridge.mindspore.qat.model",
    "save_qat_record": "amct_bridge.mindspore.qat.model",
    "strip_qat": "amct_bridge.mindspore.qat.strip",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
