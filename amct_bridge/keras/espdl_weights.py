"""Keras model -> the ESP-DL exporter's framework-free layer list (:class:`SourceLayer`), and
:func:`export_espdl` (``amct_bridge.keras.export_espdl``), the Keras entry to the exporter.

Execution order and connectivity come from :func:`amct_bridge.keras.graph.extract_graph`
(nested models are named ``"outer/inner"``); this module only says what each Keras class is
for ESP-DL (a table, :data:`RUNTIME_KINDS` / :func:`_translate`) and copies the numbers: conv /
depthwise / dense kernels and bias, BatchNormalization gamma/beta/moving stats/epsilon, the
layer's own activation, LeakyReLU slope, PReLU alpha. A SeparableConv2D becomes its two ESP-DL
layers, ``<name>/depthwise`` and ``<name>/pointwise`` (the record's keys). The model is never
modified.

1-D layers (Conv1D, DepthwiseConv1D, SeparableConv1D, the 1-D pools, ZeroPadding1D) become the
2-D layer of height 1 they are (the calibration quantizes them so, by AMCT's Conv2D rules):
kernel ``[1, k, cin, cout]``, strides / pool sizes ``(1, s)``, ``attrs["rank"] = 1``, which
tells the exporters that the framework's tensors are ``(N, W, C)`` (v3 writes the native 1-D
ops, v1 runs them at height 1; :mod:`amct_bridge.espdl.source`).

Example:
    >>> import keras
    >>> x = keras.Input((8, 8, 3), name="img")
    >>> y = keras.layers.Conv2D(4, 3, activation="relu", name="c1")(x)
    >>> [(s.name, s.op, s.attrs.get("activation")) for s in source_layers(keras.Model(x, y))]
    [('img', 'input', None), ('c1', 'conv2d', 'relu')]
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import keras
import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl import ExportResult, export
from amct_bridge.espdl.exponent_search import CalibrationData, check_rule
from amct_bridge.espdl.source import V1, SourceLayer, no_equivalent, runtime_name
from amct_bridge.espdl.v3.export import V3ExportResult, export_layers_v3
from amct_bridge.graph.ir import Graph, Node
from amct_bridge.keras.float_outputs import float_outputs
from amct_bridge.keras.graph import extract_graph_and_operations, find_layer
from amct_bridge.keras.layers import class_name
from amct_bridge.keras.simulate import by_keras_keys
from amct_bridge.records.calibration import CalibrationStats, load_stats, sidecar_path
from amct_bridge.records.model import Record

#: Coefficient-free Keras layers the ESP-DL v1 runtime has -> whether the output exponent
#: equals the input exponent (MaxPool, Concat, reshapes) or is chosen anew (Add2D, pools).
RUNTIME_KINDS: dict[str, bool] = {
    "MaxPooling2D": True,
    "GlobalMaxPooling2D": True,
    "Reshape": True,
    "Flatten": True,
    "ZeroPadding2D": True,
    "Concatenate": True,
    "Permute": True,
    "Maximum": True,
    "Minimum": True,
    "Dropout": True,
    "SpatialDropout2D": True,
    "GaussianNoise": True,
    "GaussianDropout": True,
    "Identity": True,
    "FoldedBatchNorm": True,  # QAT's identity where a BN was folded (amct_bridge.keras.qat)
    "AveragePooling2D": False,
    "GlobalAveragePooling2D": False,
    "Add": False,
    # 1-D layers: the 2-D layer of height 1 (attrs["rank"] = 1, see the module docstring)
    "MaxPooling1D": True,
    "GlobalMaxPooling1D": True,
    "ZeroPadding1D": True,
    "AveragePooling1D": False,
    "GlobalAveragePooling1D": False,
}

#: 1-D convolutions -> the ESP-DL op of their 2-D twin (height 1).
CONV_1D: dict[str, str] = {"Conv1D": "conv2d", "DepthwiseConv1D": "depthwise_conv2d"}

#: What to do instead, for layers users often have.
HINTS: dict[str, str] = {
    "Subtract": "ESP-DL v1's Sub2D arithmetic is not fixed by any source; compute it on the host",
    "Multiply": "ESP-DL v1's Mul2D arithmetic is not fixed by any source; compute it on the host",
    "QATQuant": "export strip_qat(qat_model) with the QAT record and sidecar, see docs/qat.md",
    "QATObserve": "export strip_qat(qat_model) with the QAT record and sidecar, see docs/qat.md",
    "UpSampling2D": "ESP-DL v1 has no resize layer",
    "Softmax": "apply softmax on the host to the int outputs (it keeps the arg max)",
    "SimpleRNN": "the ESP-DL v3 runtime's recurrent modules are GRU and LSTM: use one of them",
    "Rescaling": "with --skip-unsupported, scale the input on the host and quantize it with "
    "the first layer's input_exponent",
    "Normalization": "with --skip-unsupported, normalize the input on the host and quantize it "
    "with the first layer's input_exponent",
}

#: Hints about the v1 runtime only (the v3 export handles these kinds itself).
_V1_HINTS = frozenset(
    {"Subtract", "Multiply", "UpSampling2D", "Softmax", "Rescaling", "Normalization"}
)

#: Input preprocessing that keeps the shape and works per element: skipped (with
#: skip_unsupported) right after the model input, the host applies it and the chip's input is
#: its output.
HOST_INPUT_KINDS = frozenset({"Rescaling", "Normalization"})

#: Keras 3 ``keras.activations.leaky_relu`` default slope (used by ``activation="leaky_relu"``).
LEAKY_RELU_DEFAULT = 0.2


def _to_numpy(var: Any) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(var))


def _own_activation(name: str) -> tuple[str | None, dict]:
    """A conv/dense ``activation=`` name -> (SourceLayer activation, extra attrs)."""
    if name == "linear":
        return None, {}
    if name == "leaky_relu":
        return "leaky_relu", {"alpha": LEAKY_RELU_DEFAULT}
    return name, {}


def _relu(layer: Any, runtime: str) -> tuple[str, dict]:
    max_value = layer.max_value
    slope, threshold = float(layer.negative_slope), float(layer.threshold)
    if threshold != 0.0:
        why = "ESP-DL v1 has none" if runtime == V1 else f"not translated for {runtime}"
        return "unsupported", {"reason": f"ReLU threshold {threshold}: {why}"}
    if max_value is not None:
        if float(max_value) == 6.0 and slope == 0.0:
            return "relu6", {}
        why = "ESP-DL v1 cannot clip" if runtime == V1 else f"not translated for {runtime}"
        return "unsupported", {"reason": f"ReLU max_value {max_value}: {why}"}
    if slope != 0.0:
        return "leaky_relu", {"alpha": slope}
    return "relu", {}


def _activation(node: Node, runtime: str) -> tuple[str, dict]:
    name = node.params.get("activation", "linear")
    if name in ("relu", "relu6"):
        return name, {}
    if name == "leaky_relu":
        return "leaky_relu", {"alpha": LEAKY_RELU_DEFAULT}
    if name == "linear":
        return "runtime", {"keeps_exponent": True}
    # the v3 export reads "activation"; a final softmax / sigmoid is left to the host by v1
    # (amct_bridge.espdl.v1.head)
    reason = f"activation {name!r}: " + (
        "ESP-DL v1 has no such layer" if runtime == V1 else f"no {runtime} op for it here"
    )
    return "unsupported", {"reason": reason, "activation": name}


def _layer_norm(layer: Any, runtime: str) -> tuple[dict, dict]:
    """Weights and attributes of a LayerNormalization for the v3 export (v1 has none)."""
    weights = {}
    if layer.scale:
        weights["gamma"] = _to_numpy(layer.gamma)
    if layer.center:
        weights["beta"] = _to_numpy(layer.beta)
    axis = layer.axis if isinstance(layer.axis, list | tuple) else [layer.axis]
    attrs = {
        "reason": no_equivalent("Keras LayerNormalization", runtime),
        "axis": [int(a) for a in axis],
        "epsilon": float(layer.epsilon),
        "rms_scaling": bool(getattr(layer, "rms_scaling", False)),
    }
    return weights, attrs


def _prelu(layer: Any, runtime: str) -> tuple[str, dict, dict]:
    alpha = _to_numpy(layer.alpha)
    per_channel = alpha.reshape(-1, alpha.shape[-1])
    if not np.all(per_channel == per_channel[0]):
        reason = f"PReLU alpha varies over positions: {runtime} takes one alpha per channel"
        return "unsupported", {}, {"reason": reason}
    return "prelu", {"alpha": per_channel[0]}, {}


def _conv_like(layer: Any, node: Node, op: str, runtime: str) -> tuple[str, dict, dict]:
    p = node.params
    problems = []
    if p.get("data_format", "channels_last") != "channels_last":
        problems.append("channels_first data format")
    dilation = tuple(int(d) for d in p.get("dilation_rate", (1,)))
    if any(d != 1 for d in dilation) and runtime == V1:
        problems.append(f"dilation {tuple(p['dilation_rate'])}")
    groups = int(p.get("groups", 1))
    depthwise = groups != 1 and groups == int(p.get("in_channels", 0)) == int(p.get("filters", 0))
    if groups != 1 and (runtime == V1 or not depthwise):
        problems.append(f"groups {p['groups']}")
    if groups != 1 and runtime != V1 and not depthwise and len(problems) == 1:
        reason = (
            f"{class_name(layer)} with groups {groups} (not depthwise): the {runtime} runtime's "
            "Conv runs group 1 or depthwise (group = channels = filters) only; split the layer "
            f"into {groups} convs on channel slices and concatenate their outputs"
        )
        return "unsupported", {}, {"reason": reason}
    if problems:
        reason = f"{', '.join(problems)}: not supported by the {runtime} exporter"
        return "unsupported", {}, {"reason": reason, "problems": problems}
    weights: dict = {}
    if hasattr(layer, "kernel"):  # SeparableConv2D: its kernels are read by _separable
        weights["kernel"] = _to_numpy(layer.kernel)
    if depthwise:  # Conv2D(groups=C, filters=C) is a depthwise conv: (kh, kw, 1, C) -> HWCM
        op = "depthwise_conv2d"
        weights["kernel"] = np.swapaxes(weights["kernel"], -1, -2)
    if getattr(layer, "use_bias", False) and layer.bias is not None:
        weights["bias"] = _to_numpy(layer.bias)
    act, extra = _own_activation(p.get("activation", "linear"))
    attrs = {"activation": act, **extra}
    if node.shared:  # each call is a layer of its own (v3); its record / sidecar key is one
        attrs.update(call_of=node.layer, record_key=node.layer)
    for key in ("strides", "padding", "depth_multiplier"):
        if key in p:
            attrs[key] = p[key]
    if any(d != 1 for d in dilation):  # v3 only (v1 refused it above)
        attrs["dilations"] = dilation
    return op, weights, attrs


def _conv_transpose(layer: Any, node: Node, runtime: str) -> tuple[str, dict, dict]:
    """A Conv2DTranspose / Conv1DTranspose for the v3 export (ESP-DL v1 has none): kernel in
    Keras' ``(kh, kw, filters, in)`` layout (1-D: height 1), op ``unsupported``."""
    kind = class_name(layer)
    p = node.params
    attrs: dict = {"reason": no_equivalent(f"Keras {kind}", runtime)}
    if runtime == V1 or p.get("data_format", "channels_last") != "channels_last":
        return "unsupported", {}, attrs
    weights = {"kernel": _to_numpy(layer.kernel)}
    if layer.use_bias and layer.bias is not None:
        weights["bias"] = _to_numpy(layer.bias)
    act, extra = _own_activation(p.get("activation", "linear"))
    attrs.update(activation=act, padding=str(p.get("padding", "valid")), **extra)
    attrs["strides"] = tuple(int(s) for s in p.get("strides", (1,)))
    attrs["dilations"] = tuple(int(d) for d in p.get("dilation_rate", (1,)))
    padding = getattr(layer, "output_padding", None)
    if padding is not None:
        attrs["output_padding"] = tuple(int(v) for v in np.ravel(padding))
    if kind == "Conv1DTranspose":
        weights["kernel"] = weights["kernel"][None]
        attrs.update(rank=1, strides=(1, *attrs["strides"]), dilations=(1, *attrs["dilations"]))
    return "unsupported", weights, attrs


