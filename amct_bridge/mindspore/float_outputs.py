"""Float outputs of a MindSpore network's cell call sites (NHWC where 4-D), for comparing with
the chip: the ESP-DL evaluation (:mod:`amct_bridge.mindspore.espdl_eval`) and the exponent
search of the export (:mod:`amct_bridge.mindspore.espdl_weights`) both read them. Rank-3
tensors are NCW maps (nn.Conv1d: NWC on the chip) unless the network's are token sequences
(N, T, D) (:func:`amct_bridge.mindspore.graph.sequence_layout`), which the chip holds as
they are.

A cell called at several sites per forward pass is named per site (``relu``, ``relu@1``: its
k-th call of a pass is site k, as the graph names them); a functional op (``x + y``,
``ops.relu``) is read through the input of the cell site that reads its output alone.

Example:
    >>> from collections import OrderedDict
    >>> from mindspore import nn
    >>> net = nn.SequentialCell(OrderedDict(fc=nn.Dense(2, 1), relu=nn.ReLU()))
    >>> run = float_outputs(net, np.float32([[1, 2], [3, 4]]), batch=1)
    >>> sorted(run.floats), run.scores.shape, run.output
    (['fc', 'relu'], (2, 1), 'relu')
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from mindspore import Tensor, nn

from amct_bridge.graph.ir import Graph
from amct_bridge.mindspore.cells import leaf_cells
from amct_bridge.mindspore.graph import extract_graph, sequence_layout
from amct_bridge.mindspore.hooks import first_tensor, pynative_inference, recorded

__all__ = ["FloatRun", "float_outputs", "functional_outputs"]


class FloatRun(NamedTuple):
    """What :func:`float_outputs` found.

    Attributes:
        floats: output by call site (``relu``, ``relu@1``, functional op names), NHWC if 4-D.
        scores: the network's (first) output for every input, as the network gives it.
        reasons: why a call site has no float output (a Flatten of an NCHW map, an op no cell
            reads alone).
        output: the graph name of the node computing the network's first output (None: none).
        sequence: the network's rank-3 tensors are tokens (N, T, D), kept as they are (else
            NCW maps, given NWC).

    Example:
        >>> FloatRun({}, np.zeros(1), {}, None).output is None
        True
    """

    floats: dict[str, np.ndarray]
    scores: Any
    reasons: dict[str, str]
    output: str | None
    sequence: bool = False


def float_outputs(
    net: nn.Cell,
    x: np.ndarray,
    batch: int = 64,
    linear: frozenset[str] | set[str] = frozenset(),
    graph: Graph | None = None,
) -> FloatRun:
    """Run ``net`` (PyNative, inference; mode and training state put back) on ``x`` (NCHW as the
    network takes it) in batches of ``batch``, recording every leaf cell call site and the
    functional ops a cell site reads.

    An ``nn.Dense`` call site in ``linear`` gives its output before its own ``activation``
    (a classifier head whose softmax is left to the host: the chip computes its logits),
    from the input it got and its weights.

    A Flatten of an NCHW map is left out with a reason: NCHW flattens channel-major, the chip
    pixel-major (the Dense after it, its rows reordered by the export, is compared).

    ``graph``: the network's graph on inputs shaped as ``x`` (default: extracted here).

    Example:
        >>> from collections import OrderedDict
        >>> from mindspore import nn
        >>> net = nn.SequentialCell(OrderedDict(fc=nn.Dense(2, 1), relu=nn.ReLU()))
        >>> x = np.float32([[1, 2], [3, 4], [5, 6]])
        >>> run = float_outputs(net, x, batch=2)
        >>> np.allclose(run.floats["relu"], np.maximum(run.floats["fc"], 0)), run.reasons
        (True, {})
        >>> head = nn.SequentialCell(OrderedDict(fc=nn.Dense(2, 3, activation="softmax")))
        >>> logits = float_outputs(head, x, linear={"fc"}).floats["fc"]  # before its softmax
        >>> w, b = head.fc.weight.asnumpy(), head.fc.bias.asnumpy()
        >>> np.allclose(logits, x @ w.T + b, atol=1e-5)
        True
    """
    cells = leaf_cells(net)
    if graph is None:
        graph = extract_graph(net, x[:1])  # the export needed it too: it compiles
    seq = sequence_layout(graph, dict(net.cells_and_names()))
    finals = []
    with pynative_inference(net), recorded(cells, inputs=True) as (outs, ins):
        for start in range(0, len(x), batch):
            finals.append(first_tensor(net(Tensor(x[start : start + batch]))).asnumpy())
    batches = len(finals)
    floats: dict[str, np.ndarray] = {}
    site_inputs: dict[str, np.ndarray] = {}
    reasons: dict[str, str] = {}
    for key, values in outs.items():
        calls, rest = divmod(len(values), batches) if batches else (0, 0)
        if not values or rest:
            continue
        for site in range(calls):  # per pass: site 0, 1, ... in call order
            name = key if site == 0 else f"{key}@{site}"
            inputs = np.concatenate(ins[key][site::calls])
            site_inputs[name] = _nhwc(inputs, seq)
            if (
                isinstance(cells[key], nn.Flatten)
                and (inputs.ndim == 4 or inputs.ndim == 3 and not seq)
                and inputs[0, 0].size > 1
            ):
                # NCHW (NCW) flattens channel-major, the chip pixel-major (the Dense after it,
                # its rows reordered by the export, is compared)
                reasons[name] = "a Flatten of an NCHW map (the chip flattens NHWC; the Dense "
                reasons[name] += "after it is compared)"
                continue
            if name in linear and not isinstance(cells[key], nn.Dense):
                reasons[name] = f"no linear part of a {type(cells[key]).__name__} (only nn.Dense)"
                continue
            if name in linear:
                floats[name] = _nhwc(_linear_part(cells[key], inputs), seq)
                continue
            floats[name] = _nhwc(np.concatenate(values[site::calls]), seq)
    functional, output = functional_outputs(net, x[:1], site_inputs, reasons, graph)
    floats.update(functional)
    return FloatRun(floats, np.concatenate(finals), reasons, output, seq)


def functional_outputs(
    net: nn.Cell,
    sample: np.ndarray,
    site_inputs: dict[str, np.ndarray],
    reasons: dict[str, str],
    graph: Graph | None = None,
) -> tuple[dict[str, np.ndarray], str | None]:
    """A functional op's output is the input of the cell site reading it (``add_op0`` feeds
    ``relu@1``): the graph of ``net`` on ``sample`` (or ``graph``, that graph) says which. An
    op no cell reads alone gets a line in ``reasons``. Also returns the name of the node
    computing the network's output.

    Example:
        >>> from mindspore import nn
        >>> class Net(nn.Cell):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc, self.relu = nn.Dense(2, 2), nn.ReLU()
        ...     def construct(self, x):
        ...         return self.relu(self.fc(x) + x)
        >>> fed = {"relu": np.float32([[5, 6]])}  # what relu's hook saw as input
        >>> out, output = functional_outputs(Net(), np.float32([[1, 2]]), fed, {})
        >>> [(k, v.tolist()) for k, v in out.items()], output
        ([('add_op0', [[5.0, 6.0]])], 'relu')
    """
    if graph is None:
        graph = extract_graph(net, sample)  # the export needed it too: it compiles
    producer = graph.producer_of(graph.outputs[0]) if graph.outputs else None
    out = {}
    for node in graph.nodes:
        if node.is_layer or not node.outputs:
            continue
        readers = [
            c
            for c in graph.consumers_of(node.outputs[0])
            if c.is_layer and c.inputs == [node.outputs[0]] and c.name in site_inputs
        ]
        if readers:
            out[node.name] = site_inputs[readers[0].name]
        else:
            reasons[node.name] = (
                "a functional op whose output no cell reads alone (so no hook sees it)"
            )
    return out, None if producer is None else producer.name


def _linear_part(cell: nn.Dense, inputs: np.ndarray) -> np.ndarray:
    """An ``nn.Dense``'s output without its activation: ``x · Wᵀ + b`` over the last axis
    (what its construct computes before the activation; the network is not touched)."""
    out = np.asarray(inputs, np.float32) @ cell.weight.asnumpy().T
    return out + cell.bias.asnumpy() if cell.has_bias else out


def _nhwc(value: np.ndarray, seq: bool = False) -> np.ndarray:
    """NCHW -> NHWC for a 4-D array, NCW -> NWC for a 3-D one (an nn.Conv1d map: the chip's
    layouts), unless ``seq``: tokens (N, T, D), as the chip holds them; others as they are."""
    if value.ndim == 3:
        return value if seq else value.transpose(0, 2, 1)
    return value.transpose(0, 2, 3, 1) if value.ndim == 4 else value
