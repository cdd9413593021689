"""MindSpore network -> the ESP-DL exporter's framework-free layer list (:class:`SourceLayer`),
and :func:`export_espdl` (``amct_bridge.mindspore.export_espdl``), the MindSpore entry.

Execution order, connectivity and names come from
:func:`amct_bridge.mindspore.graph.extract_graph` (``cells_and_names()`` names; functional ops
``layer1.0.add_op0``); this module says what each cell / op is for ESP-DL and copies the
numbers, **turned into the chip's NHWC layouts** (the Keras adapter hands over the same arrays
for a Keras twin):

- ``nn.Conv2d`` weight OIHW -> HWIO (``(kH, kW, Cin, Cout)``); depthwise (``group ==
  in_channels``) ``(C*m, 1, kH, kW)`` -> ``(kH, kW, C, m)`` (ESP-DL v1 takes m = 1 only);
- ``nn.Dense`` weight ``(out, in)`` -> ``(in, out)``. After a ``Flatten`` of an NCHW map
  (H*W > 1) its rows are reordered from MindSpore's channel-major ``c*HW + s`` to the chip's
  NHWC order ``s*C + c``, so the chip computes the same outputs;
- ``nn.BatchNorm2d`` gamma, beta, moving mean / variance and ``eps``; ``nn.ReLU``,
  ``nn.LeakyReLU`` (``alpha``), ``nn.PReLU`` (``w``); pools with ``kernel_size`` / ``stride``
  / ``pad_mode``; ``AdaptiveAvg/MaxPool2d(1)`` and ``ops.mean`` over H, W are global pools;
  functional ``x + y`` and ``ops.concat`` (channel axis 1 -> the chip's last axis);
- the model input's shape as the chip's ``(H, W, C)``;
- ``nn.Conv1d`` (weight ``(O, I, 1, k)``, MindSpore's own Conv2D of height 1) as that conv
  (HWIO ``(1, k, I, O)``, ``attrs["rank"] = 1``: :mod:`amct_bridge.espdl.source`) on NCW
  tensors, which the chip holds NWC (``(W, C)`` input; a Flatten of an NCW map before a Dense
  reorders its rows as for NCHW);
- for the ESP-DL v3 export also: element-wise ops whose operands broadcast (squeeze-excite's
  ``(N, C, H, W) * (N, C, 1, 1)``, the chip's ``(1, H, W, C) * (1, 1, 1, C)``) and scalar
  operands (``y + 3.0``, ``y / 6.0`` as ``y * (1 / 6.0)``: ``attrs["scalar_operands"]``), the
  global pools' ``keepdims``, ``nn.Upsample`` / ``ops.interpolate`` / resize primitives as
  UpSampling2D, ``nn.Conv2dTranspose`` (kernel ``(in, out, kH, kW)`` -> ``(kH, kW, out, in)``;
  ``pad_mode="pad"``: ``attrs["pads"]`` cropped off the full output), dilated convs
  (``attrs["dilations"]``), ``nn.GELU`` (exact: ``"gelu"``; the tanh approximation:
  ``"gelu_tanh"``), ``nn.ELU`` (``alpha``), ``nn.GRU`` / ``nn.LSTM`` (:func:`_rnn`: PyTorch's
  gates in Keras' layout; ``y[:, -1]`` makes a one-direction layer ``return_sequences=False``),
  ``nn.Embedding`` (its table), functional ``ops.sqrt`` / ``exp`` / ``log`` / ``-x`` /
  ``ops.pow`` / ``x / y`` and reductions over axes (``ops.amax`` / ``amin`` / ``sum`` /
  ``mean``: NCHW axes as the chip's NHWC ones), all by the core's (Keras') kinds; and sequences
  ``(N, T, D)`` (:func:`sequence_layout`: tokens, which the chip holds as they are, for
  nn.Dense / nn.LayerNorm over the features, ``ops.transpose`` and the functional
  ``ops.matmul`` / ``x @ y`` / ``ops.BatchMatMul`` of two of them: the core's ``Matmul``).

Anything else becomes an ``unsupported`` layer with the reason (the exporter refuses it, or
leaves it out with ``skip_unsupported``). The network is not modified.

Example:
    >>> from mindspore import nn
    >>> net = nn.SequentialCell([nn.Conv2d(3, 4, 3, has_bias=True), nn.ReLU()])
    >>> [(s.name, s.op, s.weights["kernel"].shape if s.weights else None)
    ...  for s in source_layers(net, (1, 3, 8, 8))]
    [('input0', 'input', None), ('0', 'conv2d', (3, 3, 3, 4)), ('1', 'relu', None)]
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from typing import Any

import numpy as np
from mindspore import nn

from amct_bridge.errors import ExportError
from amct_bridge.espdl import ExportResult, export
from amct_bridge.espdl.source import V1, SourceLayer, no_equivalent, runtime_name
from amct_bridge.espdl.v3.export import V3ExportResult, export_layers_v3
from amct_bridge.graph.ir import Graph, Node
from amct_bridge.mindspore.float_outputs import float_outputs
from amct_bridge.mindspore.graph import extract_graph, sequence_layout
from amct_bridge.mindspore.graph_cells import dense_activation
from amct_bridge.mindspore.weights import batch_norm_params, bias_of, kernel_of
from amct_bridge.records import load
from amct_bridge.records.calibration import CalibrationStats, load_stats, sidecar_path
from amct_bridge.records.model import Record

#: Coefficient-free graph kinds the ESP-DL v1 runtime has -> whether the output exponent is
#: the input's (as :data:`amct_bridge.keras.espdl_weights.RUNTIME_KINDS`).
_KEEPING = ("MaxPooling2D", "GlobalMaxPooling2D", "Flatten", "Concatenate", "Maximum", "Minimum")
_AVERAGING = ("AveragePooling2D", "GlobalAveragePooling2D", "Add", "Subtract")
#: 1-D pools (nn.MaxPool1d & co.): the 2-D ones at height 1 (``attrs["rank"] = 1``).
_POOLS_1D = ("MaxPooling1D", "GlobalMaxPooling1D", "AveragePooling1D", "GlobalAveragePooling1D")
RUNTIME_KINDS: dict[str, bool] = {
    **dict.fromkeys((*_KEEPING, "Dropout", "Identity"), True),
    **dict.fromkeys(_AVERAGING, False),
    "Multiply": False,
    **{kind: "Max" in kind for kind in _POOLS_1D},
}
_ELEMENTWISE = ("Add", "Subtract", "Multiply", "Maximum", "Minimum")
_PASS = ("Dropout", "Identity")
#: What to do instead, for cells users often have (ESP-DL v1).
HINTS: dict[str, str] = {
    "Softmax": "apply softmax on the host to the int outputs (it keeps the arg max)",
    "Conv2DTranspose": "ESP-DL v1 has no transposed convolution",
    "ReLU6": "retrain with nn.ReLU",
}
#: How the v3 export writes a transposed convolution, for its refusals.
_V3_TRANSPOSE = (
    "the ESP-DL v3 runtime runs a transposed convolution as InsertZeros + Conv, which this "
    "exporter writes for group 1 and NCHW"
)

Translated = tuple[str, dict, dict]


def _pair(value: Any) -> tuple[int, int]:
    """MindSpore's int / (h, w) / (1, 1, h, w) sizes -> (h, w)."""
    if isinstance(value, int):
        return int(value), int(value)
    vals = [int(v) for v in value]
    return vals[-2], vals[-1]


def _unsupported(reason: str) -> Translated:
    return "unsupported", {}, {"reason": reason}


