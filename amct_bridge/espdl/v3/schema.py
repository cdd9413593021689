"""What each ESP-DL v3 op takes, checked before the simulator computes anything.

Like ONNX's op schemas (``onnx/defs``) beside its reference ops: for every op type the
simulator runs, how many inputs and outputs it reads and the type and range of each attribute
its module reads (``esp-dl/dl/module/include/dl_module_<op>.hpp``'s ``deserialize()``).
:func:`check_model` refuses, with one line naming the file, the node, the field and what was
expected, what would otherwise fail inside the arithmetic: an attribute of another type (a list
for ``quant_type``, a string for ``dilations``), out of range (stride 0, negative pads, NaN
epsilon), a node with too few inputs, a declared shape beyond the memory budget.

The budget (:data:`MAX_ELEMENTS`) bounds every tensor the simulator holds or builds on the way
(padded inputs, gathered windows, broadcasts): 64 M elements, twice the largest PSRAM any ESP32
carries (32 MB) at int8, so no model that fits a chip is refused, and a damaged file (pads of
10,000, a broadcast of two long vectors) is refused before it allocates gigabytes.

Example:
    >>> from amct_bridge.espdl.v3.model import EspdlModel, Node
    >>> m = EspdlModel([Node("c", "Conv", ["x", "w"], ["y"], {"strides": [0, 1]})], {})
    >>> check_model(m)
    Traceback (most recent call last):
    ...
    amct_bridge.espdl.v3.model.EspdlError: <memory>: node 'c' (Conv): attribute 'strides' is \
[0, 1], expected integers in 1..65536
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from amct_bridge.espdl.v3.model import EspdlError, EspdlModel, Node

__all__ = [
    "Attr",
    "OpSchema",
    "SCHEMAS",
    "MAX_ELEMENTS",
    "MAX_EXPONENT",
    "MAX_RANK",
    "check_model",
    "check_node",
    "elements",
]

#: Most elements any one tensor or intermediate may have (see the module's docstring).
MAX_ELEMENTS = 2**26
#: Largest exponent magnitude a tensor may carry: the runtime shifts 32-bit accumulators and
#: builds float scales from exponents; beyond this no computation means anything (esp-ppq's
#: stay within about ±30).
MAX_EXPONENT = 64
#: Most dimensions a tensor may have (the runtime's shapes are small vectors; ONNX allows any).
MAX_RANK = 8


@dataclass(frozen=True)
class Attr:
    """One attribute: ``kind`` int / ints / int_or_ints / float / floats / string / strings,
    the range of its numbers (inclusive), the strings it may be, the length of a list.

    Example:
        >>> Attr("ints", low=1).problem([2, 0])
        'expected integers >= 1'
        >>> Attr("string", choices=("a", "b")).problem("c")
        "expected one of 'a', 'b'"
    """

    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    length: tuple[int, int] = (0, 64)

    def _range(self, what: str) -> str:
        if self.low is not None and self.high is not None:
            return f"{what} in {_num(self.low)}..{_num(self.high)}"
        if self.low is not None:
            return f"{what} >= {_num(self.low)}"
        if self.high is not None:
            return f"{what} <= {_num(self.high)}"
        return what

    def _number_ok(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and value < self.low:
            return False
        return self.high is None or value <= self.high

    def problem(self, value) -> str | None:
        """What is wrong with ``value`` (None when it fits)."""
        kind = self.kind
        if kind == "int_or_ints":
            if not isinstance(value, (list, int)) or isinstance(value, bool):
                return f"expected {self._range('an integer or a list of integers')}"
            kind = "ints" if isinstance(value, list) else "int"
        if kind in ("int", "float"):
            what = "an integer" if kind == "int" else "a finite number"
            if kind == "int" and not isinstance(value, int):
                return f"expected {self._range(what)}"
            return None if self._number_ok(value) else f"expected {self._range(what)}"
        if kind in ("ints", "floats"):
            what = "integers" if kind == "ints" else "finite numbers"
            if not isinstance(value, list):
                return f"expected a list of {self._range(what)}"
            low, high = self.length
            if not low <= len(value) <= high:
                return f"expected {low}..{high} values, got {len(value)}"
            exact = kind == "ints"
            if any((exact and not isinstance(v, int)) or not self._number_ok(v) for v in value):
                return f"expected {self._range(what)}"
            return None
        if kind == "string":
            if not isinstance(value, str):
                return "expected a string"
            if self.choices and value not in self.choices:
                return "expected one of " + ", ".join(repr(c) for c in self.choices)
            return None
        if kind == "strings":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                return "expected a list of strings"
            return None
        raise ValueError(f"unknown attribute kind {self.kind!r}")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class OpSchema:
    """An op's inputs (min, max), outputs (min, max) and attributes.

    Example:
        >>> SCHEMAS["Conv"].inputs
        (2, 3)
    """

    inputs: tuple[int, int] = (1, 1)
    outputs: tuple[int, int] = (1, 1)
    attributes: dict[str, Attr] = field(default_factory=dict)


_SMALL = 1 << 16  # a bound on a spatial size, a block size, a hidden size: far above any chip's
_FLAG = Attr("int", 0, 1)
_AXIS = Attr("int", -MAX_RANK, MAX_RANK - 1)
_AXES = Attr("int_or_ints", -MAX_RANK, MAX_RANK - 1, length=(0, MAX_RANK))
_FINITE = Attr("float")
_WINDOW = {
    "kernel_shape": Attr("int_or_ints", 1, _SMALL, length=(1, 3)),
    "strides": Attr("int_or_ints", 1, _SMALL, length=(0, 3)),
    "dilations": Attr("int_or_ints", 1, _SMALL, length=(0, 3)),
    "pads": Attr("int_or_ints", 0, _SMALL, length=(0, 6)),
}
#: Every op's quant_type is a string (S8, S16, F32: the op says which it runs).
_COMMON = {"quant_type": Attr("string")}


def _ops(names: Iterable[str], schema: OpSchema) -> dict[str, OpSchema]:
    return dict.fromkeys(names, schema)


# one more input than the op computes with: int8 files may carry the op's lookup table as the
# last input (esp-ppq's), which the module reads or ignores
_UNARY = OpSchema(inputs=(1, 2))
_BINARY = OpSchema(inputs=(2, 3))
_REDUCE = OpSchema(inputs=(1, 2), attributes={"axes": _AXES, "keepdims": _FLAG})
_LUT_ATTRS = {"alpha": _FINITE, "beta": _FINITE, "lut": Attr("string")}
#: What GRU and LSTM share (``ops/_rnn.py``; the module checks ``layout`` itself).
_RNN = {
    "hidden_size": Attr("int", 1, _SMALL),
    "direction": Attr("string"),
    "gate_exponent": Attr("int", -64, 64),
    "activations": Attr("strings"),
}

#: op type -> what it takes. Attributes not listed are ignored by the runtime and here.
SCHEMAS: dict[str, OpSchema] = {
    **_ops(("Add", "Sub", "Mul", "Div", "Pow", "MatMul", "PRelu"), _BINARY),
    **_ops(("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"), _BINARY),
    "Mod": OpSchema(inputs=(2, 3), attributes={"fmod": _FLAG}),
    **_ops(("Relu", "Neg", "Exp", "Log", "Sqrt", "GlobalAveragePool"), _UNARY),
    **_ops(
        ("Sigmoid", "Tanh", "Swish", "HardSigmoid", "HardSwish", "LeakyRelu", "Gelu", "Elu"),
        OpSchema(inputs=(1, 2), attributes=_LUT_ATTRS),
    ),
    "LUT": OpSchema(inputs=(1, 2), attributes=_LUT_ATTRS),
    "Clip": OpSchema(inputs=(1, 3)),
    "Concat": OpSchema(inputs=(1, 4096), attributes={"axis": _AXIS}),
    "Conv": OpSchema(
        inputs=(2, 3),
        attributes={
            **_WINDOW,
            "group": Attr("int", 1, 1 << 20),
            "activation": Attr("string"),
        },
    ),
    **_ops(
        ("AveragePool", "MaxPool"),
        OpSchema(attributes={**_WINDOW, "ceil_mode": _FLAG, "count_include_pad": _FLAG}),
    ),
    **_ops(
        ("DepthToSpace", "SpaceToDepth"),
        OpSchema(attributes={"blocksize": Attr("int", 1, 64), "mode": Attr("string")}),
    ),
    "Flatten": OpSchema(attributes={"axis": _AXIS}),
    "Gather": OpSchema(inputs=(2, 2), attributes={"axis": _AXIS}),
    "Gemm": OpSchema(inputs=(2, 3), attributes={"activation": Attr("string")}),
    # the module names X, W and R when one is missing
    "GRU": OpSchema(
        inputs=(1, 6), outputs=(0, 2), attributes={**_RNN, "linear_before_reset": _FLAG}
    ),
    "LSTM": OpSchema(inputs=(1, 8), outputs=(0, 3), attributes={**_RNN, "input_forget": _FLAG}),
    "InsertZeros": OpSchema(
        attributes={
            "stride": Attr("int_or_ints", 1, _SMALL, length=(0, 3)),
            "output_padding": Attr("int_or_ints", 0, _SMALL, length=(0, 3)),
        }
    ),
    "LayerNormalization": OpSchema(
        inputs=(1, 3), outputs=(1, 3), attributes={"axis": _AXIS, "epsilon": Attr("float", 0)}
    ),
    "RMSNormalization": OpSchema(
        inputs=(1, 2), attributes={"axis": _AXIS, "epsilon": Attr("float", 0)}
    ),
    **_ops(("Softmax", "LogSoftmax"), OpSchema(attributes={"axis": _AXIS})),
    "LpNormalization": OpSchema(attributes={"axis": _AXIS, "p": Attr("int", 1, 2)}),
    "Pad": OpSchema(inputs=(1, 4), attributes={"mode": Attr("string")}),
    **_ops(
        (
            "ReduceL1",
            "ReduceL2",
            "ReduceLogSum",
            "ReduceLogSumExp",
            "ReduceMax",
            "ReduceMean",
            "ReduceMin",
            "ReduceProd",
            "ReduceSum",
            "ReduceSumSquare",
        ),
        _REDUCE,
    ),
    **_ops(("RequantizeLinear", "QuantizeLinear", "DequantizeLinear"), OpSchema(inputs=(1, 3))),
    "Reshape": OpSchema(
        inputs=(1, 2), attributes={"shape": Attr("int_or_ints", -1, MAX_ELEMENTS, length=(0, 8))}
    ),
    "Resize": OpSchema(
        inputs=(1, 4),
        attributes={"mode": Attr("string"), "coordinate_transformation_mode": Attr("string")},
    ),
    "ReverseSequence": OpSchema(
        inputs=(2, 2), attributes={"batch_axis": _FLAG, "time_axis": _FLAG}
    ),
    "ScatterND": OpSchema(inputs=(3, 3), attributes={"reduction": Attr("string")}),
    "Slice": OpSchema(inputs=(1, 5)),
    "Split": OpSchema(
        inputs=(1, 2),
        outputs=(1, 4096),
        attributes={"axis": _AXIS, "split": Attr("int_or_ints", 0, MAX_ELEMENTS, length=(0, 4096))},
    ),
    **_ops(("Squeeze", "Unsqueeze"), OpSchema(inputs=(1, 2), attributes={"axes": _AXES})),
    "Transpose": OpSchema(
        attributes={"perm": Attr("int_or_ints", 0, MAX_RANK - 1, length=(0, MAX_RANK))}
    ),
}


def elements(shape: Iterable[int]) -> int:
    """The element count of ``shape`` as a Python int (no int64 wrap-around).

    Example:
        >>> elements([2**40, 2**40]) > 2**63
        True
    """
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def check_node(model: EspdlModel, node: Node) -> None:
    """Refuse ``node`` when its input / output count or an attribute does not fit its op.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> check_node(EspdlModel([], {}), Node("a", "Add", ["x"], ["y"]))
        Traceback (most recent call last):
        ...
        amct_bridge.espdl.v3.model.EspdlError: <memory>: node 'a' (Add): has 1 input, expected 2..3
    """
    schema = SCHEMAS.get(node.op_type)
    if schema is None:  # not simulated: the simulator refuses it by name
        return
    where = f"{model.source}: node {_short(node.name)} ({node.op_type})"
    for what, names, (low, high) in (
        ("input", node.inputs, schema.inputs),
        ("output", node.outputs, schema.outputs),
    ):
        if not low <= len(names) <= high:
            expected = str(low) if low == high else f"{low}..{high}"
            plural = "" if len(names) == 1 else "s"
            raise EspdlError(f"{where}: has {len(names)} {what}{plural}, expected {expected}")
        if what == "input" and names and not names[0]:
            raise EspdlError(f"{where}: its first input has no name")
    for name, value in node.attributes.items():
        spec = schema.attributes.get(name) or _COMMON.get(name)
        if spec is None:
            continue
        problem = spec.problem(value)
        if problem is not None:
            raise EspdlError(f"{where}: attribute {_short(name)} is {_short(value)}, {problem}")


def check_model(model: EspdlModel) -> None:
    """Refuse a model whose nodes, declared shapes or constants cannot be simulated within
    :data:`MAX_ELEMENTS`: called by the simulator before it computes anything.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> check_model(EspdlModel([], {}, inputs=[ValueInfo("x", [1, 10**6, 10**6], 3, [0])]))
        Traceback (most recent call last):
        ...
        amct_bridge.espdl.v3.model.EspdlError: <memory>: input 'x': shape [1, 1000000, \
1000000] holds 1000000000000 elements, more than the 67108864 (2^26) the simulator holds
    """
    for node in model.nodes:
        check_node(model, node)
    tensors = [("initializer", t) for t in model.initializers.values()]
    tensors += [("test input", t) for t in model.test_inputs]
    tensors += [("test output", t) for t in model.test_outputs]
    tensors += [
        (k, v)
        for k, vs in (
            ("input", model.inputs),
            ("output", model.outputs),
            ("value_info", model.value_info),
        )
        for v in vs
    ]
    for kind, tensor in tensors:
        bad = [e for e in tensor.exponents if not -MAX_EXPONENT <= int(e) <= MAX_EXPONENT]
        if bad:
            raise EspdlError(
                f"{model.source}: {kind} {_short(tensor.name)}: exponent {_short(bad[0])}, "
                f"expected -{MAX_EXPONENT}..{MAX_EXPONENT} (the runtime's shifts are of 32-bit "
                "values)"
            )
    for kind, infos in (
        ("input", model.inputs),
        ("output", model.outputs),
        ("value_info", model.value_info),
    ):
        for info in infos:
            shape = [d for d in info.shape or [] if isinstance(d, int)]
            if len(info.shape or []) > MAX_RANK or any(d < 0 for d in shape):
                raise EspdlError(
                    f"{model.source}: {kind} {_short(info.name)}: shape {info.shape}, expected "
                    f"at most {MAX_RANK} dimensions, none negative"
                )
            count = elements(shape)
            if count > MAX_ELEMENTS:
                raise EspdlError(
                    f"{model.source}: {kind} {_short(info.name)}: shape {info.shape} holds "
                    f"{count} elements, more than the {MAX_ELEMENTS} (2^26) the simulator holds"
                )


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
