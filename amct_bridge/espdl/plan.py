"""Decide what gets exported: conv/dense -> [BatchNorm] -> [activation] chains, and what is refused.

A chain starts at every conv2d / depthwise_conv2d / dense layer. A BatchNormalization that is
the only consumer of the layer's output (and reads nothing else) is folded in, unless the
record sets ``skip_fusion`` for the layer (or the layer already applies its own activation). A
ReLU / LeakyReLU / PReLU that is then the only consumer is fused as the chain's activation. A
ZeroPadding2D read only by a "valid" conv2d / depthwise_conv2d is folded into that conv's padding
(ESP-DL ``PADDING_NOT_SET`` with explicit ``{top, bottom, left, right}``: Keras MobileNet's
``conv_pad_*``); elsewhere it stays a runtime ``Pad`` layer.

Refused (collected as :class:`Problem`, one per layer): ReLU6 (fused or standalone; inside a
hard sigmoid with its own reason, where replacing it with ReLU is no fix), depthwise
multiplier > 1, activations ESP-DL lacks, BatchNormalization that cannot be folded, standalone
PReLU (convert.py cannot write its alpha), a ``runtime`` kind the exporter has no ESP-DL class
for (Subtract, Multiply...), and every ``unsupported`` op.

Example:
    >>> import numpy as np
    >>> layers = [SourceLayer("in", "input"),
    ...           SourceLayer("c", "conv2d", ["in"], weights={"kernel": np.ones((1, 1, 1, 2))}),
    ...           SourceLayer("r", "relu", ["c"])]
    >>> chains, problems = plan_chains(layers)
    >>> [(c.head.name, c.activation, c.last) for c in chains], problems
    ([('c', 'ReLU', 'r')], [])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from amct_bridge.espdl.source import (
    ESPDL_CLASS,
    FUSABLE_ACTIVATIONS,
    PASS_THROUGH,
    WEIGHT_OPS,
    ZERO_PADDING_KINDS,
    SourceLayer,
    zero_padding,
)


@dataclass
class Problem:
    """Why one layer cannot be exported as ESP-DL v1 (``str()`` is the user message).

    ``topic`` is the short name the refusal summary counts it under (e.g. ``ReLU6``; empty:
    the kind, see :func:`amct_bridge.espdl.refusals.label`).
    """

    layer: str
    kind: str
    reason: str
    topic: str = field(default="", repr=False, compare=False)

    def __str__(self) -> str:
        return f"layer {self.layer!r} ({self.kind}): {self.reason}"


@dataclass
class Chain:
    """One exported ESP-DL layer: a conv/dense ``head`` plus what was fused into it.

    ``last`` names the layer whose output is the chain's output (its range sets
    output_exponent); ``activation`` is convert.py's type name or None; ``pad`` a ZeroPadding2D
    folded into the conv, ``pads`` its ``[top, bottom, left, right]``, or the conv's own
    explicit pads (``attrs["pads"]`` of a "valid" conv).
    """

    head: SourceLayer
    bn: SourceLayer | None = None
    act_layer: SourceLayer | None = None
    activation: str | None = None
    members: list[str] = field(default_factory=list)
    pad: SourceLayer | None = None
    pads: list[int] | None = None

    @property
    def fused(self) -> list[str]:
        """Every model layer the exported entry computes (a folded padding first)."""
        return ([self.pad.name] if self.pad is not None else []) + self.members

    @property
    def last(self) -> str:
        """Name of the layer whose output the chain produces."""
        return self.members[-1] if self.members else self.head.name


_OWN_ACTIVATIONS = {"relu": "ReLU", "leaky_relu": "LeakyReLU"}


def consumers_map(layers: list[SourceLayer]) -> dict[str, list[SourceLayer]]:
    """Name -> layers that read its output (in execution order).

    Example:
        >>> consumers_map([SourceLayer("a", "input"), SourceLayer("b", "relu", ["a"])])["a"][0].name
        'b'
    """
    result: dict[str, list[SourceLayer]] = {layer.name: [] for layer in layers}
    for layer in layers:
        for src in layer.inputs:
            result.setdefault(src, []).append(layer)
    return result


def _sole_consumer(
    layer: SourceLayer, consumers: dict[str, list[SourceLayer]]
) -> SourceLayer | None:
    # Fusing changes what every reader sees, so only a single reader (not a model output) counts.
    users = consumers.get(layer.name, [])
    if len(users) == 1 and users[0].inputs == [layer.name] and not layer.attrs.get("model_output"):
        return users[0]
    return None


def _head_problem(layer: SourceLayer) -> str | None:
    if layer.attrs.get("call_of"):
        return "layer called more than once: not supported by the ESP-DL v1 exporter"
    if layer.op == "depthwise_conv2d" and int(layer.attrs.get("depth_multiplier", 1)) != 1:
        return (
            f"depth_multiplier {layer.attrs['depth_multiplier']}: ESP-DL v1 depthwise_conv2d "
            "takes multiplier 1 only (split it into a depthwise + a 1x1 conv)"
        )
    act = layer.attrs.get("activation")
    if act == "relu6":
        return (
            "activation relu6: ESP-DL v1 has no ReLU6 (no clip): replace it with ReLU and "
            "fine-tune briefly, replace_relu6() of amct_bridge.keras or amct_bridge.mindspore"
        )
    if act == "prelu":  # a layer's own PReLU (MindSpore nn.Dense(activation="prelu"))
        return (
            "activation 'prelu' applied by the layer itself: ESP-DL v1 fuses a PReLU only as "
            "a separate layer after it (its alpha is read there): use an nn.PReLU cell"
        )
    if act not in (None, *_OWN_ACTIVATIONS):
        return f"activation {act!r}: ESP-DL v1 can fuse only ReLU, LeakyReLU and PReLU"
    return None


def _folded_padding(
    head: SourceLayer, by_name: dict[str, SourceLayer], consumers: dict[str, list[SourceLayer]]
) -> SourceLayer | None:
    """The ZeroPadding2D that only ``head`` (a "valid" conv) reads, if any: foldable."""
    if head.op not in ("conv2d", "depthwise_conv2d") or len(head.inputs) != 1:
        return None
    if str(head.attrs.get("padding", "valid")).lower() != "valid" or head.attrs.get("pads"):
        return None  # SAME (or own pads) plus explicit pads: left as a Pad layer
    src = by_name.get(head.inputs[0])
    if src is None or src.op != "runtime" or src.kind not in ZERO_PADDING_KINDS:
        return None
    if len(src.inputs) != 1:
        return None
    return src if _sole_consumer(src, consumers) is head else None


def _build_chain(
    head: SourceLayer,
    consumers: dict[str, list[SourceLayer]],
    skip_fusion: Callable[[str], bool],
    by_name: dict[str, SourceLayer] | None = None,
) -> Chain:
    chain = Chain(head, members=[head.name])
    pad = _folded_padding(head, by_name or {}, consumers)
    if pad is not None:
        chain.pad, chain.pads = pad, zero_padding(pad)
    elif head.attrs.get("pads") is not None:  # the conv's own explicit pads (MindSpore "pad")
        chain.pads = [int(p) for p in head.attrs["pads"]]
    own = head.attrs.get("activation")
    if own is not None:
        chain.activation = _OWN_ACTIVATIONS[own]
        return chain
    nxt = _sole_consumer(head, consumers)
    if nxt is not None and nxt.op == "batch_norm" and not skip_fusion(head.name):
        chain.bn = nxt
        chain.members.append(nxt.name)
        nxt = _sole_consumer(nxt, consumers)
    if nxt is not None and nxt.op in FUSABLE_ACTIVATIONS:
        chain.act_layer = nxt
        chain.activation = FUSABLE_ACTIVATIONS[nxt.op]
        chain.members.append(nxt.name)
    return chain


def plan_chains(
    layers: list[SourceLayer], skip_fusion: Callable[[str], bool] = lambda name: False
) -> tuple[list[Chain], list[Problem]]:
    """Group layers into exported chains (execution order) and list every refused layer.

    ``skip_fusion(name)`` tells whether the record forbids folding BN into layer ``name``.

    Example:
        >>> plan_chains([SourceLayer("x", "unsupported", kind="LSTM", attrs={"reason": "no"})])[1]
        [Problem(layer='x', kind='LSTM', reason='no')]
    """
    consumers = consumers_map(layers)
    by_name = {layer.name: layer for layer in layers}
    chains: list[Chain] = []
    problems: list[Problem] = []
    fused: set[str] = set()
    for layer in layers:
        if layer.op in WEIGHT_OPS:
            reason = _head_problem(layer)
            if reason:
                problems.append(_problem(layer, reason))
                continue
            chain = _build_chain(layer, consumers, skip_fusion, by_name)
            fused.update(chain.fused)
            chains.append(chain)
    refused = {p.layer for p in problems}
    refused |= {layer.name for layer in layers if layer.op == "unsupported"}
    for layer in layers:
        if layer.name in fused:
            continue
        if layer.op == "relu6" and _in_hard_sigmoid(layer, by_name, consumers):
            problems.append(_problem(layer, HARD_SIGMOID, "ReLU6 in a hard sigmoid"))
            continue
        reason = _standalone_problem(layer, skip_fusion, refused)
        if reason:
            problems.append(_problem(layer, reason))
    order = {layer.name: i for i, layer in enumerate(layers)}
    problems.sort(key=lambda p: order[p.layer])  # report in execution order
    return chains, problems


#: A ReLU6 whose clip is the function: replacing it with ReLU is no fix (MobileNetV3).
HARD_SIGMOID = (
    "ReLU6 inside a hard sigmoid (relu6(x + 3) / 6, as MobileNetV3 computes it): here the clip "
    "at 6 is what the block computes, so replacing it with ReLU would change the model's "
    "function (no replace_relu6); ESP-DL v1 has no clip and no hard sigmoid: compute the block "
    "on the host, or export ESP-DL v3 (--format espdl), whose runtime has HardSigmoid"
)

#: Classifier activations ESP-DL v1 lacks; both keep the arg max, so the host can apply them.
_HEAD_ACTIVATIONS = ("softmax", "sigmoid")

_HEAD_HINT = (
    "; this is the model's output: build the model without it (keras.applications: "
    "classifier_activation=None) and apply it on the host ({act} keeps the arg max)"
)

# elementwise ops with one tensor input: the other operand is a constant
_ADD_KINDS = frozenset({"Add", "AddV2", "TensorAdd"})
_MUL_KINDS = frozenset({"Multiply", "Mul", "Muls"})


def _problem(layer: SourceLayer, reason: str, topic: str = "") -> Problem:
    """A refusal of ``layer``; a softmax/sigmoid at the model's output gets the classifier
    hint, a ReLU6 the topic ``ReLU6`` (the summary counts it apart from plain ReLU)."""
    act = next((a for a in _HEAD_ACTIVATIONS if a in reason.lower()), None)
    if act is not None and layer.attrs.get("model_output"):
        reason += _HEAD_HINT.format(act=act)
    if not topic and (layer.op == "relu6" or layer.attrs.get("activation") == "relu6"):
        topic = "ReLU6"
    return Problem(layer.name, layer.kind or layer.op, reason, topic)


def _in_hard_sigmoid(
    layer: SourceLayer, by_name: dict[str, SourceLayer], consumers: dict[str, list[SourceLayer]]
) -> bool:
    """``relu6(x + c) * k`` (MobileNetV3's hard sigmoid): a ReLU6 reading an Add of a constant
    (one tensor input), or read only by a Multiply by a constant."""
    src = by_name.get(layer.inputs[0]) if len(layer.inputs) == 1 else None
    shifted = src is not None and src.kind in _ADD_KINDS and len(src.inputs) == 1
    users = consumers.get(layer.name, [])
    scaled = len(users) == 1 and users[0].kind in _MUL_KINDS and len(users[0].inputs) == 1
    return shifted or scaled


def hard_sigmoid_relu6(layers: list[SourceLayer]) -> list[str]:
    """Names of the ReLU6 layers whose clip is part of a hard sigmoid (``relu6(x + 3) / 6``,
    MobileNetV3): replacing them with ReLU would change the function, so ``replace_relu6``
    keeps them.

    Example:
        >>> add = SourceLayer("add", "runtime", ["x"], "Add")
        >>> r6 = SourceLayer("r6", "relu6", ["add"], "ReLU")
        >>> plain = SourceLayer("p6", "relu6", ["x"], "ReLU")
        >>> hard_sigmoid_relu6([SourceLayer("x", "input", [], "InputLayer"), add, r6, plain])
        ['r6']
    """
    by_name = {layer.name: layer for layer in layers}
    consumers = consumers_map(layers)
    return [
        layer.name
        for layer in layers
        if layer.op == "relu6" and _in_hard_sigmoid(layer, by_name, consumers)
    ]


def _standalone_problem(
    layer: SourceLayer, skip_fusion: Callable[[str], bool], refused: set[str] = frozenset()
) -> str | None:
    if layer.op == "relu6":
        return (
            "ReLU6: ESP-DL v1 has no ReLU6 (no clip): replace it with ReLU and fine-tune briefly "
            "(replace_relu6() of amct_bridge.keras or amct_bridge.mindspore, "
            "docs/espdl-export.md), or skip it"
        )
    if layer.op == "batch_norm":
        src = layer.inputs[0] if len(layer.inputs) == 1 else None
        if src in refused:  # not a placement problem: it folds once its conv exports
            return (
                f"BatchNormalization cannot be folded: the layer before it, {src!r}, is refused "
                "(its own line says why); the BN folds into it once that layer exports"
            )
        if src and skip_fusion(src):  # placed right: the record keeps it apart
            return (
                f"BatchNormalization cannot be folded: the record sets skip_fusion for {src!r} "
                "(calibration's skip_fusion_layers, or QAT with fold_batchnorm=False) and ESP-DL "
                "v1 has no BatchNorm layer: make the record with folding (no skip_fusion_layers; "
                "QAT: fold_batchnorm=True, the default)"
            )
        why = "it does not directly follow a conv/dense with no activation of its own"
        return (
            f"BatchNormalization cannot be folded ({why}); ESP-DL v1 has no BatchNorm layer: "
            "only a BN right after a conv/dense (before any activation) folds into its weights, "
            "so a model with BN elsewhere (pre-activation blocks: DenseNet, ResNet v2) needs "
            "that BN moved or removed and a fine-tune before ESP-DL v1 can run it"
        )
    if layer.op == "prelu":
        return "PReLU that does not follow a conv/dense: convert.py cannot write its alpha"
    if layer.op == "unsupported":
        return str(layer.attrs.get("reason", "not supported by ESP-DL v1"))
    if layer.op == "runtime" and layer.kind not in ESPDL_CLASS and layer.kind not in PASS_THROUGH:
        return (
            f"no ESP-DL v1 runtime layer for {layer.kind or 'it'} in this exporter (supported: "
            f"{', '.join(sorted(ESPDL_CLASS))}): replace it, or skip it and compute it on the host"
        )
    return None
