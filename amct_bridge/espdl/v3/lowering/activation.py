"""Lowerings of activations and per-channel affine layers: the runtime's activation ops,
lookup tables for the ones it computes only as a table (GELU) or that it lacks (any other
element-wise function: ``LUT``), Softmax, PRelu, and a BatchNormalization that folds into no
conv (``Mul`` + ``Add``).

Tables: an int8 node holds 256 entries (``lut`` attribute, read by every activation module's
loader in int8); an int16 node is a ``LUT`` of 65537 entries (the module's step 1:
``table[x + 32768]``), since the modules read no table in int16 and the runtime has no float
ELU / GELU path the simulator knows bit for bit. Either table is ``round(f(x·2^e_in)·2^-e_out)``
over every input integer: the exact rounding of the float function.

Example:
    >>> sorted(TABLE_FUNCTIONS)[:3], ACTIVATION_OPS["gelu"], ACTIVATION_OPS["selu"]
    (['celu', 'elu', 'exponential'], 'Gelu', 'LUT')
"""

from __future__ import annotations

import math

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.checks import channel_vector
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.exponents import FIXED_RANGES
from amct_bridge.espdl.v3.lowering.emitter import Emitter, round_half
from amct_bridge.quant.espdl import auto_exponent

__all__ = [
    "ACTIVATION_OPS",
    "CELL_ACTIVATIONS",
    "TABLE_FUNCTIONS",
    "activation",
    "lower_activation",
    "lower_batch_norm",
    "lower_cell_activation",
    "lower_passthrough",
    "lower_prelu",
]

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _softplus(t: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, t)


def _elu(alpha: float):
    return lambda t: np.where(t > 0, t, alpha * np.expm1(np.minimum(t, 0.0)))


#: Element-wise activations the export writes as a table, by their framework name: float64
#: functions of the real input (Keras' definitions; ``alpha`` of an ELU is the layer's).
TABLE_FUNCTIONS = {
    "elu": lambda alpha: _elu(1.0 if alpha is None else alpha),
    "gelu": lambda alpha: lambda t: 0.5 * t * (1.0 + _erf(t / math.sqrt(2.0))),
    # the tanh approximation (MindSpore nn.GELU's default, PyTorch approximate="tanh")
    "gelu_tanh": lambda alpha: (
        lambda t: 0.5 * t * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (t + 0.044715 * t**3)))
    ),
    "selu": lambda alpha: lambda t: 1.0507009873554805 * _elu(1.6732632423543772)(t),
    "celu": lambda alpha: lambda t: np.where(t > 0, t, np.expm1(np.minimum(t, 0.0))),
    "softplus": lambda alpha: _softplus,
    "softsign": lambda alpha: lambda t: t / (1.0 + np.abs(t)),
    "mish": lambda alpha: lambda t: t * np.tanh(_softplus(t)),
    "log_sigmoid": lambda alpha: lambda t: -_softplus(-t),
    "exponential": lambda alpha: np.exp,
    "hard_tanh": lambda alpha: lambda t: np.clip(t, -1.0, 1.0),
    "tanh_shrink": lambda alpha: lambda t: t - np.tanh(t),
}

#: Framework activation names -> v3 op type (int8 sigmoid-like ones get a table; the
#: TABLE_FUNCTIONS are their runtime op with a table, else ``LUT``).
ACTIVATION_OPS = {
    "sigmoid": "Sigmoid",
    "tanh": "Tanh",
    "swish": "Swish",
    "silu": "Swish",
    "hard_sigmoid": "HardSigmoid",
    "hard_swish": "HardSwish",
    "hard_silu": "HardSwish",
    "leaky_relu": "LeakyRelu",
    "relu": "Relu",
    "relu6": "Clip",
    "softmax": "Softmax",
    "elu": "Elu",
    "gelu": "Gelu",
    **{name: "LUT" for name in TABLE_FUNCTIONS if name not in ("elu", "gelu")},
}
_LUT_OPS = ("Sigmoid", "Tanh", "Swish", "HardSigmoid", "HardSwish")

#: MindSpore cell classes -> the activation names above.
CELL_ACTIVATIONS = {
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "SiLU": "silu",
    "HSigmoid": "hard_sigmoid",
    "HSwish": "hard_swish",
    "Softmax": "softmax",
}