def _same_pads(hw: tuple[int, int], kernel: tuple[int, int], strides: tuple[int, int]) -> list:
    """[top, bottom, left, right] of TF/ESP-DL SAME padding (the extra row/column at the end)."""
    pads = []
    for size, k, s in zip(hw, kernel, strides, strict=True):
        need = max((math.ceil(size / s) - 1) * s + k - size, 0)
        pads += [need // 2, need - need // 2]
    return pads


def effective_pads(
    hw: tuple[int, int], kernel: tuple[int, int], strides: tuple[int, int], pads: list[int]
) -> list[int]:
    """``[top, bottom, left, right]`` that a convolution actually reads: padding past the last
    window is never read (3x3, stride 2, padding 1 on an even size reads no bottom row).

    Example:
        >>> effective_pads((16, 16), (3, 3), (2, 2), [1, 1, 1, 1])
        [1, 0, 1, 0]
    """
    out = []
    for size, k, s, (before, after) in zip(hw, kernel, strides, (pads[:2], pads[2:]), strict=True):
        windows = (size + before + after - k) // s + 1
        read = (windows - 1) * s + k  # padded rows the windows cover
        out += [before, max(0, min(after, read - size - before))]
    return out


def _padding(cell: Any, hw: tuple[int, int], kernel: tuple[int, int], strides: tuple) -> dict:
    """``{"padding": "same" | "valid"}``, plus ``pads`` for explicit ones (``pad_mode='pad'``:
    the pads the windows read, PADDING_NOT_SET on the chip)."""
    mode = str(cell.pad_mode).lower()
    if mode in ("same", "valid"):
        return {"padding": mode}
    pad = getattr(cell, "padding", 0)
    pads = [int(pad)] * 4 if isinstance(pad, int) else [int(p) for p in pad]
    pads = effective_pads(hw, tuple(kernel), tuple(strides), pads)
    if not any(pads):
        return {"padding": "valid"}
    if pads == _same_pads(hw, kernel, strides):
        return {"padding": "same"}  # e.g. padding=1 around a 3x3 stride-1 kernel
    return {"padding": "valid", "pads": pads}


def _conv_transpose(cell: Any, node: Node, graph: Graph, runtime: str) -> Translated:
    """nn.Conv2dTranspose for the v3 export (ESP-DL v1 has none): the core's Conv2DTranspose
    (InsertZeros + Conv), kernel ``(in, out, kH, kW)`` -> Keras' ``(kH, kW, out, in)``;
    ``pad_mode`` "same" / "valid" (TF's output sizes) or "pad" (``attrs["pads"]``: cropped off
    the full output on each side, ONNX ConvTranspose's pads)."""
    if runtime == V1:
        return _unsupported(f"nn.Conv2dTranspose: {HINTS['Conv2DTranspose']}")
    problems = []
    if cell.data_format != "NCHW":
        problems.append(f"data_format {cell.data_format}")
    if int(cell.group) != 1:
        problems.append(f"group {cell.group} (grouped transposed convolution)")
    mode = str(cell.pad_mode).lower()
    pads = [int(p) for p in np.ravel(getattr(cell, "padding", 0))]
    crops = None
    if mode == "pad":  # crops [top, bottom, left, right] off the full output (ONNX's pads)
        mode, crops = "valid", (pads * 4 if len(pads) == 1 else pads)
        crops = crops if any(crops) else None
    output_padding = [int(v) for v in np.ravel(getattr(cell, "output_padding", 0))]
    if any(output_padding):
        problems.append(
            f"output_padding {cell.output_padding!r} (pad_mode='{cell.pad_mode}', "
            f"padding={cell.padding!r}): MindSpore appends rows and columns of zeros after the "
            "convolution and its bias, which the runtime's form does not write; leave it 0"
        )
    if node.shared:
        problems.append(_shared(node, graph))
    if problems:
        return _unsupported(f"nn.Conv2dTranspose with {', '.join(problems)}: {_V3_TRANSPOSE}")
    # y[o, i*s + h] += x[c, i] * W[c, o, h]: Keras' K[h, w, o, c] is W transposed
    weights = {"kernel": np.ascontiguousarray(kernel_of(cell, node.layer).transpose(2, 3, 1, 0))}
    bias = bias_of(cell)
    if bias is not None:
        weights["bias"] = bias
    attrs = {
        "reason": no_equivalent("MindSpore nn.Conv2dTranspose", runtime),
        "kind": "Conv2DTranspose",
        "activation": None,
        "padding": mode,
        "strides": _pair(cell.stride),
        "dilations": _pair(cell.dilation),
    }
    if crops is not None:
        attrs["pads"] = crops
    return "unsupported", weights, attrs


def _conv(cell: Any, node: Node, graph: Graph, runtime: str) -> Translated:
    if isinstance(cell, nn.Conv2dTranspose):
        return _conv_transpose(cell, node, graph, runtime)
    in_shape = graph.tensors[node.inputs[0]].shape
    one_d = isinstance(cell, nn.Conv1d)
    if one_d:  # NCW: the height-1 NCHW map nn.Conv1d's own Conv2D primitive reads
        in_shape = (in_shape[0], in_shape[1], 1, in_shape[2])
    problems = []
    if cell.data_format != "NCHW":
        problems.append(f"data_format {cell.data_format}")
    dilation = _pair(cell.dilation)
    if dilation != (1, 1) and runtime == V1:
        problems.append(f"dilation {dilation}")
    group, cin = int(cell.group), int(cell.in_channels)
    if group not in (1, cin):
        problems.append(f"group {group} (grouped convolution; only 1 and in_channels)")
    if node.shared:
        problems.append(_shared(node, graph))
    kernel = kernel_of(cell, node.layer)
    strides = _pair(cell.stride)
    reach = tuple((k - 1) * d + 1 for k, d in zip(kernel.shape[-2:], dilation, strict=True))
    padding = _padding(cell, tuple(in_shape[-2:]), reach, strides)
    if problems:
        return _unsupported(f"{', '.join(problems)}: not supported by the {runtime} exporter")
    attrs: dict = {"activation": None, "strides": strides, **padding}
    if dilation != (1, 1):  # ESP-DL v3 only (v1 refused it above)
        attrs["dilations"] = dilation
    if one_d:
        attrs["rank"] = 1
    if group == 1:
        op, hwio = "conv2d", kernel.transpose(2, 3, 1, 0)  # OIHW -> HWIO (HWCN)
    else:  # (C*m, 1, kH, kW): output c*m + k reads input c -> (kH, kW, C, m), as Keras
        op, m = "depthwise_conv2d", kernel.shape[0] // cin
        hwio = kernel.reshape(cin, m, *kernel.shape[-2:]).transpose(2, 3, 0, 1)
        attrs["depth_multiplier"] = m  # m > 1: the exporter refuses it with the reason
    weights = {"kernel": np.ascontiguousarray(hwio)}
    bias = bias_of(cell)
    if bias is not None:
        weights["bias"] = bias
    return op, weights, attrs


def _shared(node: Node, graph: Graph) -> str:
    """Why a cell with weights called at several sites is refused, naming the sites."""
    sites = [n.name for n in graph.nodes if n.layer == node.layer]
    return (
        f"cell {node.layer!r} called {len(sites)} times ({', '.join(sites)}; back to back "
        "counts too): a chip layer holds its own weights, one per call site, and the export "
        "writes one layer per cell; give each call its own cell"
    )


def _dense_activation(cell: Any, runtime: str) -> dict:
    """The activation ``nn.Dense`` applies itself, by Keras' name (``"softmax"``, ``"tanh"``:
    the core fuses, leaves to the host or refuses it by that name); an activation the graph
    has no name for keeps its class name (``"Mish"``), refused with it. A GELU is Keras'
    ``"gelu"`` (erf) only when not approximated: ``nn.Dense(activation="gelu")`` runs
    ``nn.GELU()``, the tanh form, which is the core's ``"gelu_tanh"`` (its own table, not
    the erf one)."""
    name = dense_activation(cell)
    if name == "linear":
        return {"activation": None}
    if name == "gelu" and _gelu_tanh(cell.activation):
        return {"activation": "gelu_tanh"}
    if name == "leaky_relu":
        return {"activation": name, "alpha": float(cell.activation.alpha)}
    if isinstance(cell.activation, nn.PReLU):
        return {"activation": "prelu"}  # its alpha is not read: refused by the core
    return {"activation": name}


def _gelu_tanh(cell: Any) -> bool:
    """Whether an nn.GELU computes the tanh approximation (``approximate=True``, the default)."""
    return str(getattr(cell, "approximate", "tanh")) != "none"


def _gelu(cell: Any, runtime: str) -> Translated:
    """nn.GELU: the exact (erf) one is Keras' ``Activation("gelu")``, the tanh approximation
    (``approximate=True``, the default) the core's ``"gelu_tanh"``; the v3 export tabulates
    either as the function it is."""
    reason = no_equivalent("MindSpore nn.GELU", runtime)
    if runtime == V1:
        return _unsupported(reason)
    name = "gelu_tanh" if _gelu_tanh(cell) else "gelu"
    return "unsupported", {}, {"reason": reason, "activation": name, "kind": "Activation"}


def _flatten_input(graph: Graph, tid: str) -> tuple[int, ...] | None:
    """Shape of the NCHW map a Flatten turned into ``tid`` (through Dropout/Identity), or None."""
    node = graph.producer_of(tid)
    while node is not None and node.kind in _PASS:
        node = graph.producer_of(node.inputs[0])
    if node is None or not _is_flatten(graph, node):
        return None
    return graph.tensors[node.inputs[0]].shape


def _dense(cell: Any, node: Node, graph: Graph, runtime: str, seq: bool) -> Translated:
    rank = len(graph.tensors[node.inputs[0]].shape)
    if rank == 3 and seq and runtime != V1:
        pass  # a sequence (N, T, D): the chip's Gemm works on the last axis too
    elif rank != 2:
        what = {4: "W of an NCHW map", 3: "W of an NCW map"}.get(rank, "its last axis")
        if rank == 3 and seq:
            what = "the features of each token"
        return _unsupported(
            f"nn.Dense on a rank-{rank} tensor works on its last axis ({what}), the "
            f"{runtime} FullyConnected on all of it: insert nn.Flatten before it"
        )
    if node.shared:
        return _unsupported(f"{_shared(node, graph)}: not supported by the {runtime} exporter")
    kernel = kernel_of(cell, node.layer).T  # (out, in) -> (in, out)
    shape = _flatten_input(graph, node.inputs[0])
    if seq and shape is not None and len(shape) == 3:
        shape = None  # a flattened (N, T, D) is t*D + d in MindSpore and on the chip
    if shape is not None and len(shape) in (3, 4) and int(np.prod(shape[2:])) > 1:
        c, hw = shape[1], int(np.prod(shape[2:]))  # rows c*HW + s (NCHW) -> s*C + c (NHWC)
        kernel = kernel.reshape(c, hw, -1).transpose(1, 0, 2).reshape(c * hw, -1)
    weights = {"kernel": np.ascontiguousarray(kernel)}
    bias = bias_of(cell)
    if bias is not None:
        weights["bias"] = bias
    return "dense", weights, {**_dense_activation(cell, runtime), "input_rank": rank}


def _batch_norm(cell: Any, node: Node) -> Translated:
    p = batch_norm_params(cell, node.layer)
    weights = {"gamma": p.gamma, "beta": p.beta, "mean": p.mean, "variance": p.var}
    return "batch_norm", weights, {"epsilon": float(p.eps)}


def _pool(cell: Any, node: Node, graph: Graph) -> Translated:
    kind = node.kind
    if kind in ("MaxPooling1D", "AveragePooling1D"):
        return _pool_1d(cell, node, graph)
    if isinstance(cell, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)):
        out = getattr(cell, "output_size", None)
        if out is None:
            out = cell.adaptive_avgpool2d.output_size
        if _pair(out) != (1, 1):
            return _unsupported(f"{type(cell).__name__} output_size {out}: only 1 (global pool)")
        kind = "GlobalMaxPooling2D" if kind == "MaxPooling2D" else "GlobalAveragePooling2D"
        return "runtime", {}, {"keeps_exponent": RUNTIME_KINDS[kind], "kind": kind}
    if cell is None:
        return _unsupported(f"functional {node.params.get('primitive')}: use nn.{kind[:3]}Pool2d")
    if str(cell.pad_mode).lower() == "pad":  # its pads live in a 3-D primitive: not read
        return _unsupported("pooling with pad_mode='pad': use pad_mode='same' or 'valid'")
    pool, strides = _pair(cell.kernel_size), _pair(cell.stride)
    in_shape = graph.tensors[node.inputs[0]].shape
    padding = _padding(cell, tuple(in_shape[-2:]), pool, strides)
    attrs = {"keeps_exponent": RUNTIME_KINDS[kind], "pool_size": pool, "strides": strides}
    return "runtime", {}, {**attrs, **padding}


