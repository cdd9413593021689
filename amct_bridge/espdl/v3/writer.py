"""Write an :class:`~amct_bridge.espdl.v3.model.EspdlModel` as an ``EDL2`` ``.espdl`` file.

The FlatBuffer is built with the ``flatbuffers`` runtime and the generated builders of
:mod:`amct_bridge.espdl.v3._fb`; tensor bytes go into ``raw_data`` as 16-byte aligned blocks (zero
padded), a rank-0 tensor is written as ``[1]`` (the loader crashes on empty dims). The file is
written to a temporary file next to the target, synced, then renamed over it, so a reader never
sees half a model.

Example:
    >>> import numpy as np, tempfile, pathlib
    >>> from amct_bridge.espdl.v3.model import EspdlModel, Node, Tensor, ValueInfo
    >>> from amct_bridge.espdl.v3.reader import read_espdl
    >>> m = EspdlModel([Node("r", "Relu", ["x"], ["y"], {"quant_type": "S8"})],
    ...                {"c": Tensor("c", np.arange(3, dtype=np.int8), [-2])},
    ...                inputs=[ValueInfo("x", [1, 3], 3, [-4])])
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "m.espdl"
    >>> write_espdl(m, path)
    >>> back = read_espdl(path)
    >>> back.initializers["c"].data.tolist(), back.nodes[0].attributes
    ([0, 1, 2], {'quant_type': 'S8'})
"""

from __future__ import annotations

import struct
from pathlib import Path

import flatbuffers
import numpy as np

from amct_bridge.errors import AmctBridgeError
from amct_bridge.espdl.v3._fb import (
    Attribute,
    AttributeF,
    AttributeI,
    Dimension,
    DimensionValue,
    Graph,
    Model,
    Node,
    OperatorSetId,
    StringStringEntry,
    Tensor,
    TensorShape,
    TensorTypeAndShape,
    TypeInfo,
    ValueInfo,
)
from amct_bridge.espdl.v3._fb.AttributeType import AttributeType
from amct_bridge.espdl.v3._fb.TypeInfoValue import TypeInfoValue
from amct_bridge.espdl.v3.model import EspdlError, EspdlModel
from amct_bridge.espdl.v3.model import Node as PyNode
from amct_bridge.espdl.v3.model import Tensor as PyTensor
from amct_bridge.espdl.v3.model import ValueInfo as PyValueInfo
from amct_bridge.records.atomic import atomic_write_bytes

__all__ = ["write_espdl", "espdl_bytes"]


def write_espdl(model: EspdlModel, path: str | Path) -> None:
    """Write ``model`` to ``path`` as plain EDL2, atomically (temporary file + ``os.replace``).

    Example:
        >>> write_espdl(EspdlModel([], {}), "/nonexistent/dir/m.espdl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.espdl.v3.model.EspdlError: /nonexistent/dir/m.espdl: cannot write...
    """
    try:
        # temp file + fsync + os.replace, with the mode an ordinary open() would give
        atomic_write_bytes(path, espdl_bytes(model))
    except EspdlError:
        raise
    except AmctBridgeError as err:
        raise EspdlError(str(err)) from None


def espdl_bytes(model: EspdlModel) -> bytes:
    """The EDL2 file bytes of ``model``: 16-byte header, FlatBuffer, zero padding to 16.

    Example:
        >>> data = espdl_bytes(EspdlModel([], {}))
        >>> data[:4], len(data) % 16
        (b'EDL2', 0)
    """
    body = bytes(_flatbuffer(model))
    body += bytes(-len(body) % 16)
    return b"EDL2" + struct.pack("<III", 0, len(body), 0) + body


