"""The parts of a generated ESP-DL v1 model class: :class:`ChipLayer`, :class:`ModelClass` and
the header of every ``dl::layer`` class.

:mod:`~amct_bridge.espdl.v1.cpp_model` builds these from a chip graph and
:mod:`~amct_bridge.espdl.v1.cpp_render` writes their text; both import this module, which
imports neither (so the two do not import each other).

Example:
    >>> HEADERS["Relu"], HEADERS["FullyConnected"]
    ('dl_layer_relu.hpp', 'dl_layer_fullyconnected.hpp')
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: C++ class (release/v1.1 spelling) -> the header that declares it (include/layer/).
HEADERS: dict[str, str] = {
    "Conv2D": "dl_layer_conv2d.hpp",
    "DepthwiseConv2D": "dl_layer_depthwise_conv2d.hpp",
    "FullyConnected": "dl_layer_fullyconnected.hpp",
    "Add2D": "dl_layer_add2d.hpp",
    "Sub2D": "dl_layer_sub2d.hpp",
    "Mul2D": "dl_layer_mul2d.hpp",
    "AvgPool2D": "dl_layer_avg_pool2d.hpp",
    "GlobalAveragePool2D": "dl_layer_global_avg_pool2d.hpp",
    "MaxPool2D": "dl_layer_max_pool2d.hpp",
    "GlobalMaxPool2D": "dl_layer_global_max_pool2d.hpp",
    "Concat": "dl_layer_concat.hpp",
    "Flatten": "dl_layer_flatten.hpp",
    "Reshape": "dl_layer_reshape.hpp",
    "Pad": "dl_layer_pad.hpp",
    "Transpose": "dl_layer_transpose.hpp",
    "Max2D": "dl_layer_max2d.hpp",
    "Min2D": "dl_layer_min2d.hpp",
    "Relu": "dl_layer_relu.hpp",
    "LeakyRelu": "dl_layer_leakyrelu.hpp",
}


@dataclass
class ChipLayer:
    """One member of the model class: C++ class, template and constructor arguments, readers.

    ``inputs`` are member names, or ``"input"`` for the model input; ``fused`` the model layers
    whose output this member produces (a chain's conv, BN and activation).

    Example:
        >>> ChipLayer("mp", "MaxPool2D", "int8_t", '{2, 2}, dl::PADDING_VALID, {}, 2, 2, "mp"',
        ...           ["c1"], "mp").inputs
        ['c1']
    """

    member: str
    espdl_class: str
    ctype: str
    args: str
    inputs: list[str]
    source: str
    output_exponent: int | None = None
    fused: list[str] = field(default_factory=list)


@dataclass
class ModelClass:
    """A generated model class: header text and what an app needs to use it.

    ``outputs`` are the public members (the graph's outputs); ``input_exponent`` the exponent
    the input tensor must carry (None when no calibration gave it).

    Example:
        >>> ModelClass("NetModel", "net_model.hpp", "net", "s8", [], ["fc"], -7).outputs
        ['fc']
    """

    class_name: str
    header_name: str
    coefficient_name: str
    feature_type: str
    layers: list[ChipLayer]
    outputs: list[str]
    input_exponent: int | None
    input_shape: tuple[int, ...] | None = None
    per_channel: bool = False
    text: str = ""
    constants: list[str] = field(default_factory=list)  # declared before the class
