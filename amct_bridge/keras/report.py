"""Keras side of the per-layer quantization report (the core is :mod:`amct_bridge.report`).

:class:`KerasReportRunner` lists a model's quantizable parts by record key and runs the model,
float or through :func:`amct_bridge.keras.simulate` with a (partial) record, returning the
outputs of the layers asked for. Layer outputs are read from the top-level functional graph, so
layers inside a nested model, and shared layers (several outputs), get model-level columns only.
A SeparableConv2D's pointwise input (the depthwise output) lives inside the layer: its input
columns stay empty.

Example:
    >>> import keras, numpy as np
    >>> from amct_bridge.records import LayerFactors, Record
    >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="fc")])
    >>> m.set_weights([np.float32([[0.5], [0.25]]), np.float32([0.0])])
    >>> rec = Record({"fc": LayerFactors(scale_d=0.5, offset_d=0, scale_w=[0.25], offset_w=[0])})
    >>> x = np.float32([[1.2, 0.4], [0.1, -0.3]])
    >>> rep = quant_report(m, rec, x)
    >>> rep.rows[0].key, rep.rows[0].input_max, rep.top
    ('fc', 1.2000000476837158, ['fc'])
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import keras
import numpy as np

from amct_bridge.keras.fake_quant import layer_spec
from amct_bridge.keras.layers import class_name
from amct_bridge.keras.rewrite import quantizable_layers
from amct_bridge.keras.simulate import _by_keras_keys, simulate
from amct_bridge.records.calibration import CalibrationStats
from amct_bridge.records.model import Record
from amct_bridge.report import LayerInfo, Report, RunResult, build_report, read_record


class KerasReportRunner:
    """:class:`amct_bridge.report.ReportRunner` for a built Sequential/functional Keras model.

    Args:
        model: the float model (not modified).
        data: its input (one array, or a list of arrays for several inputs), one row per sample.
        batch_size: samples per forward call.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
        >>> KerasReportRunner(m, np.zeros((4, 3), "float32")).layers()[0].key
        'fc'
    """

    def __init__(self, model: keras.Model, data, batch_size: int = 32):
        self.model = model
        self.data = data
        self.batch_size = int(batch_size)
        self._infos: list[LayerInfo] = []
        self._part: dict[str, int] = {}  # record key -> part index in its layer
        for key, layer in quantizable_layers(model).items():
            spec = layer_spec(layer)
            first = getattr(layer, "data_format", "channels_last") == "channels_first"
            for i in range(max(len(spec.kernels), 1)):
                rkey = spec.key(key, i)
                self._infos.append(LayerInfo(rkey, key, class_name(layer), 1 if first else -1))
                self._part[rkey] = i

    def layers(self) -> list[LayerInfo]:
        """The quantizable parts in execution order (record keys)."""
        return list(self._infos)

    def run(self, record: Record | None, keys: Sequence[str]) -> RunResult:
        """Forward the data through the float model (``record=None``) or its simulated copy."""
        model = self.model if record is None else simulate(self.model, record)
        layer_of = {i.key: i.layer for i in self._infos}
        tensors: list = []
        names: list[tuple[str, str]] = []  # ("out" | "in", record key) of each probed tensor
        for key in keys:
            out = _single(model, layer_of[key], "output")
            if out is not None:
                tensors.append(out)
                names.append(("out", key))
            if record is None and self._part[key] == 0:
                inp = _single(model, layer_of[key], "input")
                if inp is not None:
                    tensors.append(inp)
                    names.append(("in", key))
        probe = keras.Model(model.inputs, [model.outputs[0], *tensors])
        values = self._forward(probe)
        result = RunResult(final=values[0])
        for (what, key), value in zip(names, values[1:], strict=True):
            (result.outputs if what == "out" else result.inputs)[key] = value
        return result

    def _forward(self, probe: keras.Model) -> list[np.ndarray]:
        """Eager batches (no tf.function trace per probe model: each run builds a new one)."""
        arrays = self.data if isinstance(self.data, (list, tuple)) else [self.data]
        n = len(arrays[0])
        chunks: list[list[np.ndarray]] = []
        for start in range(0, n, self.batch_size):
            batch = [a[start : start + self.batch_size] for a in arrays]
            outs = probe(batch, training=False)
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            chunks.append([keras.ops.convert_to_numpy(o) for o in outs])
        return [np.concatenate(parts) for parts in zip(*chunks, strict=True)]


def _single(model: keras.Model, name: str, what: str):
    """The layer's single input/output tensor in ``model``'s top-level graph, or None (nested,
    shared or several tensors)."""
    try:
        tensor = getattr(model.get_layer(name), what)
    except (ValueError, AttributeError):  # not top level, or called more than once
        return None
    return None if isinstance(tensor, (list, tuple, dict)) else tensor


def quant_report(
    model: keras.Model,
    record: Record | str | os.PathLike,
    data,
    labels: np.ndarray | None = None,
    *,
    top_k: int = 3,
    batch_size: int = 32,
    stats: CalibrationStats | None = None,
) -> Report:
    """The per-layer quantization report of ``record`` on ``model`` (see docs/report.md).

    Args:
        model: the float Keras model the record was calibrated on.
        record: a :class:`~amct_bridge.records.Record` or a record file; a file's sidecar
            (``<record>.calib.json``) is read for the calibration's ranges when ``stats`` is None.
        data: report inputs (array or list of arrays), e.g. held-out calibration-like data.
        labels: class labels of ``data`` (index or one-hot) for the accuracy columns, or None.
        top_k: layers kept in float in the config fragment.
        batch_size: samples per forward call.
        stats: calibration sidecar, optional.

    Returns:
        :class:`amct_bridge.report.Report` (``.rows``: one :class:`~amct_bridge.report.LayerRow`
        per quantized part, ``.fragment``: AMCT config text; ``render_html`` / ``text_table``).

    Example:
        >>> rep = quant_report(model, "record.txt", x, y)  # doctest: +SKIP
        >>> [r.key for r in sorted(rep.rows, key=lambda r: r.rank)][:3]  # doctest: +SKIP
    """
    record, stats = read_record(record, stats)
    runner = KerasReportRunner(model, data, batch_size)
    known = {i.key for i in runner.layers()}
    if any(k not in known for k in record.layers):
        # keys="tf_op" records: re-key by layer name, as simulate does
        record = Record(_by_keras_keys(model, record.layers), flavor=record.flavor)
    return build_report(record, runner, labels, top_k=top_k, stats=stats)
