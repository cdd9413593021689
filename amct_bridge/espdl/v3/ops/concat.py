"""Concat: ``dl_module_concat.hpp``."""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("Concat",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    parts = [ctx.value(n, node) for n in node.inputs if n]
    exps = {ctx.exponent(n, node) for n in node.inputs if n} | {ctx.exponent(node.outputs[0], node)}
    if len(exps) != 1:
        ctx.notes.append(
            f"node {node.name!r} (Concat): exponents {sorted(exps)} differ; the runtime copies "
            "the integers, and so does this simulation"
        )
    return [np.concatenate(parts, axis=int(node.attributes.get("axis", 0)))]
