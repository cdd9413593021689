"""Text of the generated ESP-DL v1 model class (``<model>_model.hpp``): the :mod:`cpp_types` parts
that :mod:`cpp_model` builds from a chip graph.

Layout follows ESP-DL's tutorial header (``tutorial/convert_tool_example/model/mnist_model.hpp``):
private members, then the model outputs public, a constructor initializer list, ``build()`` and
``call()`` in execution order with ``free_element()`` after each tensor's last reader. Unlike the
tutorial: no ``using namespace`` (fully qualified names), members initialized in declaration
order (no ``-Wreorder``), a ``static const int input_exponent``.

Example:
    >>> comment_text("conv\\n1")
    'conv\\\\n1'
"""

from __future__ import annotations

from amct_bridge.espdl.v1 import spec
from amct_bridge.espdl.v1.cpp_types import HEADERS, ChipLayer, ModelClass

INPUT = "input"
_I = "    "


def comment_text(name: str) -> str:
    """A model name made safe for a ``//`` comment (no line breaks, ASCII).

    Example:
        >>> comment_text("café")
        'caf\\\\xe9'
    """
    return name.encode("unicode_escape").decode("ascii")


def _tensor(producer: str) -> str:
    return INPUT if producer == INPUT else f"this->{producer}.get_output()"


def _args(node: ChipLayer) -> str:
    if node.espdl_class == "Concat":
        return "{" + ", ".join(f"&{_tensor(p)}" for p in node.inputs) + "}"
    return ", ".join(_tensor(p) for p in node.inputs)


def _last_use(model: ModelClass) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, node in enumerate(model.layers):
        last[node.member] = i  # a tensor nobody reads is freed right after it is made
        for p in node.inputs:
            last[p] = i
    return last


def _declaration(node: ChipLayer, output: bool) -> str:
    what = f"'{comment_text(node.source)}'"
    fused = [f for f in node.fused if f != node.source]
    if fused:
        what += " + " + " + ".join(f"'{comment_text(f)}'" for f in fused)
    exp = "" if node.output_exponent is None else f", output exponent {node.output_exponent}"
    role = "model output " if output else ""
    return f"{_I}dl::layer::{node.espdl_class}<{node.ctype}> {node.member}; // {role}{what}{exp}\n"


def _header_comment(model: ModelClass) -> list[str]:
    ctype = spec.CTYPE[model.feature_type]
    bits = spec.FEATURE_BITS[model.feature_type]
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    granularity = "per-channel" if model.per_channel else "per-tensor"
    lines = [
        f"// ESP-DL v1 model class written by amct-bridge ({model.feature_type}, {granularity}).",
        f"// Coefficients: {model.coefficient_name}.hpp / {model.coefficient_name}.cpp "
        "(amct-bridge espdl-convert, or convert.py). Layer classes of ESP-DL release/v1.1",
        "// (Relu / LeakyRelu; tag v1.1.0 names them ReLU / LeakyReLU and its standalone layers "
        "do not build).",
        "//",
    ]
    e = model.input_exponent
    if e is None:
        lines.append(
            "// Input exponent: UNKNOWN (no calibrated input range): give the input tensor the "
            "exponent its first layer was exported for."
        )
    else:
        lines += [
            f"// Input: dl::Tensor<{ctype}>, HWC, exponent {e} ({model.class_name}::"
            f"input_exponent): real = int * 2^({e}).",
            f"// Quantize a float input x as q = clamp(round_half_to_even(x * 2^({-e})), {lo}, "
            f"{hi}) ({ctype}): the rule of",
            "// amct-bridge's simulation. C's nearbyintf() in the default rounding mode rounds "
            "half to even.",
        ]
    outs = {node.member: node for node in model.layers}
    for name in model.outputs:
        exp = outs[name].output_exponent
        tail = f", exponent {exp}: real = int * 2^({exp})" if exp is not None else ""
        lines.append(f"// Output: {model.class_name}::{name}.get_output(){tail}.")
    return [line + "\n" for line in lines]


def _includes(model: ModelClass) -> list[str]:
    used = dict.fromkeys(HEADERS[node.espdl_class] for node in model.layers)
    return [
        "#include <stdint.h>\n",
        '#include "dl_layer_model.hpp"\n',
        *(f'#include "{h}"\n' for h in used),
        f'#include "{model.coefficient_name}.hpp"\n',
    ]


def _members(model: ModelClass) -> tuple[list[ChipLayer], list[ChipLayer]]:
    public = [n for n in model.layers if n.member in model.outputs]
    private = [n for n in model.layers if n.member not in model.outputs]
    return private, public


def _body(model: ModelClass, method: str) -> list[str]:
    lines = [
        f"{_I}void {method}(dl::Tensor<{spec.CTYPE[model.feature_type]}> &input)\n",
        f"{_I}{{\n",
    ]
    last = _last_use(model)
    for i, node in enumerate(model.layers):
        lines.append(f"{_I * 2}this->{node.member}.{method}({_args(node)});\n")
        if method != "call":
            continue
        done = [p for p in dict.fromkeys([*node.inputs, node.member]) if last.get(p) == i]
        for p in done:
            if p not in model.outputs:
                lines.append(f"{_I * 2}{_tensor(p)}.free_element();\n")
    lines.append(f"{_I}}}\n")
    return lines


def render_model(model: ModelClass) -> str:
    """The whole ``<model>_model.hpp``.

    Example:
        >>> layer = ChipLayer("r", "Relu", "int8_t", '"r"', [INPUT], "relu")
        >>> text = render_model(ModelClass("XModel", "x_model.hpp", "x", "s8", [layer], ["r"], -7))
        >>> print(text[text.index("class XModel") : text.index("void build")].strip())
        class XModel : public dl::layer::Model<int8_t>
        {
        private:
        <BLANKLINE>
        public:
            dl::layer::Relu<int8_t> r; // model output 'relu'
        <BLANKLINE>
            /** Exponent of the input tensor: real = int * 2^input_exponent. */
            static const int input_exponent = -7;
        <BLANKLINE>
            XModel() : r("r") {}
    """
    private, public = _members(model)
    ctype = spec.CTYPE[model.feature_type]
    out = ["#pragma once\n", *_header_comment(model), "\n", *_includes(model), "\n"]
    if model.constants:  # Activation constants of fused runtime-layer activations
        out += [f"{line}\n" for line in model.constants] + ["\n"]
    out += [f"class {model.class_name} : public dl::layer::Model<{ctype}>\n", "{\n"]
    out += ["private:\n", *(_declaration(n, False) for n in private), "\n", "public:\n"]
    out += [_declaration(n, True) for n in public]
    if model.input_exponent is not None:
        out += [
            "\n",
            f"{_I}/** Exponent of the input tensor: real = int * 2^input_exponent. */\n",
            f"{_I}static const int input_exponent = {model.input_exponent};\n",
        ]
    inits = [f"{n.member}({n.args})" for n in [*private, *public]]
    pad = " " * (len(model.class_name) + 5)
    out += ["\n", f"{_I}{model.class_name}() : " + f",\n{_I}{pad}".join(inits) + " {}\n", "\n"]
    out += [*_body(model, "build"), "\n", *_body(model, "call"), "};\n"]
    return "".join(out)