def activation(em: Emitter, layer, act, x, *, alpha=None, axis=-1, found=None, node=None) -> None:
    """``act`` (an :data:`ACTIVATION_OPS` name) of tensor ``x`` as ``layer``'s output."""
    op = ACTIVATION_OPS[act]
    e_in = em.exps[x]
    shape = em.shapes[x]
    name = layer.name
    node = node or name
    if op == "Softmax":
        _softmax(em, layer, x, axis, node)
        return
    if op == "Relu":
        em.node(node, "Relu", [x], [name])
        lo, hi = em.range_of(x)
        em.tensor(name, e_in, f"the input's ({x!r}): Relu keeps it", shape, (0.0, hi))
    elif op == "Clip":
        top = min(6.0, em.range_of(x)[1])
        fb = (em.range_exp(0.0, top, name), "the ReLU6 range [0, min(6, input max)]")
        if top <= 0.0:  # an input never above 0: its exponent, not 0
            fb = (e_in, f"the input's ({x!r})")
        e_out, src, rng = em.out_exp(layer, fb, found)
        info = np.iinfo(em.dtype)
        high = int(min(info.max, round_half(np.float64(6.0 * 2.0**-e_in), em.half_even)))
        lo_t = em.init(f"{name}/min", np.zeros(1, em.dtype), e_in)
        hi_t = em.init(f"{name}/max", np.array([high], em.dtype), e_in)
        em.node(node, "Clip", [x, lo_t, hi_t], [name])
        em.tensor(name, e_out, src, shape, rng)
    else:
        fixed = FIXED_RANGES.get(act)
        fb = (
            (em.range_exp(*fixed, name), f"the range of {act} {fixed}")
            if fixed
            else (e_in, f"the input's ({x!r})")
        )
        e_out, src, rng = em.out_exp(layer, fb, found)
        attrs: dict = {}
        if op == "LeakyRelu":
            attrs["alpha"] = float(0.2 if alpha is None else alpha)
        if op == "HardSigmoid":
            attrs.update(alpha=1.0 / 6.0, beta=0.5)  # Keras: relu6(x + 3) / 6
        if op == "Elu":
            attrs["alpha"] = float(1.0 if alpha is None else alpha)
        em.tensor(name, e_out, src, shape, rng)
        if act in TABLE_FUNCTIONS:
            fn = TABLE_FUNCTIONS[act](alpha)
            attrs["lut"] = em.table(op, attrs, e_in, e_out, fn)
            if em.bits == 16:  # only the LUT module reads an int16 table
                op = "LUT"
        elif op in _LUT_OPS and em.bits == 8:
            attrs["lut"] = em.table(op, attrs, e_in, e_out)
        em.node(node, op, [x], [name], attrs)
    em.output(layer, name)


def _softmax(em: Emitter, layer, x, axis, node) -> None:
    name = layer.name
    shape = em.shapes[x]
    axis = int(axis) % len(shape)
    readers = em.consumers.get(name, [])
    out = name if not readers else f"{name}/float"
    em.node(node, "Softmax", [x], [out], {"axis": axis})
    em.tensor(out, 0, "float32 output (Softmax)", shape, (0.0, 1.0), elem=1)
    nodes = [name]
    if readers:  # later layers read integers: quantize the probabilities
        e_out, src, rng = em.out_exp(layer, (em.range_exp(0, 1, name), "[0, 1]"))
        em.node(f"{name}/quantize", "QuantizeLinear", [out], [name])
        em.tensor(name, e_out, src, shape, rng)
        nodes.append(f"{name}/quantize")
    em.output(layer, name, nodes)


