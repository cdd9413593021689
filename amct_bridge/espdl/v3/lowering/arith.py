"""Lowerings of element-wise arithmetic and joins: Add / Subtract (``Add``, ``Sub``; inputs
at another exponent through ``RequantizeLinear``, scalars as constants), Multiply (``Mul``),
Concatenate (``Concat``), and Maximum / Minimum.

The runtime has Max and Min modules (dl_module_max.hpp, _min) but does not register them
(dl_module_creator.hpp): a file with a ``Max`` node does not load. Maximum / Minimum are
therefore the inputs, each requantized to the output's exponent (a monotone rounding, so the
largest stays the largest) and given a trailing axis of 1, joined by a ``Concat`` on it and
reduced by ``ReduceMax`` / ``ReduceMin`` (integers compared as they are): exact.

Example:
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> operands(SourceLayer("a", "runtime", attrs={"scalar_operands": [(1, 3.0)]}), ["x"])
    [('x', 0.0), (None, 3.0)]
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.lowering.emitter import Emitter
from amct_bridge.quant.espdl import auto_exponent

__all__ = [
    "lower_add_sub",
    "lower_concat",
    "lower_max_min",
    "lower_multiply",
    "lower_scale",
    "operands",
]


def broadcast(em: Emitter, layer: SourceLayer, ins: list[str]) -> list[int] | None:
    """The broadcast shape of the inputs, or None (the layer refused)."""
    try:
        return list(np.broadcast_shapes(*(tuple(em.shapes[t]) for t in ins)))
    except ValueError:
        em.refuse(layer, f"inputs of shapes {[em.shapes[t] for t in ins]} do not broadcast")
        return None


def operands(layer: SourceLayer, ins: list[str]) -> list[tuple[str | None, float]]:
    """(tensor, 0.0) or (None, scalar) per operand, in the call's order (``x + 3.0``)."""
    scalars = {int(i): float(v) for i, v in layer.attrs.get("scalar_operands") or []}
    tensors = iter(ins)
    return [
        (None, scalars[i]) if i in scalars else (next(tensors), 0.0)
        for i in range(len(ins) + len(scalars))
    ]


def constant(em: Emitter, name: str, value: float, exp: int | None = None) -> str:
    """A scalar operand as a one-element integer initializer (its own exponent if None)."""
    if exp is None:
        exp = auto_exponent([value], em.bits, name=name)
    return em.init(name, em.quantize(np.array([value]), exp), exp)


