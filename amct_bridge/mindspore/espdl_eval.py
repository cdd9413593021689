"""The simulated ESP-DL chip (v1 export directory or v3 ``.espdl``) next to the float and
fake-quantized MindSpore network.

The network runs NCHW, the chip NHWC: the inputs are transposed for the chip and every 4-D cell
output for the per-layer comparison (a 1-D network's NCW maps: NWC; a Transformer's token
sequences (N, T, D), :func:`amct_bridge.mindspore.graph.sequence_layout`, as they are, as the
export's input layout ``"NTD"`` says). A Flatten cell's output is
left out of that comparison (NCHW flattens channel-major, the chip's Flatten pixel-major; the
Dense after it is compared, its rows being reordered by the export). A cell called at several
sites per forward pass is compared per site (``relu``, ``relu@1``: its k-th call of a pass is
site k, as the graph names them), and a functional op (``x + y``, ``ops.relu``) through the
input of the cell site that reads its output. A chip layer with no float counterpart gets a "not
compared" line with the reason.
An ``.espdl`` file (ESP-DL v3) goes to :func:`amct_bridge.espdl.v3.evaluation.evaluate_espdl_model`
with the same NHWC inputs and the same per-site float outputs: the v3 export names its
tensors after the same cells and call sites.

Example:
    >>> # from amct_bridge.espdl.evaluation import format_evaluation
    >>> # ev = evaluate_espdl("espdl_out", net, x_val, y_val, record="record.txt")
    >>> # print(format_evaluation(ev))
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from mindspore import nn

from amct_bridge.errors import ExportError
from amct_bridge.espdl.evaluation import Evaluation, chip_network, evaluate_export
from amct_bridge.espdl.v3.evaluation import evaluate_espdl_model, is_espdl_file
from amct_bridge.mindspore.espdl_weights import chip_data
from amct_bridge.mindspore.float_outputs import float_outputs
from amct_bridge.mindspore.graph import extract_graph, sequence_layout
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
        export_dir: the ``export_espdl`` output directory (or its ExportResult), or an
            ESP-DL v3 ``.espdl`` file (``format="espdl"``: its simulator, at the file's input
            exponent; ``input_exponent`` must then be None).
        net: the float network that was exported (not modified).
        x: inputs, NCHW as the network runs; y: class indices.
        record: the AMCT record: adds the fake-quant accuracy (:func:`simulate`).
        target, input_exponent, batch_size: as :func:`amct_bridge.espdl.simulate_chip`.

    Example:
        >>> # see the module docstring
    """
    x = np.asarray(x, np.float32)
    v3 = is_espdl_file(export_dir)  # ESP-DL v3: the .espdl file and its simulator
    graph, seq = None, False  # ESP-DL v1 exports no token net (it refuses Dense on them)
    if v3:
        graph = extract_graph(net, x[:1])
        seq = sequence_layout(graph, dict(net.cells_and_names()))
    # the chip runs NHWC (NWC); tokens (N, T, D) as they are (source_layers' input layout)
    x_chip = chip_data(x, "NTD" if seq else "")
    if v3 and input_exponent is not None:
        raise ExportError(f"{export_dir}: an .espdl file runs at its own input exponent")
    # v1: the chip graph before the network meets data of another shape
    chip = None if v3 else chip_network(export_dir, x_chip)
    floats, float_scores, reasons, output, _ = float_outputs(net, x, batch_size, graph=graph)
    fq = None
    if record is not None:
        outputs = simulate(net, record, x, batch_size=batch_size).outputs
        fq = outputs[0] if isinstance(outputs, tuple) else outputs
    if v3:
        return evaluate_espdl_model(
            export_dir,
            x_chip,
            y,
            float_scores=float_scores,
            fake_quant_scores=fq,
            floats=floats,
            output=output,
            target=target,
            batch_size=batch_size,
            source_label="cell",
            missing_reasons=reasons,
        )
    return evaluate_export(
        chip,
        x_chip,
        y,
        float_scores=float_scores,
        fake_quant_scores=fq,
        floats=floats,
        output=output,  # its chip layer is scored (a skipped one: "n/a" with the reason)
        target=target,
        input_exponent=input_exponent,
        batch_size=batch_size,
        source_label="cell",
        missing_reasons=reasons,
    )
