"""MindSpore side of the per-layer quantization report (the core is :mod:`amct_bridge.report`).

:class:`MindSporeReportRunner` lists a network's quantizable cells by record key
(``cells_and_names()`` names) in the order the network calls them and runs the network on the
report data, float or inside :func:`amct_bridge.mindspore.simulated` with a (partial) record,
returning the outputs (and, float, the inputs) of the cells asked for. The runs are PyNative
(forward hooks read the tensors; the mode is put back afterwards), NCHW: a cell's input channel
axis is 1. A cell called more than once per forward pass (shared) gets model-level columns only,
as a shared Keras layer does.

Example:
    >>> import numpy as np, mindspore as ms
    >>> from mindspore import nn
    >>> from amct_bridge.records import LayerFactors, Record
    >>> net = nn.SequentialCell([nn.Dense(2, 1, has_bias=False)])
    >>> _ = net[0].weight.set_data(ms.Tensor(np.float32([[0.5, 0.25]])))
    >>> rec = Record({"0": LayerFactors(scale_d=0.5, offset_d=0, scale_w=[0.25], offset_w=[0])})
    >>> rep = quant_report(net, rec, np.float32([[1.2, 0.4], [0.1, -0.3]]))
    >>> rep.rows[0].key, rep.rows[0].input_max, rep.top
    ('0', 1.2000000476837158, ['0'])
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from mindspore import Tensor, nn

from amct_bridge.errors import CalibrationError, RecordError
from amct_bridge.mindspore.hooks import first_tensor, pynative_inference, recorded
from amct_bridge.mindspore.simulation import quantizable_cells, simulated
from amct_bridge.records.calibration import CalibrationStats
from amct_bridge.records.model import Record
from amct_bridge.report import LayerInfo, Report, RunResult, build_report, read_record

__all__ = ["MindSporeReportRunner", "quant_report"]


class MindSporeReportRunner:
    """:class:`amct_bridge.report.ReportRunner` for a MindSpore network.

    Args:
        net: the float network (not modified: its cells and weights are as before afterwards).
        data: its input, NCHW (a numpy array, or a tuple of arrays for several inputs), one row
            per sample.
        batch_size: samples per forward call.

    Example:
        >>> import numpy as np
        >>> from mindspore import nn
        >>> net = nn.SequentialCell([nn.Dense(3, 2)])
        >>> MindSporeReportRunner(net, np.zeros((4, 3), np.float32)).layers()[0].key
        '0'
    """

    def __init__(self, net: nn.Cell, data: Any, batch_size: int = 32) -> None:
        self.net = net
        arrays = list(data) if isinstance(data, (list, tuple)) else [data]
        self.arrays = [np.asarray(a, np.float32) for a in arrays]
        if not self.arrays or len(self.arrays[0]) == 0:
            raise RecordError("report: no data (zero samples)")
        self.batch_size = int(batch_size)
        self._cells = {key: cell for key, (cell, _) in quantizable_cells(net).items()}
        # call order and calls per pass, from one float pass over the first batch
        calls: dict[str, int] = {}
        order: list[str] = []

        def counter(key):
            def hook(cell, args):
                calls[key] = calls.get(key, 0) + 1
                if key not in order:
                    order.append(key)

            return hook

        with pynative_inference(net):
            handles = [c.register_forward_pre_hook(counter(k)) for k, c in self._cells.items()]
            try:
                net(*[Tensor(a[: self.batch_size]) for a in self.arrays])
            except (RuntimeError, TypeError, ValueError) as err:  # MindSpore's shape checks
                shapes = ", ".join(str(a.shape) for a in self.arrays)
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise CalibrationError(
                    f"report data of shape {shapes} does not run through network "
                    f"{type(net).__name__!r} (NCHW, as it runs): {first}"
                ) from None
            finally:
                for handle in handles:
                    handle.remove()
        self._calls = calls
        keys = order + [k for k in self._cells if k not in calls]  # never called: listed last
        self._infos = [LayerInfo(k, k, type(self._cells[k]).__name__, 1) for k in keys]

    def layers(self) -> list[LayerInfo]:
        """The quantizable cells in the order the network calls them (record keys)."""
        return list(self._infos)

    def run(self, record: Record | None, keys: Sequence[str]) -> RunResult:
        """Forward the data float (``record=None``) or simulated with ``record``."""
        seen = [k for k in keys if self._calls.get(k) == 1]  # a shared cell: no layer columns
        finals: list[np.ndarray] = []
        with pynative_inference(self.net), contextlib.ExitStack() as stack:
            if record is not None:
                sample = [a[:1] for a in self.arrays]
                stack.enter_context(simulated(self.net, record, sample_input=sample[0]))
            cells = {k: self._cells[k] for k in seen}
            outs, ins = stack.enter_context(recorded(cells, inputs=record is None))
            n = len(self.arrays[0])
            for start in range(0, n, self.batch_size):
                batch = [Tensor(a[start : start + self.batch_size]) for a in self.arrays]
                finals.append(first_tensor(self.net(*batch)).asnumpy())
        result = RunResult(final=np.concatenate(finals))
        result.outputs = {k: np.concatenate(v) for k, v in outs.items()}
        if record is None:
            result.inputs = {k: np.concatenate(v) for k, v in ins.items()}
        return result


def quant_report(
    net: nn.Cell,
    record: Record | str | os.PathLike,
    data: Any,
    labels: np.ndarray | None = None,
    *,
    top_k: int = 3,
    batch_size: int = 32,
    stats: CalibrationStats | None = None,
) -> Report:
    """The per-layer quantization report of ``record`` on ``net`` (see docs/report.md).

    Args:
        net: the float MindSpore network the record was calibrated on.
        record: a :class:`~amct_bridge.records.Record` or a record file (MindSpore or inner
            flavor, keyed by ``cells_and_names()`` names); a file's sidecar
            (``<record>.calib.json``) is read for the calibration's ranges when ``stats`` is None.
        data: report inputs, NCHW (array, or tuple of arrays for several inputs).
        labels: class labels of ``data`` (index or one-hot) for the accuracy columns, or None.
        top_k: layers kept in float in the config fragment.
        batch_size: samples per forward call.
        stats: calibration sidecar, optional.

    Returns:
        :class:`amct_bridge.report.Report`, as :func:`amct_bridge.keras.report.quant_report`.

    Example:
        >>> # rep = quant_report(net, "record.txt", x_val, y_val); print(text_table(rep))
    """
    record, stats = read_record(record, stats)
    runner = MindSporeReportRunner(net, data, batch_size)
    return build_report(record, runner, labels, top_k=top_k, stats=stats)
