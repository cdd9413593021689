"""MatMul: ``dl_module_matmul.hpp``, every product run as a 1x1 conv (``dl_base_conv2d.cpp``).

The module views A as the conv input (``[1, 1, M, K]``) and B as the filter (``[1, 1, K, N]``),
with no bias, the node's fused ReLU and the conv's output stage (``e_out - e_a - e_b`` shift,
rounded as the target rounds). Operands of rank > 2 are batched: the module loops over the
batch dims, rank 3 and 4 broadcast a batch dim of 1 (``input0_batch == 1 ? 0 : i``), a rank-1
operand multiplies every matrix of the other; the output shape is ``torch.matmul``'s (a dot
product of two vectors gives ``[1]``).

B's element order is named by esp-ppq's ``input1_layout`` (esp-ppq 1.3.12,
``InsertPreNodeOfMatMulPattern``; the attribute is newer than esp-dl 12c0616d, whose module
reads B as the conv filter): ``packed`` (a constant, or a file without the attribute) keeps
each ``[K, N]`` matrix in the conv filter order of the target (blocks of 16 int8 / 8 int16
output columns on esp32s3 / esp32p4, :func:`filter_nhwc`); ``native_kn`` (an activation B) is
plain row-major ``[..., K, N]``. From the files: the suite's MatMul files of two activations
(``native_kn``), batched and broadcast, and the constant ones (``packed``) are equal under this
rule on every target; a constant B may carry per-channel exponents on esp32p4 (one per column,
as a Gemm filter: :func:`~amct_bridge.espdl.v3.ops.conv.filter_shift`).

Example:
    >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
    >>> m = EspdlModel([], {}, inputs=[ValueInfo("a", [2, 2], 3, [0]),
    ...     ValueInfo("b", [2, 2], 3, [0])], outputs=[ValueInfo("y", [2, 2], 3, [1])])
    >>> ctx = Context(m, "esp32p4")
    >>> ctx.values["a"] = np.array([[1, 2], [3, 4]], np.int8)
    >>> ctx.values["b"] = np.array([[1, 0], [1, 1]], np.int8)
    >>> node = Node("mm", "MatMul", ["a", "b"], ["y"], {"input1_layout": "native_kn"})
    >>> compute(ctx, node)[0].tolist()  # [[3, 2], [7, 4]] / 2, half to even
    [[2, 1], [4, 2]]
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node, Tensor, filter_nhwc
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops.conv import (
    filter_shift,
    fused_activation,
    note_qacc_reach,
    requant_output,
)

OP_TYPES = ("MatMul",)


def unpack_b(data: np.ndarray, layout: str, target: str) -> np.ndarray:
    """B as logical ``[..., K, N]`` integers from its stored order (``packed`` or ``native_kn``).

    Example:
        >>> packed = np.arange(32, dtype=np.int8).reshape(16, 2).T.reshape(2, 16)  # K=2, N=16
        >>> b = unpack_b(packed, "packed", "esp32s3")
        >>> b.shape, b[1, :3].tolist(), unpack_b(b, "native_kn", "esp32s3")[1, :3].tolist()
        ((2, 16), [1, 3, 5], [1, 3, 5])
    """
    if data.ndim < 2 or layout == "native_kn":
        return data  # a vector B is [K, 1]: the same in every layout
    k, n = data.shape[-2:]
    mats = data.reshape(-1, k, n)
    out = np.empty_like(mats)
    for i, mat in enumerate(mats):  # each batch matrix is a filter of its own
        out[i] = filter_nhwc(Tensor("B", mat), 1, target).reshape(n, k).T
    return out.reshape(data.shape)


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # float64 sums are exact below 2^53 (int8/int16 products over any practical K): BLAS then
    # computes the integer sums, ~20x faster than numpy's int64 matmul
    reach = int(np.abs(a).max(initial=0)) * int(np.abs(b).max(initial=0)) * max(a.shape[-1], 1)
    if reach < 2**53:
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """A MatMul node: ``act((A @ B) · 2^-shift)`` saturated, batched as the module batches.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("a", [3], 3, [0]),
        ...     ValueInfo("b", [2, 3, 1], 3, [0])], outputs=[ValueInfo("y", [2, 1], 3, [0])])
        >>> ctx = Context(m, "c")
        >>> ctx.values["a"] = np.array([1, 2, 3], np.int8)
        >>> ctx.values["b"] = np.array([1, 1, 1, 0, 0, -1], np.int8).reshape(2, 3, 1)
        >>> node = Node("mm", "MatMul", ["a", "b"], ["y"], {"activation": "Relu"})
        >>> compute(ctx, node)[0].tolist()  # [6, -3], ReLU
        [[6], [0]]
    """
    act = fused_activation(ctx, node)
    a = ctx.value(node.inputs[0], node)
    b_name = node.inputs[1]
    constant = b_name in ctx.model.initializers
    layout = str(node.attributes.get("input1_layout", "packed"))
    if layout not in ("packed", "native_kn"):
        raise ctx.refuse(node, f"input1_layout {layout!r} (packed and native_kn are simulated)")
    if constant:
        tensor = ctx.initializer(b_name, node)
        data, exponents = tensor.data, list(tensor.exponents)
    else:
        data, exponents = ctx.value(b_name, node), [ctx.exponent(b_name, node)]
    if not 1 <= a.ndim <= 4 or not 1 <= data.ndim <= 4:
        raise ctx.refuse(node, f"operands of rank {a.ndim} and {data.ndim} (the module: <= 4)")
    b = unpack_b(data, layout, ctx.target)
    k = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if a.shape[-1] != k:
        raise ctx.refuse(node, f"A {list(a.shape)} and B {list(b.shape)} do not chain")
    if a.ndim > 2 and b.ndim > 2:
        for da, db in zip(a.shape[-3::-1], b.shape[-3::-1], strict=False):
            if da != db and 1 not in (da, db):  # the module asserts batch 1 or equal
                raise ctx.refuse(node, f"batch dims of {list(a.shape)} and {list(b.shape)}")
    n = b.shape[-1] if b.ndim > 1 else 1
    filt = Tensor(b_name, np.zeros(0, np.int8), exponents)
    if len(exponents) > 1 and b.ndim > 2:
        # the batched path rebuilds each filter with input1->exponent (dl_module_matmul.hpp):
        # no file shows a per-channel batched B
        raise ctx.refuse(node, "a batched B with per-channel exponents is not simulated")
    shift = filter_shift(ctx, node, filt, n)
    acc = _matmul(a, b)
    if a.ndim == 1 and b.ndim == 1:
        acc = acc.reshape(1)
    note_qacc_reach(ctx, node, acc[..., : n // 16 * 16])
    return [requant_output(ctx, node, acc, shift, act, ctx.out_dtype(node))]
