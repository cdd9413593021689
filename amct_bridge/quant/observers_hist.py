"""Histogram-backed observers: percentile, IFMR and HFMG (bounded memory, exact merges).

Each keeps one :class:`~amct_bridge.quant.histogram.GridHistogram` of ``bins`` bins fed from
per-batch histograms; the exact global min/max and element count are kept alongside.

Example:
    >>> import numpy as np
    >>> obs = PercentileObserver(max_percentile=0.5, min_percentile=1.0)
    >>> obs.update(np.arange(1000, dtype=np.float32))
    >>> round(obs.clip_range()[1])
    500
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from amct_bridge.errors import QuantError
from amct_bridge.quant.hfmg import NUM_OF_BINS_CHOICES, hfmg_search
from amct_bridge.quant.histogram import GridHistogram
from amct_bridge.quant.ifmr import candidate_ratios, ifmr_search
from amct_bridge.quant.observers_base import Observer
from amct_bridge.quant.stats import BatchStats


def percentile_rank(p: float, n: int) -> int:
    """AMCT's rank ``k`` (1-based, from the top) of percentile ``p`` over ``n`` values.

    ``k = n - floor(float32(p) * float32(n))``, and 1 when ``p == 1``.

    Example:
        >>> percentile_rank(0.999999, 999_999), percentile_rank(0.999999, 3_000_000)
        (1, 3)
    """
    if abs(p - 1.0) < np.finfo(np.float64).eps:
        return 1
    k = n - int(math.floor(np.float32(p) * np.float32(n)))
    return max(k, 1)


def integer_counts(counts: np.ndarray) -> np.ndarray:
    """Round a re-binned histogram to integers as AMCT's own histogram has them.

    Cumulative rounding keeps the total and every partial sum within 1/2 of the interpolated
    one; the first and last bins hold the exact min and max, so each keeps at least one count
    (AMCT's trimming compares per-bin counts against ``ceil(total / 1e5)``).

    Example:
        >>> integer_counts(np.array([0.4, 0.4, 1.2, 0.0])).tolist()
        [1.0, 0.0, 0.0, 1.0]
    """
    cum = np.rint(np.cumsum(counts))
    out = np.diff(np.concatenate(([0.0], cum)))
    for end, inward in ((0, 1), (out.size - 1, -1)):
        if out[end] < 1 and out.sum() >= 2:
            donors = np.nonzero(out[::inward] >= 1)[0]
            donor = donors[0] if inward == 1 else out.size - 1 - donors[0]
            out[donor] -= 1
            out[end] += 1
    return out


class _HistogramObserver(Observer):
    """Shared histogram bookkeeping."""

    def __init__(self, **common: Any) -> None:
        super().__init__(**common)
        self.hist: GridHistogram | None = None

    def _absorb(self, s: BatchStats) -> None:
        hist = np.asarray(s.hist)
        if s.max == s.min:  # a constant batch is a point mass; TF cannot histogram it anyway
            hist = np.zeros(self.bins)
            hist[0] = s.count
        batch = GridHistogram.from_batch(s.min, s.max, hist)
        if self.hist is None:
            self.hist = batch
        else:
            self.hist.add(batch)

    def _absorb_grid(self, lo: float, hi: float, counts: np.ndarray) -> None:
        grid = GridHistogram.from_batch(lo, hi, counts)
        if self.hist is None:
            self.hist = grid
        else:
            self.hist.add(grid)

    def _require_data(self) -> None:
        super()._require_data()
        total = 0.0 if self.hist is None else self.hist.total
        if abs(total - self.count) > 0.5:  # a deferred histogram never arrived
            raise QuantError(
                f"{self.name}: histogram holds {total:.0f} values but {self.count} were seen"
            )

    def _merge_state(self, other: Observer) -> None:
        assert isinstance(other, _HistogramObserver) and other.hist is not None
        self.hist.add(other.hist)

    def _state(self) -> dict[str, Any]:
        return {"hist": self.hist.state_dict()}

    def _load_state(self, d: dict[str, Any]) -> None:
        self.hist = GridHistogram.from_state(d["hist"])


class PercentileObserver(_HistogramObserver):
    """AMCT's max/min percentile (``max_percentile``, ``min_percentile``, default 0.999999).

    The k-th largest value (``k = N - floor(float32(p) * float32(N))``; the exact max when k is 1,
    i.e. for N below about 10**6 at the default) is located in the histogram and interpolated
    as an order statistic of uniform values in its bin. Clamped to ``max >= 0``, ``min <= 0``.

    Example:
        >>> obs = PercentileObserver()
        >>> obs.update(np.array([-1.0, 0.0, 4.0])); obs.clip_range()
        (-1.0, 4.0)
    """

    algorithm = "percentile"
    option_names: tuple[str, ...] = ("max_percentile", "min_percentile")
    default_bins = 2048

    def __init__(
        self, *, max_percentile: float = 0.999999, min_percentile: float = 0.999999, **common: Any
    ) -> None:
        super().__init__(**common)
        for label, p in (("max_percentile", max_percentile), ("min_percentile", min_percentile)):
            if not 0.5 <= float(p) <= 1.0:
                raise QuantError(f"{self.name}: {label} must be in [0.5, 1.0], got {p!r}")
        self.max_percentile = float(max_percentile)
        self.min_percentile = float(min_percentile)

    def percentile_range(self) -> tuple[float, float]:
        """``(min_p, max_p)``: AMCT's percentile min (<= 0) and max (>= 0)."""
        self._require_data()
        k_hi = percentile_rank(self.max_percentile, self.count)
        k_lo = percentile_rank(self.min_percentile, self.count)
        hi = self.max if k_hi <= 1 else self.hist.kth_largest(k_hi, self.min, self.max)
        lo = self.min if k_lo <= 1 else self.hist.kth_smallest(k_lo, self.min, self.max)
        hi = min(max(hi, self.min), self.max)
        lo = min(max(lo, self.min), self.max)
        return min(lo, 0.0), max(hi, 0.0)

    def _clip_range(self, bits: int, symmetric: bool) -> tuple[float, float]:
        return self.percentile_range()


class IfmrObserver(PercentileObserver):
    """AMCT's IFMR: percentile range, then the lowest-MSE clip ratio, evaluated on a histogram.

    Options (AMCT ``ifmr_quantize``): ``max_percentile``, ``min_percentile`` (0.999999),
    ``search_range_start`` (0.7), ``search_range_end`` (1.3), ``search_step`` (0.01).

    Example:
        >>> x = np.random.default_rng(0).standard_t(3, 100_000).astype(np.float32)
        >>> obs = IfmrObserver()
        >>> obs.update(x)
        >>> obs.clip_range()[1] < x.max()
        True
    """

    algorithm = "ifmr"
    option_names = PercentileObserver.option_names + (
        "search_range_start",
        "search_range_end",
        "search_step",
    )
    default_bins = 8192

    def __init__(
        self,
        *,
        search_range_start: float = 0.7,
        search_range_end: float = 1.3,
        search_step: float = 0.01,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        candidate_ratios(search_range_start, search_range_end, search_step)  # validates
        self.search_range_start = float(search_range_start)
        self.search_range_end = float(search_range_end)
        self.search_step = float(search_step)

    def _clip_range(self, bits: int, symmetric: bool) -> tuple[float, float]:
        lo, hi = self.percentile_range()
        return ifmr_search(
            self.hist,
            lo,
            hi,
            support=(self.min, self.max),
            bits=bits,
            symmetric=symmetric,
            search_range_start=self.search_range_start,
            search_range_end=self.search_range_end,
            search_step=self.search_step,
        )


class HfmgObserver(_HistogramObserver):
    """AMCT's HFMG (``hfmg_quantize { num_of_bins }``, default 4096) on a merged histogram.

    Batches are summarised with ``4 * num_of_bins`` bins and merged on one grid; the search
    runs on ``num_of_bins`` bins over the exact global ``[min, max]``, like AMCT's.

    Example:
        >>> obs = HfmgObserver(num_of_bins=1024)
        >>> obs.update(np.r_[np.linspace(0, 1, 100000), [8.0]].astype(np.float32))
        >>> obs.clip_range()[1] < 2.0
        True
    """

    algorithm = "hfmg"
    option_names = ("num_of_bins",)

    def __init__(self, *, num_of_bins: int = 4096, **common: Any) -> None:
        if int(num_of_bins) not in NUM_OF_BINS_CHOICES:
            raise QuantError(
                f"{common.get('name', 'tensor')}: hfmg num_of_bins must be one of "
                f"{NUM_OF_BINS_CHOICES}, got {num_of_bins!r}"
            )
        self.num_of_bins = int(num_of_bins)
        if common.get("bins") is None:
            common["bins"] = 4 * self.num_of_bins
        super().__init__(**common)

    default_bins = 4 * 4096

    def search_histogram(self) -> np.ndarray:
        """The ``num_of_bins`` counts over the exact global ``[min, max]`` that HFMG searches."""
        self._require_data()
        counts = self.hist.rebin(self.min, self.max, self.num_of_bins)
        return integer_counts(counts)

    def _clip_range(self, bits: int, symmetric: bool) -> tuple[float, float]:
        if self.max <= self.min:
            return self.min, self.max
        return hfmg_search(self.search_histogram(), self.min, self.max, bits)