def _pool_1d(cell: Any, node: Node, graph: Graph) -> Translated:
    """nn.MaxPool1d / nn.AvgPool1d (and their adaptive forms with output size 1, global
    pools) as the 2-D pools of height 1 they run (``attrs["rank"] = 1``)."""
    kind = node.kind
    if isinstance(cell, (nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)):
        if int(np.ravel(cell.output_size)[0]) != 1:
            why = f"{type(cell).__name__} output_size {cell.output_size}: only 1 (global pool)"
            return _unsupported(why)
        kind = f"Global{kind}"
        return "runtime", {}, {"keeps_exponent": RUNTIME_KINDS[kind], "kind": kind, "rank": 1}
    if getattr(cell, "use_pad", False) or str(cell.pad_mode).lower() == "pad":
        return _unsupported("pooling with pad_mode='pad': use pad_mode='same' or 'valid'")
    pool, strides = _pair(cell.kernel_size), _pair(cell.stride)
    width = graph.tensors[node.inputs[0]].shape[-1]
    padding = _padding(cell, (1, width), pool, strides)
    attrs = {"keeps_exponent": RUNTIME_KINDS[kind], "pool_size": pool, "strides": strides}
    return "runtime", {}, {**attrs, **padding, "kind": kind, "rank": 1}


def _is_flatten(graph: Graph, node: Node) -> bool:
    """``nn.Flatten`` / ``ops.flatten``, or a Reshape to ``(N, everything else)``."""
    if node.kind == "Flatten":
        return True
    if node.kind != "Reshape":
        return False
    src, out = graph.tensors[node.inputs[0]].shape, graph.tensors[node.outputs[0]].shape
    return len(out) == 2 and bool(src) and out == (src[0], int(np.prod(src[1:])))


def _flatten(node: Node, graph: Graph, seq: bool) -> Translated:
    shape = graph.tensors[node.inputs[0]].shape
    if len(shape) == 3 and seq:
        pass  # (N, T, D) flattens to t*D + d in MindSpore and on the chip
    elif len(shape) == 3 and shape[2] > 1 or len(shape) == 4 and shape[2] * shape[3] > 1:
        readers = _readers(graph, node)
        if not readers or any(r.kind != "Dense" for r in readers):
            return _unsupported(
                "Flatten of an NCHW map with H*W > 1 (NCW: W > 1) read by something other than "
                "nn.Dense: the chip flattens NHWC (s*C + c), MindSpore channel-major (c*HW + s); "
                "only a following Dense's rows can be reordered"
            )
    elif len(shape) not in (2, 3, 4):
        return _unsupported(f"Flatten of a rank-{len(shape)} tensor")
    return "runtime", {}, {"keeps_exponent": True, "kind": "Flatten"}


