"""Test helper: esp-ppq's filter byte order, written element by element (not by reshapes)."""

from __future__ import annotations

import numpy as np


def encode_filter(w: np.ndarray, group: int, target: str) -> np.ndarray:
    """File order of a logical ``[N, *kernel, C]`` filter, element by element, as esp-ppq's
    ``ResetParamLayoutPattern.reset_conv_filter_layout`` (export_patterns.py) describes it."""
    n, c = w.shape[0], w.shape[-1]
    kernel = w.shape[1:-1]
    k = int(np.prod(kernel))
    flat = w.reshape(n, k, c)
    out = np.zeros(n * k * c, w.dtype)
    block = 16 if w.dtype == np.int8 else 8
    aligned = n // block * block
    for o in range(n):
        for kk in range(k):
            for ci in range(c):
                if target == "c":
                    pos = o * k * c + kk * c + ci if group == 1 else kk * n + o
                elif o < aligned:
                    pos = ((o // block) * k * c + kk * c + ci) * block + o % block
                elif group == 1:
                    pos = aligned * k * c + (o - aligned) * k * c + kk * c + ci
                else:
                    pos = aligned * k + kk * (n - aligned) + (o - aligned)
                out[pos] = flat[o, kk, ci]
    dims = [*kernel, c, n] if group == 1 else [*kernel, n, c]
    return out.reshape(dims)
