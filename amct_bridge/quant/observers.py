"""Activation observers: per-batch summaries in, AMCT clip ranges and (scale_d, offset_d) out.

Every observer works from :class:`BatchStats` alone (count, min, max, an optional histogram of
``obs.bins`` bins over the batch's own range, optional per-channel absmax), so framework adapters
compute the summary inside their graph and memory stays bounded: no observer keeps activations.

==============  ======  ==========================================================================
algorithm       bins    result
==============  ======  ==========================================================================
``minmax``      0       global min/max
``ema``         0       exponential moving average of batch min/max (``momentum``, TF-style)
``percentile``  2048    AMCT's k-th largest/smallest, ``k = N - floor(float32(p) * float32(N))``
``ifmr``        8192    AMCT's default: percentile, then the lowest-MSE clip ratio (61 candidates)
``hfmg``        4 x n   AMCT's histogram search over ``num_of_bins`` bins (default 4096)
==============  ======  ==========================================================================

Example:
    >>> import numpy as np
    >>> obs = make_observer("ifmr")
    >>> obs.update(np.linspace(0.0, 6.0, 10000, dtype=np.float32))
    >>> scale, offset = obs.factors()
    >>> f"{scale:.9g}", offset
    ('0.0235294122', -128)
"""

from __future__ import annotations

from amct_bridge.errors import QuantError
from amct_bridge.quant.factors import activation_factors, bits_of
from amct_bridge.quant.observers_base import Observer
from amct_bridge.quant.observers_hist import HfmgObserver, IfmrObserver, PercentileObserver
from amct_bridge.quant.stats import BatchStats, batch_stats


class MinMaxObserver(Observer):
    """Global min/max over all batches (AMCT/TFLite ``minmax``); merge is exact.

    Example:
        >>> import numpy as np
        >>> obs = MinMaxObserver()
        >>> obs.update(np.array([-1.0, 3.0]))
        >>> obs.clip_range()
        (-1.0, 3.0)
    """

    algorithm = "minmax"

    def _clip_range(self, bits: int, symmetric: bool) -> tuple[float, float]:
        return self.min, self.max


class EmaObserver(Observer):
    """Exponential moving average of per-batch min/max, for training and QAT.

    ``v = momentum * v + (1 - momentum) * batch`` after the first batch initialises ``v``
    (TF's ``MovingAverageQuantizer`` with ``ema_decay``). Merge averages two states weighted by
    their batch counts (an approximation: an EMA depends on batch order).

    Example:
        >>> import numpy as np
        >>> obs = EmaObserver(momentum=0.5)
        >>> obs.update(np.array([0.0, 2.0])); obs.update(np.array([0.0, 4.0]))
        >>> obs.clip_range()
        (0.0, 3.0)
    """

    algorithm = "ema"
    option_names = ("momentum",)

    def __init__(self, *, momentum: float = 0.999, **common) -> None:
        super().__init__(**common)
        if not 0.0 <= float(momentum) < 1.0:
            raise QuantError(f"ema momentum must be in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)
        self.ema_min = self.ema_max = 0.0

    def _absorb(self, s: BatchStats) -> None:
        if self.batches == 0:
            self.ema_min, self.ema_max = s.min, s.max
            return
        m = self.momentum
        self.ema_min = m * self.ema_min + (1.0 - m) * s.min
        self.ema_max = m * self.ema_max + (1.0 - m) * s.max

    def _merge_state(self, other: EmaObserver) -> None:
        wa, wb = self.batches, other.batches
        self.ema_min = (self.ema_min * wa + other.ema_min * wb) / (wa + wb)
        self.ema_max = (self.ema_max * wa + other.ema_max * wb) / (wa + wb)

    def _state(self) -> dict:
        return {"ema_min": self.ema_min, "ema_max": self.ema_max}

    def _load_state(self, d: dict) -> None:
        self.ema_min, self.ema_max = float(d["ema_min"]), float(d["ema_max"])

    def _clip_range(self, bits: int, symmetric: bool) -> tuple[float, float]:
        return self.ema_min, self.ema_max


OBSERVERS: dict[str, type[Observer]] = {
    cls.algorithm: cls
    for cls in (MinMaxObserver, EmaObserver, PercentileObserver, IfmrObserver, HfmgObserver)
}


def make_observer(algorithm: str, **options) -> Observer:
    """Create an observer by AMCT algorithm name with AMCT option names.

    Common options: ``num_bits`` (8; 16 for act_type INT16, 4 for dst_type INT4),
    ``activation_offset`` (True = asymmetric), ``name`` (tensor name for errors). Per algorithm:
    ema ``momentum``; percentile ``max_percentile``, ``min_percentile``; ifmr the same plus
    ``search_range_start``, ``search_range_end``, ``search_step``; hfmg ``num_of_bins``.
    Any algorithm accepts ``bins`` to override its per-batch histogram size.

    Example:
        >>> make_observer("hfmg", num_of_bins=1024).bins
        4096
    """
    cls = OBSERVERS.get(str(algorithm).lower())
    if cls is None:
        raise QuantError(f"unknown observer {algorithm!r}; expected one of {sorted(OBSERVERS)}")
    return cls.with_options(options)


def observer_from_state(d: dict) -> Observer:
    """Rebuild any observer from its :meth:`Observer.state_dict`.

    Example:
        >>> import numpy as np
        >>> obs = make_observer("minmax"); obs.update(np.array([1.0, 2.0]))
        >>> observer_from_state(obs.state_dict()).clip_range()
        (1.0, 2.0)
    """
    cls = OBSERVERS.get(str(d.get("algorithm", "")))
    if cls is None:
        raise QuantError(f"observer state has unknown algorithm {d.get('algorithm')!r}")
    return cls.from_state(d)


__all__ = [
    "BatchStats",
    "EmaObserver",
    "HfmgObserver",
    "IfmrObserver",
    "MinMaxObserver",
    "OBSERVERS",
    "Observer",
    "PercentileObserver",
    "activation_factors",
    "batch_stats",
    "bits_of",
    "make_observer",
    "observer_from_state",
]
