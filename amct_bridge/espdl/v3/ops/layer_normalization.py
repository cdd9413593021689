"""LayerNormalization: each row normalized in float32, operation by operation.

Runtime: ``dl_module_layer_normalization.hpp`` (its integer path) and ``dl_math.hpp``'s
``sqrt_newton``. A row is the elements from ``axis`` (default -1) to the end; ``Scale`` and
``B`` are optional initializers with their own exponents. A float32 input is refused.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import EspdlError, Node
from amct_bridge.espdl.v3.ops._base import Context, round_float, saturate

OP_TYPES = ("LayerNormalization",)


def sqrt_newton(x: np.ndarray) -> np.ndarray:
    """esp-dl's ``dl::math::sqrt_newton`` (dl_math.hpp) in float32, element by element: start
    at ``x``, ``r = (r + x / r) · 0.5`` until ``|r − r_last| <= 1e-5``; 0 gives 0.

    Example:
        >>> sqrt_newton(np.float32([4.0, 0.0, 2.0])).tolist()
        [2.0, 0.0, 1.4142135381698608]
    """
    x = np.asarray(x, np.float32)
    result = x.copy()
    active = x != 0
    tol = np.float32(0.00001)
    for _ in range(200):  # converges in a few dozen steps from r = x for any float32 x
        if not active.any():
            return result
        last = result[active]
        # (last + x / last) * 0.5: the 0.5 is a double, the product exact, stored as float
        new = ((last + x[active] / last) * np.float32(0.5)).astype(np.float32)
        result[active] = new
        still = np.abs(new - last) > tol
        active[np.flatnonzero(active)[~still]] = False
    if active.any():
        raise EspdlError("sqrt_newton does not settle for some values (the chip would loop)")
    return result


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``round(((x·s_in - mean) · inv · (g·s_g) + b·s_b) · 2^-e_out)``, saturated, with
    ``inv = 1 / sqrt_newton(var + eps)`` (``dl_module_layer_normalization.hpp``).

    In float32, operation by operation: an int sum; ``mean = float(sum * 1.0 / n)`` (a double
    division); ``var`` = the sum in order of ``float(x - mean)^2``; then ``mean *= s_in``,
    ``var *= s_in^2``, ``var /= n``.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, Tensor, ValueInfo
        >>> g = Tensor("g", np.int8([3, 3]), [-1])  # 1.5
        >>> m = EspdlModel([], {"g": g},
        ...     value_info=[ValueInfo("x", [1, 2], 3, [-2]), ValueInfo("y", [1, 2], 3, [0])])
        >>> n = Node("n", "LayerNormalization", ["x", "g"], ["y"],
        ...          {"epsilon": 0.0, "quant_type": "S8"})
        >>> for target in ("esp32s3", "esp32p4"):  # x = -1, 1: mean 0, var 1, y = -1.5, 1.5
        ...     ctx = Context(m, target)
        ...     ctx.values["x"] = np.int8([[-4, 4]])
        ...     print(target, compute(ctx, n)[0].tolist())
        esp32s3 [[-1, 2]]
        esp32p4 [[-2, 2]]
    """
    # The chip's compiler may fuse a*b + c (GCC's -ffp-contract=fast); that is not modelled.
    x = ctx.value(node.inputs[0], node)
    if x.dtype.kind == "f":
        raise ctx.refuse(node, "a float32 LayerNormalization is not simulated")
    axis = int(node.attributes.get("axis", -1)) % x.ndim
    if axis == 0:
        raise ctx.refuse(node, "axis 0 would normalize over the batch")
    inner = int(np.prod(x.shape[axis:]))
    rows = x.reshape(-1, inner)
    eps = np.float32(node.attributes.get("epsilon", 1e-5))
    s_in = np.float32(2.0 ** ctx.exponent(node.inputs[0], node))
    s_out = np.float32(2.0 ** -ctx.exponent(node.outputs[0], node))
    params = []
    for index in (1, 2):
        if len(node.inputs) > index and node.inputs[index]:
            t = ctx.initializer(node.inputs[index], node)
            if t.data.size != inner:
                raise ctx.refuse(node, f"{t.name!r} has {t.data.size} values, expected {inner}")
            scale = np.float32(2.0**t.exponent)
            params.append(t.data.reshape(1, inner).astype(np.float32) * scale)
        else:
            params.append(np.float32(1.0) if index == 1 else np.float32(0.0))
    gamma, beta = params
    total = rows.astype(np.int64).sum(axis=1)  # an int on the chip (overflow not modelled)
    mean = (total.astype(np.float64) / inner).astype(np.float32)
    diff = rows.astype(np.float32) - mean[:, None]
    var = np.add.accumulate(diff * diff, axis=1, dtype=np.float32)[:, -1]  # in order
    mean = mean * s_in
    var = var * (s_in * s_in)
    var = var / np.float32(inner)
    inv = np.float32(1.0) / sqrt_newton(var + eps)
    norm = (rows.astype(np.float32) * s_in - mean[:, None]) * inv[:, None]
    result = norm * gamma + beta
    out = round_float(result * s_out, ctx.half_even)
    return [saturate(out, ctx.out_dtype(node)).reshape(x.shape)]
