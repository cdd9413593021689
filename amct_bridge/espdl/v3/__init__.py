"""ESP-DL v3 ``.espdl`` models: read, write, and simulate them bit for bit (docs/espdl-v3.md).

Framework-free core: :func:`read_espdl` gives an :class:`EspdlModel` of plain dataclasses
(graph nodes, initializers as numpy arrays with exponents, value infos, test values),
:func:`write_espdl` writes one back atomically, and :func:`simulate_espdl` runs it with the
integer arithmetic of the ESP-DL runtime for ``esp32s3``, ``esp32p4`` or ``c``.

Example:
    >>> import numpy as np
    >>> m = EspdlModel([Node("r", "Relu", ["x"], ["y"], {"quant_type": "S8"})], {},
    ...                inputs=[ValueInfo("x", [2], 3, [-3])],
    ...                outputs=[ValueInfo("y", [2], 3, [-3])])
    >>> back = parse_espdl(espdl_bytes(m))
    >>> simulate_espdl(back, np.array([-4, 9], np.int8), "esp32s3").outputs["y"].tolist()
    [0, 9]
"""

from amct_bridge.espdl.v3.model import EspdlError, EspdlModel, Node, Tensor, ValueInfo, filter_nhwc
from amct_bridge.espdl.v3.reader import parse_espdl, parse_espdl_pack, read_espdl, read_espdl_pack
from amct_bridge.espdl.v3.simulate import (
    CHIPS,
    TARGETS,
    SimulationResult,
    infer_target,
    simulate_espdl,
    supported_ops,
)
from amct_bridge.espdl.v3.writer import espdl_bytes, write_espdl

__all__ = [
    "EspdlError",
    "EspdlModel",
    "Node",
    "Tensor",
    "ValueInfo",
    "filter_nhwc",
    "parse_espdl",
    "parse_espdl_pack",
    "read_espdl",
    "read_espdl_pack",
    "TARGETS",
    "CHIPS",
    "SimulationResult",
    "infer_target",
    "simulate_espdl",
    "supported_ops",
    "espdl_bytes",
    "write_espdl",
]
