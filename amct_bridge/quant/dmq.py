"""DMQ balancer (AMCT ``dmq_balancer { migration_strength }``): ``tensor_balance_factor``.

One factor per INPUT channel: ``f_c = amax|x_c|**a / amax|W_c|**(1 - a)``; activations are
divided by it, weights multiplied. Edge cases exactly as AMCT's ``dmq_balance.cpp``:

- all activation amax (or all weight amax) below FLT_EPSILON -> every factor 1;
- a channel whose activation or weight amax is below FLT_EPSILON is a "zero channel"; with
  ``A = max(x_c / f_c)`` and ``B = max(W_c * f_c)`` over the normal channels (all factors 1 if
  either is below FLT_EPSILON): both zero -> 1; activation zero -> ``B / amax|W_c|``;
  weight zero -> ``amax|x_c| / A``;
- ``a`` (migration_strength) must be in [0.2, 0.8]; each factor is clamped to
  [FLT_EPSILON, 1 / FLT_EPSILON] (AMCT rejects records outside that range).

Example:
    >>> import numpy as np
    >>> balance_factors([4.0, 1.0], np.array([[1.0], [4.0]]), "IO").tolist()
    [2.0, 0.5]
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from amct_bridge.errors import QuantError
from amct_bridge.quant.factors import FLT_EPSILON
from amct_bridge.quant.layouts import in_channel_absmax

MIGRATION_STRENGTH_RANGE = (0.2, 0.8)


def balance_factors(
    act_absmax_per_cin: ArrayLike,
    weight: ArrayLike,
    layout: str,
    alpha: float = 0.5,
    *,
    name: str = "layer",
) -> np.ndarray:
    """DMQ ``tensor_balance_factor`` (float32, length Cin).

    Args:
        act_absmax_per_cin: ``max |x|`` of the layer INPUT per channel (e.g. an observer's
            ``channel_absmax`` with the channel axis last).
        weight: the layer kernel in ``layout``.
        layout: kernel layout (HWIO, HWCM, IO, OIHW, ...); its input-channel axis is used.
        alpha: migration_strength, in [0.2, 0.8] (default 0.5).
        name: layer name for errors.

    Example:
        >>> balance_factors([0.0, 1.0], np.array([[1.0], [1.0]]), "IO").tolist()  # zero act
        [1.0, 1.0]
    """
    a = float(alpha)
    lo, hi = MIGRATION_STRENGTH_RANGE
    if not lo <= a <= hi:
        raise QuantError(f"{name}: DMQ migration_strength {alpha!r} not in [{lo}, {hi}]")
    act = np.abs(np.asarray(act_absmax_per_cin, dtype=np.float32).ravel())
    wts = in_channel_absmax(weight, layout, name)
    if act.size != wts.size:
        raise QuantError(
            f"{name}: activation absmax has {act.size} channels, weights have {wts.size} (Cin)"
        )
    for label, v in (("activation", act), ("weight", wts)):
        if not np.all(np.isfinite(v)):
            raise QuantError(f"{name}: {label} channel max is NaN/Inf; cannot balance")
    ones = np.ones(act.size, dtype=np.float32)
    if act.max() < FLT_EPSILON or wts.max() < FLT_EPSILON:
        return ones
    zero = (act < FLT_EPSILON) | (wts < FLT_EPSILON)
    f32 = np.float32
    with np.errstate(divide="ignore"):
        factor = np.where(zero, f32(0), act ** f32(a) / wts ** f32(1 - a)).astype(np.float32)
    if zero.any():
        factor = _fill_zero_channels(act, wts, factor)
    return np.clip(factor, f32(FLT_EPSILON), f32(1 / FLT_EPSILON)).astype(np.float32)


def _fill_zero_channels(act: np.ndarray, wts: np.ndarray, factor: np.ndarray) -> np.ndarray:
    normal = factor >= FLT_EPSILON
    act_outlier = float(np.max(act[normal] / factor[normal], initial=0.0))
    wts_outlier = float(np.max(wts[normal] * factor[normal], initial=0.0))
    if act_outlier < FLT_EPSILON or wts_outlier < FLT_EPSILON:
        return np.ones_like(factor)
    out = factor.copy()
    act_zero, wts_zero = act < FLT_EPSILON, wts < FLT_EPSILON
    out[act_zero & wts_zero] = 1.0
    only_act = act_zero & ~wts_zero
    out[only_act] = wts_outlier / wts[only_act]
    only_wts = ~act_zero & wts_zero
    out[only_wts] = act[only_wts] / act_outlier
    return out
