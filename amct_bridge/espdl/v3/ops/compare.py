"""Equal, Greater, GreaterOrEqual, Less, LessOrEqual: the stored integers compared as they are.

Runtime: ``dl_module_equal.hpp`` (and ``_greater``, ``_greater_or_equal``, ``_less``,
``_less_or_equal``), ``dl_base_equal.cpp`` (and the others), ``dl_base_elemwise.cpp`` for the
broadcast, ``isa/{tie728,esp32p4}/dl_*_s{8,16}_<op>.S``. Every kernel, C and assembly, compares
the stored int8 / int16 values of both inputs as they are (the assembly's comment: "input0 exp
= input1 exp = output exp"): there is no rescaling when the two exponents differ; esp-ppq aligns
them before export (``TYPES_FOR_ALIGNMENT['LogicalElementwise']``). The output is bool (one byte
each, 0 or 1), exponent 0. The broadcast is ONNX's multidirectional one, which the runtime runs
after merging the two shapes into at most 4 dimensions (``get_elemwise_operation_args``, which
asserts ``merged_dims <= 4``).

"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, elemwise_rows

OP_TYPES = ("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual")
_RELATIONS = {
    "Equal": np.equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
}


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """The node's relation of its two inputs' stored integers, broadcast, as bool (exponent 0).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo(n, [3], 3, [-4]) for n in "ab"])
        >>> ctx = Context(m, "esp32s3")
        >>> ctx.values.update(a=np.int8([3, -2, 5]), b=np.int8([3, 2, 4]))
        >>> for op in OP_TYPES:
        ...     print(op, compute(ctx, Node("n", op, ["a", "b"], ["y"]))[0].tolist())
        Equal [True, False, False]
        Greater [False, False, True]
        GreaterOrEqual [True, False, True]
        Less [False, True, False]
        LessOrEqual [True, True, False]
    """
    relation = _RELATIONS[node.op_type]
    ctx.out_dtype(node)  # the module exists for S8 and S16 only: anything else is refused here
    a, b = (np.asarray(ctx.value(n, node)) for n in node.inputs[:2])
    try:
        out_shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError as exc:
        raise ctx.refuse(
            node, f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast"
        ) from exc
    if elemwise_rows(a.shape, b.shape)[3] > 4:
        raise ctx.refuse(
            node,
            f"shapes {list(a.shape)} and {list(b.shape)} merge into more than 4 dimensions, "
            "which the runtime's element-wise loop does not handle (dl_base_elemwise.cpp)",
        )
    e0, e1 = (ctx.exponent(n, node) for n in node.inputs[:2])
    if e0 != e1:
        ctx.notes.append(
            f"node {node.name!r} ({node.op_type}): input exponents {e0} and {e1} differ; the "
            "runtime compares the stored integers without rescaling, and so does this simulation"
        )
    out = relation(a.astype(np.int64), b.astype(np.int64))
    return [np.broadcast_to(out, out_shape).astype(np.bool_)]
