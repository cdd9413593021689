"""2:4 (4-choose-2) selective pruning: eligibility, masks from magnitudes, AMCT record nodes.

In every run of 4 consecutive INPUT channels of a kernel (for each spatial position and output
channel) the 2 weights with the largest |w| are kept (ties: lower index first). A last run of
``r < 4`` channels keeps ``min(r, 2)``. The input axis follows the kernel layout: HWIO (Conv2D)
axis 2, IO (Dense) axis 0, HWOI (Conv2DTranspose) axis 3.

MindSpore layouts: OIHW (Conv2d) axis 1, OI (Dense) axis 1, IOHW (Conv2dTranspose) axis 0.

``selective_mask`` packing (as AMCT): ``np.packbits`` of the flattened C-order mask (1 = kept,
most significant bit first), zero-padded to a multiple of 8 bytes, read as little-endian int64.

Example:
    >>> import numpy as np
    >>> w = np.array([[1.0, -3.0, 2.0, 0.5]]).T        # Dense kernel (in=4, out=1)
    >>> two_four_mask(w, "IO")[:, 0].tolist()
    [False, True, True, False]
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import GraphError
from amct_bridge.graph.groups import Refusal
from amct_bridge.graph.ir import Graph, Node
from amct_bridge.graph.reasons import Reason
from amct_bridge.graph.rules import DEPTHWISE_KINDS
from amct_bridge.records.model import Attr, PruneNode, PruneRecord

#: Layer kinds that can take a 2:4 mask, with the kernel layout they use.
ELIGIBLE_KINDS = {"Conv2D": "HWIO", "Dense": "IO", "Conv2DTranspose": "HWOI"}
_INPUT_AXIS = {"HWIO": 2, "IO": 0, "HWOI": 3, "OIHW": 1, "OI": 1, "IOHW": 0}
_SELECTIVE_CANDIDATES = frozenset(
    {
        "Conv1D",
        "Conv2D",
        "Conv3D",
        "Dense",
        "Conv2DTranspose",
        "DepthwiseConv2D",
        "SeparableConv2D",
        "Conv1DTranspose",
        "Conv3DTranspose",
        "DepthwiseConv1D",
        "SeparableConv1D",
    }
)


def input_axis(layout: str) -> int:
    """Axis of the input channels in a kernel of ``layout`` (GraphError if unknown)."""
    try:
        return _INPUT_AXIS[layout]
    except KeyError:
        raise GraphError(f"no 2:4 input axis for kernel layout {layout!r}") from None


def node_layout(node: Node) -> str:
    """Kernel layout of an eligible node: its ``kernel_layout`` param, else the Keras default.

    Example:
        >>> node_layout(Node("c", "c", "Conv2D", "Conv2D", [], [], {"kernel_layout": "OIHW"}))
        'OIHW'
    """
    return node.params.get("kernel_layout") or ELIGIBLE_KINDS[node.kind]


def selective_candidates(graph: Graph) -> tuple[list[Node], list[Refusal]]:
    """Eligible layer nodes (first call of each) and refusals for the other weighted layers.

    Example:
        >>> selective_candidates(Graph())
        ([], [])
    """
    eligible, refused, seen = [], [], set()
    for node in graph.nodes:
        if node.kind not in _SELECTIVE_CANDIDATES or node.layer in seen:
            continue
        seen.add(node.layer)
        reason = _refusal_reason(node)
        if reason is None:
            eligible.append(node)
        else:
            shape = node.params.get("kernel_shape", ())
            refused.append(Refusal(node.layer, 0, 0, reason, f"{node.kind} {tuple(shape)}"))
    return eligible, refused


def _refusal_reason(node: Node) -> Reason | None:
    groups = node.params.get("groups", 1)
    if node.kind in DEPTHWISE_KINDS or (groups != 1 and groups == node.params.get("in_channels")):
        return Reason.DEPTHWISE_CONV  # a conv with groups == Cin is a depthwise conv
    if node.kind not in ELIGIBLE_KINDS:
        return Reason.NOT_ELIGIBLE
    if groups != 1:
        return Reason.GROUPED_CONV
    if node.shared:
        return Reason.SHARED_LAYER
    return None


def two_four_mask(kernel: np.ndarray, layout: str) -> np.ndarray:
    """Boolean mask keeping the 2 largest |w| of every 4 consecutive input channels."""
    axis = input_axis(layout)
    mags = np.moveaxis(np.abs(np.asarray(kernel, dtype=np.float64)), axis, -1)
    cin = mags.shape[-1]
    pad = (-cin) % 4
    # Padding with -1 (below any |w|) lets a short last run keep its min(r, 2) real weights.
    padded = np.pad(mags, [(0, 0)] * (mags.ndim - 1) + [(0, pad)], constant_values=-1.0)
    runs = padded.reshape(*padded.shape[:-1], -1, 4)
    order = np.argsort(-runs, axis=-1, kind="stable")[..., :2]
    keep = np.zeros(runs.shape, dtype=bool)
    np.put_along_axis(keep, order, True, axis=-1)
    keep = keep.reshape(padded.shape)[..., :cin]
    return np.moveaxis(keep, -1, axis)


def pack_mask(mask: np.ndarray) -> list[int]:
    """AMCT's ``selective_mask`` INTS: packbits of the flat mask, 8-byte padded, as int64."""
    packed = np.packbits(np.asarray(mask, dtype=bool).reshape(-1).astype(np.uint8))
    packed = np.pad(packed, (0, (-packed.size) % 8))
    return packed.view("<i8").tolist()


def unpack_mask(values: list[int], shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of :func:`pack_mask` for a kernel of ``shape``."""
    raw = np.asarray(values, dtype="<i8").view(np.uint8)
    size = int(np.prod(shape))
    if raw.size * 8 < size:
        raise GraphError(f"selective_mask holds {raw.size * 8} bits, kernel {shape} needs {size}")
    return np.unpackbits(raw)[:size].astype(bool).reshape(shape)


def selective_record(name: str, kernel_shape: tuple[int, ...], mask=None) -> PruneRecord:
    """A PruneRecord with ``selective_prune { name; mask_shape; [selective_mask] }``.

    Example:
        >>> r = selective_record("c1", (3, 3, 3, 32))
        >>> r.selective_prune.get("mask_shape")
        [3, 3, 3, 32]
    """
    attrs = [Attr("mask_shape", "INTS", [int(d) for d in kernel_shape])]
    if mask is not None:
        if tuple(mask.shape) != tuple(kernel_shape):
            raise GraphError(f"{name}: mask shape {mask.shape} != kernel shape {kernel_shape}")
        attrs.append(Attr("selective_mask", "INTS", pack_mask(mask)))
    return PruneRecord(selective_prune=PruneNode(name, attrs))
