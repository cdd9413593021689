"""What ESP-DL v1.1.0's convert tool accepts, as tables (one place to read and change).

Facts from running the real tool (docs/espdl-export.md): the three operations it implements,
the filter layout each expects, the axis that per-channel quantization splits on, the activation
names (case-sensitive), the element widths and the esp32s3 block sizes.

Example:
    >>> OPERATIONS["depthwise_conv2d"].channel_axis
    2
    >>> FEATURE_BITS["s16"], S3_GROUP["s8"]
    (16, 16)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Operation:
    """One convert.py operation: its filter layout and the per-channel split axis."""

    name: str
    layout: str
    channel_axis: int


OPERATIONS: dict[str, Operation] = {
    "conv2d": Operation("conv2d", "HWCN", 3),
    "depthwise_conv2d": Operation("depthwise_conv2d", "HWC1", 2),
    "fully_connected": Operation("fully_connected", "11CN", 3),
}

#: Activation types the tool fuses, and whether each reads an alpha npy.
ACTIVATIONS: dict[str, bool] = {"ReLU": False, "LeakyReLU": True, "PReLU": True}

#: Element width per feature_type.
FEATURE_BITS: dict[str, int] = {"s8": 8, "s16": 16}

#: C type of the elements per feature_type.
CTYPE: dict[str, str] = {"s8": "int8_t", "s16": "int16_t"}

#: Targets the tool knows; only esp32s3 reorders elements into blocks.
TARGETS: tuple[str, ...] = ("esp32", "esp32s2", "esp32c3", "esp32s3")

#: esp32s3 output-channel block size per feature_type.
S3_GROUP: dict[str, int] = {"s8": 16, "s16": 8}

#: Per-channel filter exponents are clamped to at least this.
PER_CHANNEL_MIN_EXPONENT = -15

#: Per-channel bias: int16 with exponent input_exponent + filter_exponent[c] + this.
PER_CHANNEL_BIAS_SHIFT = 4

#: Placeholder exponent the tool writes into a per-channel ``Bias<int16_t>``.
PER_CHANNEL_BIAS_PLACEHOLDER = -128
