"""What every op module shares: the run's :class:`Context`, esp-dl's rounding helpers, saturation.

The rounding follows ``esp-dl/dl/tool/src/dl_tool.cpp`` (``shift_and_round_half_up`` /
``_half_even``, ``tool::round``); :class:`Context` gives an op its inputs' values, exponents and
element types and builds refusals that name the file and the node.

Example:
    >>> shift_round(np.array([6]), 2, half_even=False).tolist()
    [2]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from amct_bridge.espdl.v3.model import EspdlError, EspdlModel, Node, Tensor
from amct_bridge.espdl.v3.schema import MAX_ELEMENTS, MAX_EXPONENT, elements

__all__ = [
    "Context",
    "OpFunction",
    "HALF_EVEN_TARGETS",
    "elemwise_rows",
    "MAX_EXPONENT",
    "expf",
    "logf",
    "powf",
    "ints_input",
    "round_float",
    "saturate",
    "shift_round",
    "sigmoid",
]

#: Targets whose kernels round half to even (``CONFIG_ROUND_HALF_EVEN_ENABLED``, PIE-V2 chips).
HALF_EVEN_TARGETS = ("esp32p4", "esp32s31")
_INT = {"S8": np.dtype(np.int8), "S16": np.dtype(np.int16)}


def shift_round(x: np.ndarray, shift: int | np.ndarray, half_even: bool) -> np.ndarray:
    """x · 2^-shift rounded like esp-dl's ``shift_and_round_half_up`` / ``_half_even``.

    A shift ≤ 0 is a left shift (exact). int64 in, int64 out; the caller saturates.

    Example:
        >>> shift_round(np.array([5, 6, 7, -5, -6, -7]), 2, half_even=False).tolist()
        [1, 2, 2, -1, -1, -2]
        >>> shift_round(np.array([2, 6, -2, -6]), 2, half_even=True).tolist()
        [0, 2, 0, -2]
    """
    x = np.asarray(x, np.int64)
    if np.ndim(shift) == 0:  # one shift for the whole tensor: a scalar, in place
        s = int(shift)
        if s <= 0:
            return np.left_shift(x, -s)
        shift_array = np.int64(s)
    else:  # broadcast as it is given (one per last-axis channel): no full-size shift array
        shift_array = np.asarray(shift, np.int64)
        if (shift_array <= 0).any():
            right = shift_round(x, np.maximum(shift_array, 1), half_even)
            return np.where(shift_array > 0, right, np.left_shift(x, np.maximum(-shift_array, 0)))
    half = np.left_shift(np.int64(1), shift_array - 1)
    if half_even:  # ties to even: (x + half - 1 + lsb(floor)) >> s, four passes over the data
        out = np.right_shift(x, shift_array)
        out &= 1
        out += x
        out += half - 1
    else:
        out = x + half
    np.right_shift(out, shift_array, out=out)
    return out


def expf(x: np.ndarray) -> np.ndarray:
    """``expf`` as the correctly rounded float32 value: exp in double, rounded to float32.

    numpy's float32 ``exp`` is off by one unit in the last place more often (``exp(1)`` gives
    2.71828198 instead of 2.71828174) and its SIMD kernels differ between CPUs; this is the same
    on every CPU but at a rounding boundary. The chip's libm may differ: newlib-esp32 selects
    newlib's older single-precision ``ef_exp.c`` for Xtensa and RISC-V, which is 1 ulp off on
    about 10 % of inputs. Espressif's suite cannot tell the two apart (all 1,473 files pass with
    either), and no board result is at hand, so the documented choice is the exact value.

    Example:
        >>> float(expf(np.float32([1.0]))[0])
        2.7182817459106445
    """
    with np.errstate(over="ignore"):  # beyond float32 range: inf, as expf gives
        return np.exp(np.asarray(x, np.float32).astype(np.float64)).astype(np.float32)


def logf(x: np.ndarray) -> np.ndarray:
    """newlib's ``logf``, as :func:`expf`: log in double rounded to float32 (-inf for 0, NaN
    below).

    Example:
        >>> logf(np.float32([1.0, 0.0])).tolist()
        [0.0, -inf]
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.asarray(x, np.float32).astype(np.float64)).astype(np.float32)


