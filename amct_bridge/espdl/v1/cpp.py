"""The C++ constructor of each exported layer, for the user's ESP-DL v1 model class.

ESP-DL v1 users write the model class by hand and copy each layer's output exponent into its
constructor (``Conv2D<int16_t>(-2, get_l1_filter(), get_l1_bias(), get_l1_activation(),
PADDING_VALID, {}, 2, 2, "l1")``). We write that line into export.json so it can be pasted:
``dl::layer::`` and ``dl::PADDING_*`` qualified as in the generated model class (an unqualified
``ReLU`` is ambiguous with ``dl::ReLU``; no ``using namespace`` is needed), ``NULL`` for a
missing bias / activation, ``<int8_t, int16_t>`` for int8 per-channel layers with a bias, Keras
``"same"`` -> ``dl::PADDING_SAME_END`` (TensorFlow's rule), ``"valid"`` -> ``dl::PADDING_VALID``,
``"not_set"`` (a folded ZeroPadding2D, ``attrs["pads"]``) -> ``dl::PADDING_NOT_SET, {t, b, l, r}``.

Example:
    >>> print(constructor("c1", "conv2d", {"output_exponent": -5, "bias": "True"}, "s8", False,
    ...                   {"padding": "same", "strides": (2, 2)}))  # doctest: +NORMALIZE_WHITESPACE
    dl::layer::Conv2D<int8_t>(-5, get_c1_filter(), get_c1_bias(), NULL, dl::PADDING_SAME_END,
    {}, 2, 2, "c1")
"""

from __future__ import annotations

from amct_bridge.espdl.v1 import spec

_CLASSES = {
    "conv2d": "Conv2D",
    "depthwise_conv2d": "DepthwiseConv2D",
    "fully_connected": "FullyConnected",
}
_PADDING = {
    "valid": "dl::PADDING_VALID",
    "same": "dl::PADDING_SAME_END",
    "not_set": "dl::PADDING_NOT_SET",
}


def constructor(
    name: str, operation: str, entry: dict, feature_type: str, per_channel: bool, attrs: dict
) -> str | None:
    """The constructor call for one exported layer (None if the padding has no ESP-DL name).

    Example:
        >>> constructor("fc", "fully_connected", {"output_exponent": -9}, "s16", False, {})
        'dl::layer::FullyConnected<int16_t>(-9, get_fc_filter(), NULL, NULL, true, "fc")'
    """
    ctype = spec.CTYPE[feature_type]
    bias = "bias" in entry
    types = f"{ctype}, int16_t" if per_channel and bias else ctype
    args = [
        str(entry["output_exponent"]),
        f"get_{name}_filter()",
        f"get_{name}_bias()" if bias else "NULL",
        f"get_{name}_activation()" if "activation" in entry else "NULL",
    ]
    if operation == "fully_connected":
        flatten = int(attrs.get("input_rank", 2)) <= 2
        args.append("true" if flatten else "false")
    else:
        padding = _PADDING.get(str(attrs.get("padding", "valid")).lower())
        if padding is None:
            return None
        sy, sx = tuple(attrs.get("strides", (1, 1)))
        pads = "{}"
        if padding == "dl::PADDING_NOT_SET":  # a folded ZeroPadding2D: {top, bottom, left, right}
            pads = "{" + ", ".join(str(int(p)) for p in attrs["pads"]) + "}"
        args += [padding, pads, str(int(sy)), str(int(sx))]
    args.append(f'"{name}"')
    return f"dl::layer::{_CLASSES[operation]}<{types}>({', '.join(args)})"