def _readers(graph: Graph, node: Node) -> list[Node]:
    """Nodes reading ``node``'s output through Dropout/Identity; [] if it is a model output."""
    out, todo = [], list(node.outputs)
    while todo:
        tid = todo.pop()
        if graph.is_output(tid):
            return []
        for user in graph.consumers_of(tid):
            if user.kind in _PASS:
                todo += user.outputs
            else:
                out.append(user)
    return out


def _functional(node: Node, graph: Graph, runtime: str, seq: bool) -> Translated:
    kind, prim = node.kind, node.params.get("primitive", node.kind)
    shapes = [graph.tensors[t].shape for t in node.inputs]
    producer = graph.producer_of(node.inputs[0]) if node.inputs else None
    rnn = producer is not None and producer.kind in ("GRU", "LSTM") and runtime != V1
    if rnn and prim == "StridedSlice":
        return _rnn_slice(node, graph, producer, runtime)
    if seq and shapes and len(shapes[0]) == 3 and runtime != V1:
        found = _sequence_op(node, graph, shapes, prim)
        if found is not None:
            return found
    if kind == "Relu":
        return "relu", {}, {}
    if kind == "Relu6":
        return "relu6", {}, {}  # refused by the plan with the replace_relu6 path
    if kind in _ELEMENTWISE or kind in ("Divide", "Power"):
        return _elementwise(node, shapes, runtime)
    if runtime != V1 and (kind in _UNARY or prim == "Reciprocal"):
        return _unary(node, prim, runtime)
    if runtime != V1 and kind in _REDUCTIONS and node.params.get("axis"):
        return _reduction(node, graph, shapes, seq, runtime)
    if kind == "UpSampling2D":
        return _upsample(node, graph, f"functional {prim}", runtime)
    if kind == "Concatenate":
        rank, axis = len(shapes[0]), int(node.params.get("axis", -1))
        nhwc = {4: {-3: -1, -2: -3, -1: -2}, 2: {-1: -1}}.get(rank, {}).get(axis)
        if rank == 3 and seq:
            nhwc = axis if axis in (-2, -1) else None  # (N, T, D): the chip's own axes
        if nhwc is None:
            return _unsupported(f"concat on axis {axis} of a rank-{rank} tensor (batch axis)")
        return "runtime", {}, {"keeps_exponent": True, "axis": nhwc}
    if kind == "GlobalAveragePooling2D" or kind == "GlobalMaxPooling2D":
        if len(shapes[0]) == 3:  # ops.mean(x, 2) of an NCW map: the 1-D global pool
            out = graph.tensors[node.outputs[0]].shape
            kind = kind.replace("2D", "1D")
            attrs = {"keepdims": len(out) == 3, "kind": kind, "rank": 1}
            return "runtime", {}, {"keeps_exponent": RUNTIME_KINDS[kind], **attrs}
        # ops.mean(x, (2, 3)) without keep_dims: (N, C), which the v3 export flattens to
        keep = len(graph.tensors[node.outputs[0]].shape) == len(shapes[0])
        return "runtime", {}, {"keeps_exponent": RUNTIME_KINDS[kind], "keepdims": keep}
    if _is_flatten(graph, node):
        return _flatten(node, graph, seq)
    if kind == "Matmul" and len(shapes) == 2 and not node.params.get("const_operands"):
        return _matmul(node, shapes, runtime, seq)
    if prim in ("ArgMaxWithValue", "ArgMinWithValue") and runtime != V1:
        short = "max" if "Max" in prim else "min"
        return _unsupported(
            f"functional {prim} (ops.{short} over an axis: values and indices): the {runtime} "
            f"export writes the values alone as Reduce{short.title()}; use ops.a{short}(x, axis, "
            "keepdims)"
        )
    return _unsupported(
        f"{no_equivalent(f'functional {prim}', runtime)} here (tensors are NCHW in MindSpore, "
        "NHWC on the chip)"
    )


def _rnn_slice(node: Node, graph: Graph, rnn: Node, runtime: str) -> Translated:
    """A StridedSlice of an nn.GRU / nn.LSTM's output: ``y[:, -1]`` of a one-direction layer is
    its last state, which the layer then outputs itself (``return_sequences=False``, see
    :func:`_rnn`): nothing to compute; any other slice is refused naming why."""
    bidirectional = bool(rnn.params.get("bidirectional"))
    if _last_step(graph, node) and not bidirectional:
        readers, _ = _rnn_readers(graph, rnn)
        if all(_last_step(graph, r) for r in readers):
            return "runtime", {}, {"keeps_exponent": True, "kind": "Identity"}
    if bidirectional and _last_step(graph, node):
        why = (
            f"y[:, -1] of the bidirectional {rnn.params.get('framework_class')} {rnn.name!r}: "
            "its backward half at the last step has read one step only, while the ESP-DL v3 "
            "runtime's bidirectional node gives the whole sequence (Y) or each direction's "
            "final state; read the sequence (e.g. ops.mean over the steps)"
        )
    else:
        why = (
            f"StridedSlice of the {rnn.params.get('framework_class')} {rnn.name!r} output: "
            f"the {runtime} export takes its last step y[:, -1] (one direction) or the whole "
            "sequence"
        )
    return _unsupported(why)


def _sequence_op(node: Node, graph: Graph, shapes: list, prim: str) -> Translated | None:
    """A functional op on a sequence (N, T, D), which the chip holds as it is: ``ops.mean``
    over T (the 1-D global pool of the chip's (W, C) view) and ``ops.transpose`` /
    ``x.swapaxes(1, 2)`` (the core's ``Transpose`` with ``perm``, as Keras gives
    ``keras.ops.transpose``: the core refuses a perm that moves the batch axis, naming it);
    None: the op is translated as for any tensor."""
    out = graph.tensors[node.outputs[0]].shape
    axes = tuple(node.params.get("axis") or ())
    if node.kind == "Mean" and axes == (-2,):
        kind = "GlobalAveragePooling1D"
        attrs = {"keepdims": len(out) == 3, "kind": kind, "rank": 1}
        return "runtime", {}, {"keeps_exponent": RUNTIME_KINDS[kind], **attrs}
    if node.kind == "Transpose":
        perm = node.params.get("axes")
        attrs = {"reason": no_equivalent(f"functional {prim}", "ESP-DL v3"), "kind": "Transpose"}
        return "unsupported", {}, {**attrs, "perm": None if perm is None else tuple(perm)}
    return None


def _matmul(node: Node, shapes: list, runtime: str, seq: bool) -> Translated:
    """A functional ``ops.matmul`` / ``x @ y`` / ``ops.BatchMatMul`` of two activations for the
    v3 export: the core's ``Matmul`` (as Keras gives ``keras.ops.matmul``) on sequences
    (N, T, D), which the chip holds as MindSpore does. ``attrs["transpose"]``: the primitive's
    (transpose_a, transpose_b), written as Transpose layers before it (:func:`source_layers`)."""
    prim = node.params.get("primitive", node.kind)
    if runtime == V1:
        return _unsupported(no_equivalent(f"functional {prim} of two activations (x @ y)", V1))
    if not seq or any(len(s) != 3 for s in shapes):
        return _unsupported(
            f"functional {prim} of shapes {shapes[0]} and {shapes[1]}: the {runtime} export "
            "writes the product of two token tensors (N, T, D) (attention's q @ kᵀ and "
            "attn @ v), which the chip holds as MindSpore does; MindSpore's NCHW (NCW) maps are "
            "NHWC (NWC) on the chip, so their last axes differ"
        )
    attrs = {"reason": no_equivalent(f"functional {prim}", runtime), "kind": "Matmul"}
    return "unsupported", {}, {**attrs, "transpose": node.params.get("transpose", (False, False))}