def _batch_norm(layer: Any, node: Node) -> tuple[str, dict, dict]:
    if node.params.get("axis", -1) != -1:
        return "unsupported", {}, {"reason": "BatchNormalization not on the last (channel) axis"}
    weights = {"mean": _to_numpy(layer.moving_mean), "variance": _to_numpy(layer.moving_variance)}
    if layer.scale:
        weights["gamma"] = _to_numpy(layer.gamma)
    if layer.center:
        weights["beta"] = _to_numpy(layer.beta)
    return "batch_norm", weights, {"epsilon": float(layer.epsilon)}


def _runtime_attrs(layer: Any, node: Node) -> dict:
    """What the C++ constructor of a runtime layer needs: pool size/strides/padding, concat axis."""
    attrs: dict = {}
    for key in ("pool_size", "strides", "padding", "target_shape", "dims"):
        value = getattr(layer, key, None) if layer is not None else None
        if value is not None:
            attrs[key] = tuple(int(v) for v in value) if key != "padding" else str(value)
    if "axis" in node.params:
        attrs["axis"] = int(node.params["axis"])
    if node.kind == "Transpose" and "axes" in node.params:  # keras.ops.transpose
        axes = node.params["axes"]
        attrs["perm"] = None if axes is None else tuple(int(a) for a in axes)
    if "scalar_operands" in node.params:  # (position, value): x + 3.0 and the like
        attrs["scalar_operands"] = list(node.params["scalar_operands"])
    if node.params.get("const_operands"):  # x / np.array(...): an operand no input names
        attrs["const_operands"] = int(node.params["const_operands"])
    for key in ("keepdims", "interpolation", "size", "cropping"):  # read by the v3 export
        value = getattr(layer, key, None) if layer is not None else None
        if isinstance(value, bool | str):
            attrs[key] = value
        elif value is not None:
            attrs[key] = tuple(int(v) for v in np.ravel(value))
    return attrs


