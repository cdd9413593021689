"""The exporter's framework-free view of a model: layers in execution order, plain numpy weights.

Adapters (``amct_bridge.keras.espdl_weights``) translate a framework model into a list of
:class:`SourceLayer`; the exporter core reads nothing else. ``op`` is a small vocabulary (what the
layer *is* for ESP-DL), ``kind`` the framework class for messages:

==================  ========================================================================
op                  weights / attrs
==================  ========================================================================
input               model input (no weights)
conv2d              ``kernel`` HWIO, optional ``bias``; attrs ``activation``, ``alpha``,
                    ``strides``, ``padding`` ("same" / "valid"), ``pads`` (a "valid" conv's own
                    explicit ``[top, bottom, left, right]``: PADDING_NOT_SET)
depthwise_conv2d    ``kernel`` H, W, C, multiplier; attrs ``depth_multiplier``, ``activation``,
                    as conv2d
dense               ``kernel`` (in, out), optional ``bias``; attrs ``activation``, ``alpha``
batch_norm          ``gamma``, ``beta``, ``mean``, ``variance``; attrs ``epsilon``
relu                (no weights)
leaky_relu          attrs ``alpha`` (float)
prelu               ``alpha`` (one per channel, or broadcastable to it)
relu6               (refused: ESP-DL v1 has no ReLU6)
runtime             a coefficient-free layer the ESP-DL runtime has (pooling, Add2D, Concat,
                    Reshape, Pad...); attrs ``keeps_exponent`` (bool: output exponent = input's),
                    ``pool_size`` / ``strides`` / ``padding`` (pools; ZeroPadding2D: its
                    ``padding``), ``axis`` (Concat), ``target_shape`` (Reshape), ``dims``
                    (Permute, 1-based as Keras)
unsupported         anything else; attrs ``reason``
==================  ========================================================================

A 1-D layer (Keras Conv1D / DepthwiseConv1D / SeparableConv1D and the 1-D pools and padding,
MindSpore ``nn.Conv1d``) is given as the 2-D layer of height 1 it is, as the calibration
quantizes it (AMCT's Conv2D rules): kernel ``[1, k, cin, cout]``, ``strides`` / ``pool_size``
``(1, s)``, ZeroPadding1D ``padding`` ``((0, 0), (left, right))``, and ``attrs["rank"] = 1``:
the framework's tensors are ``(N, W, C)``. The v3 exporter writes the runtime's native 1-D ops
for them; v1, which has only 2-D layers, runs them on ``(1, W, C)`` tensors (a Reshape after
the model input, :mod:`amct_bridge.espdl.v1.height1`).

What the ESP-DL v3 export reads beyond this (op ``unsupported`` for v1, which refuses these;
the v3 lowering registry, :mod:`amct_bridge.espdl.v3.lowering.registry`, dispatches them by
``kind``):

- conv2d / depthwise_conv2d ``attrs["dilations"]``: ``(dh, dw)`` (v3 only; v1 adapters refuse
  a dilated conv). A ``Conv2D(groups=C)`` with C input channels and C filters is given as the
  depthwise_conv2d it is (kernel HWCM); other groups are refused by the adapter with the reason.
- ``Conv2DTranspose`` / ``Conv1DTranspose``: ``kernel`` in Keras' ``(kh, kw, filters, in)``
  layout (1-D: height 1, ``rank`` 1), optional ``bias``; attrs ``strides``, ``padding``
  ("valid" / "same", TF's crop), ``activation``, ``dilations``, ``output_padding`` (refused
  unless None). A BatchNormalization / ReLU after it folds into it as after a conv.
- ``Activation``: ``attrs["activation"]``, the framework's name (``"gelu"`` is the exact erf
  GELU, ``"elu"`` with ``attrs["alpha"]``); ``ELU``: ``attrs["alpha"]``.
- ``Cropping2D`` / ``Cropping1D``: ``attrs["cropping"]``, ``(top, bottom, left, right)`` /
  ``(left, right)``. ``UpSampling2D``: ``size``, ``interpolation`` ("nearest", "bilinear").
- ``Maximum`` / ``Minimum``: inputs of one shape. ``Transpose`` (a raw transpose):
  ``attrs["perm"]`` with the batch axis. ``Matmul``: two activation inputs.
- ``LayerNormalization``: ``gamma``, ``beta``; attrs ``axis`` (list), ``epsilon``,
  ``rms_scaling``. ``RMSNormalization``: ``scale``; attrs ``axis``, ``epsilon``.
- keras.ops math (raw ops, kind = the op's class): ``Divide`` / ``TrueDivide`` / ``Power`` with
  attrs ``scalar_operands`` (``(position, value)`` of a number operand) and ``const_operands``
  (how many constant arrays, which no input names); ``Sqrt``, ``Exp``, ``Log``, ``Negative``;
  reductions ``Max`` / ``Min`` / ``Sum`` / ``Mean``: attrs ``axis`` (None, an int or a tuple,
  on the framework's channel-last tensor), ``keepdims``, ``initial``. ``Embedding``:
  ``embeddings`` ``(rows, features)``; attrs ``mask_zero``, ``quantization_mode``.
- ``GRU`` / ``LSTM`` / ``Bidirectional`` (of either): per direction (forward, then backward),
  in the framework's gate order (Keras: GRU z, r, h; LSTM i, f, c, o), ``kernel``
  ``[dirs, I, G·H]``, ``recurrent_kernel`` ``[dirs, H, G·H]``, optional ``bias`` (GRU
  ``[dirs, 2, G·H]``: input then recurrent bias; LSTM ``[dirs, G·H]``); attrs ``cell`` ("GRU" /
  "LSTM"), ``units``, ``return_sequences``, ``go_backwards``, ``reset_after`` (GRU),
  ``activation``, ``recurrent_activation``, ``stateful``, ``return_state``, ``merge_mode``
  (Bidirectional).
- ``MultiHeadAttention``: inputs ``[query]`` (read as all three), ``[query, value]`` (``mha(x, x)``:
  the same tensor twice) or ``[query, value, key]``; ``query_kernel`` / ``key_kernel`` ``(D, heads,
  key_dim)``, ``value_kernel`` ``(D, heads, value_dim)``, ``output_kernel`` ``(heads, value_dim,
  out)`` and optional ``*_bias``; attrs ``num_heads``, ``key_dim``, ``value_dim``,
  ``attention_axes``, ``use_gate``, ``masked`` (what masks its scores, or None), optional ``ranges``
  (``{"query" | "key" | "value" | "scores" | "probs" | "context": (lo, hi)}``, measured by the
  adapter; the query scaled by ``1/sqrt(key_dim)``).

A framework layer that becomes two ESP-DL layers (SeparableConv2D -> depthwise_conv2d
``"sep/depthwise"`` + 1x1 conv2d ``"sep/pointwise"``, the record keys) gives both
``attrs["part_of"] = "sep"``. Every layer may carry ``attrs["model_output"] = True`` (its
output is a model output, so nothing is fused after it). ``attrs["activation"]`` of a
conv/dense is the activation fused by the layer itself (``None``, ``"relu"``, ``"leaky_relu"``
with ``attrs["alpha"]``, ``"relu6"``, or the framework's name of an activation ESP-DL lacks).

Example:
    >>> import numpy as np
    >>> conv = SourceLayer("c1", "conv2d", inputs=["in"], kind="Conv2D",
    ...                    weights={"kernel": np.zeros((3, 3, 1, 4), np.float32)})
    >>> conv.out_channels
    4
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from amct_bridge.errors import ExportError

#: Ops the exporter writes coefficients for, and convert.py's operation name for each.
WEIGHT_OPS: dict[str, str] = {
    "conv2d": "conv2d",
    "depthwise_conv2d": "depthwise_conv2d",
    "dense": "fully_connected",
}

#: Activations convert.py can fuse into a conv/dense, by op -> convert.py's type name.
FUSABLE_ACTIVATIONS: dict[str, str] = {"relu": "ReLU", "leaky_relu": "LeakyReLU", "prelu": "PReLU"}

OPS: tuple[str, ...] = (
    "input",
    *WEIGHT_OPS,
    "batch_norm",
    *FUSABLE_ACTIVATIONS,
    "relu6",
    "runtime",
    "unsupported",
)


#: Framework kind -> ESP-DL v1 class of the coefficient-free ("runtime") layers it runs.
ESPDL_CLASS: dict[str, str] = {
    "Add": "Add2D",
    "AveragePooling2D": "AvgPool2D",
    "GlobalAveragePooling2D": "GlobalAveragePool2D",
    "MaxPooling2D": "MaxPool2D",
    "GlobalMaxPooling2D": "GlobalMaxPool2D",
    "Concatenate": "Concat",
    "Flatten": "Flatten",
    "Reshape": "Reshape",
    "ZeroPadding2D": "Pad",
    "Permute": "Transpose",
    "Maximum": "Max2D",
    "Minimum": "Min2D",
    # 1-D layers run as their 2-D twins at height 1 (attrs["rank"] = 1)
    "AveragePooling1D": "AvgPool2D",
    "GlobalAveragePooling1D": "GlobalAveragePool2D",
    "MaxPooling1D": "MaxPool2D",
    "GlobalMaxPooling1D": "GlobalMaxPool2D",
    "ZeroPadding1D": "Pad",
}

#: Zero paddings a "valid" conv reading only them takes as its own pads.
ZERO_PADDING_KINDS: tuple[str, ...] = ("ZeroPadding2D", "ZeroPadding1D")

#: Kinds whose output exponent is chosen from the calibrated range of an average.
AVERAGE_KINDS: tuple[str, ...] = (
    "AveragePooling2D",
    "GlobalAveragePooling2D",
    "AveragePooling1D",
    "GlobalAveragePooling1D",
)

#: Runtime kinds that compute nothing at inference: readers read their input (export.json
#: lists them under "passthrough"). "Activation" is a linear one (others have their own op).
PASS_THROUGH: tuple[str, ...] = (
    "Dropout",
    "SpatialDropout2D",
    "GaussianNoise",
    "GaussianDropout",
    "Identity",
    "Activation",
    "FoldedBatchNorm",
)

#: Export format (``export_espdl(format=...)``) -> the runtime named in messages.
RUNTIMES: dict[str, str] = {"v1": "ESP-DL v1", "espdl": "ESP-DL v3"}
V1 = RUNTIMES["v1"]


def runtime_name(format: str) -> str:
    """The runtime an adapter's refusal reasons name: a reason written for the v1 export must
    not show up in a v3 refusal (``ESP-DL v3 export cannot take ...: ... no ESP-DL v1 ...``).

    Raises:
        ExportError: an unknown format.

    Example:
        >>> runtime_name("espdl")
        'ESP-DL v3'
    """
    if format not in RUNTIMES:
        raise ExportError(f"format {format!r}: expected 'v1' (convert.py set) or 'espdl' (v3)")
    return RUNTIMES[format]


def no_equivalent(what: str, runtime: str) -> str:
    """A refusal reason for something the adapter does not translate, worded for ``runtime``
    (:func:`runtime_name`): v1 lacks such layers; the v3 runtime has many more, so there it is
    this exporter that has no translation.

    Example:
        >>> no_equivalent("functional StridedSlice", "ESP-DL v1")
        'functional StridedSlice has no ESP-DL v1 equivalent'
        >>> no_equivalent("functional StridedSlice", "ESP-DL v3")
        'functional StridedSlice is not translated by the ESP-DL v3 exporter'
    """
    if runtime == V1:
        return f"{what} has no ESP-DL v1 equivalent"
    return f"{what} is not translated by the {runtime} exporter"


#: Standalone activations the runtime applies in place (output exponent = input exponent).
_KEEPING_ACTIVATIONS = ("relu", "leaky_relu")


@dataclass
class SourceLayer:
    """One layer call of the source model (see the module docstring for ``op``/weights/attrs).

    ``name`` is the record / sidecar key (Keras layer name, nested models ``"outer/inner"``);
    ``inputs`` the names of the layers producing its inputs.

    Example:
        >>> SourceLayer("r", "relu", inputs=["c1"]).weights
        {}
    """

    name: str
    op: str
    inputs: list[str] = field(default_factory=list)
    kind: str = ""
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)

    @property
    def out_channels(self) -> int | None:
        """Output channels of a conv/dense (depthwise: C * multiplier), else None."""
        kernel = self.weights.get("kernel")
        if kernel is None or self.op not in WEIGHT_OPS:
            return None
        if self.op == "depthwise_conv2d":
            return int(kernel.shape[-2] * kernel.shape[-1])
        return int(kernel.shape[-1])

    def describe(self) -> str:
        """``'name' (Kind)`` for messages."""
        return f"{self.name!r} ({self.kind or self.op})"


def zero_padding(layer: SourceLayer) -> list[int]:
    """``[top, bottom, left, right]`` of a ZeroPadding2D (``attrs["padding"]``: an int, a pair,
    a pair of pairs, or the str of one).

    Example:
        >>> zero_padding(SourceLayer("p", "runtime", attrs={"padding": "((0, 1), (0, 1))"}))
        [0, 1, 0, 1]
    """
    value = layer.attrs.get("padding", 1)
    if isinstance(value, str):  # read the integers; a model's config text is never evaluated
        numbers = [int(v) for v in re.findall(r"-?\d+", value)]
        if len(numbers) not in (1, 2, 4):
            raise ExportError(f"layer {layer.describe()}: cannot read padding {value!r}")
        value = numbers[0] if len(numbers) == 1 else numbers
        value = value if len(numbers) != 4 else (tuple(numbers[:2]), tuple(numbers[2:]))
    if isinstance(value, int):
        return [value] * 4
    rows, cols = value
    rows = (rows, rows) if isinstance(rows, int) else rows
    cols = (cols, cols) if isinstance(cols, int) else cols
    return [int(rows[0]), int(rows[1]), int(cols[0]), int(cols[1])]


def keeps_exponent(layer: SourceLayer) -> bool:
    """True when the runtime gives ``layer``'s output the exponent of its input(s).

    Example:
        >>> keeps_exponent(SourceLayer("p", "runtime", attrs={"keeps_exponent": True}))
        True
    """
    if layer.op in _KEEPING_ACTIVATIONS:
        return True
    return layer.op == "runtime" and bool(layer.attrs.get("keeps_exponent"))
