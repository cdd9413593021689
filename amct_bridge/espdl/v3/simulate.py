"""Bit-exact integer simulation of an ESP-DL v3 model, as the runtime computes it on the chip.

Each op follows esp-dl's kernels (``esp-dl/dl/base/dl_base_*.cpp`` for the arithmetic,
``dl/module/include/dl_module_*.hpp`` for the attributes, ``dl/tool/src/dl_tool.cpp`` for
rounding), vectorised in numpy with int64 intermediates. Activations are channel-last
(``NWC`` / ``NHWC``), as esp-ppq exported them. The rounding depends on the target:

- ``esp32p4``: half to even (``CONFIG_ROUND_HALF_EVEN_ENABLED``; float roundings use ``rne``);
- ``esp32s3`` and ``c``: half up (``(x + 2^(s-1)) >> s``; floats ``floor(x + 0.5)``).

The target is the caller's, else the file's ``metadata_props`` ``target`` (esp-ppq writes it),
else guessed from the filter layout notes: a blocked ``(N/16)...`` / ``N16...`` layout means
esp32s3 or esp32p4 and esp32s3 is assumed, a plain one means ``c``
(:func:`infer_target` returns the reason). docs/espdl-v3.md lists each op's formula.

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.v3.model import EspdlModel, Node, Tensor, ValueInfo
    >>> w = Tensor("w", np.array([[[[2, -1]]]], np.int8), [-1], "layout ==> NHWC")  # 1 in, 2 out
    >>> m = EspdlModel(
    ...     [Node("fc", "Gemm", ["x", "w"], ["y"], {"activation": "Relu", "quant_type": "S8"})],
    ...     {"w": w}, inputs=[ValueInfo("x", [1, 1], 3, [0])],
    ...     outputs=[ValueInfo("y", [1, 2], 3, [0])], metadata={"target": "c"})
    >>> r = simulate_espdl(m, {"x": np.array([[3]], np.int8)})
    >>> r.outputs["y"].tolist()  # 3*2*2^-1 = 3; 3*-1*2^-1 = -1.5 -> relu 0
    [[3, 0]]
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from amct_bridge.espdl.v3.model import EspdlError, EspdlModel
from amct_bridge.espdl.v3.ops import OPS, Context
from amct_bridge.espdl.v3.ops._base import round_float, shift_round
from amct_bridge.espdl.v3.ops.layer_normalization import sqrt_newton
from amct_bridge.espdl.v3.schema import check_model

__all__ = [
    "TARGETS",
    "CHIPS",
    "SimulationResult",
    "infer_target",
    "simulate_espdl",
    "shift_round",
    "round_float",
    "sqrt_newton",
    "supported_ops",
]

#: The kernel families the runtime distinguishes, which the simulator computes.
TARGETS = ("esp32s3", "esp32p4", "c")
#: Every chip name ESP-DL builds for (``dl_define_private.hpp``, CMakeLists.txt), with the
#: kernels it runs: esp32s31 is a PIE-V2 chip like esp32p4 (half-to-even rounding, per-channel
#: filters); the others run the generic C kernels.
CHIPS: dict[str, str] = {
    "esp32s3": "esp32s3",
    "esp32p4": "esp32p4",
    "esp32s31": "esp32p4",
    "c": "c",
    "esp32": "c",
    "esp32s2": "c",
    "esp32c2": "c",
    "esp32c3": "c",
    "esp32c5": "c",
    "esp32c6": "c",
    "esp32c61": "c",
    "esp32h2": "c",
    "esp32h4": "c",
}


@dataclass
class SimulationResult:
    """Integers of every tensor the simulation computed, the graph outputs, and the target used.

    Example:
        >>> r = SimulationResult({"y": np.array([1])}, {"y": np.array([1])}, {"y": -3}, "c", "")
        >>> r.outputs["y"].tolist(), r.exponents["y"]
        ([1], -3)
    """

    outputs: dict[str, np.ndarray]
    values: dict[str, np.ndarray]
    exponents: dict[str, int]
    target: str
    target_reason: str
    notes: list[str] = field(default_factory=list)


def infer_target(model: EspdlModel, target: str | None = None) -> tuple[str, str]:
    """(kernels, why): the caller's chip, the file's ``target`` metadata, a chip named in the
    file's path (``models/esp32p4/model.espdl``), else a guess from the filter layouts.

    Example:
        >>> infer_target(EspdlModel([], {}, metadata={"target": "esp32p4"}))
        ('esp32p4', "the file's metadata_props target")
        >>> infer_target(EspdlModel([], {}, metadata={"target": "esp32s31"}))
        ('esp32p4', "the file's metadata_props target esp32s31 (the esp32p4 kernels)")
        >>> infer_target(EspdlModel([], {}, source="models/esp32p4/model.espdl"))
        ('esp32p4', 'no target in the file; its path names esp32p4')
        >>> infer_target(EspdlModel([], {}))[1][:46]
        'no target in the file and no filter layout: es'

    """
    if target is not None:
        if target not in CHIPS:
            raise EspdlError(f"unknown target {target!r}, expected one of {', '.join(CHIPS)}")
        return CHIPS[target], "given by the caller" + _runs_as(target)
    meta = model.target
    if meta in CHIPS:
        return CHIPS[meta], "the file's metadata_props target" + _runs_as(meta)
    unknown = f"target {meta!r} in the file is not a chip ESP-DL knows; " if meta else ""
    named = [t for t in re.findall(r"esp32[a-z0-9]*", str(model.source).lower()) if t in CHIPS]
    if named:  # Espressif's examples keep one file per chip: models/esp32p4/model.espdl
        chip = named[-1]  # the name nearest the file
        return CHIPS[chip], (
            f"{unknown or 'no target in the file; '}its path names {chip}" + _runs_as(chip)
        )
    layouts = {t.layout for t in model.initializers.values() if t.layout and t.layout != "UNK"}
    if any("/16)" in s or "/8)" in s or s.startswith(("N16", "N8")) for s in layouts):
        return "esp32s3", (
            f"{unknown or 'no target in the file; '}blocked filter layouts (esp32s3 or esp32p4): "
            "esp32s3 assumed (pass --target esp32p4 for a PIE-V2 chip)"
        )
    if layouts:
        return "c", f"{unknown or 'no target in the file; '}plain filter layouts: the c target"
    return "esp32s3", (
        f"{unknown or 'no target in the file and '}no filter layout: esp32s3 assumed (pass "
        "--target for another chip)"
    )


def _runs_as(chip: str) -> str:
    runtime = CHIPS[chip]
    return "" if runtime == chip else f" {chip} (the {runtime} kernels)"


def supported_ops() -> list[str]:
    """The op types :func:`simulate_espdl` simulates; any other is refused by name.

    Example:
        >>> {"Conv", "Gemm", "Sigmoid"} <= set(supported_ops())
        True
    """
    return sorted(OPS)


def simulate_espdl(
    model: EspdlModel,
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray | None = None,
    target: str | None = None,
) -> SimulationResult:
    """Run ``model`` on integer ``inputs`` (by name, in input order, or one array; None: the
    file's test inputs) as the ESP-DL runtime of ``target`` computes it.

    Example:
        >>> from amct_bridge.espdl.v3.model import Node, ValueInfo
        >>> m = EspdlModel([Node("r", "Relu", ["x"], ["y"], {"quant_type": "S8"})], {},
        ...                inputs=[ValueInfo("x", [3], 3, [-2])],
        ...                outputs=[ValueInfo("y", [3], 3, [-2])])
        >>> simulate_espdl(m, np.array([-1, 0, 5], np.int8), "c").outputs["y"].tolist()
        [0, 0, 5]
        >>> simulate_espdl(EspdlModel([Node("n", "Foo", ["x"], ["y"])], {},
        ...     inputs=[ValueInfo("x", [1], 3, [0])]), [np.zeros(1, np.int8)], "c")
        Traceback (most recent call last):
        ...
        amct_bridge.espdl.v3.model.EspdlError: <memory>: node 'n': op 'Foo' is not simulated
    """
    target, reason = infer_target(model, target)
    check_model(model)  # attributes, arities, declared shapes: before any arithmetic
    ctx = Context(model, target)
    for name, array in _named_inputs(model, inputs).items():
        ctx.values[name] = array
    for node in model.nodes:
        fn = OPS.get(node.op_type)
        if fn is None:
            raise EspdlError(
                f"{model.source}: node {node.name!r}: op {node.op_type!r} is not simulated"
            )
        results = _run_node(ctx, node, fn)
        for name, value in zip(node.outputs, results, strict=False):
            if name:
                ctx.values[name] = value
    outputs = {}
    for info in model.outputs:
        if info.name not in ctx.values:
            raise EspdlError(f"{model.source}: no node computes the graph output {info.name!r}")
        outputs[info.name] = ctx.values[info.name]
    exponents = {}
    for name in ctx.values:
        info = ctx.infos.get(name)
        if info is not None and len(info.exponents) == 1:
            exponents[name] = info.exponent
    return SimulationResult(outputs, dict(ctx.values), exponents, target, reason, ctx.notes)


#: Ops whose output is the numpy broadcast of their first two inputs.
_BROADCASTING = frozenset(
    ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu")
    + ("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual")
)


def _run_node(ctx: Context, node, fn) -> list[np.ndarray]:
    """``fn(ctx, node)``, its inputs' broadcast checked first; an op that cannot compute what
    the file asks (shapes that do not fit it: the checks of :mod:`.schema` and of each op
    module catch what they can name) is refused with the node and its input shapes, never an
    internal error."""
    if node.op_type in _BROADCASTING and len(node.inputs) >= 2:
        shapes = [np.shape(ctx.value(name, node)) for name in node.inputs[:2]]
        try:
            out = np.broadcast_shapes(*shapes)
        except ValueError:
            raise ctx.refuse(
                node, f"input shapes {[list(s) for s in shapes]} do not broadcast"
            ) from None
        ctx.check_elements(node, out, "broadcast output")
    try:
        return fn(ctx, node)
    except EspdlError as err:  # a tensor's own check (Tensor.exponent) names no file or node
        if str(err).startswith(f"{ctx.model.source}:"):
            raise
        raise ctx.refuse(node, str(err)) from None
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError, MemoryError) as err:
        known = {**{k: t.data for k, t in ctx.model.initializers.items()}, **ctx.values}
        shapes = [list(np.shape(known[n])) if n in known else None for n in node.inputs]
        detail = str(err).splitlines()[0][:200] if str(err) else ""
        raise ctx.refuse(
            node,
            f"cannot be computed from inputs of shapes {shapes} and attributes "
            f"{sorted(node.attributes)} ({type(err).__name__}: {detail})",
        ) from None


def _named_inputs(model: EspdlModel, inputs) -> dict[str, np.ndarray]:
    names = [v.name for v in model.inputs]
    if inputs is None:
        if not model.test_inputs:
            raise EspdlError(f"{model.source}: no inputs given and the file has no test inputs")
        given = {t.name: t.data for t in model.test_inputs}
    elif isinstance(inputs, np.ndarray):
        given = {names[0]: inputs} if len(names) == 1 else {}
        if len(names) != 1:
            raise EspdlError(f"{model.source}: the model has {len(names)} inputs, one array given")
    elif isinstance(inputs, Mapping):
        given = dict(inputs)
    else:
        arrays = list(inputs)
        if len(arrays) != len(names):
            raise EspdlError(
                f"{model.source}: the model has {len(names)} inputs, {len(arrays)} arrays given"
            )
        given = dict(zip(names, arrays, strict=True))
    missing = [n for n in names if n not in given]
    if missing:
        raise EspdlError(f"{model.source}: no value for input(s) {', '.join(missing)}")
    out = {}
    for info in model.inputs:
        array = np.asarray(given[info.name])
        if array.size == 0:  # the runtime has no empty tensors: every kernel reads element 0
            raise EspdlError(
                f"{model.source}: input {info.name!r} holds no values (shape {list(array.shape)})"
            )
        if info.elem_type == 1:  # a float input, quantized by the model's QuantizeLinear
            array = array.astype(np.float32)
        elif array.dtype.kind not in "iu":
            raise EspdlError(
                f"{model.source}: input {info.name!r} must hold integers, got {array.dtype}"
            )
        elif info.elem_type in (3, 5):  # held as the model's int8/int16, as on the chip
            dtype = np.dtype(np.int8 if info.elem_type == 3 else np.int16)
            bounds = np.iinfo(dtype)
            if array.size and (array.min() < bounds.min or array.max() > bounds.max):
                raise EspdlError(
                    f"{model.source}: input {info.name!r} holds {array.min()}..{array.max()}, "
                    f"beyond {dtype}"
                )
            array = array.astype(dtype)
        shape = info.shape
        if shape and all(isinstance(d, int) for d in shape) and int(np.prod(shape)) == array.size:
            array = array.reshape(shape)
        out[info.name] = array
    return out
