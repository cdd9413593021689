"""Neg: ``dl_module_neg.hpp``.

The module negates the integers as they are: it reads neither the node's table (esp-ppq writes
one, attribute ``lut``) nor the exponents, and maps the type's minimum to its maximum
(``INT8_MIN -> INT8_MAX``, ``INT16_MIN -> INT16_MAX``). float32: ``-x``.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import EspdlError, Node
from amct_bridge.espdl.v3.ops._base import Context, saturate
from amct_bridge.espdl.v3.ops.lut import is_float

OP_TYPES = ("Neg",)


def _exponent(ctx: Context, name: str, node: Node) -> int | None:
    """The tensor's exponent, None when the file gives none (the runtime reads none)."""
    try:
        return ctx.exponent(name, node)
    except EspdlError:
        return None


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``-x``, the type's minimum going to its maximum.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> ctx.values["x"] = np.array([-128, -1, 0, 127], np.int8)
        >>> compute(ctx, Node("n", "Neg", ["x"], ["y"], {"quant_type": "S8"}))[0].tolist()
        [127, 1, 0, -127]
    """
    x = ctx.value(node.inputs[0], node)
    if is_float(node):
        return [(-x).astype(np.float32)]
    e_in, e_out = (_exponent(ctx, name, node) for name in (node.inputs[0], node.outputs[0]))
    if e_in is not None and e_out is not None and e_in != e_out:
        ctx.notes.append(
            f"node {node.name!r} (Neg): exponents {e_in} -> {e_out} differ; the runtime negates "
            "the integers without rescaling, and so does this simulation"
        )
    dtype = ctx.out_dtype(node)
    return [saturate(-x.astype(np.int64), dtype)]