def _separable(layer: Any, node: Node, inputs: list[str], runtime: str) -> list[SourceLayer]:
    """A SeparableConv2D as ESP-DL runs it: a depthwise conv ``<name>/depthwise`` (no bias) and
    a 1x1 conv ``<name>/pointwise`` (bias, activation), the record's two keys. A
    SeparableConv1D: the same at height 1 (``attrs["rank"] = 1``)."""
    op, weights, attrs = _conv_like(layer, node, "conv2d", runtime)
    if op == "unsupported":
        return [SourceLayer(node.name, op, inputs, node.kind, {}, attrs)]
    one_d = class_name(layer) == "SeparableConv1D"
    if one_d:
        attrs = {**attrs, "rank": 1, "strides": (1, *(int(v) for v in attrs["strides"]))}
    dw_name, pw_name = f"{node.name}/depthwise", f"{node.name}/pointwise"
    dw_attrs = {"activation": None, "part_of": node.name, **({"rank": 1} if one_d else {})}
    if node.shared:
        dw_attrs.update(call_of=node.layer, record_key=f"{node.layer}/depthwise")
    for key in ("strides", "padding", "depth_multiplier"):
        if key in attrs:
            dw_attrs[key] = attrs[key]
    pw_attrs = {**attrs, "strides": (1, 1), "padding": "valid", "part_of": node.name}
    if node.shared:
        pw_attrs["record_key"] = f"{node.layer}/pointwise"
    pw_attrs.pop("depth_multiplier", None)
    pw_kernel, dw_kernel = _to_numpy(layer.pointwise_kernel), _to_numpy(layer.depthwise_kernel)
    if one_d:  # [k, C, M] / [1, C*M, F] -> height 1
        pw_kernel, dw_kernel = pw_kernel[None], dw_kernel[None]
    pw_weights = {"kernel": pw_kernel}
    if "bias" in weights:
        pw_weights["bias"] = weights["bias"]
    return [
        SourceLayer(
            dw_name, "depthwise_conv2d", inputs, node.kind, {"kernel": dw_kernel}, dw_attrs
        ),
        SourceLayer(pw_name, "conv2d", [dw_name], node.kind, pw_weights, pw_attrs),
    ]


