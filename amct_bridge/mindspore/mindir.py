"""MindIR export of a MindSpore network, read back as a flat list of primitive calls.

``ms.export(net, *inputs, file_format="MINDIR")`` compiles the network whatever its
``construct`` looks like (loops, ``if``, list comprehensions, functional ``ops.*`` and ``x + y``)
and writes the inlined graph: every primitive with its scope (``node.domain``, e.g.
``Default/layer1-SequentialCell/0-Block/conv1-Conv2d/Conv2D-op0``), its inputs and its output
shape. This module exports into a temporary directory (made the working directory for the
call, because a failed compile writes ``rank_0/`` there), reads the graph as a
``mindspore.train.mind_ir_pb2.ModelProto`` through ``ms.export``'s documented ``custom_func``
hook (before the parameter data is filled in; the hook then ends the export, so neither the
parameter data nor the file is written and nothing is parsed back) and resolves the plumbing
MindSpore adds:

- ``Load(param, u)`` is the parameter; ``Depend(x, ...)`` and ``TensorMove(x)`` (a copy) are
  ``x``; ``UpdateState`` is dropped, except that it carries in-place updates: after
  ``out += y`` (``InplaceAddExt(out, y, alpha, u)``) every ``Load(out, u')`` of a later state
  ``u'`` reads the in-place result, since ``out`` and every name bound to the same tensor
  changed;
- ``MakeTuple`` / ``TupleGetItem`` become tuples and indices into a primitive's outputs;
- ``Constant`` nodes become Python values (int, float, bool, tuples; tensors as arrays).

The network's training flag is set to False for the export and restored afterwards.

Example:
    >>> import numpy as np, mindspore as ms
    >>> from mindspore import nn
    >>> prims, ins, outs = export_primitives(nn.Conv2d(3, 4, 3), np.zeros((1, 3, 8, 8), "f4"))
    >>> [(p.op, p.cell_path, p.shapes) for p in prims]
    [('Conv2D', '', [(1, 4, 8, 8)])]
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
import numpy as np

from amct_bridge.errors import GraphError

#: What a primitive input resolves to: ("node", prim index, output index), ("input", k),
#: ("param", parameter name), ("const", value) or ("tuple", [values...]).
Value = tuple

_NP_TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64}
_NP_TYPES.update({9: np.bool_, 10: np.float16, 11: np.float64})


@dataclass
class Prim:
    """One primitive call of the exported graph (plumbing already resolved).

    ``scope`` is the MindIR ``domain``; ``cell_path`` the dotted cell name it names ("" for the
    top cell); ``shapes`` one shape per output.
    """

    index: int
    op: str
    scope: str
    cell_path: str
    inputs: list[Value]
    shapes: list[tuple[int, ...]]
    attrs: dict[str, Any] = field(default_factory=dict)


def to_tensors(sample_input: Any) -> list[ms.Tensor]:
    """Sample input(s) as MindSpore Tensors: a shape tuple (zeros), an array, or a list of them.

    Example:
        >>> [t.shape for t in to_tensors((1, 3, 8, 8))]
        [(1, 3, 8, 8)]
    """
    if isinstance(sample_input, ms.Tensor):
        return [sample_input]
    if isinstance(sample_input, np.ndarray):
        return [ms.Tensor(sample_input)]
    if isinstance(sample_input, (tuple, list)):
        if sample_input and all(isinstance(d, (int, np.integer)) for d in sample_input):
            return [ms.Tensor(np.zeros(tuple(int(d) for d in sample_input), np.float32))]
        if sample_input and all(isinstance(x, (ms.Tensor, np.ndarray)) for x in sample_input):
            return [x if isinstance(x, ms.Tensor) else ms.Tensor(x) for x in sample_input]
    raise GraphError(
        f"sample_input: expected a shape tuple such as (1, 3, 16, 16), a numpy array, a "
        f"mindspore.Tensor or a list of arrays/Tensors, got {type(sample_input).__name__}"
    )


@contextlib.contextmanager
def _in_temp_dir() -> Iterator[str]:
    """Run in a fresh temp dir (MindSpore writes rank_0/ and other debris into the cwd)."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="amct_bridge_mindir_") as tmp:
        os.chdir(tmp)
        try:
            yield tmp
        finally:
            os.chdir(old)


class _Read(Exception):
    """Raised by the export hook once the graph is read (ends ``ms.export`` there)."""