def _transposed_operands(layer: SourceLayer) -> list[SourceLayer]:
    """The Transpose layers ``<matmul>/transpose_a`` / ``/transpose_b`` a ``BatchMatMul``
    with transpose flags reads (the core's MatMul takes A and B as they are); ``layer``'s
    inputs are pointed at them."""
    flags = layer.attrs.pop("transpose", (False, False))
    parts = []
    for k, flag in enumerate(flags):
        if flag:
            name = f"{layer.name}/transpose_{'ab'[k]}"
            attrs = {"reason": layer.attrs["reason"], "perm": (0, 2, 1)}
            operand = [layer.inputs[k]]
            parts.append(SourceLayer(name, "unsupported", operand, "Transpose", {}, attrs))
            layer.inputs[k] = name
    return parts


#: Functional element-wise math the v3 export lowers by kind (amct_bridge.espdl.v3.lowering.math).
_UNARY = ("Sqrt", "Exp", "Log", "Negative")
#: Functional reductions (``ops.amax`` / ``amin`` / ``sum`` / ``mean`` over axes) -> the
#: core's kinds (Keras' keras.ops reductions).
_REDUCTIONS = ("Max", "Min", "Sum", "Mean")


def _unary(node: Node, prim: str, runtime: str) -> Translated:
    """``ops.sqrt`` / ``exp`` / ``log`` / ``-x`` (element-wise: any layout) as the core's kind;
    ``1.0 / x`` (``Reciprocal``) as a division of the number 1 by ``x``."""
    reason = no_equivalent(f"functional {prim}", runtime)
    if prim == "Reciprocal":
        return "unsupported", {}, {"reason": reason, "kind": "Divide",
                                   "scalar_operands": [(0, 1.0)]}  # fmt: skip
    return "unsupported", {}, {"reason": reason, "kind": node.kind}


def _reduction(node: Node, graph: Graph, shapes: list, seq: bool, runtime: str) -> Translated:
    """``ops.amax`` / ``amin`` / ``sum`` / ``mean`` over axes: the core's reduction with the
    axes of the chip's layout (NCHW axis 1 is its last; a sequence's as they are)."""
    rank = len(shapes[0])
    to_chip = {4: {1: 3, 2: 1, 3: 2}, 3: {} if seq else {1: 2, 2: 1}}.get(rank, {})
    axes = [int(a) % rank for a in node.params["axis"]]
    axes = tuple(sorted(to_chip.get(a, a) for a in axes))
    keep = len(graph.tensors[node.outputs[0]].shape) == rank
    prim = node.params.get("primitive", node.kind)
    attrs = {"reason": no_equivalent(f"functional {prim}", runtime), "kind": node.kind}
    return "unsupported", {}, {**attrs, "axis": axes, "keepdims": keep, "initial": None}


def _elementwise(node: Node, shapes: list[tuple[int, ...]], runtime: str) -> Translated:
    """``x + y``, ``x * s`` (SE gating: NCHW operands broadcast as the chip's NHWC ones do),
    ``x + 3.0`` and ``x / 6.0`` (a scalar operand, ``attrs["scalar_operands"]``; ``x / c`` is
    ``x * (1 / c)``) for the v3 export, and the core's ``Divide`` (``x / y``, ``c / x``) and
    ``Power`` (``ops.pow(x, 2.0)``); ESP-DL v1 takes two tensors of one shape."""
    kind, prim = node.kind, node.params.get("primitive", node.kind)
    scalars = [(int(i), float(v)) for i, v in node.params.get("scalar_operands") or []]
    if node.params.get("const_operands", 0):
        why = f"{prim} with a constant tensor operand (a Parameter or an array)"
        hint = "fold it into the layer before it, or give it as a cell with weights"
        return _unsupported(f"{no_equivalent(why, runtime)} ({hint})")
    if scalars and runtime == V1:
        return _unsupported(no_equivalent(f"{prim} with a constant operand", runtime))
    if len(shapes) + len(scalars) != 2:
        return _unsupported(f"{prim} of {len(shapes) + len(scalars)} operands: not exported")
    if kind in ("Divide", "Power") and runtime == V1:
        return _unsupported(f"{prim}: ESP-DL v1 has no {'division' if kind == 'Divide' else kind}")
    if kind == "Divide" and scalars == [(1, 0.0)]:
        return _unsupported(f"{prim}: division by 0 (no finite result to quantize)")
    if kind == "Divide" and [i for i, _ in scalars] == [1]:
        kind, scalars = "Multiply", [(1, 1.0 / scalars[0][1])]  # what the chip's Mul computes
    # else x / y, c / x: the core's Div (the runtime divides in float32, rounded once)
    if len(shapes) == 2 and shapes[0] != shapes[1]:
        try:
            np.broadcast_shapes(*shapes)
        except ValueError:
            return _unsupported(f"{prim} of shapes {shapes[0]} and {shapes[1]}: no broadcast")
        if len(shapes[0]) != len(shapes[1]):  # NCHW aligns W with the other's last axis
            return _unsupported(
                f"{prim} of shapes {shapes[0]} and {shapes[1]}: operands of different ranks "
                "broadcast from MindSpore's last axis (W of NCHW), the chip's from C (NHWC); "
                "reshape the smaller operand to the rank of the other (e.g. (N, C, 1, 1))"
            )
        if runtime == V1:
            return _unsupported(
                f"{prim} of shapes {shapes[0]} and {shapes[1]} (broadcast): ESP-DL v1's "
                "element-wise layers take operands of one shape (ESP-DL v3 broadcasts)"
            )
    if kind in ("Divide", "Power"):  # the core's math lowerings
        attrs: dict = {"reason": no_equivalent(prim, runtime), "kind": kind}
        return "unsupported", {}, {**attrs, "scalar_operands": scalars}
    attrs = {"keeps_exponent": RUNTIME_KINDS[kind], "kind": kind}
    if scalars:
        attrs["scalar_operands"] = scalars
    return "runtime", {}, attrs


def _upsample(node: Node, graph: Graph, what: str, runtime: str) -> Translated:
    """``nn.Upsample`` / ``ops.interpolate`` / ``ops.ResizeNearestNeighbor`` as the core's
    UpSampling2D (``size`` the integer scales, ``interpolation``): a nearest resize by an
    integer factor repeats each pixel, a bilinear one (``align_corners=False``: half-pixel
    centres, clamped edges) is TF's, which the core writes; others are refused naming why."""
    p = node.params
    if runtime == V1:
        return _unsupported(f"{what}: ESP-DL v1 has no resize layer")
    shape = graph.tensors[node.inputs[0]].shape if node.inputs else ()
    out = graph.tensors[node.outputs[0]].shape
    mode = str(p.get("interpolation", "nearest"))
    if len(shape) != 4:
        return _unsupported(
            f"{what} of a rank-{len(shape)} tensor: the {runtime} export takes NCHW maps"
        )
    if p.get("size") is None:
        return _unsupported(
            f"{what} from {shape[2]}x{shape[3]} to {out[2]}x{out[3]}: not an integer scale; "
            f"the {runtime} export upsamples by integer factors only"
        )
    if p.get("align_corners"):
        return _unsupported(
            f"{what} {mode} with align_corners=True: it samples the input at "
            f"i * (in - 1) / (out - 1), while the {runtime} export repeats each pixel "
            "(nearest) or interpolates between half-pixel centres (bilinear); use "
            "align_corners=False"
        )
    if mode == "bilinear" and not p.get("half_pixel_centers"):
        return _unsupported(
            f"{what} bilinear without half_pixel_centers: it samples the input at i * in / out "
            f"(the legacy ResizeBilinear), the {runtime} export between half-pixel centres "
            "(nn.Upsample / ops.interpolate with align_corners=False)"
        )
    # the core writes nearest and (half-pixel) bilinear, or refuses another mode naming why
    attrs = {"keeps_exponent": mode == "nearest", "kind": "UpSampling2D", "size": tuple(p["size"])}
    return "runtime", {}, {**attrs, "interpolation": mode}


