"""SpaceToDepth: ``dl_module_space_to_depth.hpp`` (values moved, no arithmetic).

The input is NHWC (``CONV_LAYOUT_OP_SET`` in esp-ppq); the module walks it in memory order
``(b, h, w, c)`` and writes each value at row ``h / bs``, column ``w / bs``, channel
``c·bs² + (h mod bs)·bs + w mod bs`` of the NHWC output ``[N, H/bs, W/bs, C·bs²]``. That channel
order is ``torch.pixel_unshuffle``'s (what esp-ppq's executor computes), not ONNX's
SpaceToDepth (``(h mod bs)·bs·C + (w mod bs)·C + c``): the two agree only for one input channel.
Heights or widths that ``blocksize`` does not divide are refused (the module logs an error and
keeps the input shape).
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context
from amct_bridge.espdl.v3.ops.depth_to_space import place

OP_TYPES = ("SpaceToDepth",)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """``blocksize`` × ``blocksize`` spatial blocks moved into channels (NHWC).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> ctx.values["x"] = np.int8([[[[1, 10], [2, 20]], [[3, 30], [4, 40]]]])  # 2x2, C=2
        >>> n = Node("s", "SpaceToDepth", ["x"], ["y"], {"blocksize": 2})
        >>> compute(ctx, n)[0].reshape(-1).tolist()  # channel c·4 + row·2 + column
        [1, 2, 3, 4, 10, 20, 30, 40]
    """
    x = np.asarray(ctx.value(node.inputs[0], node))
    bs = int(node.attributes.get("blocksize", 0))
    if x.ndim != 4 or bs < 1:
        raise ctx.refuse(node, f"a rank-{x.ndim} input, blocksize {bs} (NHWC and bs >= 1 needed)")
    n, h, w, c = x.shape
    if h % bs or w % bs:
        raise ctx.refuse(node, f"height {h} and width {w} must be multiples of blocksize {bs}")
    block = bs * bs
    bi, hi, wi, ci = np.meshgrid(*(np.arange(d) for d in x.shape), indexing="ij")
    out_c = ci * block + (hi % bs) * bs + wi % bs
    c_out = c * block
    offsets = bi * h * w * c + (hi // bs) * ((w // bs) * c_out) + (wi // bs) * c_out + out_c
    return [place(ctx, node, x, offsets, (n, h // bs, w // bs, c_out))]
