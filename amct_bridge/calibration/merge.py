"""Merging calibration statistics across the ranks of a data-parallel run (framework-free).

An adapter gives one collective, ``gather(array) -> stacked``: every rank passes an array of the
same shape and dtype and receives ``[world, *shape]``, row ``r`` being rank ``r``'s array
(MindSpore: ``ops.AllGather``; on CPU ``AllReduce`` only sums, so min/max cannot be reduced
directly). On top of it this module does the rest, identically on every rank, so every rank
ends with the same numbers:

* :func:`agree` -- every rank says ok or gives its error message; if any rank failed, every
  rank raises a :class:`~amct_bridge.errors.CalibrationError` naming the failed rank(s) and their
  messages (a rank that fails alone would leave the others waiting in the next collective);
* :func:`merge_observers` -- observers of the same points on every rank become the observers of
  the union of the ranks' batches: count and batch counts summed, min / max exact (gathered),
  per-channel absmax by maximum, histograms summed on a common grid (the union ``[min, max]``,
  the observer's ``bins`` bins, each rank's histogram re-binned onto it first), EMA states
  averaged weighted by batches (as :meth:`EmaObserver.merge`). An IFMR / HFMG / percentile search
  then runs on the merged histogram: the record equals a single-process calibration over the
  union exactly for minmax, and within the histogram tolerance of docs/quantization.md for the
  histogram algorithms (the re-binning onto one grid is what a single process does when its grid
  moves);
* :func:`merge_ranges` -- plain ``[min, max]`` arrays (per-channel ranges, per-site ranges, QAT
  observers' ranges) by elementwise min / max over the ranks;
* :func:`merge_tracked` -- QAT range states ``(lo, hi, seen)``: EMA ranges averaged weighted by
  the steps each rank saw, learned ranges (Parameters the gradient all-reduce moves alike)
  checked equal; :func:`differing` -- which values (e.g. weight checksums) are not the same on
  every rank;
* :func:`check_shards` -- a rank count that does not divide the data is refused (the samplers pad
  the last shard with repeated samples, which would count twice).

Nothing here changes the inputs: merged observers are new objects, so a run can merge for a
record mid-run (``save_every_epoch``) and go on gathering its own batches.

Example (two ranks simulated by threads of one process, :func:`in_threads`):
    >>> import numpy as np
    >>> from amct_bridge.quant.observers import make_observer
    >>> a, b = make_observer("minmax"), make_observer("minmax")
    >>> a.update(np.array([0.0, 1.0])); b.update(np.array([-2.0, 0.5]))
    >>> merged = in_threads(2, lambda rank, gather: merge_observers([(a, b)[rank]], gather))
    >>> [m[0].clip_range() for m in merged], merged[0][0].count, a.clip_range()
    ([(-2.0, 1.0), (-2.0, 1.0)], 4, (0.0, 1.0))
"""

from __future__ import annotations

import math
import threading
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from amct_bridge.errors import CalibrationError
from amct_bridge.quant.histogram import GridHistogram
from amct_bridge.quant.observers import EmaObserver, Observer, observer_from_state

__all__ = [
    "Gather",
    "agree",
    "check_shards",
    "differing",
    "in_threads",
    "merge_means",
    "merge_observed",
    "merge_observers",
    "merge_ranges",
    "merge_tracked",
]

#: ``gather(array) -> [world, *array.shape]``: every rank's array, in rank order.
Gather = Callable[[np.ndarray], np.ndarray]

_MESSAGE_BYTES = 480  # of each rank's error message carried by agree()
_SUMMARY = 6  # per observer: count, batches, min, max, ema_min, ema_max
_NOTHING_WRITTEN = "; no record written"