def _flatbuffer(model: EspdlModel) -> bytearray:
    b = flatbuffers.Builder(1024)
    nodes = [_node(b, n) for n in model.nodes]
    inits = [_tensor(b, t) for t in model.initializers.values()]
    inputs = [_value(b, v) for v in model.inputs]
    outputs = [_value(b, v) for v in model.outputs]
    infos = [_value(b, v) for v in model.value_info]
    tests_in = [_tensor(b, t) for t in model.test_inputs]
    tests_out = [_tensor(b, t) for t in model.test_outputs]
    vectors = {
        "Node": _offsets(b, nodes),
        "Initializer": _offsets(b, inits),
        "Input": _offsets(b, inputs),
        "Output": _offsets(b, outputs),
        "ValueInfo": _offsets(b, infos),
        "TestInputsValue": _offsets(b, tests_in) if model.test_inputs else None,
        "TestOutputsValue": _offsets(b, tests_out) if model.test_outputs else None,
    }
    graph_name = b.CreateString(model.graph_name) if model.graph_name else None
    Graph.Start(b)
    for field, offset in vectors.items():
        if offset is not None:
            getattr(Graph, "Add" + field)(b, offset)
    if graph_name is not None:
        Graph.AddName(b, graph_name)
    graph = Graph.End(b)

    entries = []
    for key, value in model.metadata.items():
        k, v = b.CreateString(key), b.CreateString(value)
        StringStringEntry.Start(b)
        StringStringEntry.AddKey(b, k)
        StringStringEntry.AddValue(b, v)
        entries.append(StringStringEntry.End(b))
    metadata = _offsets(b, entries) if entries else None
    opsets = []
    for domain, version in model.opset_import:
        d = b.CreateString(domain)
        OperatorSetId.Start(b)
        OperatorSetId.AddDomain(b, d)
        OperatorSetId.AddVersion(b, version)
        opsets.append(OperatorSetId.End(b))
    opset = _offsets(b, opsets) if opsets else None
    strings = {
        "ProducerName": model.producer_name,
        "ProducerVersion": model.producer_version,
        "Domain": model.domain,
        "DocString": model.doc_string,
    }
    strings = {k: b.CreateString(v) for k, v in strings.items() if v}
    Model.Start(b)
    Model.AddIrVersion(b, model.ir_version)
    Model.AddModelVersion(b, model.model_version)
    for field, offset in strings.items():
        getattr(Model, "Add" + field)(b, offset)
    if opset is not None:
        Model.AddOpsetImport(b, opset)
    if metadata is not None:
        Model.AddMetadataProps(b, metadata)
    Model.AddGraph(b, graph)
    b.Finish(Model.End(b))
    return b.Output()


