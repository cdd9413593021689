"""A classifier head ESP-DL v1 cannot compute, left to the host: the final softmax / sigmoid.

ESP-DL v1 has no softmax and no sigmoid. Both are monotonic per class (softmax keeps the order
of the logits, sigmoid is increasing), so the arg max of the chip's logits is the model's
prediction and the host applies the function to the chip's output when it wants probabilities.
:func:`host_heads` finds them, before the plan of chains:

- a Dense / Conv2D / DepthwiseConv2D whose own activation is softmax or sigmoid and whose output
  is a model output (``Dense(..., activation="softmax")``, every keras.applications classifier)
  is exported linear: the chip computes its logits;
- a model output computed by a ``Softmax`` layer, an ``Activation("softmax" / "sigmoid")``
  (``attrs["activation"]``) or a sigmoid primitive, reading one layer, is left out of the chip
  graph: the layer it reads becomes the model output.

Each becomes a :class:`HostOp` (export.json ``"host"``, the CLI's "left to the host" lines); the
chip graph lists it too (``graph["host"]``, with the chip layer it reads), so ``espdl-eval``
scores the logits. A softmax / sigmoid anywhere else is not a head: it is refused as before.

The sidecar's output range of a layer with a fused softmax is the range of the probabilities,
not of the logits: its output exponent comes from the logits' range the calibration measured
(the sidecar's ``preactivation``), or, in a sidecar without it, from :func:`logit_bound` (the
input range pushed through the weights, with a warning).

Example:
    >>> import numpy as np
    >>> fc = SourceLayer("fc", "dense", ["in"], "Dense", {"kernel": np.ones((2, 3))},
    ...                  {"activation": "softmax", "model_output": True})
    >>> layers, host = host_heads([SourceLayer("in", "input"), fc])
    >>> layers[1].attrs["activation"], host[0].function, host[0].reads
    (None, 'softmax', 'fc')
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from amct_bridge.espdl.source import WEIGHT_OPS, SourceLayer

#: Head functions the host applies, and why each leaves the arg max unchanged.
FUNCTIONS: dict[str, str] = {
    "softmax": "softmax keeps the order of the logits, so the arg max is the same",
    "log_softmax": "log_softmax keeps the order of the logits, so the arg max is the same",
    "sigmoid": "sigmoid is increasing: the arg max (and > 0.5 as logit > 0) is the same",
}
#: Standalone layer kinds that are one of those functions.
_KINDS = {"Softmax": "softmax", "Sigmoid": "sigmoid", "LogSoftmax": "log_softmax"}


@dataclass
class HostOp:
    """A head function left to the host: ``function`` of model layer ``layer`` (``kind``),
    applied to the output of model layer ``reads`` (the chip computes that).

    Example:
        >>> str(HostOp("sm", "Softmax", "softmax", "fc"))  # doctest: +NORMALIZE_WHITESPACE
        "softmax of layer 'sm' (Softmax), applied to the output of 'fc' (softmax keeps the
        order of the logits, so the arg max is the same)"
    """

    layer: str
    kind: str
    function: str
    reads: str

    def __str__(self) -> str:
        return (
            f"{self.function} of layer {self.layer!r} ({self.kind}), applied to the output of "
            f"{self.reads!r} ({FUNCTIONS[self.function]})"
        )

    def to_json(self, chip: str | None = None) -> dict:
        """export.json's entry (``chip``: the chip layer computing ``reads``, if known)."""
        doc = {"layer": self.layer, "kind": self.kind, "function": self.function}
        doc.update(reads=self.reads, keeps_argmax=True, why=FUNCTIONS[self.function])
        if chip is not None:
            doc["chip"] = chip
        return doc


def _function(layer: SourceLayer) -> str | None:
    """The head function a standalone layer computes, or None."""
    if layer.kind in _KINDS:
        return _KINDS[layer.kind]
    name = str(layer.attrs.get("activation") or "").lower()
    return name if layer.kind == "Activation" and name in FUNCTIONS else None


def _own_function(layer: SourceLayer) -> str | None:
    name = str(layer.attrs.get("activation") or "").lower().replace("logsoftmax", "log_softmax")
    return name if layer.op in WEIGHT_OPS and name in FUNCTIONS else None