def agree(gather: Gather, error: BaseException | None, what: str, layout: str = "") -> None:
    """Every rank reports ok (``error`` None) or its error; raise on every rank if any failed.

    ``layout``: a description of what the ranks are about to exchange (e.g. their points); ranks
    whose layouts differ cannot be merged, and each rank then raises saying so. ``what`` names the
    step for the message ("the calibration merge").

    The rank that failed re-raises its own exception (chained); the others raise a
    :class:`CalibrationError` naming the failed rank(s) and their messages.

    Example:
        >>> errors = [None, OSError("disk full")]
        >>> out = in_threads(2, lambda rank, gather: agree(gather, errors[rank], "the merge"))
        >>> len({str(e) for e in out}), str(out[0])  # both ranks raise the same, naming rank 1
        (1, 'rank 1 of 2 failed in the merge: disk full; no record written')
    """
    text = "" if error is None else (str(error) or type(error).__name__)
    raw = text.encode("utf-8")[:_MESSAGE_BYTES]
    row = np.zeros(3 + _MESSAGE_BYTES, np.int32)
    row[0] = 0 if error is None else 1
    row[1] = zlib.crc32(layout.encode("utf-8")) & 0x7FFFFFFF
    row[2] = len(raw)
    row[3 : 3 + len(raw)] = np.frombuffer(raw, np.uint8)
    rows = np.asarray(gather(row))
    failed = [r for r in range(rows.shape[0]) if rows[r, 0]]
    world = rows.shape[0]
    if failed:
        texts = {
            # a rank's own error already ends "no record written": said once, at the end
            r: _without_tail(
                bytes(rows[r, 3 : 3 + rows[r, 2]].astype(np.uint8)).decode("utf-8", "replace")
            )
            for r in failed
        }
        if len(failed) == world and len(set(texts.values())) == 1:
            who, said = f"all {world} ranks", texts[failed[0]]
        elif len(failed) == 1:
            who, said = f"rank {failed[0]} of {world}", texts[failed[0]]
        else:
            who = f"ranks {', '.join(map(str, failed))} of {world}"
            said = "; ".join(f"rank {r}: {t}" for r, t in texts.items())
        tail = "" if "no record written" in said else _NOTHING_WRITTEN  # "(empty dataset?)"
        message = f"{who} failed in {what}: {said}{tail}"
        if error is not None:
            raise CalibrationError(message) from error
        raise CalibrationError(message)
    if len(set(rows[:, 1].tolist())) > 1:
        raise CalibrationError(
            f"{what}: the {world} ranks observe different tensors (another network or other "
            "settings on some rank); every rank must run the same network with the same "
            "QuantCalibration settings; no record written"
        )


def _without_tail(text: str) -> str:
    """``text`` without a trailing "; no record written" (the merged message adds it once)."""
    return text[: -len(_NOTHING_WRITTEN)] if text.endswith(_NOTHING_WRITTEN) else text


def check_shards(total: int, world: int, where: str = "the dataset") -> None:
    """Refuse a rank count that does not divide the data (its last shard would repeat samples).

    Example:
        >>> check_shards(8, 2)
        >>> try:
        ...     check_shards(9, 2)
        ... except CalibrationError as err:
        ...     print(str(err)[:65])
        the dataset has 9 samples, which 2 ranks cannot share evenly (9 =
    """
    if world > 1 and total % world:
        rest = total % world
        raise CalibrationError(
            f"{where} has {total} samples, which {world} ranks cannot share evenly "
            f"({total} = {world} x {total // world} + {rest}): sharding would repeat "
            f"{world - rest} sample(s) on the last rank(s) and calibration would count them "
            f"twice; use a sample count divisible by {world} (drop {rest} or add "
            f"{world - rest} sample(s)), or another rank count"
        )


def merge_ranges(ranges: np.ndarray, gather: Gather) -> np.ndarray:
    """``[2, ...]`` (row 0 minima, row 1 maxima) merged over every rank: min of the minima, max of
    the maxima. ``inf`` / ``-inf`` mark "nothing seen" and drop out.

    For QAT observers: pass ``np.stack([lo, hi])`` of their ranges.

    Example:
        >>> held = [np.array([[0.0, -1.0], [1.0, 2.0]]), np.array([[-3.0, 0.0], [0.5, 5.0]])]
        >>> in_threads(2, lambda rank, gather: merge_ranges(held[rank], gather).tolist())[0]
        [[-3.0, -1.0], [1.0, 5.0]]
    """
    ranges = np.asarray(ranges, np.float64)
    rows = np.asarray(gather(ranges))
    return np.stack([rows[:, 0].min(axis=0), rows[:, 1].max(axis=0)])