def _height_1(op: str, weights: dict, attrs: dict, node: Node) -> tuple[str, dict, dict]:
    """A 1-D conv's ``(op, weights, attrs)`` as the 2-D conv of height 1 it is: kernel
    ``[k, cin, cout]`` -> ``[1, k, cin, cout]``, strides ``(1, s)``, ``attrs["rank"] = 1``; a
    causal Conv1D pads ``(k - 1)`` zeros on the left (explicit ``pads``, padding "valid")."""
    if op == "unsupported":
        return op, weights, attrs
    weights = dict(weights)
    for key in ("kernel", "pointwise_kernel", "depthwise_kernel"):
        if key in weights:
            weights[key] = weights[key][None]
    attrs = {**attrs, "rank": 1}
    if "strides" in attrs:
        attrs["strides"] = (1, *(int(s) for s in attrs["strides"]))
    if "dilations" in attrs:
        attrs["dilations"] = (1, *(int(d) for d in attrs["dilations"]))
    if str(attrs.get("padding", "valid")).lower() == "causal":
        k = int(weights["kernel"].shape[1])
        d = int(attrs.get("dilations", (1, 1))[-1])
        attrs.update(padding="valid", pads=[0, 0, (k - 1) * d, 0])
    return op, weights, attrs


def _runtime_1d(kind: str, attrs: dict) -> dict:
    """A 1-D pool / padding's attrs as its 2-D twin's (height 1), ``rank`` 1."""
    attrs = {**attrs, "rank": 1}
    for key in ("pool_size", "strides"):
        if key in attrs:
            attrs[key] = (1, *(int(v) for v in attrs[key]))
    if kind == "ZeroPadding1D" and "padding" in attrs:  # the str of Keras' (left, right)
        left, right = (int(v) for v in re.findall(r"-?\d+", str(attrs["padding"])))
        attrs["padding"] = ((0, 0), (left, right))
    return attrs


def _translate(layer: Any, node: Node, runtime: str) -> tuple[str, dict, dict]:
    """(op, weights, attrs) of one graph node (see amct_bridge.espdl.source for the ops);
    refusal reasons name ``runtime`` (:func:`amct_bridge.espdl.source.runtime_name`)."""
    kind = class_name(layer) if layer is not None else node.kind
    if kind == "Conv2D":
        return _conv_like(layer, node, "conv2d", runtime)
    if kind == "DepthwiseConv2D":
        return _conv_like(layer, node, "depthwise_conv2d", runtime)
    if kind == "Dense":
        return _conv_like(layer, node, "dense", runtime)
    if kind in CONV_1D:
        return _height_1(*_conv_like(layer, node, CONV_1D[kind], runtime), node)
    if kind == "BatchNormalization":
        return _batch_norm(layer, node)
    if kind == "ReLU":
        op, attrs = _relu(layer, runtime)
        return op, {}, attrs
    if kind == "LeakyReLU":
        return "leaky_relu", {}, {"alpha": float(layer.negative_slope)}
    if kind == "PReLU":
        return _prelu(layer, runtime)
    if kind == "Activation":
        op, attrs = _activation(node, runtime)
        return op, {}, attrs
    if kind in RUNTIME_KINDS:
        attrs = {"keeps_exponent": RUNTIME_KINDS[kind], **_runtime_attrs(layer, node)}
        return "runtime", {}, _runtime_1d(kind, attrs) if kind.endswith("1D") else attrs
    if kind == "LayerNormalization":  # v1 refuses it; the v3 export reads these
        return "unsupported", *_layer_norm(layer, runtime)
    if kind in V3_ONLY:
        return V3_ONLY[kind](layer, node, runtime)
    reason = no_equivalent(f"Keras {kind}", runtime)
    if kind in HINTS and (runtime == V1 or kind not in _V1_HINTS):
        reason += f" ({HINTS[kind]})"
    elif kind in V3_HINTS and runtime != V1:
        reason += f" ({V3_HINTS[kind]})"
    # elementwise, shape-keeping input preprocessing: skipped, the host applies it
    attrs = {"reason": reason, "host_input": kind in HOST_INPUT_KINDS}
    try:  # what the v3 export reads (UpSampling2D size, Softmax axis...), if it reads
        extra = _runtime_attrs(layer, node)
    except (TypeError, ValueError):
        extra = {}
    return "unsupported", {}, {**extra, **attrs}


