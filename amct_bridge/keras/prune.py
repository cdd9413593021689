"""Channel groups and 2:4 selective pruning for Keras 3 models.

``prune_discovery(model)`` finds channel-pruning groups; ``selective_masks(model)`` computes a
2:4 mask per eligible layer from its weight magnitudes; ``apply_selective_masks`` zeroes the
pruned weights in place; ``prune_record(model, ...)`` builds an AMCT inner Record holding
both kinds of PruneRecord. Keep masks applied while fine-tuning with
:class:`amct_bridge.keras.selective_prune_callback.SelectivePruneCallback`.

Example:
    >>> import keras
    >>> from amct_bridge.keras.prune import selective_masks, apply_selective_masks
    >>> x = keras.Input((4, 4, 8))
    >>> m = keras.Model(x, keras.layers.Conv2D(4, 1, name="c")(x))
    >>> masks = selective_masks(m)
    >>> masks["c"].shape, int(masks["c"].sum())
    ((1, 1, 8, 4), 16)
    >>> apply_selective_masks(m, masks)
    >>> int((m.get_layer("c").kernel.numpy() != 0).sum())
    16
"""

from __future__ import annotations

import keras
import numpy as np

from amct_bridge.errors import GraphError
from amct_bridge.graph.groups import Discovery, discover_groups
from amct_bridge.graph.ir import Graph
from amct_bridge.graph.prune_records import graph_prune_record
from amct_bridge.graph.selective import (
    ELIGIBLE_KINDS,
    selective_candidates,
    two_four_mask,
)
from amct_bridge.keras.graph import extract_graph, find_layer
from amct_bridge.records.model import Record


def kernel_variable(layer: keras.layers.Layer) -> keras.Variable:
    """The kernel Variable of a Conv2D / Dense / Conv2DTranspose layer (not a LoRA sum)."""
    var = getattr(layer, "_kernel", None)
    if var is None:
        var = getattr(layer, "kernel", None)
    if var is None:
        raise GraphError(f"layer {layer.name!r} ({type(layer).__name__}) has no kernel")
    return var


def prune_discovery(model: keras.Model, graph: Graph | None = None) -> Discovery:
    """Channel-pruning groups and refusals of ``model`` (never modified).

    Example:
        >>> import keras
        >>> x = keras.Input((3,))
        >>> h = keras.layers.Dense(4, name="a")(x)
        >>> m = keras.Model(x, keras.layers.Dense(2, name="b")(h))
        >>> [p.name for p in prune_discovery(m).groups[0].producers]
        ['a']
    """
    return discover_groups(graph if graph is not None else extract_graph(model))


def selective_masks(model: keras.Model, graph: Graph | None = None) -> dict[str, np.ndarray]:
    """2:4 masks (bool, kernel shape) of every eligible layer, keyed by record key.

    Eligible: Conv2D with groups == 1, Dense, Conv2DTranspose, each called once.
    """
    graph = graph if graph is not None else extract_graph(model)
    eligible, _ = selective_candidates(graph)
    masks = {}
    for node in eligible:
        kernel = kernel_variable(find_layer(model, node.layer))
        masks[node.layer] = two_four_mask(np.asarray(kernel), ELIGIBLE_KINDS[node.kind])
    return masks


def apply_selective_masks(model: keras.Model, masks: dict[str, np.ndarray]) -> None:
    """Zero the pruned weights: ``kernel *= mask`` for each ``masks`` entry (in place).

    Example:
        >>> import keras
        >>> x = keras.Input((4,))
        >>> m = keras.Model(x, keras.layers.Dense(1, name="fc")(x))
        >>> apply_selective_masks(m, {"fc": np.array([[1], [0], [0], [1]], bool)})
        >>> m.get_layer("fc").kernel.numpy()[1:3].tolist()
        [[0.0], [0.0]]
    """
    for key, mask in masks.items():
        var = kernel_variable(find_layer(model, key))
        if tuple(var.shape) != tuple(mask.shape):
            raise GraphError(f"layer {key!r}: mask shape {mask.shape} != kernel {tuple(var.shape)}")
        # where() rather than multiply: pruned weights become +0.0, not -0.0
        var.assign(keras.ops.where(mask, var, keras.ops.zeros_like(var)))


def prune_record(
    model: keras.Model,
    *,
    channel: bool = True,
    selective: bool = False,
    masks: dict[str, np.ndarray] | None = None,
    record: Record | None = None,
) -> Record:
    """An inner-flavor Record with channel groups and/or 2:4 selective PruneRecords.

    Args:
        model: the Keras model (read only).
        channel: add one PruneRecord per channel-pruning group.
        selective: add one selective PruneRecord per eligible layer (``mask_shape``).
        masks: 2:4 masks to write as ``selective_mask`` (e.g. from :func:`selective_masks`);
            None writes only ``mask_shape``.
        record: a Record to extend (its quantized layers get prune_producer/prune_consumer).

    Example:
        >>> import keras
        >>> x = keras.Input((8,))
        >>> m = keras.Model(x, keras.layers.Dense(4, name="fc")(x))
        >>> prune_record(m, channel=False, selective=True).prune_records[0].selective_prune.name
        'fc'
    """
    graph = extract_graph(model)
    return graph_prune_record(
        graph, channel=channel, selective=selective, masks=masks, record=record
    )
