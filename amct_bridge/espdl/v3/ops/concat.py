"""Concat: the stored integers of the inputs joined along ``axis``, no arithmetic.

Runtime: ``dl_module_concat.hpp``, which copies the inputs as they are: esp-ppq gives the
inputs and the output one exponent (a file where they differ is noted, not rescaled).
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("Concat",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """The inputs concatenated along ``axis`` (default 0), integers copied unchanged.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo(n, None, 3, [-3]) for n in "aby"])
        >>> ctx = Context(m, "c")
        >>> ctx.values.update(a=np.int8([[1, 2], [3, 4]]), b=np.int8([[5], [6]]))
        >>> compute(ctx, Node("n", "Concat", ["a", "b"], ["y"], {"axis": 1}))[0].tolist()
        [[1, 2, 5], [3, 4, 6]]
    """
    parts = [ctx.value(n, node) for n in node.inputs if n]
    exps = {ctx.exponent(n, node) for n in node.inputs if n} | {ctx.exponent(node.outputs[0], node)}
    if len(exps) != 1:
        ctx.notes.append(
            f"node {node.name!r} (Concat): exponents {sorted(exps)} differ; the runtime copies "
            "the integers, and so does this simulation"
        )
    return [np.concatenate(parts, axis=int(node.attributes.get("axis", 0)))]
