"""Lowerings of element-wise math and reductions as Keras 3 records ``keras.ops`` calls in a
functional model (raw ops named by their class): ``divide`` / ``x / y`` (``Div``), ``sqrt``,
``exp``, ``log`` (``Sqrt``, ``Exp``, ``Log``), ``power`` / ``x ** p`` (``Pow``), ``negative`` /
``-x`` (``Neg``), ``max`` / ``min`` / ``sum`` / ``mean`` over axes (``ReduceMax``,
``ReduceMin``, ``ReduceSum``, ``ReduceMean``), and the ``Embedding`` layer.

Every op here is a module esp-dl registers (``dl_module_creator.hpp``). Sqrt / Exp / Log in
int8 carry a 256-entry table (``lut``, which their loaders turn into the LUT module, as
esp-ppq writes every int8 Exp), each entry the exact rounding of the float function; in int16
the module computes ``round(f(x·2^e_in)·2^-e_out)`` in float32 (no 128 KiB table).

``Embedding`` is no ``Gather``: the runtime's Gather reads its indices as a constant
(``dl_module_gather.hpp``: ``get_operation_parameter(node, 1)``), never from an activation.
The export therefore looks the table up with the model's integer input, one ``LUT`` per output
feature (``table[x + 128]`` in int8; int16: a table of step ``2^k``) joined by a ``Concat``:
exact, since every entry is the table's value at the output's exponent. The input holds the
indices at exponent 0 (int8: up to 127) or, in int16, ``-k`` (the index times ``2^k``, so the
table has ``2^(16-k) + 1`` entries instead of 65537).

Example:
    >>> reduce_shape([1, 4, 5, 3], [1, 2], keepdims=False), index_exponent(8, 20)
    ([1, 3], 0)
    >>> index_exponent(16, 20)  # 19 · 2^10 fits int16
    -10
"""

from __future__ import annotations

import math

import numpy as np

from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.lowering.arith import broadcast, constant, operands
from amct_bridge.espdl.v3.lowering.emitter import Emitter
from amct_bridge.quant.espdl import auto_exponent

__all__ = [
    "REDUCE_OPS",
    "UNARY_OPS",
    "index_exponent",
    "lower_divide",
    "lower_embedding",
    "lower_negative",
    "lower_power",
    "lower_reduce",
    "lower_unary",
    "reduce_shape",
]


def _sqrt(t: np.ndarray) -> np.ndarray:
    return np.sqrt(np.maximum(t, 0.0))  # NaN in Keras below 0: the table gives 0


def _log(t: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):  # -inf (saturated to the minimum) at and below 0
        return np.log(np.where(t > 0, t, 0.0))


#: Keras op kind -> (v3 op, float64 function of the real input, lowest input it is defined on).
UNARY_OPS = {
    "Sqrt": ("Sqrt", _sqrt, 0.0),
    "Exp": ("Exp", np.exp, -math.inf),
    "Log": ("Log", _log, math.ulp(0.0)),
}

#: keras.ops reduction kind -> v3 op.
REDUCE_OPS = {"Max": "ReduceMax", "Min": "ReduceMin", "Sum": "ReduceSum", "Mean": "ReduceMean"}


def _grid(em: Emitter, tensor: str | None, value: float) -> np.ndarray:
    """Points spanning an operand's range (calibrated, else its format's): a scalar itself."""
    if tensor is None:
        return np.array([value])
    lo, hi = em.range_of(tensor)
    return np.unique(np.append(np.linspace(lo, hi, 65), 0.0 if lo <= 0.0 <= hi else lo))


