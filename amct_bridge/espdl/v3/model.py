"""Plain-Python view of an ESP-DL v3 ``.espdl`` model: graph, tensors with exponents, test values.

The reader (:mod:`amct_bridge.espdl.v3.reader`) fills these dataclasses from the FlatBuffers file
and the writer (:mod:`amct_bridge.espdl.v3.writer`) turns them back into one; nothing here
depends on FlatBuffers. A tensor keeps its integers in the order they are stored in the file
(``Tensor.data``, shaped as ``dims``): Conv/Gemm filters of the esp32s3/esp32p4 targets are stored
in blocks of 16 (int8) or 8 (int16) output channels, and :func:`filter_nhwc` undoes that.

Example:
    >>> import numpy as np
    >>> t = Tensor("w", np.array([1, -2], np.int8), [-3])
    >>> t.dequantized().tolist(), t.exponent, t.data_type
    ([0.125, -0.25], -3, 3)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from amct_bridge.errors import AmctBridgeError

__all__ = [
    "EspdlError",
    "Tensor",
    "ValueInfo",
    "Node",
    "EspdlModel",
    "DTYPES",
    "DATA_TYPES",
    "filter_nhwc",
]


class EspdlError(AmctBridgeError):
    """An ``.espdl`` file cannot be read, written or simulated (the message names file and cause).

    Example:
        >>> str(EspdlError("m.espdl: bad magic b'XXXX', expected b'EDL2'"))
        "m.espdl: bad magic b'XXXX', expected b'EDL2'"
    """


#: espdl.TensorDataType -> numpy dtype (only the numeric ones the runtime uses).
DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),
    2: np.dtype("u1"),
    3: np.dtype("i1"),
    4: np.dtype("<u2"),
    5: np.dtype("<i2"),
    6: np.dtype("<i4"),
    7: np.dtype("<i8"),
    9: np.dtype("?"),
    10: np.dtype("<f2"),
    11: np.dtype("<f8"),
    12: np.dtype("<u4"),
    13: np.dtype("<u8"),
}
#: numpy dtype -> espdl.TensorDataType.
DATA_TYPES: dict[np.dtype, int] = {v: k for k, v in DTYPES.items()}


@dataclass
class Tensor:
    """A constant or test tensor: integers in file order, shaped as ``dims``, and exponents.

    value = data · 2^exponent (one exponent per tensor in every published file; a list is kept
    for per-channel files). ``doc_string`` holds esp-ppq's ``layout ==> ...`` note.

    Example:
        >>> Tensor("b", np.zeros(4, np.int32), [-14]).dims
        [4]
    """

    name: str
    data: np.ndarray
    exponents: list[int] = field(default_factory=lambda: [0])
    doc_string: str = ""
    data_location: int = 0

    @property
    def dims(self) -> list[int]:
        """Shape as stored in the file.

        Example:
            >>> Tensor("t", np.zeros((2, 3), np.int8)).dims
            [2, 3]
        """
        return [int(d) for d in self.data.shape]

    @property
    def data_type(self) -> int:
        """espdl.TensorDataType code (3 INT8, 5 INT16, 6 INT32, 7 INT64).

        Example:
            >>> Tensor("t", np.zeros(1, np.int16)).data_type
            5
        """
        try:
            return DATA_TYPES[self.data.dtype.newbyteorder("<")]
        except KeyError:
            raise EspdlError(
                f"tensor {self.name!r}: dtype {self.data.dtype} has no espdl type"
            ) from None

    @property
    def exponent(self) -> int:
        """The single exponent (per-tensor quantization); refuses per-channel exponents.

        Example:
            >>> Tensor("t", np.zeros(1, np.int8), [-7]).exponent
            -7
        """
        if len(self.exponents) != 1:
            raise EspdlError(
                f"tensor {self.name!r} has {len(self.exponents)} exponents, expected one"
            )
        return int(self.exponents[0])

    @property
    def layout(self) -> str | None:
        """esp-ppq's layout note (``(N/16)HWC16``, ``NHWC``...), from ``layout ==> X``.

        Example:
            >>> Tensor("w", np.zeros(1, np.int8), doc_string="layout ==> (N/16)HWC16").layout
            '(N/16)HWC16'
        """
        text = self.doc_string or ""
        if "layout ==>" not in text:
            return None
        return text.split("layout ==>", 1)[1].strip() or None

    def dequantized(self) -> np.ndarray:
        """float64 values (data · 2^exponent).

        Example:
            >>> Tensor("t", np.array([4], np.int8), [-2]).dequantized().tolist()
            [1.0]
        """
        return self.data.astype(np.float64) * 2.0**self.exponent


@dataclass
class ValueInfo:
    """A graph input, output or intermediate tensor: shape, element type and exponents.

    Example:
        >>> ValueInfo("x", [1, 16], 3, [-6]).exponent
        -6
    """

    name: str
    shape: list[int | str] | None = None
    elem_type: int = 3
    exponents: list[int] = field(default_factory=list)
    doc_string: str = ""

    @property
    def exponent(self) -> int:
        """The single exponent.

        Example:
            >>> ValueInfo("x", None, 3, [-1]).exponent
            -1
        """
        if len(self.exponents) != 1:
            raise EspdlError(
                f"value {self.name!r} has {len(self.exponents)} exponents, expected one"
            )
        return int(self.exponents[0])


@dataclass
class Node:
    """One operator: ``attributes`` maps names to Python values (int, float, str, lists, Tensor).

    ``attribute_types`` keeps each attribute's espdl.AttributeType so that an empty list or an
    integral float is written back as it was read.

    Example:
        >>> n = Node("/fc/Gemm", "Gemm", ["x", "w", "b"], ["y"], {"activation": "Relu"})
        >>> n.attributes["activation"]
        'Relu'
    """

    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attributes: dict[str, Any] = field(default_factory=dict)
    attribute_types: dict[str, int] = field(default_factory=dict)
    domain: str = ""
    doc_string: str = ""


@dataclass
class EspdlModel:
    """A whole ``.espdl`` model.

    ``metadata`` holds ``metadata_props`` (esp-ppq writes ``target``: ``c``, ``esp32s3`` or
    ``esp32p4``; older files have none). ``test_inputs`` / ``test_outputs`` are the values the
    runtime's ``Model::test()`` checks on the chip.

    Example:
        >>> m = EspdlModel(nodes=[], initializers={}, metadata={"target": "esp32s3"})
        >>> m.target, m.initializers
        ('esp32s3', {})
    """

    nodes: list[Node]
    initializers: dict[str, Tensor]
    inputs: list[ValueInfo] = field(default_factory=list)
    outputs: list[ValueInfo] = field(default_factory=list)
    value_info: list[ValueInfo] = field(default_factory=list)
    test_inputs: list[Tensor] = field(default_factory=list)
    test_outputs: list[Tensor] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    ir_version: int = 8
    graph_name: str = ""
    producer_name: str = ""
    producer_version: str = ""
    domain: str = ""
    model_version: int = 0
    doc_string: str = ""
    opset_import: list[tuple[str, int]] = field(default_factory=list)
    source: str = "<memory>"

    @property
    def target(self) -> str | None:
        """The target written by esp-ppq in ``metadata_props`` (None when absent).

        Example:
            >>> EspdlModel([], {}).target is None
            True
        """
        return self.metadata.get("target")

    def value(self, name: str) -> ValueInfo | None:
        """The ValueInfo of tensor ``name`` (inputs, outputs, then value_info), or None.

        Example:
            >>> m = EspdlModel([], {}, inputs=[ValueInfo("x", [1], 3, [-2])])
            >>> m.value("x").exponents
            [-2]
        """
        for info in (*self.inputs, *self.outputs, *self.value_info):
            if info.name == name:
                return info
        return None


def filter_nhwc(tensor: Tensor, group: int, target: str) -> np.ndarray:
    """A Conv/Gemm filter as ``[N, *kernel, C]`` (output channel first), from its file order.

    esp-ppq (``ResetParamLayoutPattern`` in ``export_patterns.py``) stores the filter of an
    ``[N, kernel..., C]`` (channel-last, ``C`` = input channels, 1 for depthwise) tensor:

    - ``c`` target: plain ``N, kernel..., C`` order; depthwise as ``kernel..., N``;
    - esp32s3 / esp32p4: the first ``N // B * B`` output channels in blocks of ``B`` (16 for
      int8, 8 for int16) as ``[N/B, kernel..., C, B]``; the remaining channels follow in plain
      ``N, kernel..., C`` order (depthwise: ``kernel..., N``).

    ``dims`` say ``[kernel..., C, N]`` (depthwise ``[kernel..., N, 1]``) but do not describe the
    byte order, so the layout is chosen from the target (``layout ==>`` notes agree).

    Example:
        >>> w = np.arange(2 * 3).reshape(1, 1, 3, 2).astype(np.int8)  # c target: N=2, C=3
        >>> filter_nhwc(Tensor("w", w), 1, "c")[:, 0, 0, :].tolist()  # stored N-major
        [[0, 1, 2], [3, 4, 5]]
    """
    dims = tensor.dims
    if len(dims) < 2:  # a Gemm filter is [C, N]; a conv's [kernel..., C, N]
        raise EspdlError(f"filter {tensor.name!r}: dims {dims}, expected [kernel..., C, N]")
    flat = tensor.data.reshape(-1)
    kernel = dims[:-2]
    if group == 1:
        c, n = dims[-2], dims[-1]
    else:
        n, c = dims[-2], dims[-1]
    ksize = int(np.prod(kernel)) if kernel else 1
    if flat.size != n * ksize * c:
        raise EspdlError(f"filter {tensor.name!r}: {flat.size} values for dims {dims}")
    if target == "c":
        if group == 1:
            return flat.reshape(n, *kernel, c)
        return np.moveaxis(flat.reshape(*kernel, n), -1, 0)[..., None]
    block = 16 if tensor.data.dtype.itemsize == 1 else 8
    aligned = n // block * block
    head = flat[: aligned * ksize * c].reshape(aligned // block, ksize, c, block)
    head = np.moveaxis(head, 3, 1).reshape(aligned, ksize, c)
    rest = flat[aligned * ksize * c :]
    if group == 1:
        rest = rest.reshape(n - aligned, ksize, c)
    else:
        rest = rest.reshape(ksize, n - aligned).T[..., None]
    return np.concatenate([head, rest], 0).reshape(n, *kernel, c)


def filter_file_order(nhwc: np.ndarray, group: int, target: str) -> tuple[np.ndarray, str]:
    """``(stored tensor, layout note)`` of a filter given as ``[N, *kernel, C]``: the inverse of
    :func:`filter_nhwc`, in esp-ppq's order for ``target`` (``ResetParamLayoutPattern``).

    The result is shaped as the file's ``dims``: ``[*kernel, C, N]`` (depthwise ``group > 1``:
    ``[*kernel, N, 1]``); its elements are in the target's order (blocks of 16 output channels
    for int8, 8 for int16 on esp32s3 / esp32p4, the rest plain; ``c``: plain).

    Example:
        >>> w = np.arange(2 * 3, dtype=np.int8).reshape(2, 1, 1, 3)  # N=2, 1x1, C=3
        >>> stored, note = filter_file_order(w, 1, "c")
        >>> stored.shape, note, filter_nhwc(Tensor("w", stored), 1, "c").tolist() == w.tolist()
        ((1, 1, 3, 2), 'NHWC', True)
    """
    n, *kernel, c = nhwc.shape
    dims = [*kernel, c, n] if group == 1 else [*kernel, n, 1]
    spatial = "HW" if len(kernel) == 2 else "W"
    if target == "c":
        if group == 1:
            return nhwc.reshape(dims), f"N{spatial}C"
        return np.ascontiguousarray(np.moveaxis(nhwc[..., 0], 0, -1)).reshape(dims), f"{spatial}CN"
    block = 16 if nhwc.dtype.itemsize == 1 else 8
    aligned = n // block * block
    flat = nhwc.reshape(n, -1)
    size = flat.shape[1]
    head = flat[:aligned].reshape(aligned // block, block, size).transpose(0, 2, 1).reshape(-1)
    rest = flat[aligned:]
    if group != 1:  # depthwise remainder: kernel-major, channel last
        rest = rest.T
    stored = np.concatenate([head, rest.reshape(-1)]).reshape(dims)
    note = f"N{block}{spatial}C{block}" + ("_UNALIGNED" if aligned != n else "")
    return stored, note
