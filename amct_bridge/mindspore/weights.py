"""MindSpore weights for the core's record builder: :class:`MindSporeWeights`.

Kernels are handed over as float32 numpy **in MindSpore's own layout** (the part names it, see
:mod:`amct_bridge.mindspore.cells`): Conv2d ``OIHW`` (depthwise ``(C*m, 1, kH, kW)``, still
OIHW), Conv2dTranspose ``IOHW`` (``(in, out, kH, kW)``), Dense ``OI`` (``(out, in)``). The
math in :mod:`amct_bridge.calibration.weights` reads the channel axes from the layout name, so
scale_w is per output channel exactly where AMCT for MindSpore puts it.

BatchNorm2d: ``gamma``, ``beta``, ``moving_mean``, ``moving_variance`` and the attribute
``eps``. ``affine=False`` keeps fixed ones / zeros as gamma / beta (handed over as they are). Note
MindSpore stores ``bn.momentum = 1 - momentum`` of the constructor (:func:`bn_momentum` gives
the constructor's value back; folding does not need it).

Example:
    >>> from mindspore import nn
    >>> from amct_bridge.mindspore.cells import describe
    >>> d = describe("fc", nn.Dense(3, 2))
    >>> w = MindSporeWeights().part_weights(d, d.parts[0]); w.kernel.shape, w.layout
    ((2, 3), 'OI')
"""

from __future__ import annotations

import numpy as np

from amct_bridge.calibration.layers import LayerDesc
from amct_bridge.calibration.protocol import BatchNormParams, PartWeights
from amct_bridge.errors import CalibrationError
from amct_bridge.mindspore.cells import QuantPart


class MindSporeWeights:
    """The core's :class:`~amct_bridge.calibration.protocol.WeightSource` for MindSpore cells.

    Example:
        >>> from mindspore import nn
        >>> from amct_bridge.mindspore.cells import describe
        >>> d = describe("c", nn.Conv2d(3, 4, 3, has_bias=True))
        >>> w = MindSporeWeights().part_weights(d, d.parts[0])
        >>> w.kernel.shape, w.layout, w.bias.shape
        ((4, 3, 3, 3), 'OIHW', (4,))
    """

    def part_weights(self, layer: LayerDesc, part: QuantPart) -> PartWeights:
        """Kernel and bias (None without ``has_bias``) of ``part`` in its MindSpore layout."""
        if not part.weights:
            raise CalibrationError(f"cell {layer.key!r}: {part.op_type} has no weights")
        cell = layer.handle
        return PartWeights(kernel_of(cell, layer.key), part.layout, bias_of(cell))

    def batch_norm(self, bn: LayerDesc) -> BatchNormParams:
        """gamma, beta, moving mean/variance, ``eps``."""
        return batch_norm_params(bn.handle, bn.key)


def kernel_of(cell, key: str = "cell") -> np.ndarray:
    """The cell's ``weight`` as float32 numpy (MindSpore layout).

    Example:
        >>> from mindspore import nn
        >>> kernel_of(nn.Conv2dTranspose(4, 8, 3)).shape
        (4, 8, 3, 3)
    """
    weight = getattr(cell, "weight", None)
    if weight is None:
        raise CalibrationError(f"cell {key!r} ({type(cell).__name__}) has no 'weight' parameter")
    return np.asarray(weight.asnumpy(), dtype=np.float32)


def bias_of(cell) -> np.ndarray | None:
    """The cell's bias as float32 numpy, or None (``has_bias=False``).

    Example:
        >>> from mindspore import nn
        >>> bias_of(nn.Conv2d(3, 4, 3)) is None, bias_of(nn.Dense(3, 4)).shape
        (True, (4,))
    """
    if not getattr(cell, "has_bias", False) or getattr(cell, "bias", None) is None:
        return None
    return np.asarray(cell.bias.asnumpy(), dtype=np.float32)


def batch_norm_params(bn, key: str = "bn") -> BatchNormParams:
    """Inference parameters of a BatchNorm2d (``y = gamma (x - mean) / sqrt(var + eps) + beta``).

    Example:
        >>> from mindspore import nn
        >>> p = batch_norm_params(nn.BatchNorm2d(2, eps=1e-3, affine=False))
        >>> p.gamma.tolist(), p.eps, p.var.tolist()
        ([1.0, 1.0], 0.001, [1.0, 1.0])
    """
    try:
        mean = np.asarray(bn.moving_mean.asnumpy(), np.float32)
        var = np.asarray(bn.moving_variance.asnumpy(), np.float32)
        eps = float(bn.eps)
    except AttributeError as exc:
        raise CalibrationError(
            f"cell {key!r} ({type(bn).__name__}) is not a BatchNorm2d: {exc}"
        ) from exc
    # affine=False keeps gamma/beta as fixed ones/zeros Parameters: folding them is exact
    gamma = np.asarray(bn.gamma.asnumpy(), np.float32)
    beta = np.asarray(bn.beta.asnumpy(), np.float32)
    return BatchNormParams(gamma, beta, mean, var, eps)


def bn_momentum(bn) -> float:
    """The ``momentum`` the BatchNorm2d was constructed with (MindSpore keeps ``1 - momentum``).

    Example:
        >>> from mindspore import nn
        >>> round(bn_momentum(nn.BatchNorm2d(2, momentum=0.8)), 6)
        0.8
    """
    return 1.0 - float(bn.momentum)