def export_model(net: ms.nn.Cell, tensors: list[ms.Tensor], read: Any = None) -> Any:
    """Export ``net`` to MindIR in a temp dir; returns ``read(model_proto)``.

    ``read`` sees the ``ModelProto`` through ``ms.export``'s documented ``custom_func`` hook,
    before MindSpore fills in the parameter data, so the file is never parsed back. It must
    not modify the proto. Without ``read`` the proto itself is returned (a copy).

    Example:
        >>> from mindspore import nn
        >>> export_model(nn.ReLU(), to_tensors((1, 2)), lambda m: len(m.graph.input))
        1
    """
    seen: list[Any] = []

    def custom_func(model: Any) -> None:
        if read is not None:
            seen.append(read(model))
        else:
            copy = type(model)()
            copy.CopyFrom(model)
            seen.append(copy)
        # all we need is read: end the export before it copies every parameter's data into
        # the proto and writes the file (half of a warm export of the benchmark's ResNet)
        raise _Read

    training = net.training
    net.set_train(False)
    # A cell's scope (MindIR domain) is set once, by the first compile that sees it: after a
    # Model compiled ``net`` inside its WithEvalCell / TrainOneStepCell, every scope would start
    # with ``Default/_network-Net/`` (or ``_backbone``...). Let this export name them from ``net``.
    scopes = [(cell, cell.__dict__.get("_scope")) for _, cell in net.cells_and_names()]
    for cell, _ in scopes:
        cell.__dict__["_scope"] = None
    syntax = ms.get_context("jit_syntax_level")  # ms.export sets STRICT, restores it on return
    try:
        with _in_temp_dir() as tmp:
            try:
                ms.export(
                    net,
                    *tensors,
                    file_name=os.path.join(tmp, "net"),
                    file_format="MINDIR",
                    custom_func=custom_func,
                )
            except _Read:
                pass
            except GraphError:
                raise
            except Exception as err:  # compile errors come in many types; name the network
                first = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
                shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
                # MindSpore casts no input: integer data reaches Conv2D as int and fails there
                kinds = sorted({str(t.dtype) for t in tensors if not t.dtype.is_floating_point})
                dtype_hint = (
                    f"; the sample input is {', '.join(kinds)}: MindSpore does not cast network "
                    "inputs, pass float32 data (x.astype(np.float32))"
                    if kinds
                    else ""
                )
                raise GraphError(
                    f"{type(net).__name__}: MindIR export failed ({type(err).__name__}: "
                    f"{first}); the network must compile in GRAPH_MODE with the sample input "
                    f"of shape {shapes} (NCHW, as the network runs: is that its input shape?)"
                    f"{dtype_hint}. {_log_hint()}"
                ) from None
    finally:
        if ms.get_context("jit_syntax_level") != syntax:
            ms.set_context(jit_syntax_level=syntax)
        net.set_train(training)
        for cell, scope in scopes:
            cell.__dict__["_scope"] = scope
    if not seen:
        raise GraphError(f"{type(net).__name__}: MindIR export produced no graph")
    return seen[0]


def export_primitives(
    net: ms.nn.Cell, sample_input: Any
) -> tuple[list[Prim], list[tuple[int, ...]], list[Value]]:
    """Primitive calls of ``net`` in topological order, model input shapes, output values.

    Example:
        >>> from mindspore import nn
        >>> prims, ins, outs = export_primitives(nn.ReLU(), (1, 4))
        >>> [p.op for p in prims], ins, outs
        (['ReLU'], [(1, 4)], [('node', 0, 0)])
    """

    def read(model: Any) -> tuple:
        if len(model.functions):
            raise GraphError(
                f"{type(net).__name__}: the MindIR holds {len(model.functions)} sub-graph(s) "
                "(control flow that depends on data); only straight-line graphs are supported"
            )
        return parse_graph(model.graph)

    return export_model(net, to_tensors(sample_input), read)


def _short(name: str) -> str:
    return name.split(":", 1)[1] if ":" in name else name


def _op_name(op_type: str) -> str:
    op = op_type.removeprefix("REF::")
    return op.rsplit(":", 1)[0] if ":" in op else op


def cell_path_of(scope: str) -> str:
    """Dotted cell name of a MindIR scope (``Default/a-SequentialCell/0-Block/X-op0`` -> a.0)."""
    parts = scope.split("/")[1:-1]
    return ".".join(p.rsplit("-", 1)[0] for p in parts)


def _attr_value(attr: Any) -> Any:
    kind = attr.DESCRIPTOR.fields_by_name["type"].enum_type.values_by_number[attr.type].name
    # a scalar stands alone in i/f/d, or inside a tuple as the single element of ints/floats
    if kind in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"):
        return int(attr.ints[0]) if len(attr.ints) else int(attr.i)
    if kind == "BOOL":
        return bool(attr.ints[0]) if len(attr.ints) else bool(attr.i)
    if kind == "FLOAT":
        return float(attr.floats[0]) if len(attr.floats) else float(attr.f)
    if kind == "DOUBLE":
        return float(attr.doubles[0]) if len(attr.doubles) else float(attr.d)
    if kind == "STRING":
        return attr.s.decode() if isinstance(attr.s, bytes) else attr.s
    if kind in ("TUPLE", "LIST"):
        values = [_attr_value(v) for v in attr.values]
        if not values and attr.ints:
            values = [int(i) for i in attr.ints]
        return tuple(values)
    if kind in ("TENSOR", "TENSORS") and attr.tensors:
        return _tensor_value(attr.tensors[0])
    return None  # monads, types and the like carry no data we need


