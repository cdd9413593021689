"""Channel groups and 2:4 selective pruning for MindSpore networks (mirrors keras.prune).

``prune_discovery(net, sample_input)`` finds channel-pruning groups on the graph extracted
through MindIR; ``selective_masks`` computes a 2:4 mask per eligible cell from its weight
magnitudes (OIHW: input channels on axis 1; Dense (out, in): axis 1; Conv2dTranspose IOHW:
axis 0); ``apply_selective_masks`` zeroes pruned weights in place; ``prune_record`` builds an
AMCT inner Record (the flavor that carries PruneRecords) keyed by ``cells_and_names()`` names.

Example:
    >>> import mindspore as ms
    >>> from mindspore import nn
    >>> net = nn.SequentialCell([nn.Dense(3, 4), nn.ReLU(), nn.Dense(4, 2)])
    >>> [(m.name, m.begin, m.end) for m in prune_discovery(net, (1, 3)).groups[0].members]
    [('0', 0, 4), ('1', 0, 4), ('2', 0, 4)]
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np

from amct_bridge.errors import GraphError
from amct_bridge.graph.groups import Discovery, discover_groups
from amct_bridge.graph.ir import Graph
from amct_bridge.graph.prune_records import graph_prune_record
from amct_bridge.graph.selective import (
    node_layout,
    selective_candidates,
    two_four_mask,
)
from amct_bridge.mindspore.graph import extract_graph
from amct_bridge.records.model import Record


def find_cell(net: ms.nn.Cell, name: str) -> ms.nn.Cell:
    """The cell called ``name`` in ``net.cells_and_names()`` (GraphError naming it otherwise).

    Example:
        >>> from mindspore import nn
        >>> type(find_cell(nn.SequentialCell([nn.ReLU()]), "0")).__name__
        'ReLU'
    """
    for cname, cell in net.cells_and_names():
        if cname == name:
            return cell
    raise GraphError(f"cell {name!r}: not in network {type(net).__name__}")


def prune_discovery(
    net: ms.nn.Cell, sample_input: Any = None, graph: Graph | None = None
) -> Discovery:
    """Channel-pruning groups and refusals of ``net`` (never modified).

    Args:
        net: the network.
        sample_input: input shape / array / Tensor for the MindIR export (not needed with
            ``graph``).
        graph: a graph already extracted with :func:`amct_bridge.mindspore.extract_graph`.

    Example:
        >>> from mindspore import nn
        >>> net = nn.SequentialCell([nn.Conv2d(3, 4, 3), nn.Conv2d(4, 2, 1)])
        >>> [p.name for p in prune_discovery(net, (1, 3, 8, 8)).groups[0].producers]
        ['0']
    """
    return discover_groups(_graph(net, sample_input, graph))


def _graph(net: ms.nn.Cell, sample_input: Any, graph: Graph | None) -> Graph:
    if graph is not None:
        return graph
    if sample_input is None:
        raise GraphError("give sample_input (e.g. the input shape (1, 3, 16, 16)) or a graph")
    return extract_graph(net, sample_input)


def selective_masks(
    net: ms.nn.Cell, sample_input: Any = None, graph: Graph | None = None
) -> dict[str, np.ndarray]:
    """2:4 masks (bool, weight shape) of every eligible cell, keyed by cell name.

    Eligible: Conv2d with group 1, Dense, Conv2dTranspose, each called once.

    Example:
        >>> from mindspore import nn
        >>> m = selective_masks(nn.SequentialCell([nn.Dense(8, 2)]), (1, 8))
        >>> m["0"].shape, int(m["0"].sum())
        ((2, 8), 8)
    """
    graph = _graph(net, sample_input, graph)
    eligible, _ = selective_candidates(graph)
    return {
        node.layer: two_four_mask(find_cell(net, node.layer).weight.asnumpy(), node_layout(node))
        for node in eligible
    }


def apply_selective_masks(net: ms.nn.Cell, masks: dict[str, np.ndarray]) -> None:
    """Zero the pruned weights: ``weight = where(mask, weight, 0)`` for each entry (in place).

    Example:
        >>> from mindspore import nn
        >>> net = nn.SequentialCell([nn.Dense(4, 1)])
        >>> apply_selective_masks(net, {"0": np.array([[1, 0, 0, 1]], bool)})
        >>> net[0].weight.asnumpy()[0, 1:3].tolist()
        [0.0, 0.0]
    """
    for name, mask in masks.items():
        param = find_cell(net, name).weight
        w = param.asnumpy()
        if w.shape != tuple(mask.shape):
            raise GraphError(f"cell {name!r}: mask shape {mask.shape} != weight {w.shape}")
        param.set_data(ms.Tensor(np.where(mask, w, np.zeros_like(w))))


def prune_record(
    net: ms.nn.Cell,
    sample_input: Any = None,
    *,
    channel: bool = True,
    selective: bool = False,
    masks: dict[str, np.ndarray] | None = None,
    record: Record | None = None,
    graph: Graph | None = None,
) -> Record:
    """An inner-flavor Record with channel groups and/or 2:4 selective PruneRecords.

    Args:
        net: the network (read only).
        sample_input: input shape / array / Tensor for the MindIR export.
        channel: add one PruneRecord per channel-pruning group.
        selective: add one selective PruneRecord per eligible cell (``mask_shape``, the
            MindSpore weight shape, e.g. OIHW).
        masks: 2:4 masks to write as ``selective_mask`` (from :func:`selective_masks`).
        record: a Record to extend (its quantized layers get prune_producer/prune_consumer).
        graph: an already extracted graph (then ``sample_input`` is not needed).

    Example:
        >>> from mindspore import nn
        >>> net = nn.SequentialCell([nn.Dense(8, 4)])
        >>> rec = prune_record(net, (1, 8), channel=False, selective=True)
        >>> rec.prune_records[0].selective_prune.name
        '0'
    """
    graph = _graph(net, sample_input, graph)
    return graph_prune_record(
        graph, channel=channel, selective=selective, masks=masks, record=record
    )
