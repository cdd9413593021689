"""The ESP-DL v3 ops the simulator computes: one module per runtime module, one table.

Each module follows one ``esp-dl/dl/module/include/dl_module_<op>.hpp`` (the attributes and
initializers its ``deserialize()`` reads, its shape rule) and the kernels it calls
(``dl/base/dl_base_<op>.cpp``, the esp32s3 / esp32p4 assembly where it differs), as ONNX's
``onnx/reference/ops/op_<name>.py`` do for ONNX. A module names the op types it computes in
``OP_TYPES`` and computes a node with ``compute(ctx, node)`` (:class:`Context` gives it the
values, exponents and target). :data:`OPS` maps every op type to its ``compute``; the
simulator refuses any other op type by name.

Example:
    >>> from amct_bridge.espdl.v3.ops import conv
    >>> OPS["Conv"] is conv.compute, OPS["Sub"] is OPS["Add"], "gru" in NAMES
    (True, True, True)
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from amct_bridge.espdl.v3.ops._base import Context, OpFunction

__all__ = ["OPS", "MODULES", "NAMES", "Context", "OpFunction"]

#: The op modules (``amct_bridge.espdl.v3.ops.<name>``), in name order.
NAMES = (
    "add",
    "average_pool",
    "clip",
    "compare",
    "concat",
    "conv",
    "depth_to_space",
    "div",
    "exp",
    "flatten",
    "gather",
    "gemm",
    "global_average_pool",
    "gru",
    "insert_zeros",
    "layer_normalization",
    "log",
    "log_softmax",
    "lp_normalization",
    "lstm",
    "lut",
    "matmul",
    "max_pool",
    "mod",
    "mul",
    "neg",
    "pad",
    "pow",
    "prelu",
    "reduce_l1",
    "reduce_l2",
    "reduce_log_sum",
    "reduce_log_sum_exp",
    "reduce_max",
    "reduce_mean",
    "reduce_min",
    "reduce_prod",
    "reduce_sum",
    "reduce_sum_square",
    "relu",
    "requantize_linear",
    "reshape",
    "resize",
    "reverse_sequence",
    "rms_normalization",
    "scatter_nd",
    "slice",
    "softmax",
    "space_to_depth",
    "split",
    "sqrt",
    "squeeze",
    "transpose",
)
MODULES: tuple[ModuleType, ...] = tuple(import_module(f"{__name__}.{n}") for n in NAMES)


def _table(modules: tuple[ModuleType, ...]) -> dict[str, OpFunction]:
    table: dict[str, OpFunction] = {}
    for module in modules:
        for op_type in module.OP_TYPES:
            if op_type in table:  # two modules claiming one op would silently shadow one
                raise RuntimeError(f"op {op_type!r} is registered twice ({module.__name__})")
            table[op_type] = module.compute
    return table


#: op type -> the ``compute`` of the module that simulates it.
OPS: dict[str, OpFunction] = _table(MODULES)