def merge_means(values: np.ndarray, gather: Gather, weights: float = 1.0) -> np.ndarray:
    """The mean of ``values`` over every rank, each rank's weighted by ``weights`` (e.g. its
    batch count): for EMA ranges kept in the graph (QAT), merged as Keras merges replicas'
    ``aggregation="mean"`` variables. A rank with weight 0 drops out.

    Example:
        >>> held = [(np.array([1.0, 2.0]), 1.0), (np.array([3.0, 6.0]), 3.0)]
        >>> in_threads(2, lambda rank, gather: merge_means(*held[rank][:1], gather,
        ...                                                 held[rank][1]).tolist())[0]
        [2.5, 5.0]
    """
    values = np.asarray(values, np.float64)
    rows = np.asarray(gather(np.concatenate([[float(weights)], values.reshape(-1)])))
    w = rows[:, 0]
    if w.sum() <= 0:
        raise CalibrationError("merge_means: every rank's weight is 0 (nothing observed)")
    return ((rows[:, 1:] * w[:, None]).sum(axis=0) / w.sum()).reshape(values.shape)


def merge_tracked(
    tracked: np.ndarray, learned: Sequence[bool], gather: Gather
) -> tuple[np.ndarray, list[int]]:
    """QAT range states ``[n, 3]`` (``lo, hi, seen``) merged over every rank, and the indices of
    the learned ones that differ between ranks.

    EMA rows (``learned`` False): ``lo`` and ``hi`` averaged over the ranks weighted by their
    ``seen`` (a rank that saw nothing drops out), ``seen`` summed. The EMA is linear, so with
    equal step counts the mean of the ranks' EMAs is the EMA of the ranks' mean batch min / max.
    Learned rows: rank 0's values where every rank holds the same, else the weighted mean too,
    the index listed (the caller says so). A row no rank saw keeps this rank's values, seen 0.
    One collective; the result is the same on every rank.

    Example:
        >>> held = [np.array([[0.0, 2.0, 1.0], [-1.0, 1.0, 1.0]]),
        ...         np.array([[-1.0, 4.0, 3.0], [-1.0, 1.0, 1.0]])]
        >>> out = in_threads(2, lambda r, gather: merge_tracked(held[r], [False, True], gather))
        >>> out[0][0].tolist(), out[0][1]
        ([[-0.75, 3.5, 4.0], [-1.0, 1.0, 2.0]], [])
    """
    tracked = np.asarray(tracked, np.float64).reshape(-1, 3)
    rows = np.asarray(gather(tracked))  # [world, n, 3]
    seen = np.maximum(rows[:, :, 2], 0.0)
    total = seen.sum(axis=0)
    some = total > 0
    w = seen / np.where(some, total, 1.0)
    out = np.stack([(rows[:, :, 0] * w).sum(axis=0), (rows[:, :, 1] * w).sum(axis=0), total], 1)
    out[~some, :2] = tracked[~some, :2]
    differ = []
    for i in np.flatnonzero(np.asarray(learned, bool)).tolist():
        if (rows[:, i, :2] == rows[0, i, :2]).all():
            out[i, :2] = rows[0, i, :2]
        elif some[i]:
            differ.append(i)
    return out, differ


def differing(values: np.ndarray, gather: Gather) -> list[int]:
    """Indices of ``values`` (a vector, e.g. checksums of weights) that are not equal on every
    rank. One collective.

    Example:
        >>> held = [np.array([7.0, 1.0]), np.array([7.0, 2.0])]
        >>> in_threads(2, lambda r, gather: differing(held[r], gather))
        [[1], [1]]
    """
    rows = np.asarray(gather(np.asarray(values, np.float64).reshape(-1)))
    return np.flatnonzero((rows != rows[0]).any(axis=0)).tolist()


