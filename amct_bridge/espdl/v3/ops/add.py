"""Add and Sub: integers added as they are.

Runtime: ``dl_module_add.hpp`` / ``dl_module_sub.hpp``, ``dl_base_add.cpp``, ``dl_base_sub.cpp``.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context, saturate

OP_TYPES = ("Add", "Sub")


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``a + b`` (Sub: ``a - b``) on the stored integers, saturated (``dl_base_add.cpp`` /
    ``dl_base_sub.cpp``); the exponents are not used: esp-ppq gives the three tensors one.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo(n, [3], 3, [-4]) for n in "aby"])
        >>> ctx = Context(m, "esp32s3")
        >>> ctx.values.update(a=np.int8([100, -100, 3]), b=np.int8([100, 100, -5]))
        >>> compute(ctx, Node("n", "Add", ["a", "b"], ["y"], {"quant_type": "S8"}))[0].tolist()
        [127, 0, -2]
        >>> compute(ctx, Node("n", "Sub", ["a", "b"], ["y"], {"quant_type": "S8"}))[0].tolist()
        [0, -128, 8]
    """
    a, b = (ctx.value(n, node).astype(np.int64) for n in node.inputs[:2])
    exps = [ctx.exponent(n, node) for n in (*node.inputs[:2], node.outputs[0])]
    if len(set(exps)) != 1:
        # the v3 kernels add the integers as they are (no rescaling): esp-ppq keeps one exponent
        ctx.notes.append(
            f"node {node.name!r} ({node.op_type}): exponents {exps[0]}, {exps[1]} -> {exps[2]} "
            "differ; the runtime adds the integers without rescaling, and so does this simulation"
        )
    out = a + b if node.op_type == "Add" else a - b
    return [saturate(out, ctx.out_dtype(node))]