def lower_relu(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """A ReLU that fuses into no conv: ``Relu`` at the input's exponent."""
    activation(em, layer, "relu", ins[0])


def lower_leaky_relu(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """LeakyReLU: ``LeakyRelu``."""
    activation(em, layer, "leaky_relu", ins[0], alpha=layer.attrs.get("alpha"))


def lower_relu6(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """ReLU6: ``Clip`` (min 0, max 6 in the input's quantization)."""
    activation(em, layer, "relu6", ins[0])


def lower_passthrough(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """A layer that computes nothing at inference (Dropout & co.): its readers read its input."""
    em.tensor_of[layer.name] = ins[0]
    em.done(layer, "passthrough")


def lower_activation(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """Keras ``Activation(name)`` and ``ELU``: the op :data:`ACTIVATION_OPS` names."""
    name = layer.attrs.get("activation")
    if layer.kind == "ELU":
        name = "elu"
    if name in (None, "linear"):
        lower_passthrough(em, layer, ins)
        return
    if name not in ACTIVATION_OPS:
        em.refuse(
            layer,
            f"activation {name!r}: no ESP-DL v3 op computes it and it is not an element-wise "
            f"function the export tabulates ({', '.join(sorted(TABLE_FUNCTIONS))})",
        )
        return
    activation(em, layer, name, ins[0], alpha=layer.attrs.get("alpha"))


def lower_cell_activation(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """An activation layer named by its class (Keras ``Softmax``, MindSpore ``nn.Sigmoid``...)."""
    act = CELL_ACTIVATIONS.get(layer.kind, "softmax")
    axis = layer.attrs.get("axis", -1)
    if isinstance(axis, list | tuple) and len(axis) == 1:
        axis = axis[0]
    if not isinstance(axis, int):
        em.refuse(
            layer,
            f"softmax over axes {axis!r}: the ESP-DL v3 Softmax runs over one axis "
            "(reshape the axes into one first)",
        )
        return
    activation(em, layer, act, ins[0], axis=axis, alpha=layer.attrs.get("alpha"))


def lower_batch_norm(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """A BatchNormalization that folds into no conv (pre-activation blocks, skip_fusion):
    ``Mul`` by the per-channel scale, then ``Add`` of the per-channel shift."""
    x = ins[0]
    w = layer.weights
    if "mean" not in w or "variance" not in w:
        raise ExportError(f"layer {layer.describe()}: BatchNormalization without stats")
    channels = em.shapes[x][-1]
    mean = channel_vector(w["mean"], channels, layer.name, "BN mean").astype(np.float64)
    var = channel_vector(w["variance"], channels, layer.name, "BN variance")
    gamma = channel_vector(w.get("gamma", np.ones(1)), channels, layer.name, "BN gamma")
    beta = channel_vector(w.get("beta", np.zeros(1)), channels, layer.name, "BN beta")
    eps = float(layer.attrs.get("epsilon", 1e-3))
    if np.any(var.astype(np.float64) + eps <= 0):
        raise ExportError(f"layer {layer.describe()}: variance + epsilon <= 0")
    scale = gamma / np.sqrt(var.astype(np.float64) + eps)
    shift = beta - mean * scale
    x_reach = max(map(abs, em.range_of(x)))
    reach = float(np.abs(scale).max() * x_reach + np.abs(shift).max())
    fallback = (em.range_exp(-reach, reach, layer.name), "bound of the folded BN")
    e_out, src, rng = em.out_exp(layer, fallback)
    name = layer.name
    s_exp = auto_exponent(scale, em.bits, name=f"{name} scale")
    s_t = em.init(f"{name}/scale", em.quantize(scale, s_exp), s_exp)
    t_t = em.init(f"{name}/shift", em.quantize(shift, e_out), e_out)
    em.node(f"{name}/mul", "Mul", [x, s_t], [f"{name}/scaled"])
    em.tensor(f"{name}/scaled", e_out, src, em.shapes[x], rng)
    em.node(name, "Add", [f"{name}/scaled", t_t], [name])
    em.tensor(name, e_out, src, em.shapes[x], rng)
    em.tensor_of[name] = name
    em.done(layer, "exported")


def lower_prelu(em: Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``PRelu`` at the input's exponent: the c kernel copies x >= 0 as it is."""
    x = ins[0]
    if em.target == "esp32p4":
        em.refuse(
            layer,
            "PReLU on esp32p4: the rounding of its esp.vprelu kernel is not known here, so "
            "the simulator (and this export) does not take it; use esp32s3 or c",
        )
        return
    if "alpha" not in layer.weights:
        raise ExportError(f"layer {layer.describe()}: PReLU without alpha weights")
    channels = em.shapes[x][-1]
    alpha = channel_vector(layer.weights["alpha"], channels, layer.name, "PReLU alpha")
    e_alpha = auto_exponent(alpha, em.bits, name=f"{layer.name} alpha")
    slope = em.init(f"{layer.name}/alpha", em.quantize(alpha, e_alpha), e_alpha)
    em.node(layer.name, "PRelu", [x, slope], [layer.name])
    e_in = em.exps[x]
    em.tensor(layer.name, e_in, f"the input's ({x!r})", em.shapes[x], em.ranges.get(x))
    em.tensor_of[layer.name] = layer.name
    em.done(layer, "exported")
