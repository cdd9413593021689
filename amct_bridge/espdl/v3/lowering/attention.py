"""Lowering of a matrix product of two activations (``keras.ops.matmul(q, k)``, attention's
scores and context): the runtime's batched ``MatMul`` (dl_module_matmul.hpp), B an activation
stored row-major (``input1_layout`` ``native_kn``, as esp-ppq writes it), the output through
the conv output stage: ``sat(round_shift(Σ a·b, e_out − e_a − e_b))``.

Example:
    >>> matmul_shape([1, 4, 6, 8], [1, 4, 8, 6]), matmul_shape([1, 6, 8], [8, 3])
    ([1, 4, 6, 6], [1, 6, 3])
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.exponents import keep_mac_shift
from amct_bridge.espdl.v3.lowering.emitter import Emitter

__all__ = ["lower_matmul", "matmul_shape"]


def matmul_shape(a: list[int], b: list[int]) -> list[int] | None:
    """``np.matmul``'s output shape for operands of rank 2 to 4, or None when they do not
    chain or their batch dimensions do not broadcast."""
    if not (2 <= len(a) <= 4 and 2 <= len(b) <= 4) or a[-1] != b[-2]:
        return None
    try:
        batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    except ValueError:
        return None
    return [*batch, a[-2], b[-1]]


def lower_matmul(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``keras.ops.matmul`` of two activations: ``MatMul`` (B ``native_kn``)."""
    if len(ins) != 2:
        em.refuse(
            layer,
            f"{layer.kind} of {len(ins)} activation(s): the ESP-DL v3 MatMul is exported for "
            "two activations (a product with a constant is a Dense layer)",
        )
        return
    a, b = ins
    shape = matmul_shape(em.shapes[a], em.shapes[b])
    if shape is None:
        em.refuse(
            layer,
            f"{layer.kind} of shapes {em.shapes[a]} and {em.shapes[b]}: the ESP-DL v3 MatMul "
            "takes operands of rank 2 to 4 whose batch dimensions broadcast",
        )
        return
    e_a, e_b = em.exps[a], em.exps[b]
    inner = em.shapes[a][-1]
    reach = max(map(abs, em.range_of(a))) * max(map(abs, em.range_of(b))) * inner
    fallback = (em.range_exp(-reach, reach, layer.name), "bound of the product's sum")
    e_out, src, rng = em.out_exp(layer, fallback)
    e_out, raised = keep_mac_shift(e_a, e_b, e_out)
    if raised:
        src += f"; raised to {e_out} for mac_shift >= 0 (e_a {e_a} + e_b {e_b})"
    attrs = {"activation": "Linear", "input1_layout": "native_kn"}
    em.node(layer.name, "MatMul", [a, b], [layer.name], attrs)
    em.tensor(layer.name, e_out, src, shape, rng)
    em.output(layer, layer.name)