def powf(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """newlib's ``powf``, as :func:`expf`: pow in double rounded to float32.

    Example:
        >>> powf(np.float32([2.0, 4.0]), np.float32([3.0, 0.5])).tolist()
        [8.0, 2.0]
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a64 = np.asarray(a, np.float32).astype(np.float64)
        return np.power(a64, np.asarray(b, np.float32).astype(np.float64)).astype(np.float32)


def sigmoid(t: np.ndarray) -> np.ndarray:
    """``dl_math.hpp``'s sigmoid: ``1.0 / (1.0 + expf(-x))``, expf in float32, the division in
    double (the 1.0 literals), stored as float32.

    Example:
        >>> sigmoid(np.float32([0.0, 2.0])).tolist()
        [0.5, 0.8807970881462097]
    """
    return (1.0 / (1.0 + expf(-np.asarray(t, np.float32)).astype(np.float64))).astype(np.float32)


def round_float(x: np.ndarray, half_even: bool) -> np.ndarray:
    """esp-dl's ``tool::round`` of float32 values: ``rne`` on esp32p4, ``floor(x + 0.5)`` else.

    Example:
        >>> round_float(np.float32([0.5, 1.5, -0.5, -1.5]), False).tolist()
        [1, 2, 0, -1]
        >>> round_float(np.float32([0.5, 1.5, -0.5, -1.5]), True).tolist()
        [0, 2, 0, -2]
    """
    x = np.asarray(x, np.float32)
    if half_even:
        return np.rint(x).astype(np.int64)
    # floorf(value + 0.5): the sum is a double, converted to float by floorf's parameter
    return np.floor((x.astype(np.float64) + 0.5).astype(np.float32)).astype(np.int64)


def saturate(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Clip to ``dtype``'s range and cast, as the kernels saturate their outputs.

    Example:
        >>> saturate(np.array([-200, 5, 200]), np.dtype(np.int8)).tolist()
        [-128, 5, 127]
    """
    info = np.iinfo(dtype)
    return np.clip(x, info.min, info.max).astype(dtype)


class Context:
    """One simulation run: the model, the target, the values computed so far, notes.

    Op modules read their inputs through it (:meth:`value`, :meth:`exponent`,
    :meth:`initializer`) so that a missing tensor is refused with the file and node named.

    Example:
        >>> from amct_bridge.espdl.v3.model import ValueInfo
        >>> m = EspdlModel([], {}, inputs=[ValueInfo("x", [1], 3, [-4])])
        >>> ctx = Context(m, "esp32p4")
        >>> ctx.half_even, ctx.exponent("x", Node("n", "Relu", ["x"], ["y"]))
        (True, -4)
    """

    def __init__(self, model: EspdlModel, target: str) -> None:
        self.model = model
        self.target = target
        self.half_even = target in HALF_EVEN_TARGETS
        self.values: dict[str, np.ndarray] = {}
        self.notes: list[str] = []
        self.infos = {v.name: v for v in (*model.value_info, *model.outputs, *model.inputs)}

    def exponent(self, name: str, node: Node) -> int:
        """The single exponent of tensor ``name`` (initializer or value_info)."""
        tensor = self.model.initializers.get(name)
        where = "initializer"
        exponents = tensor.exponents if tensor is not None else None
        if tensor is None:
            info = self.infos.get(name)
            where = "value_info"
            exponents = info.exponents if info is not None else []
        if len(exponents) != 1:
            found = "no exponent" if not exponents else f"{len(exponents)} exponents"
            raise self.refuse(node, f"tensor {name!r} has {found} in its {where}, expected one")
        exponent = int(exponents[0])
        if not -MAX_EXPONENT <= exponent <= MAX_EXPONENT:
            raise self.refuse(
                node,
                f"tensor {name!r}: exponent {exponent} in its {where}, expected "
                f"-{MAX_EXPONENT}..{MAX_EXPONENT} (the runtime's shifts are of 32-bit values)",
            )
        return exponent

    def value(self, name: str, node: Node) -> np.ndarray:
        """The integers (or floats) of ``name``: computed, a graph input, or an initializer."""
        if name in self.values:
            return self.values[name]
        tensor = self.model.initializers.get(name)
        if tensor is not None:
            return tensor.data
        raise EspdlError(
            f"{self.model.source}: node {node.name!r} ({node.op_type}) reads {name!r}, which no "
            "earlier node, input or initializer provides"
        )

    def initializer(self, name: str, node: Node) -> Tensor:
        """The constant tensor ``name``; refused when it is not an initializer."""
        tensor = self.model.initializers.get(name)
        if tensor is None:
            raise EspdlError(
                f"{self.model.source}: node {node.name!r} ({node.op_type}): {name!r} must be a "
                "constant (initializer)"
            )
        return tensor

    def value_dtype(self, name: str, node: Node) -> np.dtype:
        """The element type value_info gives ``name`` (float32, int8, int16), else quant_type's."""
        info = self.infos.get(name)
        if info is not None and info.elem_type in (1, 3, 5):
            return np.dtype({1: np.float32, 3: np.int8, 5: np.int16}[info.elem_type])
        return self.out_dtype(node)

    def out_dtype(self, node: Node) -> np.dtype:
        """int8 or int16, from the node's ``quant_type`` (S8 when absent)."""
        quant = node.attributes.get("quant_type", "S8")
        if quant not in _INT:
            raise EspdlError(
                f"{self.model.source}: node {node.name!r} ({node.op_type}): quant_type "
                f"{quant!r} is not simulated (S8 and S16 are)"
            )
        return _INT[quant]

    def check_elements(self, node: Node, shape, what: str) -> None:
        """Refuse before allocating when ``shape`` holds more than the simulator's budget
        (:data:`~amct_bridge.espdl.v3.schema.MAX_ELEMENTS`): a damaged file's pads or
        broadcasts must not allocate gigabytes.

        Example:
            >>> ctx = Context(EspdlModel([], {}), "c")
            >>> ctx.check_elements(Node("p", "Pad", ["x"], ["y"]), (1, 10**5, 10**5), "output")
            Traceback (most recent call last):
            ...
            amct_bridge.espdl.v3.model.EspdlError: <memory>: node 'p' (Pad): output of shape \
[1, 100000, 100000] (10000000000 elements) is beyond the simulator's 67108864 (2^26)
        """
        count = elements(shape)
        if count > MAX_ELEMENTS:
            raise self.refuse(
                node,
                f"{what} of shape {[int(d) for d in shape]} ({count} elements) is beyond the "
                f"simulator's {MAX_ELEMENTS} (2^26)",
            )

    def refuse(self, node: Node, why: str) -> EspdlError:
        """An error naming the file and the node, for the op to raise."""
        return EspdlError(f"{self.model.source}: node {node.name!r} ({node.op_type}): {why}")


#: What an op module's ``compute`` is: the node's output values, in output order.
OpFunction = Callable[[Context, Node], list[np.ndarray]]


def elemwise_rows(shape0: tuple[int, ...], shape1: tuple[int, ...]) -> tuple[int, int, int, int]:
    """``(input0_d0, input1_d0, output_d0, dims)`` as ``get_elemwise_operation_args`` merges
    (``dl_base_elemwise.cpp``, shared by every broadcasting element-wise op).

    Both shapes are right-aligned to the broadcast output's rank; two adjacent dimensions
    merge while both inputs agree on both, or one input is 1 on both. ``dims`` above 4 is
    what the runtime cannot run.

    Example:
        >>> elemwise_rows((1, 96, 5, 16), (1, 96, 5, 1))  # one b per row of 16: n_1
        (16, 1, 16, 2)
        >>> elemwise_rows((2, 3, 4, 5), (1,))  # a single b: everything merges
        (120, 1, 120, 1)
    """
    out = list(np.broadcast_shapes(tuple(shape0), tuple(shape1)))
    dims = len(out)
    s0 = [1] * (dims - len(shape0)) + list(shape0)
    s1 = [1] * (dims - len(shape1)) + list(shape1)
    merged = dims
    for i in range(dims):
        j = i + 1
        while j < dims:
            if s0[i] == s1[i] and s0[j] == s1[j]:
                s0[i], s1[i], out[i] = s0[i] * s0[j], s1[i] * s1[j], out[i] * out[j]
                s0[j] = s1[j] = out[j] = 1
            elif s0[i] == 1 and s0[j] == 1:
                s1[i], out[i] = s1[i] * s1[j], out[i] * out[j]
                s1[j] = out[j] = 1
            elif s1[i] == 1 and s1[j] == 1:
                s0[i], out[i] = s0[i] * s0[j], out[i] * out[j]
                s0[j] = out[j] = 1
            else:
                break
            j += 1
        if j == dims:
            merged = i + 1
            break
    last = merged - 1
    return s0[last], s1[last], out[last], merged


def ints_input(ctx: Context, node: Node, index: int) -> list[int] | None:
    """The integers of the node's input ``index`` (a constant such as axes or pads), or None.

    Example:
        >>> m = EspdlModel([], {"a": Tensor("a", np.array([2, 3], np.int64), [0])})
        >>> ints_input(Context(m, "c"), Node("n", "Pad", ["x", "a"], ["y"]), 1)
        [2, 3]
    """
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    return [int(v) for v in ctx.value(node.inputs[index], node).reshape(-1)]