def _tensor_value(t: Any) -> np.ndarray | None:
    dtype = _NP_TYPES.get(t.data_type)
    if dtype is None or not t.raw_data:
        return None
    return np.frombuffer(t.raw_data, dtype=dtype).reshape(tuple(t.dims))


def _shapes(node: Any) -> list[tuple[int, ...]]:
    for attr in node.attribute:
        if attr.name != "shape":
            continue
        if attr.tensors:
            return [tuple(int(d) for d in t.dims) for t in attr.tensors]
        return [tuple(int(d) for d in t.dims) for v in attr.values for t in v.tensors]
    return []


def parse_graph(graph: Any) -> tuple[list[Prim], list[tuple[int, ...]], list[Value]]:
    """Resolve a MindIR ``GraphProto`` into :class:`Prim` calls (see the module docstring)."""
    values: dict[str, Value] = {}
    input_shapes = []
    for k, inp in enumerate(graph.input):
        values[inp.name] = ("input", k)
        input_shapes.append(tuple(int(d) for d in inp.tensor[0].dims) if inp.tensor else ())
    for param in graph.parameter:
        values[param.name] = ("param", _short(param.name))
    prims: list[Prim] = []
    node_inputs: dict[str, list[str]] = {}  # node output -> its input names (MakeTuple's)
    # state name -> {tensor value: its value after the in-place ops up to that state}
    states: dict[str, dict[Value, Value]] = {}
    inplace: dict[str, tuple[Value, Value]] = {}  # in-place node output -> (target, result)
    for node in graph.node:
        op = _op_name(node.op_type)
        ins = [values.get(name, ("const", None)) for name in node.input]
        out = node.output[0] if node.output else node.name
        if op == "Constant":
            attr = next((a for a in node.attribute if a.name == "value"), None)
            values[out] = ("const", _attr_value(attr) if attr is not None else None)
        elif op == "Load":
            state = states.get(node.input[1], {}) if len(node.input) > 1 else {}
            values[out] = state.get(_key(ins[0]), ins[0])
        elif op in ("Depend", "TensorMove"):
            values[out] = ins[0]
        elif op == "UpdateState":
            state = dict(states.get(node.input[0], {})) if node.input else {}
            for name in node.input[1:]:
                for target, result in _inplace_of(name, inplace, node_inputs):
                    state[_key(target)] = result
            states[out] = state
            values[out] = ("const", None)
        elif op == "MakeTuple":
            values[out] = ("tuple", ins)
        elif op == "TupleGetItem":
            values[out] = _item(ins[0], ins[1])
        else:
            if op in ("Switch", "SwitchLayer", "Partial"):
                raise GraphError(f"{node.domain}: control flow ({op}) is not supported")
            scope = node.domain
            if op.startswith("Inplace") and node.input:
                # the in-place ops take the state last: keep it out of the tensor inputs
                ins = [v for v, name in zip(ins, node.input, strict=True) if name not in states]
            prims.append(Prim(len(prims), op, scope, cell_path_of(scope), ins, _shapes(node)))
            values[out] = ("node", len(prims) - 1, 0)
            if op.startswith("Inplace") and ins:
                inplace[out] = (ins[0], values[out])
        node_inputs[out] = list(node.input)
    outputs = [_flat(values.get(o.name, ("const", None))) for o in graph.output]
    return prims, input_shapes, [v for group in outputs for v in group]


def _key(value: Value) -> Value:
    """A hashable form of a resolved value (tuples hold lists)."""
    if value[0] == "tuple":
        return ("tuple", tuple(_key(v) for v in value[1]))
    if value[0] == "const":
        return ("const", id(value[1]))
    return value


def _inplace_of(name: str, inplace: dict, node_inputs: dict) -> list[tuple[Value, Value]]:
    """The in-place updates an UpdateState input names: an in-place node, or a MakeTuple of
    them (one level, as MindSpore attaches several side effects to one state)."""
    if name in inplace:
        return [inplace[name]]
    return [inplace[n] for n in node_inputs.get(name, ()) if n in inplace]


def _item(value: Value, index: Value) -> Value:
    i = index[1] if index[0] == "const" else None
    if not isinstance(i, int):
        return ("const", None)
    if value[0] == "tuple":
        return value[1][i]
    if value[0] == "node":
        return ("node", value[1], i)
    return ("const", None)


def _flat(value: Value) -> list[Value]:
    if value[0] == "tuple":
        return [v for item in value[1] for v in _flat(item)]
    return [value]


def _log_hint() -> str:
    """Where MindSpore's own account of a failed compile is (the CLI hides it without -v)."""
    if os.environ.get("GLOG_v") == "4":
        return "MindSpore's own log of the failure is hidden: rerun with -v to see it"
    return (
        "MindSpore's own log above names an analyze_fail.ir in a temporary directory, removed "
        "since: this message is the summary"
    )
