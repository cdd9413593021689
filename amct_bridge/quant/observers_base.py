"""The observer protocol shared by every activation algorithm (see ``observers.py``).

An observer absorbs :class:`~amct_bridge.quant.stats.BatchStats`, merges with another observer of
the same algorithm and options, round-trips through a JSON-ready ``state_dict``, and turns what
it saw into a clip range and AMCT ``(scale_d, offset_d)``.

Example:
    >>> import numpy as np
    >>> from amct_bridge.quant.observers import make_observer
    >>> a, b = make_observer("minmax"), make_observer("minmax")
    >>> a.update(np.array([0.0, 1.0])); b.update(np.array([-2.0, 0.5]))
    >>> a.merge(b).clip_range()
    (-2.0, 1.0)
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from amct_bridge.errors import QuantError
from amct_bridge.quant.factors import activation_factors, bits_of
from amct_bridge.quant.stats import BatchStats, batch_stats

_COMMON_OPTIONS = ("num_bits", "activation_offset", "name", "bins")


class Observer:
    """Base class: bookkeeping common to all algorithms; subclasses add the hooks.

    Args:
        num_bits: 8 (INT8), 16 (act_type INT16) or 4 (dst_type INT4); the default for
            ``clip_range``/``factors``.
        activation_offset: True = asymmetric (AMCT default), False = symmetric.
        name: tensor name used in error messages.
        bins: per-batch histogram bins to request (default: the algorithm's ``default_bins``).

    Example:
        >>> from amct_bridge.quant.observers import MinMaxObserver
        >>> MinMaxObserver(name="conv1").bins
        0
    """

    algorithm: ClassVar[str] = ""
    option_names: ClassVar[tuple[str, ...]] = ()
    default_bins: ClassVar[int] = 0

    def __init__(
        self,
        *,
        num_bits: int | str = 8,
        activation_offset: bool = True,
        name: str = "tensor",
        bins: int | None = None,
    ) -> None:
        self.num_bits = bits_of(num_bits)
        self.activation_offset = bool(activation_offset)
        self.name = str(name)
        self.bins = self.default_bins if bins is None else int(bins)
        if self.bins < 0 or (self.default_bins and self.bins < 16):
            raise QuantError(f"{self.name}: {self.algorithm} needs bins >= 16, got {self.bins}")
        self.count = 0
        self.batches = 0
        self.min = math.inf
        self.max = -math.inf
        self.channel_absmax: np.ndarray | None = None

    @classmethod
    def with_options(cls, options: dict[str, Any]) -> Observer:
        """Construct from an options dict, rejecting unknown names with the accepted list.

        Example:
            >>> from amct_bridge.quant.observers import EmaObserver
            >>> EmaObserver.with_options({"momentum": 0.9}).momentum
            0.9
        """
        unknown = sorted(set(options) - set(_COMMON_OPTIONS) - set(cls.option_names))
        if unknown:
            allowed = ", ".join(_COMMON_OPTIONS + cls.option_names)
            raise QuantError(f"{cls.algorithm}: unknown option(s) {unknown}; accepted: {allowed}")
        return cls(**options)

    def options(self) -> dict[str, Any]:
        """The options this observer was built with (AMCT names)."""
        opts = {
            "num_bits": self.num_bits,
            "activation_offset": self.activation_offset,
            "name": self.name,
            "bins": self.bins,
        }
        opts.update({n: getattr(self, n) for n in self.option_names})
        return opts

    # -- feeding -------------------------------------------------------------------------------
    def update(self, x: ArrayLike, channel_axis: int | None = None) -> None:
        """Absorb one batch of raw values (computes :func:`batch_stats` first).

        Example:
            >>> from amct_bridge.quant.observers import make_observer
            >>> obs = make_observer("minmax"); obs.update(np.ones((2, 3)), channel_axis=1)
            >>> obs.count, obs.channel_absmax.tolist()
            (6, [1.0, 1.0, 1.0])
        """
        self.update_stats(batch_stats(x, self.bins, channel_axis, name=self.name))

    def update_stats(self, s: BatchStats, *, hist_later: bool = False) -> None:
        """Absorb one batch summary (validated; errors name the tensor).

        ``hist_later=True``: ``s`` carries no histogram because the batch was binned together
        with others on a shared grid, handed over later by :meth:`add_histogram` (what the
        in-graph accumulation of the Keras callback does).

        Example:
            >>> from amct_bridge.quant.observers import make_observer
            >>> obs = make_observer("minmax")
            >>> obs.update_stats(BatchStats(4, -1.0, 2.0)); obs.clip_range()
            (-1.0, 2.0)
        """
        self._check_stats(s, hist_later)
        if not hist_later:
            self._absorb(s)
        self.count += int(s.count)
        self.batches += 1
        self.min = min(self.min, float(s.min))
        self.max = max(self.max, float(s.max))
        self._merge_absmax(s.channel_absmax)

    def add_histogram(self, lo: float, hi: float, counts: np.ndarray) -> None:
        """Add counts binned on ``len(counts)`` equal bins over ``[lo, hi]`` (batches whose
        summaries came through ``update_stats(..., hist_later=True)``).

        Example:
            >>> from amct_bridge.quant.observers import make_observer
            >>> obs = make_observer("hfmg", num_of_bins=1024)
            >>> obs.update_stats(BatchStats(2, 0.0, 1.0), hist_later=True)
            >>> obs.add_histogram(0.0, 1.0, np.r_[1, np.zeros(4094), 1])
            >>> obs.clip_range()[0]
            0.0
        """
        if not self.bins:
            raise QuantError(f"{self.name}: {self.algorithm} keeps no histogram")
        counts = np.asarray(counts)
        if counts.sum() > 0:
            self._absorb_grid(float(lo), float(hi), counts)

    def _absorb_grid(self, lo: float, hi: float, counts: np.ndarray) -> None:
        raise NotImplementedError

    def _check_stats(self, s: BatchStats, hist_later: bool = False) -> None:
        where = f"{self.name} (batch {self.batches + 1})"
        if int(s.count) <= 0:
            raise QuantError(f"{where}: batch has no elements")
        if not (math.isfinite(s.min) and math.isfinite(s.max)):
            raise QuantError(f"{where}: batch min/max is {s.min}/{s.max}; data must be finite")
        if s.min > s.max:
            raise QuantError(f"{where}: batch min {s.min} > max {s.max}")
        if hist_later:
            return
        if self.bins and s.hist is None and s.max > s.min:
            raise QuantError(f"{where}: {self.algorithm} needs a histogram of {self.bins} bins")
        if self.bins and s.max > s.min:
            hist = np.asarray(s.hist)
            if hist.shape != (self.bins,):
                raise QuantError(f"{where}: histogram shape {hist.shape}, expected ({self.bins},)")
            if int(hist.sum()) != int(s.count):
                raise QuantError(f"{where}: histogram counts sum to {hist.sum()}, not {s.count}")

    def _merge_absmax(self, absmax: np.ndarray | None) -> None:
        if absmax is None:
            return
        absmax = np.asarray(absmax, dtype=np.float32)
        if self.channel_absmax is None:
            self.channel_absmax = absmax.copy()
        elif self.channel_absmax.shape != absmax.shape:
            raise QuantError(
                f"{self.name}: per-channel absmax has {absmax.shape[0]} channels, "
                f"earlier batches had {self.channel_absmax.shape[0]}"
            )
        else:
            self.channel_absmax = np.maximum(self.channel_absmax, absmax)

    def merge(self, other: Observer) -> Observer:
        """Fold ``other``'s observations into this one (in place; returns self).

        Example:
            >>> from amct_bridge.quant.observers import make_observer
            >>> a = make_observer("minmax"); a.merge(make_observer("minmax")).batches
            0
        """
        if type(other) is not type(self):
            raise QuantError(f"{self.name}: cannot merge {other.algorithm} into {self.algorithm}")
        mine = {k: v for k, v in self.options().items() if k != "name"}
        theirs = {k: v for k, v in other.options().items() if k != "name"}
        if mine != theirs:
            raise QuantError(f"{self.name}: cannot merge observers with options {theirs} != {mine}")
        if other.batches == 0:
            return self
        if self.batches == 0:
            self._load_state(other._state())
        else:
            self._merge_state(other)
        self.count += other.count
        self.batches += other.batches
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self._merge_absmax(other.channel_absmax)
        return self

    # -- persistence ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state (plain Python types) to resume or merge a calibration later."""
        seen = self.batches > 0
        absmax = None if self.channel_absmax is None else self.channel_absmax.tolist()
        return {
            "algorithm": self.algorithm,
            "options": self.options(),
            "count": self.count,
            "batches": self.batches,
            "min": self.min if seen else None,
            "max": self.max if seen else None,
            "channel_absmax": absmax,
            **(self._state() if seen else {}),
        }

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> Observer:
        """Rebuild an observer from :meth:`state_dict` output.

        Example:
            >>> from amct_bridge.quant.observers import MinMaxObserver
            >>> obs = MinMaxObserver(); obs.update(np.array([2.0, 5.0]))
            >>> MinMaxObserver.from_state(obs.state_dict()).clip_range()
            (2.0, 5.0)
        """
        if d.get("algorithm") != cls.algorithm:
            raise QuantError(f"state is for {d.get('algorithm')!r}, not {cls.algorithm!r}")
        obs = cls.with_options(dict(d["options"]))
        obs.count, obs.batches = int(d["count"]), int(d["batches"])
        if obs.batches:
            obs.min, obs.max = float(d["min"]), float(d["max"])
            obs._load_state(d)
        if d.get("channel_absmax") is not None:
            obs.channel_absmax = np.asarray(d["channel_absmax"], dtype=np.float32)
        return obs

    # -- results -------------------------------------------------------------------------------
    def observed_range(self) -> tuple[float, float]:
        """Exact min/max of everything seen."""
        self._require_data()
        return self.min, self.max

    def clip_range(self, bits: int | str | None = None, symmetric: bool | None = None) -> tuple:
        """The clip range ``(lo, hi)`` the algorithm chose (defaults: the observer's options).

        ``factors(b, s) == activation_factors(*clip_range(b, s), b, s)`` always holds.
        """
        self._require_data()
        b = self.num_bits if bits is None else bits_of(bits)
        sym = (not self.activation_offset) if symmetric is None else bool(symmetric)
        lo, hi = self._clip_range(b, sym)
        return float(lo), float(hi)

    def factors(self, bits: int | str | None = None, symmetric: bool | None = None) -> tuple:
        """AMCT ``(scale_d, offset_d)`` for the clip range.

        Example:
            >>> from amct_bridge.quant.observers import make_observer
            >>> obs = make_observer("minmax"); obs.update(np.array([0.0, 1.0]))
            >>> obs.factors()
            (0.003921568859368563, -128)
        """
        b = self.num_bits if bits is None else bits_of(bits)
        sym = (not self.activation_offset) if symmetric is None else bool(symmetric)
        lo, hi = self.clip_range(b, sym)
        return activation_factors(lo, hi, b, sym, name=self.name)

    def _require_data(self) -> None:
        if self.batches == 0:
            raise QuantError(f"{self.name}: {self.algorithm} observer has seen no data")

    # -- hooks for subclasses ------------------------------------------------------------------
    def _absorb(self, s: BatchStats) -> None:
        """Update algorithm state with a validated batch (counters not yet incremented)."""

    def _merge_state(self, other: Observer) -> None:
        """Merge algorithm state of a non-empty ``other`` into a non-empty self."""

    def _state(self) -> dict[str, Any]:
        return {}

    def _load_state(self, d: dict[str, Any]) -> None:
        """Load algorithm state from a ``_state``/``state_dict`` mapping."""

    def _clip_range(self, bits: int, symmetric: bool) -> tuple[float, float]:
        raise NotImplementedError
