"""Framework-free layer descriptors: what an adapter tells the calibration core about a model.

An adapter describes each leaf layer (Keras layer, MindSpore cell) once as a :class:`LayerDesc`:
its record key, its kind (the adapter's registry name), its quantized parts (:class:`QuantPart`,
one AMCT record entry each), its role flags and an opaque ``handle`` (the framework object; the
core never looks inside, it only hands it back to the adapter's instrumentation and weights).
:class:`ModelDesc` bundles the layers with the model's graph IR and the kind names the
Conv/Dense + BatchNorm chain rule needs.

Example:
    >>> conv = QuantPart("", "Conv2D", weights=True, channel_wise=True, foldable=True)
    >>> d = LayerDesc("c1", "Conv2D", parts=(conv,), handle=None)
    >>> d.quantizable, conv.key("c1"), QuantPart("dw", "Depthwise", True, True, False).key("s")
    (True, 'c1', 's/dw')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amct_bridge.graph.ir import Graph


@dataclass(frozen=True)
class QuantPart:
    """One quantized op of a layer (one AMCT record entry).

    Args:
        suffix: record-key suffix ("" = the layer key itself; "depthwise" -> "sep/depthwise").
        op_type: op type the record's consumer sees (TF "Conv2D", MindSpore "Conv2D"...).
        weights: the part has a kernel (scale_w / offset_w are written); False: AvgPool.
        channel_wise: per-output-channel scale_w allowed (AMCT: convolutions, not Dense).
        foldable: a directly following BatchNorm may be folded into this op.

    Adapters may subclass it to carry their own lookup fields (Keras: kernel attribute names).

    Example:
        >>> QuantPart("", "MatMul", True, False, True).has_weights
        True
    """

    suffix: str
    op_type: str
    weights: bool
    channel_wise: bool
    foldable: bool

    def key(self, layer_key: str) -> str:
        """Record key of this part for the layer whose key is ``layer_key``."""
        return f"{layer_key}/{self.suffix}" if self.suffix else layer_key

    @property
    def has_weights(self) -> bool:
        """True if the part has a kernel (scale_w / offset_w are written)."""
        return self.weights


@dataclass(eq=False)
class LayerDesc:
    """One leaf layer / cell / raw op of a model, as the core sees it.

    Args:
        key: record / sidecar key, the framework's own name ("conv1", "outer/inner",
            MindSpore "layer1.0.conv1").
        kind: the adapter's registry name ("Conv2D", "ReLU", "Add"...); a subclass of a
            registered framework class gets its base's name.
        parts: quantized parts in execution order (empty: not quantized).
        handle: the framework object (opaque to the core).
        activation: standalone activation (ranges go to the sidecar only).
        runtime: coefficient-free op whose output range runtimes need (Add, concat, pools).
        name: the framework's short name, for messages (default: ``key``).
        params: facts the core reads: ``channel_axis`` (int, activation channel axis for DMQ,
            default -1), ``on_channels`` (BatchNorm: normalizes the channel axis; default True).
        weighted: the layer holds weights the deployed model computes with (kernels, BN
            parameters, embeddings...): one that gets no record entry and is not folded into
            one is named in a warning (:func:`amct_bridge.calibration.plan.unquantized_layers`).

    Example:
        >>> LayerDesc("r1", "ReLU", activation=True).quantizable
        False
    """

    key: str
    kind: str
    parts: tuple[QuantPart, ...] = ()
    handle: Any = None
    activation: bool = False
    runtime: bool = False
    name: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    weighted: bool = False

    def __post_init__(self) -> None:
        self.name = self.name or self.key

    @property
    def quantizable(self) -> bool:
        """True when the layer has record entries."""
        return bool(self.parts)

    @property
    def channel_axis(self) -> int:
        """Activation channel axis (DMQ per-channel ranges): -1 channels-last, 1 NCHW."""
        return int(self.params.get("channel_axis", -1))


@dataclass
class ModelDesc:
    """A model as the calibration core sees it (see :mod:`amct_bridge.calibration`).

    Args:
        name: the model's name (messages).
        layers: every leaf layer by key, in the adapter's layer order (the execution order
            used when there is no graph).
        graph: the graph IR (node ``layer`` = LayerDesc key), or None when the model has no
            call graph: then no BN folding and one call per layer.
        operations: raw ops in the graph that are not layers (``x + y``), by node ``layer``.
        foldable_kinds: graph node kinds whose following BatchNorm may be folded.
        batch_norm_kinds: graph node kinds of BatchNorm layers.
        quantizable_kinds: kind names the adapter can quantize (for "nothing to quantize").

    Example:
        >>> ModelDesc("m", {}).graph is None
        True
    """

    name: str
    layers: dict[str, LayerDesc]
    graph: Graph | None = None
    operations: dict[str, LayerDesc] = field(default_factory=dict)
    foldable_kinds: tuple[str, ...] = ()
    batch_norm_kinds: tuple[str, ...] = ()
    quantizable_kinds: tuple[str, ...] = ()

    def lookup(self, key: str) -> LayerDesc | None:
        """The layer or raw op whose key is ``key`` (None if unknown)."""
        found = self.layers.get(key)
        return found if found is not None else self.operations.get(key)
