"""Greater: ``dl_module_greater.hpp``, ``dl_base_greater.cpp``, ``isa/*/dl_*_s{8,16}_greater.S``.

The stored integers of the two inputs compared as they are (no rescaling), broadcast; the
output is bool. The rule is shared with the other comparisons: :mod:`._compare`.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops._compare import compare

OP_TYPES = ("Greater",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``a > b`` on the stored integers, as bool (exponent 0).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel, ValueInfo
        >>> m = EspdlModel([], {}, value_info=[ValueInfo(n, [3], 3, [-4]) for n in "ab"])
        >>> ctx = Context(m, "esp32s3")
        >>> ctx.values.update(a=np.int8([3, -2, 5]), b=np.int8([3, 2, 4]))
        >>> n = Node("n", "Greater", ["a", "b"], ["y"], {"quant_type": "S8"})
        >>> compute(ctx, n)[0].tolist()
        [False, False, True]
    """
    return compare(ctx, node, np.greater)
