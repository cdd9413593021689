"""Keras kernels for the core's record builder: :class:`KerasWeights` and Fold glue.

This module only reads Keras weights (kernels in Keras layout, which is also the TF op's filter
layout, so the frozen graph of :mod:`amct_bridge.keras.freeze` carries exactly the array
scale_w was computed from) and hands numpy arrays to :mod:`amct_bridge.calibration.weights`,
where the math lives. The helpers taking a Keras :class:`~amct_bridge.keras.layers.QuantPart`
read the layout from it.

Example:
    >>> import keras
    >>> from amct_bridge.keras.layers import QUANTIZABLE
    >>> layer = keras.layers.Conv2D(8, 3); layer.build((None, 16, 16, 3))
    >>> input_channels(layer, QUANTIZABLE["Conv2D"][0])
    3
"""

from __future__ import annotations

import numpy as np

from amct_bridge.calibration import weights as core
from amct_bridge.calibration.layers import LayerDesc
from amct_bridge.calibration.protocol import BatchNormParams, PartWeights
from amct_bridge.calibration.records import FoldedPart
from amct_bridge.keras.freeze import Fold
from amct_bridge.keras.layers import QuantPart


class KerasWeights:
    """The core's :class:`~amct_bridge.calibration.protocol.WeightSource` for Keras layers.

    Example:
        >>> import keras
        >>> from amct_bridge.keras.layers import describe
        >>> d = describe("fc", keras.layers.Dense(2)); d.handle.build((None, 3))
        >>> w = KerasWeights().part_weights(d, d.parts[0]); w.kernel.shape, w.layout
        ((3, 2), 'IO')
    """

    def part_weights(self, layer: LayerDesc, part: QuantPart) -> PartWeights:
        """Kernel and bias of ``part`` in the Keras layout the part names."""
        return PartWeights(kernel_of(layer.handle, part), part.layout, bias_of(layer.handle, part))

    def batch_norm(self, bn: LayerDesc) -> BatchNormParams:
        """gamma/beta (None when ``scale``/``center`` is off), moving stats, epsilon."""
        layer = bn.handle
        return BatchNormParams(
            read(layer.gamma) if layer.scale else None,
            read(layer.beta) if layer.center else None,
            read(layer.moving_mean),
            read(layer.moving_variance),
            float(layer.epsilon),
        )


def read(var, dtype=None) -> np.ndarray:
    """A variable's value as numpy: one ReadVariableOp (a third of ``np.asarray(var)``'s cost,
    which goes through Keras' and TF's array protocols; a model has hundreds of them).

    Example:
        >>> import keras
        >>> read(keras.Variable([1.0, 2.0])).tolist()
        [1.0, 2.0]
    """
    import tensorflow as tf

    value = getattr(var, "value", var)  # keras.Variable -> its tf.Variable
    if isinstance(value, tf.Variable) and not isinstance(value, tf.distribute.DistributedValues):
        out = tf.raw_ops.ReadVariableOp(resource=value.handle, dtype=value.dtype).numpy()
        return out if dtype is None else out.astype(dtype, copy=False)
    return np.asarray(var, dtype=dtype)


def kernel_of(layer, part: QuantPart) -> np.ndarray:
    """The part's kernel as float32 numpy (Keras layout).

    Example:
        >>> import keras
        >>> from amct_bridge.keras.layers import QUANTIZABLE
        >>> d = keras.layers.Dense(2); d.build((None, 3))
        >>> kernel_of(d, QUANTIZABLE["Dense"][0]).shape
        (3, 2)
    """
    return read(getattr(layer, part.kernel_attr), np.float32)


def bias_of(layer, part: QuantPart) -> np.ndarray | None:
    """The part's bias as float32 numpy, or None (no bias / depthwise half of a separable conv)."""
    if part.bias_attr is None or not getattr(layer, "use_bias", False):
        return None
    bias = getattr(layer, part.bias_attr, None)
    return None if bias is None else read(bias, np.float32)


def input_channels(layer, part: QuantPart) -> int:
    """Number of input channels of the part's kernel (length of tensor_balance_factor)."""
    return core.input_channels(kernel_of(layer, part), part.layout)


def freeze_fold(folded: FoldedPart) -> Fold:
    """The :class:`~amct_bridge.keras.freeze.Fold` that bakes a folded part into a .pb.

    Example:
        >>> # see amct_bridge.keras.record_builder
    """
    own, bias = folded.original.bias, folded.folded.bias
    delta = bias if own is None else bias - own
    target = folded.target
    return Fold(target.key, target.bn, folded.folded.kernel, np.asarray(delta, np.float32))


def weight_factors(kernel: np.ndarray, part: QuantPart, channel_wise: bool, name: str = "kernel"):
    """ARQ ``(scale_w, offset_w)`` lists; per channel only where AMCT allows it.

    Example:
        >>> from amct_bridge.keras.layers import QUANTIZABLE
        >>> weight_factors(np.array([[1.0, -2.0]], "float32"), QUANTIZABLE["Dense"][0], True)[1]
        [0]
    """
    return core.weight_factors(
        kernel,
        part.layout,
        part_channel_wise=part.channel_wise,
        channel_wise=channel_wise,
        name=name,
    )


def balance(channel_range, kernel: np.ndarray, part: QuantPart, strength: float, key: str):
    """DMQ ``(tensor_balance_factor, balanced kernel, balanced activation (lo, hi))``, see
    :func:`amct_bridge.calibration.weights.balance`.

    Example:
        >>> from amct_bridge.keras.layers import QUANTIZABLE
        >>> f, k, r = balance(np.array([[0.0, 0.0], [4.0, 1.0]]), np.array([[1.0], [4.0]]),
        ...                   QUANTIZABLE["Dense"][0], 0.5, "fc")
        >>> f, k.ravel().tolist(), r
        ([2.0, 0.5], [2.0, 2.0], (0.0, 2.0))
    """
    return core.balance(channel_range, kernel, part.layout, strength, key)


def shift_bits(kernel: np.ndarray, part: QuantPart, scale_w, act_bits: int, symmetric: bool):
    """shift_bit per scale_w entry (joint_quant), see :func:`amct_bridge.calibration.weights.
    shift_bits`.

    Example:
        >>> from amct_bridge.keras.layers import QUANTIZABLE
        >>> shift_bits(np.ones((300, 2)), QUANTIZABLE["Dense"][0], [1 / 127], 8, False)
        [9]
    """
    return core.shift_bits(kernel, part.layout, scale_w, act_bits, symmetric)