def merge_observers(observers: Sequence[Observer], gather: Gather) -> list[Observer]:
    """The observers of the union of every rank's batches (new objects; see the module
    docstring). Every rank must pass observers of the same algorithms, options and order; the
    result is the same on every rank.

    Three collectives: the per-observer summaries, the per-channel absmax (when any observer
    has one), and the histograms on their common grids.

    Example:
        >>> import numpy as np
        >>> from amct_bridge.quant.observers import make_observer
        >>> a, b = make_observer("hfmg", num_of_bins=1024), make_observer("hfmg", num_of_bins=1024)
        >>> a.update(np.linspace(0, 1, 1000)); b.update(np.linspace(1, 3, 1000))
        >>> m = in_threads(2, lambda rank, gather: merge_observers([(a, b)[rank]], gather))[1][0]
        >>> m.count, m.observed_range(), round(m.hist.total)
        (2000, (0.0, 3.0), 2000)
    """
    observers = list(observers)
    if not observers:  # nothing planned (no batch reached any rank): nothing to gather
        return []
    summary = np.zeros((len(observers), _SUMMARY), np.float64)
    for i, obs in enumerate(observers):
        seen = obs.batches > 0
        ema = (obs.ema_min, obs.ema_max) if isinstance(obs, EmaObserver) else (0.0, 0.0)
        summary[i] = (
            obs.count,
            obs.batches,
            obs.min if seen else math.inf,
            obs.max if seen else -math.inf,
            *ema,
        )
    every = np.asarray(gather(summary))  # [world, n, 6]
    count = every[:, :, 0].sum(axis=0)
    batches = every[:, :, 1]
    lo, hi = every[:, :, 2].min(axis=0), every[:, :, 3].max(axis=0)

    absmax = _merge_absmax(observers, gather)
    hists = _merge_histograms(observers, lo, hi, gather)

    merged = []
    for i, obs in enumerate(observers):
        total = batches[:, i].sum()
        state = obs.state_dict()
        state.update(count=int(count[i]), batches=int(total))
        if total > 0:
            state.update(min=float(lo[i]), max=float(hi[i]))
            if isinstance(obs, EmaObserver):
                w = batches[:, i]
                state["ema_min"] = float((every[:, i, 4] * w).sum() / total)
                state["ema_max"] = float((every[:, i, 5] * w).sum() / total)
            if i in hists:
                state["hist"] = hists[i].state_dict()
        if i in absmax:
            state["channel_absmax"] = absmax[i].tolist()
        merged.append(observer_from_state(state))
    return merged


def _merge_absmax(observers: list[Observer], gather: Gather) -> dict[int, np.ndarray]:
    sizes = [0 if o.channel_absmax is None else o.channel_absmax.size for o in observers]
    # the sizes decide the layout: agree on them first (a rank that saw no batch has none)
    every = np.asarray(gather(np.asarray(sizes, np.int64)))
    width = every.max(axis=0)
    if not width.any():
        return {}
    flat = np.full(int(width.sum()), -np.inf, np.float64)
    at = 0
    for obs, size in zip(observers, width.tolist(), strict=True):
        if obs.channel_absmax is not None:
            flat[at : at + obs.channel_absmax.size] = obs.channel_absmax
        at += size
    merged = np.asarray(gather(flat)).max(axis=0)
    out, at = {}, 0
    for i, size in enumerate(width.tolist()):
        if size:
            out[i] = merged[at : at + size].astype(np.float32)
        at += size
    return out


def _merge_histograms(
    observers: list[Observer], lo: np.ndarray, hi: np.ndarray, gather: Gather
) -> dict[int, GridHistogram]:
    """Each histogram observer's counts re-binned onto ``bins`` bins over the union range, then
    summed over the ranks (one collective for all of them)."""
    which = [i for i, o in enumerate(observers) if o.bins and math.isfinite(lo[i])]
    if not which:
        return {}
    flat = np.zeros(sum(observers[i].bins for i in which), np.float64)
    at = 0
    for i in which:
        obs, bins = observers[i], observers[i].bins
        hist = getattr(obs, "hist", None)
        if hist is not None and obs.batches:
            flat[at : at + bins] = hist.rebin(float(lo[i]), float(hi[i]), bins)
        at += bins
    total = np.asarray(gather(flat)).sum(axis=0)
    out, at = {}, 0
    for i in which:
        bins = observers[i].bins
        counts = total[at : at + bins]
        at += bins
        if hi[i] > lo[i]:
            out[i] = GridHistogram(float(lo[i]), (float(hi[i]) - float(lo[i])) / bins, counts)
        else:  # every rank saw one constant value: a point mass
            out[i] = GridHistogram.from_batch(float(lo[i]), float(lo[i]), counts)
    return out


