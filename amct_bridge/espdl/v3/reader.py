"""Read ``.espdl`` files (ESP-DL v3) into :class:`~amct_bridge.espdl.v3.model.EspdlModel`.

Framing (``esp-dl/fbs_loader/include/fbs_loader.hpp``): ``EDL2`` = magic, uint32 mode (0 plain,
otherwise AES-encrypted), uint32 length, uint32 zero, then ``length`` bytes of a FlatBuffers
``espdl.Model``; ``EDL1`` has no zero word; ``PDL1``/``PDL2`` packs hold several models behind a
table of (data offset, name offset, name length). All integers are little-endian.

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.v3.model import EspdlModel, Node, Tensor, ValueInfo
    >>> from amct_bridge.espdl.v3.writer import espdl_bytes
    >>> m = EspdlModel([Node("r", "Relu", ["x"], ["y"])], {},
    ...                inputs=[ValueInfo("x", [1, 4], 3, [-4])])
    >>> back = parse_espdl(espdl_bytes(m), "mem.espdl")
    >>> back.nodes[0].op_type, back.inputs[0].shape, back.inputs[0].exponents
    ('Relu', [1, 4], [-4])
    >>> parse_espdl(b"EDL2" + bytes([1, 0, 0, 0]) + bytes(8), "x.espdl")
    Traceback (most recent call last):
    ...
    amct_bridge.espdl.v3.model.EspdlError: x.espdl: mode 1 is encrypted (AES-128-CTR)...
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from amct_bridge.espdl.v3 import _fb
from amct_bridge.espdl.v3._fb.AttributeType import AttributeType
from amct_bridge.espdl.v3._fb.Model import Model as FbModel
from amct_bridge.espdl.v3._fb.TensorTypeAndShape import TensorTypeAndShape
from amct_bridge.espdl.v3._fb.TypeInfoValue import TypeInfoValue
from amct_bridge.espdl.v3.model import DTYPES, EspdlError, EspdlModel, Node, Tensor, ValueInfo
from amct_bridge.espdl.v3.schema import MAX_ELEMENTS, MAX_RANK, elements

__all__ = ["read_espdl", "read_espdl_pack", "parse_espdl", "parse_espdl_pack"]

assert _fb  # the generated package is imported for its modules only


def read_espdl(path: str | Path, name: str | None = None) -> EspdlModel:
    """Read one model from an ``.espdl`` file (EDL2, EDL1, or a PDL pack with ``name``).

    Example:
        >>> read_espdl("/nonexistent.espdl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.espdl.v3.model.EspdlError: /nonexistent.espdl: cannot read: ...
    """
    data = _read_bytes(path)
    if data[:3] == b"PDL":
        table = _pack_table(data, str(path))
        offsets = dict(table)
        if name is None and len(offsets) == 1:
            name = next(iter(offsets))
        if name not in offsets:
            names = sorted(offsets)
            shown = ", ".join(repr(n) for n in names[:20])
            more = f" and {len(names) - 20} more" if len(names) > 20 else ""
            raise EspdlError(
                f"{path}: pack holds models {shown}{more}; choose one by name (got {name!r})"
            )
        return parse_espdl(memoryview(data)[offsets[name] :], f"{path}[{name}]")
    return parse_espdl(data, str(path))


def read_espdl_pack(path: str | Path) -> dict[str, EspdlModel]:
    """Every model of a PDL1/PDL2 pack by name (a single EDL file gives one entry, its stem).

    Example:
        >>> read_espdl_pack("/nonexistent.espdl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.espdl.v3.model.EspdlError: /nonexistent.espdl: cannot read: ...
    """
    data = _read_bytes(path)
    if data[:3] == b"PDL":
        return parse_espdl_pack(data, str(path))
    return {Path(path).stem: parse_espdl(data, str(path))}


def _read_bytes(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise EspdlError(f"{path}: cannot read: {err.strerror or err}") from None


def parse_espdl_pack(data: bytes, source: str = "<bytes>") -> dict[str, EspdlModel]:
    """Split a ``PDL1``/``PDL2`` pack into its models (offsets count from the pack's start).

    Example:
        >>> parse_espdl_pack(b"PDL2" + struct.pack("<I", 1) + bytes(4), "p.espdl")
        Traceback (most recent call last):
        ...
        amct_bridge.espdl.v3.model.EspdlError: p.espdl: truncated pack: table of 1 models...
    """
    parsed: dict[int, EspdlModel] = {}
    models: dict[str, EspdlModel] = {}
    view = memoryview(data)
    for name, offset in _pack_table(data, source):
        if offset not in parsed:  # names that share one model parse it once
            parsed[offset] = parse_espdl(view[offset:], f"{source}[{name}]")
        models[name] = parsed[offset]
    return models


#: Most models a PDL pack may list: far beyond any real pack (esp-dl packs hold a few), and a
#: bound on the work a damaged table can ask for.
MAX_PACK_MODELS = 1024


def _pack_table(data: bytes, source: str) -> list[tuple[str, int]]:
    """(name, offset) of every model in a pack's table, checked before any model is parsed."""
    magic = bytes(data[:4])
    if magic not in (b"PDL1", b"PDL2"):
        raise EspdlError(f"{source}: bad magic {magic!r}, expected b'PDL1' or b'PDL2'")
    if len(data) < 8:
        raise EspdlError(f"{source}: truncated pack: {len(data)} bytes, no model count")
    (count,) = struct.unpack_from("<I", data, 4)
    if count > MAX_PACK_MODELS:
        raise EspdlError(
            f"{source}: pack table lists {count} models, at most {MAX_PACK_MODELS} expected"
        )
    table_end = 8 + 12 * count
    if table_end > len(data):
        raise EspdlError(
            f"{source}: truncated pack: table of {count} models needs {table_end} bytes, "
            f"file has {len(data)}"
        )
    table: list[tuple[str, int]] = []
    seen: set[str] = set()
    for i in range(count):
        offset, name_offset, name_length = struct.unpack_from("<III", data, 8 + 12 * i)
        if name_offset + name_length > len(data) or offset >= len(data):
            raise EspdlError(f"{source}: truncated pack: model {i} lies beyond the file's end")
        raw = bytes(data[name_offset : name_offset + name_length]).split(b"\0")[0]
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise EspdlError(
                f"{source}: pack entry {i}: model name {raw[:40]!r} is not UTF-8"
            ) from None
        if name in seen:
            raise EspdlError(f"{source}: pack entry {i}: model name {name[:80]!r} is listed twice")
        seen.add(name)
        table.append((name, offset))
    return table


def parse_espdl(data: bytes, source: str = "<bytes>") -> EspdlModel:
    """Parse one ``EDL2``/``EDL1`` model from bytes; ``source`` names it in errors.

    Example:
        >>> parse_espdl(b"ONNX" + bytes(12), "m.espdl")
        Traceback (most recent call last):
        ...
        amct_bridge.espdl.v3.model.EspdlError: m.espdl: bad magic b'ONNX', expected b'EDL2'...
    """
    magic = bytes(data[:4])
    if magic == b"EDL2":
        header = 16
    elif magic == b"EDL1":
        header = 12
    else:
        raise EspdlError(f"{source}: bad magic {magic!r}, expected b'EDL2' (or b'EDL1', b'PDL2')")
    if len(data) < header:
        raise EspdlError(f"{source}: truncated: {len(data)} bytes, the header alone needs {header}")
    mode, length = struct.unpack_from("<II", data, 4)
    if mode != 0:
        raise EspdlError(
            f"{source}: mode {mode} is encrypted (AES-128-CTR), cannot be read without the key"
        )
    if header + length > len(data):
        raise EspdlError(
            f"{source}: truncated: header says {length} bytes of model, "
            f"only {len(data) - header} follow"
        )
    buf = bytearray(data[header : header + length])
    try:
        return _model(FbModel.GetRootAs(buf, 0), source)
    except EspdlError:
        raise
    except Exception as err:  # struct.error, IndexError...: a damaged FlatBuffer
        raise EspdlError(
            f"{source}: not a valid espdl.Model FlatBuffer ({type(err).__name__}: {err})"
        ) from None


def _str(value: bytes | None) -> str:
    return value.decode("utf-8") if value else ""


def _ints(obj, method: str) -> list[int]:
    if getattr(obj, method + "IsNone")():
        return []
    return [int(v) for v in getattr(obj, method + "AsNumpy")()]


def _model(fb: FbModel, source: str) -> EspdlModel:
    graph = fb.Graph()
    if graph is None:
        raise EspdlError(f"{source}: the model has no graph")
    metadata = {
        _str(fb.MetadataProps(i).Key()): _str(fb.MetadataProps(i).Value())
        for i in range(fb.MetadataPropsLength())
    }
    opsets = [
        (_str(fb.OpsetImport(i).Domain()), int(fb.OpsetImport(i).Version()))
        for i in range(fb.OpsetImportLength())
    ]
    inits = [_tensor(graph.Initializer(i), source) for i in range(graph.InitializerLength())]
    return EspdlModel(
        nodes=[_node(graph.Node(i), source) for i in range(graph.NodeLength())],
        initializers={t.name: t for t in inits},
        inputs=[_value(graph.Input(i)) for i in range(graph.InputLength())],
        outputs=[_value(graph.Output(i)) for i in range(graph.OutputLength())],
        value_info=[_value(graph.ValueInfo(i)) for i in range(graph.ValueInfoLength())],
        test_inputs=[
            _tensor(graph.TestInputsValue(i), source) for i in range(graph.TestInputsValueLength())
        ],
        test_outputs=[
            _tensor(graph.TestOutputsValue(i), source)
            for i in range(graph.TestOutputsValueLength())
        ],
        metadata=metadata,
        ir_version=int(fb.IrVersion()),
        graph_name=_str(graph.Name()),
        producer_name=_str(fb.ProducerName()),
        producer_version=_str(fb.ProducerVersion()),
        domain=_str(fb.Domain()),
        model_version=int(fb.ModelVersion()),
        doc_string=_str(fb.DocString()),
        opset_import=opsets,
        source=source,
    )


def _tensor(fb, source: str) -> Tensor:
    name = _str(fb.Name())
    dims = _ints(fb, "Dims")
    code = int(fb.DataType())
    if code not in DTYPES:
        raise EspdlError(f"{source}: tensor {name!r} has data_type {code}, not a numeric type")
    dtype = DTYPES[code]
    if len(dims) > MAX_RANK or any(d < 0 for d in dims):
        raise EspdlError(
            f"{source}: tensor {name!r} has dims {dims[:10]}, expected at most {MAX_RANK} "
            "dimensions, none negative"
        )
    count = elements(dims)  # a Python int: a numpy product of large dims wraps around
    if count > MAX_ELEMENTS:
        raise EspdlError(
            f"{source}: tensor {name!r} dims {dims} hold {count} elements, more than the "
            f"{MAX_ELEMENTS} (2^26) the simulator holds"
        )
    if not fb.RawDataIsNone():
        # raw_data is a vector of 16-byte structs: the element bytes, zero padded to 16
        start = fb._tab.Vector(fb._tab.Offset(20))
        nbytes = fb.RawDataLength() * 16
        raw = bytes(fb._tab.Bytes[start : start + nbytes])
        if count * dtype.itemsize > len(raw):
            raise EspdlError(
                f"{source}: tensor {name!r} dims {dims} need {count * dtype.itemsize} bytes, "
                f"raw_data has {len(raw)}"
            )
        flat = np.frombuffer(raw, dtype, count).copy()
    else:
        flat = _typed_data(fb, dtype, name, source)
        if flat.size != count:
            raise EspdlError(f"{source}: tensor {name!r} dims {dims} but {flat.size} values")
    return Tensor(
        name=name,
        data=flat.reshape(dims) if dims else flat,
        exponents=_ints(fb, "Exponents"),
        doc_string=_str(fb.DocString()),
        data_location=int(fb.DataLocation()),
    )


def _typed_data(fb, dtype: np.dtype, name: str, source: str) -> np.ndarray:
    for method in ("Int32Data", "Int64Data", "FloatData", "DoubleData", "Uint64Data"):
        if not getattr(fb, method + "IsNone")():
            return np.asarray(getattr(fb, method + "AsNumpy")()).astype(dtype)
    return np.zeros(0, dtype)


def _value(fb) -> ValueInfo:
    shape: list[int | str] | None = None
    elem_type = 0
    info = fb.ValueInfoType()
    if info is not None and info.ValueType() == TypeInfoValue.tensor_type:
        table = info.Value()
        tt = TensorTypeAndShape()
        tt.Init(table.Bytes, table.Pos)
        elem_type = int(tt.ElemType())
        fb_shape = tt.Shape()
        if fb_shape is not None:
            shape = []
            for i in range(fb_shape.DimLength()):
                value = fb_shape.Dim(i).Value()
                if value is not None and value.DimType() == 2:  # PARAM: a symbolic dimension
                    shape.append(_str(value.DimParam()))
                else:
                    shape.append(int(value.DimValue()) if value is not None else 0)
    return ValueInfo(
        name=_str(fb.Name()),
        shape=shape,
        elem_type=elem_type,
        exponents=_ints(fb, "Exponents"),
        doc_string=_str(fb.DocString()),
    )


def _node(fb, source: str) -> Node:
    attributes: dict = {}
    types: dict[str, int] = {}
    for i in range(fb.AttributeLength()):
        attr = fb.Attribute(i)
        name = _str(attr.Name())
        kind = int(attr.AttrType())
        attributes[name] = _attribute_value(attr, kind, source)
        types[name] = kind
    return Node(
        name=_str(fb.Name()),
        op_type=_str(fb.OpType()),
        inputs=[_str(fb.Input(i)) for i in range(fb.InputLength())],
        outputs=[_str(fb.Output(i)) for i in range(fb.OutputLength())],
        attributes=attributes,
        attribute_types=types,
        domain=_str(fb.Domain()),
        doc_string=_str(fb.DocString()),
    )


def _attribute_value(attr, kind: int, source: str):
    if kind == AttributeType.FLOAT:
        return float(attr.F().F()) if attr.F() is not None else 0.0
    if kind == AttributeType.INT:
        return int(attr.I().I()) if attr.I() is not None else 0
    if kind == AttributeType.STRING:
        return bytes(attr.SAsNumpy()).decode("utf-8") if not attr.SIsNone() else ""
    if kind == AttributeType.INTS:
        return _ints(attr, "Ints")
    if kind == AttributeType.FLOATS:
        return [] if attr.FloatsIsNone() else [float(v) for v in attr.FloatsAsNumpy()]
    if kind == AttributeType.STRINGS:
        return [_str(attr.Strings(i)) for i in range(attr.StringsLength())]
    if kind == AttributeType.TENSOR:
        return _tensor(attr.T(), source) if attr.T() is not None else None
    if kind == AttributeType.TENSORS:
        return [_tensor(attr.Tensors(i), source) for i in range(attr.TensorsLength())]
    if kind == AttributeType.UNDEFINED:
        return None
    raise EspdlError(
        f"{source}: attribute {_str(attr.Name())!r} has type {kind} (graphs and type protos "
        "are not read)"
    )