def _layer_norm(cell: Any, node: Node, graph: Graph, runtime: str, seq: bool) -> Translated:
    """nn.LayerNorm for the v3 export: the normalized NCHW axes as NHWC axes, gamma and beta
    in the chip's order (C, H, W -> H, W, C); a sequence's (N, T, D) axes as they are."""
    op, _, attrs = _unsupported(no_equivalent("MindSpore nn.LayerNorm", runtime))
    rank = len(graph.tensors[node.inputs[0]].shape)
    begin = int(cell.begin_norm_axis) % rank
    nhwc = {4: {1: 3, 2: 1, 3: 2}, 2: {1: 1}}.get(rank)
    if rank == 3 and seq:
        nhwc = {1: 1, 2: 2}
    if nhwc is None or begin == 0 or int(cell.begin_params_axis) % rank != begin:
        attrs["reason"] = (
            f"nn.LayerNorm on a rank-{rank} tensor from axis {begin} (params from "
            f"{cell.begin_params_axis}): the chip takes rank 2, 4 or a sequence (N, T, D), "
            "gamma over the normalized axes"
        )
        return op, {}, attrs
    attrs.update({"axis": sorted(nhwc[a] for a in range(begin, rank))})
    attrs["epsilon"] = float(cell.epsilon)
    weights = {}
    for key in ("gamma", "beta"):
        value = np.asarray(getattr(cell, key).asnumpy(), np.float32)
        if rank == 4 and begin == 1:
            value = value.transpose(1, 2, 0)  # (C, H, W) -> (H, W, C)
        weights[key] = value.reshape(-1)
    return op, weights, attrs


#: MindSpore's (PyTorch's) GRU gate blocks r, z, n in Keras' order z, r, h (the core reads
#: Keras' layout: amct_bridge.espdl.v3.lowering.rnn); an LSTM's i, f, g, o are Keras' i, f, c, o.
_GRU_TO_KERAS = (1, 0, 2)


def _last_step(graph: Graph, node: Node) -> bool:
    """``y[:, -1]`` (or ``y[:, -1, :]``) of a sequence ``(N, T, D)``: a StridedSlice that
    keeps axes 0 and 2 whole and picks the last step of axis 1."""
    p = node.params.get("slice")
    if node.params.get("primitive") != "StridedSlice" or not p or len(p) < 8:
        return False
    shape = graph.tensors[node.inputs[0]].shape
    out = graph.tensors[node.outputs[0]].shape
    begin, strides, ellipsis, new_axis, shrink = p[0], p[2], p[5], p[6], p[7]
    if len(shape) != 3 or tuple(out) != (shape[0], shape[2]) or len(begin) < 2:
        return False
    plain = all(int(s) == 1 for s in strides) and not ellipsis and not new_axis
    return plain and int(shrink) == 2 and int(begin[1]) % shape[1] == shape[1] - 1


def _rnn_readers(graph: Graph, node: Node) -> tuple[list[Node], bool]:
    """Who reads an nn.GRU / nn.LSTM call's output sequence ``(N, T, dirs·H)``, and whether
    anything else of the call (its states ``h_n``, ``c_n``) is read."""
    n, steps = graph.tensors[node.inputs[0]].shape[:2]
    width = int(node.params["units"]) * (2 if node.params.get("bidirectional") else 1)
    seq = [t for t in node.outputs if graph.tensors[t].shape == (n, steps, width)]
    used = any(graph.consumers_of(t) or graph.is_output(t) for t in node.outputs if t not in seq)
    if not seq or graph.is_output(seq[0]):
        return [], used
    return graph.consumers_of(seq[0]), used


def _folds_last_step(graph: Graph, rnn: Node, cell: Any) -> bool:
    """Whether the only readers of a one-direction RNN's sequence take its last step: the
    layer is then ``return_sequences=False`` (the runtime's ``Y_h``)."""
    readers, _ = _rnn_readers(graph, rnn)
    one_way = not bool(getattr(cell, "bidirectional", True))
    return one_way and bool(readers) and all(_last_step(graph, r) for r in readers)


def _rnn(cell: Any, node: Node, graph: Graph, runtime: str) -> Translated:
    """nn.GRU / nn.LSTM (``batch_first``, one layer, either direction) for the v3 export: the
    core's GRU / LSTM / Bidirectional in Keras' layout (``kernel [dirs, I, G·H]``,
    ``recurrent_kernel [dirs, H, G·H]``; a GRU's ``bias [dirs, 2, 3H]`` input then recurrent,
    PyTorch's reset-after GRU being Keras' ``reset_after=True``; an LSTM's one bias
    ``b_ih + b_hh``); ``y[:, -1]`` of a one-direction layer makes it ``return_sequences=False``.
    """
    what = f"MindSpore nn.{type(cell).__name__}"
    kind = "LSTM" if isinstance(cell, nn.LSTM) else "GRU"
    reason = no_equivalent(what, runtime)
    if runtime == V1:
        return _unsupported(reason)
    dirs = 2 if cell.bidirectional else 1
    problems = []
    if int(cell.num_layers) != 1:
        problems.append(
            f"num_layers={cell.num_layers} (the runtime's {kind} node is one layer: stack "
            f"{cell.num_layers} nn.{type(cell).__name__} cells of one layer each)"
        )
    if not cell.batch_first:
        problems.append(
            "batch_first=False (the runtime reads a sequence [1, steps, features]: give "
            "batch_first=True and (N, T, D) inputs)"
        )
    if len(node.inputs) != 1:
        problems.append(
            "an initial state hx (the runtime starts every inference from a zero state: "
            "call the cell on the sequence alone)"
        )
    readers, states = _rnn_readers(graph, node)
    if states:
        problems.append(
            "its final states h_n / c_n read (this export writes the output sequence; its last "
            "step, y[:, -1], is the last state of a one-direction layer)"
        )
    if node.shared:
        problems.append(_shared(node, graph))
    if problems:
        why = f"{what} with {'; '.join(problems)}"
        return "unsupported", {}, {"reason": why, "kind": "Bidirectional" if dirs == 2 else kind}
    hidden, gates = int(cell.hidden_size), 3 if kind == "GRU" else 4
    order = _GRU_TO_KERAS if kind == "GRU" else tuple(range(4))

    def keras(m: np.ndarray) -> np.ndarray:  # gate blocks on axis 0 in Keras' order
        blocks = m.reshape(gates, hidden, *m.shape[1:])
        return np.concatenate([blocks[k] for k in order])

    def get(params: Any, d: int) -> np.ndarray:
        return np.asarray(params[d].asnumpy(), np.float32)

    weights = {
        "kernel": np.stack([keras(get(cell.w_ih_list, d)).T for d in range(dirs)]),
        "recurrent_kernel": np.stack([keras(get(cell.w_hh_list, d)).T for d in range(dirs)]),
    }
    if cell.has_bias:
        b_ih = [keras(get(cell.b_ih_list, d)) for d in range(dirs)]
        b_hh = [keras(get(cell.b_hh_list, d)) for d in range(dirs)]
        if kind == "GRU":
            weights["bias"] = np.stack([np.stack(pair) for pair in zip(b_ih, b_hh, strict=True)])
        else:
            weights["bias"] = np.stack([a + b for a, b in zip(b_ih, b_hh, strict=True)])
    weights = {k: np.ascontiguousarray(v) for k, v in weights.items()}
    attrs = {
        "reason": reason,
        "kind": "Bidirectional" if dirs == 2 else kind,
        "cell": kind,
        "units": hidden,
        "return_sequences": not _folds_last_step(graph, node, cell),
        "return_state": False,
        "go_backwards": False,
        "stateful": False,
        "activation": "tanh",
        "recurrent_activation": "sigmoid",
    }
    if kind == "GRU":
        attrs["reset_after"] = True  # PyTorch's GRU: r * (W_hn h + b_hn)
    if dirs == 2:
        attrs["merge_mode"] = "concat"  # forward then backward per step, as Keras'
    return "unsupported", weights, attrs