def _bound(em: Emitter, layer: SourceLayer, fn, ops, fallback_exp: int) -> tuple[int, str]:
    """The exponent covering ``fn`` over the operands' ranges (no calibrated range)."""
    grids = np.meshgrid(*(_grid(em, t, c) for t, c in ops), indexing="ij")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        values = np.asarray(fn(*grids), np.float64)
    top = np.abs(values[np.isfinite(values)])
    top = float(top.max()) if top.size else 0.0
    if top == 0.0 or top > 2.0 ** (em.bits + 60):
        return fallback_exp, "the input's exponent (no calibrated range, no finite bound)"
    return em.range_exp(
        -top, top, layer.name
    ), "bound over the operands' ranges (no calibrated range)"


def _below_domain_note(em: Emitter, layer: SourceLayer, x: str, low: float, what: str) -> None:
    lo = em.range_of(x)[0]
    if lo < low:
        em.notes.append(
            f"layer {layer.name!r} ({layer.kind}): its calibrated input reaches {lo:.4g}, where "
            f"{what}; Keras gives NaN or -inf there, the chip a saturated value"
        )


def lower_unary(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``keras.ops.sqrt`` / ``exp`` / ``log``: ``Sqrt`` / ``Exp`` / ``Log`` (int8 with a table).

    Example:
        >>> em = Emitter([SourceLayer("x", "input")], None, None, 8, "c", {}, {})
        >>> em.tensor("x", -5, "given", [1, 4, 3], (0.5, 3.0))
        'x'
        >>> lower_unary(em, SourceLayer("s", "unsupported", ["x"], "Sqrt"), ["x"])
        >>> [(n.op_type, sorted(n.attributes)) for n in em.nodes], em.exps["s"]
        ([('Sqrt', ['lut', 'quant_type'])], -6)
    """
    op, fn, low = UNARY_OPS[layer.kind]
    x = ins[0]
    e_in = em.exps[x]
    if low > -math.inf:
        _below_domain_note(em, layer, x, low, f"{layer.kind.lower()} is not defined")
    e_out, src, rng = em.out_exp(layer, _bound(em, layer, fn, [(x, 0.0)], e_in))
    attrs = {}
    if em.bits == 8:  # the module's loader runs the table as the LUT module
        attrs["lut"] = em.table(op, {}, e_in, e_out, fn)
    em.node(layer.name, op, [x], [layer.name], attrs)
    em.tensor(layer.name, e_out, src, em.shapes[x], rng)
    em.output(layer, layer.name)


def lower_negative(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``keras.ops.negative`` / ``-x``: ``Neg`` at the input's exponent (the module negates the
    integers and reads no exponent).

    Example:
        >>> em = Emitter([SourceLayer("x", "input")], None, None, 8, "c", {}, {})
        >>> em.tensor("x", -5, "given", [1, 4, 3], (0.5, 3.0))
        'x'
        >>> lower_negative(em, SourceLayer("n", "unsupported", ["x"], "Negative"), ["x"])
        >>> em.nodes[0].op_type, em.exps["n"], em.ranges["n"]
        ('Neg', -5, (-3.0, -0.5))
    """
    x = ins[0]
    lo, hi = em.range_of(x)
    em.node(layer.name, "Neg", [x], [layer.name])
    em.tensor(
        layer.name, em.exps[x], f"the input's ({x!r}): Neg keeps it", em.shapes[x], (-hi, -lo)
    )
    em.output(layer, layer.name)


def _two_operands(em: Emitter, layer: SourceLayer, ins: list[str], op: str):
    """The two operands of a Div / Pow as node inputs (a scalar as a constant at its own
    exponent), or None (refused)."""
    ops = operands(layer, ins)
    if len(ops) != 2 or layer.attrs.get("const_operands"):
        em.refuse(
            layer,
            f"{layer.kind} of {len(ins)} tensor(s) and {len(ops) - len(ins)} number(s)"
            + (" and a constant array" if layer.attrs.get("const_operands") else "")
            + f": the ESP-DL v3 {op} is exported for two operands, each an activation or a "
            "single number",
        )
        return None
    if broadcast(em, layer, ins) is None:
        return None
    parts = [
        t if t is not None else constant(em, f"{layer.name}/operand_{i}", c)
        for i, (t, c) in enumerate(ops)
    ]
    return ops, parts


def lower_divide(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``keras.ops.divide`` / ``x / y`` (a number on either side): ``Div``, computed by the
    runtime in float32 from the integers and rounded once.

    Example:
        >>> em = Emitter([SourceLayer("x", "input")], None, None, 8, "c", {}, {})
        >>> em.tensor("x", -5, "given", [1, 4, 3], (0.5, 3.0))
        'x'
        >>> div = SourceLayer("d", "unsupported", ["x"], "TrueDivide",
        ...                   attrs={"scalar_operands": [(1, 4.0)]})  # x / 4.0
        >>> lower_divide(em, div, ["x"])
        >>> em.nodes[0].inputs, em.inits["d/operand_1"].data.tolist(), em.exps["d"]
        (['x', 'd/operand_1'], [64], -7)
    """
    found = _two_operands(em, layer, ins, "Div")
    if found is None:
        return
    ops, parts = found
    fallback = _bound(em, layer, np.divide, ops, em.exps[ins[0]])
    e, src, rng = em.out_exp(layer, fallback)
    em.node(layer.name, "Div", parts, [layer.name])
    em.tensor(layer.name, e, src, broadcast(em, layer, ins), rng)
    em.output(layer, layer.name)


def lower_power(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``keras.ops.power`` / ``x ** p`` (a number on either side): ``Pow``, ``powf`` of the
    dequantized operands in float32, rounded once.

    Example:
        >>> em = Emitter([SourceLayer("x", "input")], None, None, 8, "c", {}, {})
        >>> em.tensor("x", -5, "given", [1, 4, 3], (0.5, 3.0))
        'x'
        >>> pw = SourceLayer("p", "unsupported", ["x"], "Power",
        ...                  attrs={"scalar_operands": [(1, 2.0)]})  # x ** 2
        >>> lower_power(em, pw, ["x"])
        >>> em.nodes[0].op_type, em.exps["p"]  # bound 9.0 over [0.5, 3]
        ('Pow', -3)
    """
    found = _two_operands(em, layer, ins, "Pow")
    if found is None:
        return
    ops, parts = found
    base, power = ops
    if base[0] is not None and power[0] is None and power[1] != round(power[1]):
        _below_domain_note(em, layer, base[0], 0.0, f"a power of {power[1]} is not defined")
    fallback = _bound(em, layer, np.power, ops, em.exps[ins[0]])
    e, src, rng = em.out_exp(layer, fallback)
    em.node(layer.name, "Pow", parts, [layer.name])
    em.tensor(layer.name, e, src, broadcast(em, layer, ins), rng)
    em.output(layer, layer.name)


def reduce_shape(shape: list[int], axes: list[int], keepdims: bool) -> list[int]:
    """The output shape of a reduction over ``axes`` (positive, batch axis 0 kept).

    Example:
        >>> reduce_shape([1, 4, 5, 3], [1, 2], keepdims=True)
        [1, 1, 1, 3]
    """
    if keepdims:
        return [1 if i in axes else s for i, s in enumerate(shape)]
    return [s for i, s in enumerate(shape) if i not in axes]


def lower_reduce(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``keras.ops.max`` / ``min`` / ``sum`` / ``mean`` over feature axes (``keepdims`` either
    way): ``ReduceMax`` / ``ReduceMin`` (integers compared, the input's exponent),
    ``ReduceSum`` (an exact integer sum, shifted), ``ReduceMean`` (float32, rounded once).

    Example:
        >>> em = Emitter([SourceLayer("x", "input")], None, None, 8, "c", {}, {})
        >>> em.tensor("x", -5, "given", [1, 4, 3], (0.5, 3.0))
        'x'
        >>> lower_reduce(em, SourceLayer("m", "unsupported", ["x"], "Max",
        ...                              attrs={"axis": -1, "keepdims": False}), ["x"])
        >>> em.nodes[0].op_type, em.inits["m/axes"].data.tolist(), em.shapes["m"]
        ('ReduceMax', [2], [1, 4])
    """
    x = ins[0]
    shape = em.shapes[x]
    rank = len(shape)
    axis = layer.attrs.get("axis")
    if layer.attrs.get("initial") is not None:
        em.refuse(
            layer,
            f"{layer.kind} with initial={layer.attrs['initial']}: the ESP-DL v3 "
            f"{REDUCE_OPS[layer.kind]} has no initial value (take keras.ops.maximum / minimum "
            "with a constant after the reduction)",
        )
        return
    axes = [axis] if isinstance(axis, int) else list(axis) if axis is not None else None
    axes = sorted({int(a) % rank for a in axes}) if axes else None
    if not axes or 0 in axes:
        em.refuse(
            layer,
            f"{layer.kind} over axis {axis!r}: it reduces the batch axis, which the chip does "
            "not have (it runs one sample); give the feature axes, e.g. axis=(1, 2)",
        )
        return
    flags = [i in axes for i in range(rank)]
    groups = 1 + sum(flags[i] != flags[i - 1] for i in range(1, rank))
    if groups > 4:  # dl_module_reduce_base.hpp's forward_template handles 4 merged axes
        em.refuse(
            layer,
            f"{layer.kind} over axes {axes} of a rank-{rank} tensor: they alternate into "
            f"{groups} groups and the ESP-DL v3 Reduce modules compute up to 4 (reshape first)",
        )
        return
    keep = bool(layer.attrs.get("keepdims", False))
    op = REDUCE_OPS[layer.kind]
    out_shape = reduce_shape(shape, axes, keep)
    name = layer.name
    e_in = em.exps[x]
    if op in ("ReduceMax", "ReduceMin"):  # the runtime compares the integers, unscaled
        e, src, rng = e_in, f"the input's ({x!r}): {op} keeps it", em.ranges.get(x)
    else:
        count = int(np.prod([shape[a] for a in axes]))
        reach = max(map(abs, em.range_of(x))) * (count if op == "ReduceSum" else 1)
        fallback = (em.range_exp(-reach, reach, name), f"bound of the {op} of the input range")
        if reach == 0.0:  # an input all 0 on the calibration data: its exponent, not 0
            fallback = (e_in, f"the input's ({x!r})")
        e, src, rng = em.out_exp(layer, fallback)
    axes_t = em.shape_init(f"{name}/axes", axes)
    em.node(name, op, [x, axes_t], [name], {"keepdims": int(keep)})
    em.tensor(name, e, src, out_shape, rng)
    em.output(layer, name)


def index_exponent(bits: int, vocabulary: int) -> int:
    """The exponent of an Embedding's integer input: 0 in int8 (indices as they are); in
    int16 ``-k``, the largest ``k`` with ``(vocabulary - 1)·2^k`` in int16, so the step-``2^k``
    table has ``2^(16-k) + 1`` entries.

    Example:
        >>> index_exponent(16, 200), index_exponent(16, 32768)
        (-7, 0)
    """
    if bits == 8:
        return 0
    top = max(vocabulary - 1, 1)
    return -min(15, int(math.floor(math.log2(32767 / top))))


def lower_embedding(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Embedding of the model's integer input: ``Reshape`` + one ``LUT`` per output feature +
    ``Concat`` (module docstring: the runtime's Gather takes constant indices only).

    Example:
        >>> tokens = SourceLayer("t", "input", attrs={"shape": (3,)})
        >>> emb = SourceLayer("e", "unsupported", ["t"], "Embedding",
        ...                   {"embeddings": np.float32([[0.5, -1], [0.25, 2]])})
        >>> em = Emitter([tokens, emb], None, None, 8, "c", {}, {})
        >>> em.tensor("t", -6, "calibrated", [1, 3], (0.0, 1.0))
        't'
        >>> lower_embedding(em, emb, ["t"])
        >>> em.exps["t"], [n.op_type for n in em.nodes], em.exps["e"], em.shapes["e"]
        (0, ['Reshape', 'LUT', 'LUT', 'Concat'], -5, [1, 3, 2])
        >>> em.inits["e/table_1"].data[128:131].tolist()  # rows 0, 1, then never read
        [-32, 64, 0]
    """
    table = layer.weights.get("embeddings")
    src_name = layer.inputs[0]
    source = em.by_name.get(src_name)
    readers = em.consumers.get(src_name, [])
    why = None
    if layer.attrs.get("quantization_mode"):
        why = (
            f"quantized by Keras ({layer.attrs['quantization_mode']}): export the float "
            "Embedding (the export quantizes its table itself)"
        )
    elif layer.attrs.get("mask_zero"):
        why = (
            "mask_zero=True: the ESP-DL v3 runtime carries no mask, so the layers after it "
            "would also use the padded steps; export it with mask_zero=False"
        )
    elif table is None or np.ndim(table) != 2:
        why = "no 2-D embeddings table"
    elif source is None or source.op != "input" or any(r.kind != "Embedding" for r in readers):
        why = (
            "the ESP-DL v3 Gather takes its indices as a constant only (dl_module_gather.hpp), "
            "so the export looks the table up with the model's integer input (a LUT per "
            "feature); it must read a model input that only Embedding layers read"
        )
    elif em.bits == 8 and table.shape[0] > 128:
        why = (
            f"{table.shape[0]} rows: an int8 input holds indices up to 127 (export s16, whose "
            "input holds indices up to 32767)"
        )
    elif table.shape[0] > 32768:
        why = f"{table.shape[0]} rows: an int16 input holds indices up to 32767"
    if why is not None:
        em.refuse(layer, f"Embedding {why}")
        return
    table = np.asarray(table, np.float64)
    rows, features = table.shape
    top = max(len(r.weights.get("embeddings", ())) for r in readers)
    e_idx = index_exponent(em.bits, top)
    x = ins[0]
    if em.exps[x] != e_idx:  # the integer indices, not the calibrated range, fix the input
        em.tensor(
            x,
            e_idx,
            f"the indices of Embedding {layer.name!r} ({top} rows): index · 2^{-e_idx}",
            em.shapes[x],
            (0.0, float(top - 1)),
        )
    e_out = auto_exponent(table, em.bits, name=f"{layer.name} embeddings")
    name = layer.name
    shape = em.shapes[x]
    column = em.reshape(x, f"{name}/indices", [*shape, 1])
    # entry j of the table is read for the stored input j·2^k − 2^15 (int8: j − 128), the
    # row index (j − offset); the other entries are never read for indices in range
    k = -e_idx
    size = 256 if em.bits == 8 else (1 << (16 - k)) + 1
    offset = 128 if em.bits == 8 else 1 << (15 - k)
    index = np.arange(size) - offset
    valid = (index >= 0) & (index < rows)
    quantized = em.quantize(table, e_out)
    parts = []
    src = f"the embeddings table's exponent (max |w| of {name!r})"
    rng = (float(table.min()), float(table.max()))
    for d in range(features):
        lut = np.zeros(size, em.dtype)
        lut[valid] = quantized[index[valid], d]
        out = name if features == 1 else f"{name}/feature_{d}"
        t = em.init(f"{name}/table_{d}", lut, e_out)
        em.node(out, "LUT", [column], [out], {"lut": t})
        em.tensor(out, e_out, src, [*shape, 1], rng)
        parts.append(out)
    if features > 1:
        em.node(name, "Concat", parts, [name], {"axis": len(shape)})
        em.tensor(name, e_out, src, [*shape, features], rng)
    em.output(layer, name)