def _rms_norm(layer: Any, node: Node, runtime: str) -> tuple[str, dict, dict]:
    axis = layer.axis if isinstance(layer.axis, list | tuple) else [layer.axis]
    attrs = {
        "reason": no_equivalent("Keras RMSNormalization", runtime),
        "axis": [int(a) for a in axis],
        "epsilon": float(layer.epsilon),
    }
    return "unsupported", {"scale": _to_numpy(layer.scale)}, attrs


def _elu(layer: Any, node: Node, runtime: str) -> tuple[str, dict, dict]:
    reason = no_equivalent("Keras ELU", runtime)
    return "unsupported", {}, {"reason": reason, "alpha": float(layer.alpha)}


def _layer_scale(layer: Any, node: Node, runtime: str) -> tuple[str, dict, dict]:
    """keras.applications ConvNeXt's LayerScale: ``x * gamma`` per channel."""
    reason = no_equivalent("Keras LayerScale", runtime)
    return "unsupported", {"gamma": _to_numpy(layer.gamma)}, {"reason": reason}


def _rnn_attrs(layer: Any) -> dict:
    """What the v3 lowering reads of a Keras GRU / LSTM (its cell's settings)."""
    cell = layer.cell

    def name(fn) -> str:
        return str(getattr(fn, "__name__", fn))

    attrs = {
        "cell": class_name(layer),
        "units": int(layer.units),
        "return_sequences": bool(layer.return_sequences),
        "return_state": bool(layer.return_state),
        "go_backwards": bool(layer.go_backwards),
        "stateful": bool(layer.stateful),
        "activation": name(cell.activation),
        "recurrent_activation": name(cell.recurrent_activation),
    }
    if hasattr(cell, "reset_after"):
        attrs["reset_after"] = bool(cell.reset_after)
    return attrs


def _rnn_weights(layers: list) -> dict:
    """Kernels (and bias) of one GRU / LSTM per direction, stacked: ``[dirs, ...]``."""
    cells = [x.cell for x in layers]
    weights = {
        "kernel": np.stack([_to_numpy(c.kernel) for c in cells]),
        "recurrent_kernel": np.stack([_to_numpy(c.recurrent_kernel) for c in cells]),
    }
    if all(c.use_bias for c in cells):
        weights["bias"] = np.stack([_to_numpy(c.bias) for c in cells])
    return weights


def _rnn(layer: Any, node: Node, runtime: str) -> tuple[str, dict, dict]:
    """A Keras GRU / LSTM / Bidirectional for the v3 export (op ``unsupported``; weights per
    direction in Keras' gate order, see amct_bridge.espdl.source)."""
    kind = class_name(layer)
    reason = no_equivalent(f"Keras {kind}", runtime)
    if kind != "Bidirectional":
        return "unsupported", _rnn_weights([layer]), {"reason": reason, **_rnn_attrs(layer)}
    forward, backward = layer.forward_layer, layer.backward_layer
    inner = class_name(forward)
    if inner not in ("GRU", "LSTM"):
        return "unsupported", {}, {"reason": reason, "cell": inner, "units": 0}
    ahead, back = _rnn_attrs(forward), _rnn_attrs(backward)
    walks = ahead.pop("go_backwards"), back.pop("go_backwards")
    if ahead != back or walks[0] == walks[1]:
        why = f"Bidirectional whose backward layer is not its forward {inner} run backwards"
        return "unsupported", {}, {"reason": f"{why}: not translated for {runtime}"}
    attrs = {"reason": reason, **ahead, "go_backwards": walks[0], "merge_mode": layer.merge_mode}
    return "unsupported", _rnn_weights([forward, backward]), attrs


def _embedding(layer: Any, node: Node, runtime: str) -> tuple[str, dict, dict]:
    """An Embedding for the v3 export: its table (LoRA merged, as Keras reads it)."""
    attrs = {
        "reason": no_equivalent("Keras Embedding", runtime),
        "mask_zero": bool(getattr(layer, "mask_zero", False)),
        "quantization_mode": getattr(layer, "quantization_mode", None),
    }
    if attrs["quantization_mode"]:  # its embeddings are integers and scales: not read
        return "unsupported", {}, attrs
    return "unsupported", {"embeddings": _to_numpy(layer.embeddings)}, attrs


#: keras.ops reductions the v3 export lowers: their ``axis`` / ``keepdims`` / ``initial``
#: live on the operation, which the graph IR does not copy.
REDUCTION_KINDS = ("Max", "Min", "Sum", "Mean")


def _reduction_attrs(operation: Any) -> dict:
    """``axis`` (None, int or tuple), ``keepdims``, ``initial`` of a keras.ops reduction."""
    axis = getattr(operation, "axis", None)
    if axis is not None and not isinstance(axis, int):
        axis = tuple(int(a) for a in axis)
    initial = getattr(operation, "initial", None)
    return {
        "axis": axis,
        "keepdims": bool(getattr(operation, "keepdims", False)),
        "initial": None if initial is None else float(initial),
    }


