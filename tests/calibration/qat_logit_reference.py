"""The numpy reference of a QAT sidecar's pre-activation range for a Dense -> ReLU -> Dense(softmax)
net (tests/keras/test_qat_preactivation.py, tests/mindspore/test_ms_qat_preactivation.py): the
logits of each training batch, with the weights of that step, the input and the hidden
activations clipped at their own EMA ranges as QAT clips them, and the logits' per-batch extremes
through the same EMA (the first batch sets it).

QAT observes ranges with an EMA of each training batch's min / max (the first batch sets it,
then ``range <- d * range + (1 - d) * batch``) and fake-quantizes a layer's input clipped at
that range, updated with the batch first; the head's output before its activation is tracked
with the same EMA. The reference, in float64 numpy: each training batch (in order) through the
weights read at the start of its step, the input and the hidden activations clipped at their
own EMAs as QAT clips them, the logits' per-batch min / max through the EMA."""

from __future__ import annotations

import numpy as np


def ema_logit_range(x: np.ndarray, seen: list, batch: int, decay: float) -> tuple[float, float]:
    """The EMA of the logits' (min, max) over the training steps; ``seen``: per step the
    weights ``(w1, b1, w2, b2)`` read at its start, kernels as ``(in, out)``."""
    ema: dict[str, tuple[float, float]] = {}

    def clipped(name: str, v: np.ndarray) -> np.ndarray:
        lo, hi = v.min(), v.max()  # ``v`` updates its tensor's EMA first, then is clipped
        if name in ema:
            lo = decay * ema[name][0] + (1 - decay) * lo
            hi = decay * ema[name][1] + (1 - decay) * hi
        ema[name] = (lo, hi)
        return np.clip(v, lo, hi)

    rows = []
    for step, (w1, b1, w2, b2) in enumerate(seen):
        xb = clipped("x", x[(step * batch) % len(x) :][:batch].astype(np.float64))
        hidden = clipped("hidden", np.maximum(xb @ w1 + b1, 0.0))
        logits = hidden @ w2 + b2
        rows.append((logits.min(), logits.max()))
    lo, hi = rows[0]
    for b_lo, b_hi in rows[1:]:
        lo, hi = decay * lo + (1 - decay) * b_lo, decay * hi + (1 - decay) * b_hi
    return lo, hi
