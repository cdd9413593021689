"""DepthToSpace: ``dl_module_depth_to_space.hpp`` (values moved, no arithmetic).

The input is NHWC (esp-ppq lays DepthToSpace out like a Conv, ``CONV_LAYOUT_OP_SET``); the
module walks it in memory order ``(b, h, w, c)`` and writes each value at an NHWC offset of the
output ``[N, H·bs, W·bs, C/bs²]``:

- ``CRD``: channel ``c / bs²``, row ``h·bs + (c mod bs²) / bs``, column ``w·bs + c mod bs``:
  ONNX's CRD (``torch.pixel_shuffle``);
- ``DCR`` (the default): channel ``c mod bs``, row ``h·bs + c / bs²``, column ``w·bs +
  (c mod bs²) / bs``. That is ONNX's DCR only when the output has ``bs`` channels; otherwise
  the runtime moves values elsewhere (some offsets written twice, others never), and this
  simulation follows the runtime's offsets: a later write wins, and an output the runtime
  leaves unwritten (or a write past the tensor) is refused, since the chip's value there is
  whatever the buffer held.
"""

from __future__ import annotations

import numpy as np

from amct_bridge.espdl.v3.model import Node
from amct_bridge.espdl.v3.ops._base import Context

OP_TYPES = ("DepthToSpace",)


def place(ctx: Context, node: Node, x: np.ndarray, offsets: np.ndarray, shape: tuple) -> np.ndarray:
    """The output of ``shape`` when the runtime writes ``x`` (memory order) at flat ``offsets``.

    Writes happen in memory order, so at an offset written twice the later value stays; an
    offset outside the output, or an output offset never written, is refused.

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> node = Node("d", "DepthToSpace", ["x"], ["y"])
        >>> place(ctx, node, np.int8([7, 8, 9]), np.array([1, 0, 1]), (2,)).tolist()
        [8, 9]
    """
    flat = x.reshape(-1)
    offsets = offsets.reshape(-1)
    size = int(np.prod(shape, dtype=np.int64))
    if offsets.size and (offsets.min() < 0 or offsets.max() >= size):
        raise ctx.refuse(node, "the runtime's offsets fall outside the output tensor")
    # the last write at each offset: unique over the reversed order keeps the last occurrence
    last, first_of_reversed = np.unique(offsets[::-1], return_index=True)
    if last.size != size:
        raise ctx.refuse(
            node,
            f"the runtime writes {last.size} of the {size} output values (the others keep "
            "whatever the buffer held)",
        )
    out = np.empty(size, x.dtype)
    out[last] = flat[::-1][first_of_reversed]
    return out.reshape(shape)


def compute(ctx: Context, node: Node) -> list[np.ndarray]:
    """Channels moved into ``blocksize`` × ``blocksize`` spatial blocks (NHWC).

    Example:
        >>> from amct_bridge.espdl.v3.model import EspdlModel
        >>> ctx = Context(EspdlModel([], {}), "c")
        >>> ctx.values["x"] = np.arange(8, dtype=np.int8).reshape(1, 1, 1, 8)
        >>> n = Node("d", "DepthToSpace", ["x"], ["y"], {"blocksize": 2, "mode": "CRD"})
        >>> compute(ctx, n)[0][0].tolist()  # 2 output channels: c = 4·oc + 2·row + col
        [[[0, 4], [1, 5]], [[2, 6], [3, 7]]]
    """
    x = np.asarray(ctx.value(node.inputs[0], node))
    bs = int(node.attributes.get("blocksize", 0))
    mode = str(node.attributes.get("mode") or "DCR")
    if x.ndim != 4 or bs < 1:
        raise ctx.refuse(node, f"a rank-{x.ndim} input, blocksize {bs} (NHWC and bs >= 1 needed)")
    n, h, w, c = x.shape
    block = bs * bs
    c_out = c // block
    if c_out * block != c:
        raise ctx.refuse(node, f"{c} channels are not a multiple of blocksize² = {block}")
    bi, hi, wi, ci = np.meshgrid(*(np.arange(d) for d in x.shape), indexing="ij")
    if mode == "CRD":
        out_c, out_h, out_w = ci // block, hi * bs + (ci % block) // bs, wi * bs + ci % bs
    else:  # the module treats every mode other than "CRD" as DCR
        out_c, out_h, out_w = ci % bs, hi * bs + ci // block, wi * bs + (ci % block) // bs
    # b_offset = b·H·W·C (the output holds as many values per batch); h_offset = W·bs·C_out
    offsets = bi * h * w * c + out_h * (w * bs * c_out) + out_w * c_out + out_c
    return [place(ctx, node, x, offsets, (n, h * bs, w * bs, c_out))]
