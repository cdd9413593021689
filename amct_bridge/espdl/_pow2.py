"""Stop-gap power-of-two math until amct_bridge.quant.espdl is committed (then this file goes).

Example:
    >>> auto_exponent(np.array([1.0]), 8)
    -6
"""

from __future__ import annotations

import math

import numpy as np


def auto_exponent(x: np.ndarray, bits: int) -> int:
    """``ceil(log2(max|x| / (2^(bits-1) - 1)))``; 0 for an all-zero tensor."""
    peak = float(np.max(np.abs(x))) if np.size(x) else 0.0
    if peak == 0.0:
        return 0
    return int(math.ceil(math.log2(peak / (2 ** (bits - 1) - 1))))


def quantize_pow2(x: np.ndarray, exponent: np.ndarray, bits: int) -> tuple[np.ndarray, int]:
    """``clip(round_half_even(x / 2^e))`` -> (int64 integers, count of clipped elements)."""
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    r = np.round(np.asarray(x, np.float64) / np.power(2.0, exponent))
    saturated = int(np.count_nonzero((r < lo) | (r > hi)))
    return np.clip(r, lo, hi).astype(np.int64), saturated
