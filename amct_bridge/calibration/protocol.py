"""What an adapter implements for the core: in-graph statistics and weight access.

* :class:`Instrumentation` -- the framework's in-graph statistics (Keras: wrapped layer calls
  and ``tf.Variable`` ring buffers; MindSpore: wrapper cells updating Parameters). The core
  (:class:`~amct_bridge.calibration.session.CalibrationSession`) creates the
  :class:`Point` list, installs the instrumentation, reads :class:`Row` summaries with
  :meth:`~Instrumentation.drain` and moves histogram grids.
* :class:`WeightSource` -- the numbers of a layer: kernel and bias as numpy in a *stated*
  layout (a name of :data:`amct_bridge.quant.layouts.LAYOUTS`, per layer: MindSpore depthwise and
  plain convolutions are the same class), and BatchNorm parameters.

The full contract, with an example, is in :mod:`amct_bridge.calibration`.

Example:
    >>> p = Point("fc", "input", layer=None, bins=1024)
    >>> (p.key, p.role, p.bins, p.channel_axis, p.calls)
    ('fc', 'input', 1024, None, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from amct_bridge.calibration.layers import LayerDesc, QuantPart
from amct_bridge.quant.stats import BatchStats


@dataclass
class Point:
    """One observed tensor of one layer.

    Args:
        key: layer key it belongs to ("conv1"; a layer's inner tensor: its layer key too).
        role: "input", "output" (of ``layer``: a folded BN's output is observed on the BN),
            "inner" (a tensor inside the layer feeding its second part, e.g. SeparableConv2D's
            depthwise output; the adapter computes it from the layer input) or
            "preactivation" (the layer's output before its fused activation, e.g. the logits
            of ``Dense(activation="softmax")``; the adapter takes the tensor the activation
            is called on).
        layer: the framework object whose call is observed (a descriptor's handle).
        bins: histogram bins per batch (0 = min/max only).
        channel_axis: axis for per-channel min/max (None = not gathered; DMQ sets it).
        channels: size of that axis (static; sizes the buffer).
        calls: how many times the layer runs per step (shared layers).
        inner: role "inner": adapter data computing it (Keras: ``fn(layer, input)``).

    Example:
        >>> Point("fc", "input", layer=None).bins
        0
    """

    key: str
    role: str
    layer: object
    bins: int = 0
    channel_axis: int | None = None
    channels: int = 0
    calls: int = 1
    inner: Any = None


@dataclass
class Row:
    """One batch summary read back: which point (index into the points list), which replica,
    which call.

    ``step`` counts the point's summaries on that replica (0, 1, 2...; a layer called twice per
    step has two per step). ``stats`` follows :class:`~amct_bridge.quant.stats.BatchStats`:
    ``hist`` only when the batch was binned on its own ``[min, max]`` (not onto the grid).

    Example:
        >>> Row(0, 0, 0, BatchStats(count=4, min=-1.0, max=2.0)).channel_range is None
        True
    """

    point: int
    replica: int
    step: int
    stats: BatchStats
    channel_range: np.ndarray | None = None  # [2, C]: per-channel min and max (DMQ)


@runtime_checkable
class Instrumentation(Protocol):
    """In-graph statistics of one calibration pass (see :mod:`amct_bridge.calibration`).

    Example:
        >>> isinstance(object(), Instrumentation)
        False
    """

    python_calls: int

    @property
    def read_every(self) -> int:
        """Batch ends between two :meth:`drain` calls so that no buffer overflows."""

    def install(self) -> None:
        """Start observing the points (the model computes the same outputs)."""

    def remove(self) -> None:
        """Stop observing and leave nothing behind (idempotent)."""

    def drain(self) -> list[Row]:
        """Every summary written since the last drain, in write order per point."""

    def due(self) -> list[int]:
        """Points whose histogram accumulator must be taken before the next drain."""

    def take_histograms(self, indices: list[int]) -> list[tuple[int, float, float, np.ndarray]]:
        """``(point, lo, hi, counts)`` accumulated on each point's grid since the last take
        (without the batches drained with their own ``hist``); zeroes the accumulators."""

    def set_grid(self, index: int, lo: float, hi: float) -> None:
        """Bin point ``index``'s batches inside ``[lo, hi]`` onto that grid from now on."""

    def grid(self, index: int) -> tuple[float, float] | None:
        """Point ``index``'s grid, None before the first :meth:`set_grid`."""

    def set_limit(self, steps: int | None) -> None:
        """Steps after which no batch bins onto a grid any more (None: never)."""

    # Optional: ``non_finite() -> bool``, True once an observed tensor held a NaN or an Inf,
    # cheap enough to ask after every step (the session then reads at once and raises).


@dataclass
class PartWeights:
    """A part's kernel and bias as float32 numpy, in the layout named ``layout``.

    Example:
        >>> PartWeights(np.zeros((2, 3), np.float32), "OI").bias is None
        True
    """

    kernel: np.ndarray
    layout: str
    bias: np.ndarray | None = None


@dataclass
class BatchNormParams:
    """A BatchNorm's inference parameters (``gamma``/``beta`` None when not used).

    ``y = gamma * (x - mean) / sqrt(var + eps) + beta`` per channel.

    Example:
        >>> BatchNormParams(None, None, np.zeros(2), np.ones(2), 1e-3).eps
        0.001
    """

    gamma: np.ndarray | None
    beta: np.ndarray | None
    mean: np.ndarray
    var: np.ndarray
    eps: float


@runtime_checkable
class WeightSource(Protocol):
    """Reads a layer's numbers for the record builder.

    Example:
        >>> isinstance(object(), WeightSource)
        False
    """

    def part_weights(self, layer: LayerDesc, part: QuantPart) -> PartWeights:
        """Kernel (and bias, None if the part has none) of one quantized part."""

    def batch_norm(self, bn: LayerDesc) -> BatchNormParams:
        """Parameters of a BatchNorm folded into a preceding part."""