def in_threads(world: int, fn: Callable[[int, Gather], object], timeout: float = 60.0) -> list:
    """Run ``fn(rank, gather)`` for ``world`` ranks in threads of this process, ``gather`` being a
    real collective between them (a barrier): for tests and examples of the merge without a
    distributed launcher. Returns each rank's result, or its exception object if it raised.

    Example:
        >>> in_threads(2, lambda rank, gather: gather(np.array([rank])).tolist())
        [[[0], [1]], [[0], [1]]]
    """
    barrier = threading.Barrier(world, timeout=timeout)
    slots: list = [None] * world
    results: list = [None] * world

    def gather(array: np.ndarray) -> np.ndarray:
        rank = ranks[threading.get_ident()]
        slots[rank] = np.asarray(array).copy()
        barrier.wait()
        shapes = {s.shape for s in slots}
        out = np.stack(slots) if len(shapes) == 1 else None
        barrier.wait()  # everyone has read the slots before they are reused
        if out is None:  # what a real collective refuses
            raise CalibrationError(f"ranks passed different shapes: {sorted(shapes)}")
        return out

    def run(rank: int) -> None:
        ranks[threading.get_ident()] = rank
        try:
            results[rank] = fn(rank, gather)
        except BaseException as err:  # handed back, as a process would print it
            results[rank] = err

    ranks: dict[int, int] = {}
    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def merge_observed(observed: Sequence, batches: int, gather: Gather) -> tuple[list, int]:
    """A calibration session's observed points merged over every rank: new
    :class:`~amct_bridge.calibration.session.Observed` objects (observers merged by
    :func:`merge_observers`, DMQ per-channel ranges and per-call-site ranges by
    :func:`merge_ranges`) and the total batch count. The inputs are not changed.

    Example:
        >>> from amct_bridge.calibration.protocol import Point
        >>> from amct_bridge.calibration.session import Observed
        >>> from amct_bridge.quant.observers import make_observer
        >>> def rank(r, gather):
        ...     obs = make_observer("minmax"); obs.update(np.array([r, 2.0 * r + 1]))
        ...     mine = [Observed(Point("fc", "input", None), obs)]
        ...     merged, total = merge_observed(mine, 1, gather)
        ...     return merged[0].observer.clip_range(), total
        >>> in_threads(2, rank)
        [((0.0, 3.0), 2), ((0.0, 3.0), 2)]
    """
    from dataclasses import replace

    observed = list(observed)
    observers = merge_observers([o.observer for o in observed], gather)
    total = int(np.asarray(gather(np.array([batches], np.int64))).sum())
    # DMQ channel ranges and call-site ranges: one [2, n] array for all points
    parts, flat_lo, flat_hi = [], [], []
    for o in observed:
        chans = o.point.channels if o.point.channel_axis is not None else 0
        sites = len(o.sites) if o.sites is not None else 0
        parts.append((chans, sites))
        lo = np.full(chans + sites, math.inf)
        hi = np.full(chans + sites, -math.inf)
        if chans and o.channel_range is not None and o.channel_range.shape[-1] == chans:
            lo[:chans], hi[:chans] = o.channel_range[0], o.channel_range[1]
        for k in range(sites):
            lo[chans + k], hi[chans + k] = o.sites[k]
        flat_lo.append(lo)
        flat_hi.append(hi)
    ranges = None
    if any(c + s for c, s in parts):
        ranges = merge_ranges(np.stack([np.concatenate(flat_lo), np.concatenate(flat_hi)]), gather)
    out, at = [], 0
    for o, obs, (chans, sites) in zip(observed, observers, parts, strict=True):
        changes = {"observer": obs}
        if ranges is not None and chans + sites:
            piece = ranges[:, at : at + chans + sites]
            if chans and np.isfinite(piece[0, :chans]).all():
                changes["channel_range"] = piece[:, :chans].astype(np.float32)
            if sites:
                changes["sites"] = [[float(a), float(b)] for a, b in piece[:, chans:].T]
        at += chans + sites
        out.append(replace(o, **changes))
    return out, total