def lower_add_sub(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Add / Subtract of two or more operands: a chain of ``Add`` / ``Sub`` at one exponent."""
    ops = operands(layer, ins)
    if len(ops) < 2:
        em.refuse(layer, f"{layer.kind} of {len(ops)} operand(s): not exported")
        return
    shape = broadcast(em, layer, ins)
    if shape is None:
        return
    reach = sum(max(map(abs, em.range_of(t))) if t else abs(c) for t, c in ops)
    fallback = (
        em.range_exp(-reach, reach, layer.name),
        "bound of the operands' ranges (no calibrated range)",
    )
    if reach == 0.0:  # operands all 0 on the calibration data: keep their exponent, not 0
        fallback = (max(em.exps[t] for t, _ in ops if t), "the operands' largest exponent")
    e, src, rng = em.out_exp(layer, fallback)
    op = "Add" if layer.kind == "Add" else "Sub"
    parts = []
    for i, (tensor, value) in enumerate(ops):
        if tensor is None:  # in the output's exponent: the kernels add integers as they are
            parts.append(constant(em, f"{layer.name}/operand_{i}", value, e))
        else:
            parts.append(em.requant(tensor, e, layer.name, i))
    total = parts[0]
    for i, other in enumerate(parts[1:], start=1):
        out = layer.name if i == len(parts) - 1 else f"{layer.name}/partial_{i}"
        em.node(out, op, [total, other], [out])
        em.tensor(out, e, src, shape, rng)
        total = out
    em.tensor_of[layer.name] = layer.name
    em.done(layer, "exported")


def lower_multiply(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Multiply of two operands (a scalar one as a constant): ``Mul``."""
    ops = operands(layer, ins)
    if len(ops) != 2:
        em.refuse(
            layer,
            f"Multiply of {len(ops)} operands: the ESP-DL v3 Mul takes two (chain Multiply "
            "layers of two)",
        )
        return
    shape = broadcast(em, layer, ins)
    if shape is None:
        return
    parts = [
        t if t is not None else constant(em, f"{layer.name}/operand_{i}", c)
        for i, (t, c) in enumerate(ops)
    ]
    exps = [em.exps[p] if p in em.exps else em.inits[p].exponent for p in parts]
    bound = exps[0] + exps[1] + em.bits - 1
    e, src, rng = em.out_exp(layer, (bound, "bound of the product (no calibrated range)"))
    em.node(layer.name, "Mul", parts, [layer.name])
    em.tensor(layer.name, e, src, shape, rng)
    em.tensor_of[layer.name] = layer.name
    em.done(layer, "exported")


def lower_concat(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Concatenate: ``Concat``, inputs requantized to one exponent."""
    shapes = [em.shapes[t] for t in ins]
    rank = len(shapes[0])
    axis = int(layer.attrs.get("axis", -1)) % rank
    out_shape = list(shapes[0])
    out_shape[axis] = sum(s[axis] for s in shapes)
    top = max(em.exps[t] for t in ins)
    e, src, rng = em.out_exp(layer, (top, "the largest input exponent"))
    parts = [em.requant(t, e, layer.name, i) for i, t in enumerate(ins)]
    em.node(layer.name, "Concat", parts, [layer.name], {"axis": axis})
    em.tensor(layer.name, e, src, out_shape, rng)
    em.tensor_of[layer.name] = layer.name
    em.done(layer, "exported")


def lower_max_min(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Maximum / Minimum: ``Reshape`` + ``Concat`` + ``ReduceMax`` / ``ReduceMin`` (module
    docstring: the runtime does not load its Max / Min modules)."""
    shapes = [em.shapes[t] for t in ins]
    if len(ins) < 2 or any(s != shapes[0] for s in shapes):
        em.refuse(
            layer,
            f"{layer.kind} of inputs shaped {shapes}: exported for two or more inputs of one "
            "shape (the ESP-DL v3 runtime does not load its Max / Min modules, so this is a "
            "Concat + Reduce, which does not broadcast)",
        )
        return
    shape = shapes[0]
    top = max(em.exps[t] for t in ins)
    e, src, rng = em.out_exp(layer, (top, "the largest input exponent"))
    name = layer.name
    parts = []
    for i, t in enumerate(ins):
        q = em.requant(t, e, name, i)
        parts.append(em.reshape(q, f"{name}/expand_{i}", [*shape, 1]))
    joined = f"{name}/stack"
    em.node(joined, "Concat", parts, [joined], {"axis": len(shape)})
    em.tensor(joined, e, src, [*shape, len(ins)], rng)
    axes = em.shape_init(f"{name}/axes", [len(shape)])
    op = "ReduceMax" if layer.kind == "Maximum" else "ReduceMin"
    em.node(name, op, [joined, axes], [name], {"keepdims": 0})
    em.tensor(name, e, src, shape, rng)
    em.output(layer, name)


def lower_scale(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """A per-channel scale (keras.applications ConvNeXt's ``LayerScale``, ``x · gamma``): ``Mul``
    by ``gamma`` in the feature type at its own exponent."""
    x = ins[0]
    gamma = layer.weights.get("gamma")
    channels = em.shapes[x][-1]
    if gamma is None or np.size(gamma) not in (1, channels):
        em.refuse(layer, f"{layer.kind} without one gamma per channel ({channels})")
        return
    gamma = np.asarray(gamma, np.float64).reshape(-1)
    e_g = auto_exponent(gamma, em.bits, name=f"{layer.name} gamma")
    g = em.init(f"{layer.name}/gamma", em.quantize(gamma, e_g), e_g)
    reach = max(map(abs, em.range_of(x))) * float(np.abs(gamma).max())
    fallback = (em.range_exp(-reach, reach, layer.name), "bound of the input range times gamma")
    e, src, rng = em.out_exp(layer, fallback)
    em.node(layer.name, "Mul", [x, g], [layer.name])
    em.tensor(layer.name, e, src, em.shapes[x], rng)
    em.output(layer, layer.name)