def _offsets(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return b.EndVector()


def _strings(b: flatbuffers.Builder, values: list[str]) -> int:
    return _offsets(b, [b.CreateString(v) for v in values])


def _numbers(b: flatbuffers.Builder, values, dtype: str) -> int:
    return b.CreateNumpyVector(np.asarray(values, dtype=dtype).reshape(-1))


def _tensor(b: flatbuffers.Builder, tensor: PyTensor) -> int:
    data = np.ascontiguousarray(tensor.data)
    dims = tensor.dims or [1]  # the loader crashes on empty dims
    code = tensor.data_type
    raw = data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes()
    raw += bytes(-len(raw) % 16)
    # a vector of 16-byte AlignedBytes structs: copied in one piece, not struct by struct
    b.StartVector(16, len(raw) // 16, 16)
    b.head = b.head - len(raw)
    b.Bytes[b.head : b.head + len(raw)] = raw
    raw_off = b.EndVector()
    dims_off = _numbers(b, dims, "<i8")
    exps_off = _numbers(b, tensor.exponents, "<i8")
    name = b.CreateString(tensor.name)
    doc = b.CreateString(tensor.doc_string) if tensor.doc_string else None
    Tensor.Start(b)
    Tensor.AddDims(b, dims_off)
    Tensor.AddDataType(b, code)
    Tensor.AddName(b, name)
    if doc is not None:
        Tensor.AddDocString(b, doc)
    Tensor.AddRawData(b, raw_off)
    Tensor.AddDataLocation(b, tensor.data_location)
    Tensor.AddExponents(b, exps_off)
    return Tensor.End(b)


def _value(b: flatbuffers.Builder, info: PyValueInfo) -> int:
    type_off = None
    if info.shape is not None or info.elem_type:
        shape_off = None
        if info.shape is not None:
            dims = []
            for d in info.shape:
                param = b.CreateString(d) if isinstance(d, str) else None
                DimensionValue.Start(b)
                if param is not None:
                    DimensionValue.AddDimType(b, 2)
                    DimensionValue.AddDimParam(b, param)
                else:
                    DimensionValue.AddDimType(b, 1)
                    DimensionValue.AddDimValue(b, int(d))
                value = DimensionValue.End(b)
                Dimension.Start(b)
                Dimension.AddValue(b, value)
                dims.append(Dimension.End(b))
            dim_vec = _offsets(b, dims)
            TensorShape.Start(b)
            TensorShape.AddDim(b, dim_vec)
            shape_off = TensorShape.End(b)
        TensorTypeAndShape.Start(b)
        TensorTypeAndShape.AddElemType(b, info.elem_type)
        if shape_off is not None:
            TensorTypeAndShape.AddShape(b, shape_off)
        tt = TensorTypeAndShape.End(b)
        TypeInfo.Start(b)
        TypeInfo.AddValueType(b, TypeInfoValue.tensor_type)
        TypeInfo.AddValue(b, tt)
        type_off = TypeInfo.End(b)
    name = b.CreateString(info.name)
    exps = _numbers(b, info.exponents, "<i8") if info.exponents else None
    doc = b.CreateString(info.doc_string) if info.doc_string else None
    ValueInfo.Start(b)
    ValueInfo.AddName(b, name)
    if type_off is not None:
        ValueInfo.AddValueInfoType(b, type_off)
    if doc is not None:
        ValueInfo.AddDocString(b, doc)
    if exps is not None:
        ValueInfo.AddExponents(b, exps)
    return ValueInfo.End(b)


def _attribute_type(name: str, value, declared: int | None) -> int:
    if declared is not None:
        return declared
    if isinstance(value, bool | int | np.integer):
        return AttributeType.INT
    if isinstance(value, float | np.floating):
        return AttributeType.FLOAT
    if isinstance(value, str):
        return AttributeType.STRING
    if isinstance(value, PyTensor):
        return AttributeType.TENSOR
    if isinstance(value, list | tuple) and value:
        first = value[0]
        if all(isinstance(v, str) for v in value):
            return AttributeType.STRINGS
        if all(isinstance(v, PyTensor) for v in value):
            return AttributeType.TENSORS
        if isinstance(first, float) or any(isinstance(v, float) for v in value):
            return AttributeType.FLOATS
        return AttributeType.INTS
    if isinstance(value, list | tuple):
        return AttributeType.INTS
    raise EspdlError(f"attribute {name!r}: cannot write a value of type {type(value).__name__}")


def _attribute(b: flatbuffers.Builder, name: str, value, declared: int | None) -> int:
    kind = _attribute_type(name, value, declared)
    payload = None
    if kind == AttributeType.STRING:
        payload = b.CreateByteVector(str(value).encode("utf-8"))
    elif kind == AttributeType.INTS:
        payload = _numbers(b, list(value), "<i8")
    elif kind == AttributeType.FLOATS:
        payload = _numbers(b, list(value), "<f4")
    elif kind == AttributeType.STRINGS:
        payload = _strings(b, list(value))
    elif kind == AttributeType.TENSOR and value is not None:
        payload = _tensor(b, value)
    elif kind == AttributeType.TENSORS:
        payload = _offsets(b, [_tensor(b, t) for t in value])
    name_off = b.CreateString(name)
    Attribute.Start(b)
    Attribute.AddName(b, name_off)
    Attribute.AddAttrType(b, kind)
    if kind == AttributeType.FLOAT:
        Attribute.AddF(b, AttributeF.CreateAttributeF(b, float(value)))
    elif kind == AttributeType.INT:
        Attribute.AddI(b, AttributeI.CreateAttributeI(b, int(value)))
    elif payload is not None:
        adder = {
            AttributeType.STRING: Attribute.AddS,
            AttributeType.INTS: Attribute.AddInts,
            AttributeType.FLOATS: Attribute.AddFloats,
            AttributeType.STRINGS: Attribute.AddStrings,
            AttributeType.TENSOR: Attribute.AddT,
            AttributeType.TENSORS: Attribute.AddTensors,
        }[kind]
        adder(b, payload)
    return Attribute.End(b)


def _node(b: flatbuffers.Builder, node: PyNode) -> int:
    attrs = [_attribute(b, k, v, node.attribute_types.get(k)) for k, v in node.attributes.items()]
    attr_vec = _offsets(b, attrs)
    inputs = _strings(b, node.inputs)
    outputs = _strings(b, node.outputs)
    name = b.CreateString(node.name)
    op = b.CreateString(node.op_type)
    domain = b.CreateString(node.domain) if node.domain else None
    doc = b.CreateString(node.doc_string) if node.doc_string else None
    Node.Start(b)
    Node.AddInput(b, inputs)
    Node.AddOutput(b, outputs)
    Node.AddName(b, name)
    Node.AddOpType(b, op)
    if domain is not None:
        Node.AddDomain(b, domain)
    Node.AddAttribute(b, attr_vec)
    if doc is not None:
        Node.AddDocString(b, doc)
    return Node.End(b)