#: What to do instead, for layers the v3 export cannot read (v3 refusals only).
V3_HINTS: dict[str, str] = {
    "Lambda": "its Python function cannot be read; the ESP-DL v3 runtime has DepthToSpace, "
    "Gather and the keras.ops math, but a Lambda's body is not translated: write it with "
    "layers or keras.ops calls (a depth_to_space as Reshape + Permute + Reshape layers)",
}


def _mha_masked(layer: Any) -> str | None:
    """What of a MultiHeadAttention's calls (or settings) masks its scores, if anything."""
    if getattr(layer, "_sliding_window", None) is not None:
        return "a sliding window"
    for knode in getattr(layer, "_inbound_nodes", []):
        kwargs = knode.arguments.kwargs
        if kwargs.get("use_causal_mask"):
            return "use_causal_mask"
        for key in ("attention_mask", "query_mask", "value_mask", "key_mask"):
            if kwargs.get(key) is not None:
                return key
    return None


def _mha(layer: Any, node: Node, runtime: str) -> tuple[str, dict, dict]:
    """A Keras MultiHeadAttention for the v3 export: its four projections' kernels and biases
    (``query_kernel`` ``(D, heads, key_dim)``, ..., ``output_kernel``
    ``(heads, value_dim, out)``) and settings; op ``unsupported``."""
    reason = no_equivalent("Keras MultiHeadAttention", runtime)
    weights = {}
    for part, sub in (
        ("query", layer.query_dense),
        ("key", layer.key_dense),
        ("value", layer.value_dense),
        ("output", layer.output_dense),
    ):
        weights[f"{part}_kernel"] = _to_numpy(sub.kernel)
        if getattr(sub, "bias", None) is not None:
            weights[f"{part}_bias"] = _to_numpy(sub.bias)
    scores = any(
        n.arguments.kwargs.get("return_attention_scores")
        for n in getattr(layer, "_inbound_nodes", [])
    )
    masked = _mha_masked(layer)
    attrs = {
        "reason": reason,
        "num_heads": int(layer.num_heads),
        "key_dim": int(layer.key_dim),
        "value_dim": int(layer.value_dim or layer.key_dim),
        "attention_axes": list(layer.attention_axes or [1]),
        "use_gate": bool(getattr(layer, "_use_gate", False)),
        "masked": "return_attention_scores" if scores and not masked else masked,
    }
    return "unsupported", weights, attrs


def attention_ranges(model: keras.Model, layers: list[SourceLayer], data: np.ndarray) -> int:
    """Measure the tensors inside each MultiHeadAttention of ``layers`` on ``data`` (the
    model's input): its inputs from a probe model, its query / key / value sublayers run on
    them (the query times Keras' ``1/sqrt(key_dim)``), the scores, probabilities and context
    in float64 numpy as Keras computes them; sets ``attrs["ranges"]``. Returns how many layers
    were measured (a nested or shared one is not: it keeps the bounds, with a note).

    Example:
        >>> x = keras.Input((4, 6)); a = keras.layers.MultiHeadAttention(2, 3, name="a")(x, x)
        >>> m = keras.Model(x, a); ls = source_layers(m, format="espdl")
        >>> attention_ranges(m, ls, np.ones((2, 4, 6), "float32")), sorted(ls[1].attrs["ranges"])
        (1, ['context', 'key', 'probs', 'query', 'scores', 'value'])
    """
    done = 0
    for src in layers:
        if src.kind != "MultiHeadAttention" or "num_heads" not in src.attrs:
            continue
        layer = find_layer(model, src.name.split("@")[0])
        calls = getattr(layer, "_inbound_nodes", [])
        if len(calls) != 1:
            continue
        try:  # the layer's inputs as tensors of this model (a nested model's are not)
            probe = keras.Model(model.inputs, list(calls[0].input_tensors[:3]))
        except ValueError:
            continue
        ins = probe.predict(np.asarray(data), verbose=0)
        ins = ins if isinstance(ins, list) else [ins]
        query, value = ins[0], ins[1]
        key = ins[2] if len(ins) > 2 else value

        def run(sub, x):
            return np.asarray(keras.ops.convert_to_numpy(sub(x)), np.float64)

        q = run(layer.query_dense, query) / np.sqrt(float(src.attrs["key_dim"]))
        k, v = run(layer.key_dense, key), run(layer.value_dense, value)
        scores = np.einsum("btnd,bsnd->bnts", q, k)
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = e / e.sum(axis=-1, keepdims=True)
        context = np.einsum("bnts,bsnd->btnd", probs, v)
        tensors = {"query": q, "key": k, "value": v, "scores": scores}
        tensors.update(probs=probs, context=context)
        src.attrs["ranges"] = {n: (float(t.min()), float(t.max())) for n, t in tensors.items()}
        done += 1
    return done


#: Layers the ESP-DL v3 export lowers (amct_bridge.espdl.v3.lowering) and v1 refuses: what
#: they are for the core (op ``unsupported``, the numbers the v3 lowering reads).
V3_ONLY = {
    "MultiHeadAttention": _mha,
    "GRU": _rnn,
    "LSTM": _rnn,
    "Bidirectional": _rnn,
    "Conv2DTranspose": _conv_transpose,
    "Conv1DTranspose": _conv_transpose,
    "RMSNormalization": _rms_norm,
    "ELU": _elu,
    "LayerScale": _layer_scale,
    "Embedding": _embedding,
}