def host_heads(layers: list[SourceLayer]) -> tuple[list[SourceLayer], list[HostOp]]:
    """``layers`` with the model's final softmax / sigmoid taken out, and what was taken.

    Layers are copied where changed (the caller's list and layers are not modified).

    Example:
        >>> sm = SourceLayer("sm", "unsupported", ["fc"], "Softmax", attrs={"model_output": True})
        >>> fc = SourceLayer("fc", "dense", ["in"], "Dense")
        >>> layers, host = host_heads([SourceLayer("in", "input"), fc, sm])
        >>> [x.name for x in layers], layers[1].attrs["model_output"], str(host[0])[:22]
        (['in', 'fc'], True, "softmax of layer 'sm' ")
    """
    readers: dict[str, int] = {}
    for layer in layers:
        for name in layer.inputs:
            readers[name] = readers.get(name, 0) + 1
    by_name = {layer.name: layer for layer in layers}
    out: list[SourceLayer] = []
    host: list[HostOp] = []
    dropped: dict[str, str] = {}  # a dropped head -> the layer it reads
    for layer in layers:
        final = layer.attrs.get("model_output") and not readers.get(layer.name)
        func = _own_function(layer) if final else None
        if func is not None:
            attrs = {**layer.attrs, "activation": None, "host_activation": func}
            out.append(replace(layer, attrs=attrs))
            host.append(HostOp(layer.name, layer.kind or layer.op, func, layer.name))
            continue
        func = _function(layer) if final else None
        src = by_name.get(layer.inputs[0]) if func and len(layer.inputs) == 1 else None
        if src is not None and src.op != "input":
            dropped[layer.name] = src.name
            host.append(HostOp(layer.name, layer.kind, func, src.name))
            continue
        out.append(layer)
    if dropped:  # the layers they read are the model outputs now (nothing fuses after them)
        ends = set(dropped.values())
        out = [
            replace(x, attrs={**x.attrs, "model_output": True}) if x.name in ends else x
            for x in out
        ]
    return out, host


def logit_bound(head: SourceLayer, input_range: tuple[float, float]) -> tuple[float, float]:
    """Bound of a conv/dense's pre-activation output from its input range and its weights:
    output unit j lies in ``Σ_i min(w_ij·lo, w_ij·hi) + b_j .. Σ_i max(...) + b_j``.

    Never saturates (every input in [lo, hi]); coarser than a calibrated range.

    Example:
        >>> fc = SourceLayer("fc", "dense", weights={"kernel": np.array([[1.0, -2.0], [0.5, 1.0]]),
        ...                                         "bias": np.array([0.0, 1.0])})
        >>> logit_bound(fc, (0.0, 2.0))
        (-3.0, 3.0)
    """
    lo, hi = (float(v) for v in input_range)
    kernel = np.asarray(head.weights["kernel"], np.float64)
    if head.op == "depthwise_conv2d":  # H, W, C, m: each output reads one input channel
        kernel = kernel.reshape(-1, kernel.shape[2] * kernel.shape[3])
    else:  # HWIO / (in, out): every output reads every input
        kernel = kernel.reshape(-1, kernel.shape[-1])
    top = np.maximum(kernel * lo, kernel * hi).sum(axis=0)
    bottom = np.minimum(kernel * lo, kernel * hi).sum(axis=0)
    bias = head.weights.get("bias")
    if bias is not None:
        top, bottom = top + np.asarray(bias, np.float64), bottom + np.asarray(bias, np.float64)
    return float(bottom.min()), float(top.max())


def chip_reference(
    layers: list[SourceLayer], output: str | None
) -> tuple[str | None, frozenset[str]]:
    """What the chip's output is compared with when heads are left to the host (the exponent
    search, its bias correction): the model layer whose float output the chip computes in
    place of ``output`` (a dropped ``Softmax`` layer -> the layer it reads), and the layers
    whose float output is wanted before their own activation (``Dense(activation="softmax")``
    exported linear: the chip computes its logits, not the probabilities).

    Example:
        >>> fc = SourceLayer("fc", "dense", ["in"], "Dense", attrs={"activation": "softmax"})
        >>> sm = SourceLayer("sm", "unsupported", ["fc"], "Softmax", attrs={"model_output": True})
        >>> chip_reference([SourceLayer("in", "input"), fc, sm], "sm")
        ('fc', frozenset())
        >>> chip_reference([SourceLayer("in", "input"), replace(fc, attrs={
        ...     "activation": "softmax", "model_output": True})], "fc")
        ('fc', frozenset({'fc'}))
    """
    host = host_heads(layers)[1]
    reads = {h.layer: h.reads for h in host if h.layer != h.reads}
    linear = frozenset(h.layer for h in host if h.layer == h.reads)
    return reads.get(output, output) if output is not None else None, linear