def _translate(cell: Any, node: Node, graph: Graph, runtime: str, seq: bool) -> Translated:
    """(op, weights, attrs) of one graph node (``attrs["kind"]`` overrides the node's kind);
    refusal reasons name ``runtime`` (:func:`amct_bridge.espdl.source.runtime_name`); ``seq``:
    rank-3 tensors are sequences (N, T, D), not NCW maps (:func:`sequence_layout`)."""
    if cell is None:
        if node.kind in ("MaxPooling2D", "AveragePooling2D"):
            return _pool(None, node, graph)
        return _functional(node, graph, runtime, seq)
    kind = node.kind
    if isinstance(cell, nn.PReLU):  # not in the graph's cell table: an opaque leaf call
        return "prelu", {"alpha": np.asarray(cell.w.asnumpy(), np.float32)}, {}
    if kind in ("GRU", "LSTM"):
        return _rnn(cell, node, graph, runtime)
    if isinstance(cell, nn.Embedding) and runtime != V1:  # the core looks the table up
        table = np.asarray(cell.embedding_table.asnumpy(), np.float32)
        attrs = {"reason": no_equivalent("MindSpore nn.Embedding", runtime), "kind": "Embedding"}
        return "unsupported", {"embeddings": table}, attrs  # padding_idx: a row of the table
    if kind in ("Conv2D", "Conv2DTranspose", "Conv1D"):
        return _conv(cell, node, graph, runtime)
    if kind == "Dense":
        return _dense(cell, node, graph, runtime, seq)
    if kind == "BatchNormalization":
        return _batch_norm(cell, node)
    if kind == "ReLU":
        return ("relu6" if node.params.get("max_value") is not None else "relu"), {}, {}
    if kind == "LeakyReLU":
        return "leaky_relu", {}, {"alpha": float(cell.alpha)}
    if kind in ("MaxPooling2D", "AveragePooling2D", "MaxPooling1D", "AveragePooling1D") or (
        isinstance(cell, (nn.MaxPool2d, nn.AvgPool2d))
    ):
        return _pool(cell, node, graph)  # pad_mode="pad" runs a 3-D primitive: kind unknown
    if kind == "Flatten":
        return _flatten(node, graph, seq)
    if kind == "UpSampling2D":
        return _upsample(node, graph, f"nn.{type(cell).__name__}", runtime)
    if isinstance(cell, nn.LayerNorm) and node.inputs:  # v1 refuses it; the v3 export reads it
        return _layer_norm(cell, node, graph, runtime, seq)
    if isinstance(cell, nn.GELU):
        return _gelu(cell, runtime)
    if isinstance(cell, nn.ELU) and runtime != V1:  # the v3 export reads alpha (Keras' ELU)
        alpha = float(cell.elu.attrs.get("alpha", 1.0))
        reason = no_equivalent("MindSpore nn.ELU", runtime)
        return "unsupported", {}, {"reason": reason, "kind": "ELU", "alpha": alpha}
    if kind in _PASS:
        return "runtime", {}, {"keeps_exponent": True}
    name = type(cell).__name__
    own = type(cell).__module__.startswith("mindspore.")
    reason = no_equivalent(f"{'MindSpore nn.' if own else 'cell class '}{name}", runtime)
    hint = HINTS.get(kind if kind in HINTS else name) if runtime == V1 else None
    op, weights, attrs = _unsupported(f"{reason} ({hint})" if hint else reason)
    if isinstance(cell, nn.Softmax) and node.inputs:  # the ESP-DL v3 export reads the axis
        rank = len(graph.tensors[node.inputs[0]].shape)
        value = cell.softmax.attrs.get("axis", -1)  # the primitive holds it: ops.Softmax(axis)
        axis = int(np.ravel(value)[0]) % rank if np.size(value) == 1 else None
        axes = {2: {1: -1}, 4: {1: -1, 2: 1, 3: 2}, 3: {1: 1, 2: -1} if seq else {1: -1, 2: 1}}
        attrs["axis"] = axes.get(rank, {}).get(axis, "nchw")
    if kind == "Activation":  # a final nn.Sigmoid is left to the host (espdl.v1.head)
        attrs["activation"] = node.params.get("activation")
    return op, weights, attrs


def _input_name(graph: Graph, tid: str) -> str:
    producer = graph.producer_of(tid)
    return producer.name if producer is not None else tid


def _chip_shape(shape: tuple[int, ...], seq: bool) -> tuple[int, ...]:
    """An NCHW (NCW) input's shape without the batch axis, as the chip's HWC (WC); a
    sequence (N, T, D) as it is."""
    if len(shape) == 3 and not seq:
        return shape[2], shape[1]
    return (shape[2], shape[3], shape[1]) if len(shape) == 4 else tuple(shape[1:])


def _layout(shape: tuple[int, ...], seq: bool) -> str:
    """The input's MindSpore layout, which ``test_input`` and chip data are transposed from."""
    if len(shape) == 3:
        return "NTD" if seq else "NCW"
    return {4: "NCHW"}.get(len(shape), "NC")


def source_layers(net: nn.Cell, sample_input: Any, *, format: str = "v1") -> list[SourceLayer]:
    """Translate ``net`` into :class:`SourceLayer` objects in execution order (NHWC layouts).

    Args:
        net: the network (it must compile in GRAPH_MODE with ``sample_input``; not run).
        sample_input: input shape such as ``(1, 3, 16, 16)``, an array or a Tensor.
        format: the export the layers are for (``"v1"`` or ``"espdl"``): refusal reasons
            name its runtime.

    Example:
        >>> from mindspore import nn
        >>> layers = source_layers(nn.Dense(4, 2), (1, 4))
        >>> layers[0].attrs["shape"], layers[1].weights["kernel"].shape
        ((4,), (4, 2))
    """
    runtime = runtime_name(format)
    graph = extract_graph(net, sample_input)
    cells = dict(net.cells_and_names())
    seq = sequence_layout(graph, cells)
    result = []
    for tid in graph.inputs:
        shape = graph.tensors[tid].shape
        attrs = {"shape": _chip_shape(shape, seq), "layout": _layout(shape, seq)}
        result.append(SourceLayer(tid, "input", kind="Input", attrs=attrs))
    for node in graph:
        cell = cells.get(node.layer) if node.is_layer else None
        op, weights, attrs = _translate(cell, node, graph, runtime, seq)
        kind = attrs.pop("kind", None)
        if kind is None:  # messages name the MindSpore class; runtime kinds are the core's
            kind = node.kind
            if op != "runtime":
                kind = (
                    type(cell).__name__ if cell is not None else str(node.params.get("primitive"))
                )
        if any(graph.is_output(t) for t in node.outputs):
            attrs["model_output"] = True
        inputs = [_input_name(graph, t) for t in node.inputs]
        if node.is_layer:  # a functional op keeps repeats: x * x squares, concat(x, x) doubles
            inputs = list(dict.fromkeys(inputs))
        layer = SourceLayer(node.name, op, inputs, kind, weights, attrs)
        if kind == "Matmul":
            result += _transposed_operands(layer)
        result.append(layer)
    return result