def _input_name(graph: Graph, tid: str) -> str:
    producer = graph.producer_of(tid)
    return producer.name if producer is not None else tid.rsplit(":", 1)[0]


def source_layers(model: keras.Model, *, format: str = "v1") -> list[SourceLayer]:
    """Translate a built Keras model into :class:`SourceLayer` objects in execution order.

    Args:
        model: a built Functional or Sequential Keras 3 model.
        format: the export the layers are for (``"v1"`` or ``"espdl"``): refusal reasons
            name its runtime.

    Example:
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="fc"),
        ...                       keras.layers.ReLU(6.0, name="r6")])
        >>> [(s.name, s.op) for s in source_layers(m)][1:]
        [('fc', 'dense'), ('r6', 'relu6')]
    """
    runtime = runtime_name(format)
    graph, operations = extract_graph_and_operations(model)
    result = [
        SourceLayer(  # shape without the batch axis: the C++ app's input tensor
            _input_name(graph, tid),
            "input",
            kind="InputLayer",
            attrs={"shape": graph.tensors[tid].shape[1:]},
        )
        for tid in graph.inputs
    ]
    alias: dict[str, str] = {}  # a SeparableConv2D's readers read its pointwise part
    for node in graph:
        layer = find_layer(model, node.layer) if node.is_layer else None
        # one name per input tensor, repeats kept: Add([x, x]) is 2x and Concatenate([x, x])
        # doubles the channels; dropping the repeat left the chip an Add2D with one input
        inputs = [_input_name(graph, t) for t in node.inputs]
        inputs = [alias.get(name, name) for name in inputs]
        output = any(graph.is_output(t) for t in node.outputs)
        if layer is not None and class_name(layer) in ("SeparableConv2D", "SeparableConv1D"):
            parts = _separable(layer, node, inputs, runtime)
            alias[node.name] = parts[-1].name
            if output:
                parts[-1].attrs["model_output"] = True
            result += parts
            continue
        op, weights, attrs = _translate(layer, node, runtime)
        if not node.is_layer and node.kind in REDUCTION_KINDS:
            attrs.update(_reduction_attrs(operations.get(node.layer)))
        if output:
            attrs["model_output"] = True
        if op == "dense":  # FullyConnected(flatten=...) in the C++ model
            attrs["input_rank"] = len(graph.tensors[node.inputs[0]].shape)
        result.append(SourceLayer(node.name, op, inputs, node.kind, weights, attrs))
    return result


def export_espdl(
    model: keras.Model,
    record: Record | str | os.PathLike | None,
    out_dir: str | os.PathLike | None,
    *,
    format: str = "v1",
    calibration_data: np.ndarray | None = None,
    exponents: str | None = None,
    **options: Any,
) -> ExportResult | V3ExportResult:
    """Export a calibrated Keras model for ESP-DL v1 (default) or as an ESP-DL v3 ``.espdl``
    file (``format="espdl"``): :func:`source_layers`, then the core's
    :func:`amct_bridge.espdl.export` or :func:`amct_bridge.espdl.v3.export.export_layers_v3`
    (which take framework-free layers only).

    Args:
        model: a built Functional or Sequential Keras 3 model.
        record: AMCT record (object or path); None to rely on the sidecar alone.
        out_dir: v1: directory to create; ``format="espdl"``: the ``.espdl`` file to write
            (None: compute only, write nothing).
        format: ``"v1"`` (config.json + npy for convert.py) or ``"espdl"`` (ESP-DL v3).
        calibration_data: inputs (NHWC, as the model takes them; e.g. the calibration
            batches): the exponents and bias corrections (``"espdl"`` on esp32p4: and
            per-channel filter exponents) are then searched on them, the format's chip
            simulator as judge (docs/espdl-export.md, "How exponents are chosen").
            ``format="espdl"``: also the ranges of the tensors inside MultiHeadAttention layers
            (query, key, value, scores, context), measured by running their sublayers
            (:func:`attention_ranges`); without it, bounds.
        exponents: "max" (the range rule) or "search"; default "search" with
            ``calibration_data``, else "max".
        **options: :func:`amct_bridge.espdl.export`'s options (stats, feature_type,
            granularity, target, skip_unsupported, overwrite, cpp); for ``"espdl"``:
            stats, target (esp32s3, esp32p4, c), feature_type (``"auto"`` with
            ``calibration_data``: the fewest int16 layers within ``max_drop``,
            :func:`amct_bridge.espdl.v3.mixed.choose_layer_bits`), max_drop, layer_bits
            (layer -> 8 / 16), test_input (float, the model's input), seed,
            skip_unsupported, overwrite.

    Example:
        >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="fc")])
        >>> r = TensorRange(-1.0, 1.0)
        >>> st = CalibrationStats(layers={"fc": LayerStats("Dense", input=r, output=r)})
        >>> export_espdl(m, None, None, stats=st).config["fc"]["output_exponent"]
        -6

    A record keyed by TF op names (``keys="tf_op"``) is re-keyed by layer name, as
    :func:`amct_bridge.keras.simulate` does.
    """
    layers = source_layers(model, format=format)  # refuses an unknown format
    if record is not None and not isinstance(record, Record):
        from amct_bridge.records import load

        side = sidecar_path(record)
        if options.get("stats") is None and Path(side).is_file():
            options["stats"] = side
        record = load(record)
    if record is not None and any(k not in {x.name for x in layers} for k in record.layers):
        rekeyed = by_keras_keys(model, record.layers)
        if rekeyed.keys() != record.layers.keys():
            record = Record(rekeyed, record.prune_records, flavor=record.flavor)
    attention = [x for x in layers if x.kind == "MultiHeadAttention"]
    rule = exponents or ("max" if calibration_data is None else "search")
    calibration = None
    auto = format == "espdl" and options.get("feature_type") == "auto"  # mixed s8/s16
    if (rule == "search" or auto) and calibration_data is not None:
        calibration = _search_data(model, layers, calibration_data, format)
    if format == "espdl":
        if calibration_data is not None and attention:  # the ranges inside attention layers
            attention_ranges(model, attention, np.asarray(calibration_data))
        check_rule(rule, calibration)
        options["search"] = rule == "search"
        return _export_v3(model, layers, record, out_dir, options, calibration)
    if calibration is not None:
        options["calibration"] = calibration
    return export(record, layers, out_dir, exponents=rule, **options)


