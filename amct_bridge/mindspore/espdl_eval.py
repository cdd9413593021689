"""The simulated ESP-DL v1 chip next to the float and fake-quantized MindSpore network.

The network runs NCHW, the chip NHWC: the inputs are transposed for the chip and every 4-D cell
output for the per-layer comparison. A Flatten cell's output is left out of that comparison (NCHW
flattens channel-major, the chip's Flatten pixel-major; the Dense after it is compared, its rows
being reordered by the export), as are cells called more than once per forward pass.

Example:
    >>> # from amct_bridge.espdl.evaluation import format_evaluation
    >>> # ev = evaluate_espdl("espdl_out", net, x_val, y_val, record="record.txt")
    >>> # print(format_evaluation(ev))
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from mindspore import Tensor, nn

from amct_bridge.espdl.evaluation import Evaluation, chip_network, evaluate_export
from amct_bridge.mindspore.cells import leaf_cells
from amct_bridge.mindspore.hooks import first_tensor, pynative_inference, recorded
from amct_bridge.mindspore.simulation import simulate
from amct_bridge.records.model import Record


def evaluate_espdl(
    export_dir: str | Path,
    net: nn.Cell,
    x: np.ndarray,
    y: np.ndarray,
    *,
    record: Record | str | os.PathLike | None = None,
    target: str | None = None,
    input_exponent: int | None = None,
    batch_size: int = 64,
) -> Evaluation:
    """Float, fake-quant (if ``record``) and chip accuracy of ``net`` / its export on (x, y).

    Args:
        export_dir: the ``export_espdl`` output directory (or its ExportResult).
        net: the float network that was exported (not modified).
        x: inputs, NCHW as the network runs; y: class indices.
        record: the AMCT record: adds the fake-quant accuracy (:func:`simulate`).
        target, input_exponent, batch_size: as :func:`amct_bridge.espdl.simulate_chip`.

    Example:
        >>> # see the module docstring
    """
    x = np.asarray(x, np.float32)
    x_chip = x.transpose(0, 2, 3, 1) if x.ndim == 4 else x  # the chip runs NHWC
    chip = chip_network(export_dir, x_chip)  # before the network meets data of another shape
    floats, float_scores = _float_run(net, x, batch_size)
    fq = None
    if record is not None:
        outputs = simulate(net, record, x, batch_size=batch_size).outputs
        fq = outputs[0] if isinstance(outputs, tuple) else outputs
    return evaluate_export(
        chip,
        x_chip,
        y,
        float_scores=float_scores,
        fake_quant_scores=fq,
        floats=floats,
        target=target,
        input_exponent=input_exponent,
        batch_size=batch_size,
        source_label="cell",
    )


def _float_run(net: nn.Cell, x: np.ndarray, batch: int) -> tuple[dict[str, np.ndarray], Any]:
    """The float outputs of every leaf cell (NHWC where 4-D) and of the network."""
    cells = {k: c for k, c in leaf_cells(net).items() if not isinstance(c, nn.Flatten)}
    finals = []
    with pynative_inference(net), recorded(cells) as (outs, _):
        for start in range(0, len(x), batch):
            finals.append(first_tensor(net(Tensor(x[start : start + batch]))).asnumpy())
    batches = len(finals)  # a cell called twice per pass recorded more: left out
    floats = {k: _nhwc(np.concatenate(v)) for k, v in outs.items() if v and len(v) == batches}
    return floats, np.concatenate(finals)


def _nhwc(value: np.ndarray) -> np.ndarray:
    return value.transpose(0, 2, 3, 1) if value.ndim == 4 else value