def _why_unknown(key: str, names: list[str], cells: dict) -> str:
    if key in cells:
        return " (a cell construct never calls)"
    close = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _resolve(record: Any, stats: Any) -> tuple[Record | None, CalibrationStats | None]:
    if isinstance(record, (str, os.PathLike)):
        path, record = record, load(record)
        if stats is None and sidecar_path(path).is_file():
            stats = sidecar_path(path)
    if isinstance(stats, (str, os.PathLike)):
        stats = load_stats(stats)
    return record, stats


def _call_sites(stats: CalibrationStats | None, layers: list[SourceLayer]) -> Any:
    """A cell called at several sites has one probe (merged ranges): every call site
    (``relu@1``) gets the cell's ranges unless the sidecar has its own."""
    if stats is None:
        return None
    extra = {
        x.name: stats.layers[x.name.split("@")[0]]
        for x in layers
        if "@" in x.name and x.name not in stats.layers and x.name.split("@")[0] in stats.layers
    }
    if not extra:
        return stats
    # replace keeps the rest (model, record_keys, flavor, source): the export checks them
    return dataclasses.replace(stats, layers={**stats.layers, **extra})


def export_espdl(
    net: nn.Cell,
    record: Record | str | os.PathLike | None,
    out_dir: str | os.PathLike | None,
    *,
    sample_input: Any,
    stats: CalibrationStats | str | os.PathLike | None = None,
    format: str = "v1",
    calibration_data: Any = None,
    exponents: str | None = None,
    **options: Any,
) -> ExportResult | V3ExportResult:
    """Export a calibrated MindSpore network for ESP-DL v1 (default) or as an ESP-DL v3
    ``.espdl`` file (``format="espdl"``): :func:`source_layers`, then the core's
    :func:`amct_bridge.espdl.export` or :func:`amct_bridge.espdl.v3.export.export_layers_v3`.
    Coefficients are NHWC (the chip's layout) also for NCHW networks; the chip takes its input
    as ``(H, W, C)`` (a v3 ``test_input`` is given NCHW, as the network takes it).

    Args:
        net: the network (record keys and sidecar keys are its ``cells_and_names()`` names).
        record: AMCT record (MindSpore or inner flavor; object or path); None: sidecar only.
        out_dir: v1: directory to create; ``"espdl"``: the file (None: compute only).
        sample_input: input shape (``(1, 3, 16, 16)``), array or Tensor, for the graph.
        stats: calibration sidecar (object or path); default ``<record>.calib.json``.
        format: ``"v1"`` or ``"espdl"`` (ESP-DL v3).
        calibration_data: inputs (as the network takes them, NCHW): the exponents and bias
            corrections (``"espdl"`` on esp32p4: and per-channel filter exponents) are then
            searched on them, the format's chip simulator as judge (docs/espdl-export.md,
            "How exponents are chosen").
        exponents: "max" (the range rule) or "search"; default "search" with
            ``calibration_data``, else "max".
        **options: :func:`amct_bridge.espdl.export`'s options (feature_type, granularity,
            target, skip_unsupported, overwrite, cpp); for ``"espdl"``: target, feature_type
            (``"auto"`` with ``calibration_data``: int8 with the fewest int16 layers within
            ``max_drop``, amct_bridge.espdl.v3.mixed), max_drop, layer_bits (layer -> 8 / 16),
            test_input, seed, skip_unsupported, overwrite.

    Example:
        >>> from mindspore import nn
        >>> from collections import OrderedDict
        >>> from amct_bridge.records.calibration import LayerStats, TensorRange
        >>> r = TensorRange(-1.0, 1.0)
        >>> st = CalibrationStats(layers={"fc": LayerStats("Dense", input=r, output=r)})
        >>> net = nn.SequentialCell(OrderedDict(fc=nn.Dense(4, 2)))
        >>> entry = export_espdl(net, None, None, sample_input=(1, 4), stats=st).config["fc"]
        >>> entry["operation"], entry["input_exponent"], entry["output_exponent"]
        ('fully_connected', -6, -6)
    """
    layers = source_layers(net, sample_input, format=format)  # refuses an unknown format
    record, stats = _resolve(record, stats)
    if record is not None:
        names = [x.name for x in layers]
        unknown = [k for k in record.layers if k not in names]
        if unknown:
            cells = dict(net.cells_and_names())
            listing = ", ".join(f"{k!r}{_why_unknown(k, names, cells)}" for k in unknown)
            raise ExportError(
                f"record keys that are not cells of {type(net).__name__} (is this the network the "
                f"record was made for?): {listing}"
            )
    stats = _call_sites(stats, layers)
    rule = exponents or ("max" if calibration_data is None else "search")
    calibration = None
    auto = format == "espdl" and options.get("feature_type") == "auto"  # mixed s8/s16
    if (rule == "search" or auto) and calibration_data is not None:
        calibration = _search_data(net, layers, calibration_data, format)
    if format == "espdl":
        from amct_bridge.espdl.exponent_search import check_rule

        check_rule(rule, calibration)
        test_input = options.pop("test_input", None)
        if test_input is not None:
            test_input = chip_data(np.asarray(test_input), layers[0].attrs.get("layout", ""))
        v3 = {"record": record, "stats": stats, "test_input": test_input, **options}
        if calibration is not None or auto or "max_drop" in options:
            from amct_bridge.espdl.v3.search import export_searched

            search = rule == "search"
            return export_searched(layers, out_dir, calibration=calibration, search=search, **v3)
        return export_layers_v3(layers, out_dir, **v3)
    if calibration is not None:
        options["calibration"] = calibration
    return export(record, layers, out_dir, stats=stats, exponents=rule, **options)


def _search_data(net: nn.Cell, layers: list[SourceLayer], calibration_data: Any, format: str):
    """What an exponent search scores on (both formats): the first samples of
    ``calibration_data`` (the format's sample rule), as the chip takes them (NHWC), and the
    float outputs of the network's cells on them (NHWC, by cell call site)."""
    from amct_bridge.espdl.exponent_search import CalibrationData, search_samples
    from amct_bridge.espdl.v1.head import chip_reference
    from amct_bridge.espdl.v3.search import v3_search_samples

    x = np.asarray(calibration_data, np.float32)
    x = v3_search_samples(x, layers) if format == "espdl" else search_samples(x)
    # a classifier head's softmax / sigmoid: the search and the bias correction compare its
    # logits (v1 leaves the function to the host; v3's chip computes it from those logits)
    output, linear = chip_reference(layers, _output_cell(layers))
    floats = float_outputs(net, x, 64, linear=linear).floats
    chip_x = chip_data(x, layers[0].attrs.get("layout", ""))
    return CalibrationData(chip_x, floats, output, len(calibration_data), linear=linear)


def chip_data(x: np.ndarray, layout: str) -> np.ndarray:
    """Network input data as the chip takes it: NCHW -> NHWC, NCW -> NWC; a sequence
    ``"NTD"`` (and ``"NC"``) as it is. ``layout``: the input SourceLayer's
    ``attrs["layout"]`` (:func:`source_layers`).

    Example:
        >>> chip_data(np.zeros((2, 3, 8, 5)), "NCHW").shape
        (2, 8, 5, 3)
        >>> chip_data(np.zeros((2, 6, 4)), "NTD").shape
        (2, 6, 4)
    """
    if x.ndim == 4 and layout in ("NCHW", ""):
        return x.transpose(0, 2, 3, 1)
    if x.ndim == 3 and layout in ("NCW", ""):
        return x.transpose(0, 2, 1)
    return x


def _output_cell(layers: list[SourceLayer]) -> str | None:
    """The layer of the network's first output (None: the chip's first output)."""
    outputs = [x.name for x in layers if x.attrs.get("model_output")]
    return outputs[0] if outputs else None