def _search_data(model: keras.Model, layers, calibration_data, format: str) -> CalibrationData:
    """What an exponent search scores on (both formats): the first samples of
    ``calibration_data`` (the format's sample rule), as the chip takes them, and the float
    outputs of the model's layers on them."""
    from amct_bridge.errors import CalibrationError
    from amct_bridge.espdl.exponent_search import search_samples
    from amct_bridge.espdl.v1.head import chip_reference
    from amct_bridge.espdl.v3.search import v3_search_samples
    from amct_bridge.keras.calibrate import check_data_shapes

    try:  # refused, not searched-around: the user asked for a search on these inputs
        check_data_shapes(model, np.asarray(calibration_data))
    except CalibrationError as err:
        raise ExportError(str(err).replace("data", "calibration_data", 1)) from None
    x = np.asarray(calibration_data, np.float32)
    x = v3_search_samples(x, layers) if format == "espdl" else search_samples(x)
    # a classifier head's softmax / sigmoid: the search and the bias correction compare its
    # logits (v1 leaves the function to the host; v3's chip computes it from those logits)
    output, heads = chip_reference(layers, model.outputs[0]._keras_history.operation.name)
    floats = lambda names: float_outputs(model, x, names, 64, linear=heads)  # noqa: E731
    chip_x = chip_input(model, x, layers) if format == "espdl" else x  # v3: host layers first
    return CalibrationData(chip_x, floats, output, len(calibration_data), linear=heads)


def chip_input(model: keras.Model, x: np.ndarray, layers: list[SourceLayer] | None = None):
    """``x`` through the Rescaling / Normalization layers right after the model input: the
    ESP-DL v3 export runs them on the host, so the chip's input is their output.

    Example:
        >>> x = keras.Input((2,)); y = keras.layers.Rescaling(0.5, name="r")(x)
        >>> m = keras.Model(x, keras.layers.Dense(1)(y))
        >>> chip_input(m, np.float32([[2, 4]])).tolist()
        [[1.0, 2.0]]
    """
    layers = layers if layers is not None else source_layers(model)
    host = [s for s in layers if s.kind in HOST_INPUT_KINDS and s.inputs == [layers[0].name]]
    while host:
        x = np.asarray(keras.ops.convert_to_numpy(find_layer(model, host[0].name)(x)))
        host = [s for s in layers if s.kind in HOST_INPUT_KINDS and s.inputs == [host[0].name]]
    return x


def _export_v3(
    model: keras.Model, layers, record, out, options: dict, calibration=None
) -> V3ExportResult:
    """The v3 export (with ``calibration``: searched exponents, amct_bridge.espdl.v3.search);
    a test input goes through the host-side Rescaling/Normalization first."""
    stats = options.pop("stats", None)
    if stats is not None and not isinstance(stats, CalibrationStats):
        stats = load_stats(stats)
    test_input = options.pop("test_input", None)
    if test_input is not None:
        test_input = chip_input(model, np.asarray(test_input)[:1], layers)
    search = options.pop("search", False)
    known = {"target", "feature_type", "seed", "skip_unsupported", "overwrite"}
    unknown = set(options) - known - {"layer_bits", "max_drop"}  # mixed precision
    if unknown:
        raise ExportError(f"format 'espdl' does not take {', '.join(sorted(unknown))}")
    if calibration is not None or options.get("feature_type") == "auto" or "max_drop" in options:
        from amct_bridge.espdl.v3.search import export_searched

        return export_searched(
            layers,
            out,
            calibration=calibration,
            search=search,
            record=record,
            stats=stats,
            test_input=test_input,
            **options,
        )
    return export_layers_v3(
        layers, out, record=record, stats=stats, test_input=test_input, **options
    )
