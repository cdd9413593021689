"""Data-parallel MindSpore runs (``msrun``): the collective the core's merge needs, and the
dataset check.

Under ``mindspore.communication.init()`` with ``ParallelMode.DATA_PARALLEL`` (more than one
rank), :func:`current` gives a :class:`Group`; its :meth:`Group.gather` is ``ops.AllGather``
(on CPU ``AllReduce`` only sums, so min/max are gathered). Everything else, what is gathered and
how it is merged, is framework-free: :mod:`amct_bridge.calibration.merge`.

``amct_bridge.mindspore.qat.save_qat_record`` merges the QAT ranges itself (with
:func:`~amct_bridge.calibration.merge.merge_tracked`). For any other statistic in a data-parallel
run, :func:`merged_ranges`,
:func:`merged_means` and :func:`merged_observers` return their argument unchanged outside one,
and the merge over every rank inside one; or with the group itself::

    group = current()
    if group is not None:
        agree(group.gather, error_or_None, "the merge")  # before it: a failed rank fails all
        observers = merge_observers(observers, group.gather)  # amct_bridge.calibration.merge
        ranges = merge_ranges(np.stack([lo, hi]), group.gather)  # [2, n] min / max

Example:
    >>> current() is None  # a plain process: no group
    True
"""

from __future__ import annotations

import logging

import numpy as np

from amct_bridge.calibration.merge import (
    agree,
    check_shards,
    merge_means,
    merge_observers,
    merge_ranges,
)
from amct_bridge.errors import CalibrationError

__all__ = [
    "Group",
    "check_dataset",
    "current",
    "merged_means",
    "merged_observers",
    "merged_ranges",
]

log = logging.getLogger(__name__)


class Group:
    """The ranks of a data-parallel run: ``rank``, ``world`` and a gather over all of them.

    Args:
        rank: this process's rank (``get_rank()``).
        world: the number of ranks (``get_group_size()``).

    Example:
        >>> # group = current(); group.gather(np.array([1.0])).shape == (group.world, 1)
    """

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = int(rank), int(world)
        self._op = None

    def gather(self, array: np.ndarray) -> np.ndarray:
        """Every rank's ``array`` (same shape and dtype on every rank), stacked in rank order.

        Sent as float64, which holds every int32 and every count below 2**53 exactly.
        """
        import mindspore as ms
        from mindspore import ops

        array = np.asarray(array)
        if self._op is None:
            self._op = ops.AllGather()
        sent = ms.Tensor(np.ascontiguousarray(array, np.float64).reshape((1, *array.shape)))
        got = self._op(sent).asnumpy()
        return got.reshape((self.world, *array.shape)).astype(array.dtype, copy=False)


def current() -> Group | None:
    """The data-parallel group of this process, None outside one (no ``init()``, one rank, or
    another parallel mode: then each rank calibrates its own batches, and a warning says so).

    Example:
        >>> current() is None
        True
    """
    from mindspore.communication._comm_helper import GlobalComm

    if not GlobalComm.INITED:
        return None
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank

    world = get_group_size()
    if world <= 1:
        return None
    mode = ms.get_auto_parallel_context("parallel_mode")
    if mode != "data_parallel":
        log.warning(
            "mindspore.communication is initialised with %d ranks, but the parallel mode is %r: "
            "QuantCalibration merges statistics across ranks only with "
            "ParallelMode.DATA_PARALLEL; each rank calibrates its own batches (give each rank "
            "its own record_path)",
            world,
            mode,
        )
        return None
    return Group(get_rank(), world)


def merged_ranges(ranges: np.ndarray, group: Group | None = None) -> np.ndarray:
    """``[2, ...]`` min / max ranges merged over the ranks of ``group`` (default
    :func:`current`); unchanged outside a data-parallel run. Every rank must call it.

    Example:
        >>> merged_ranges(np.array([[0.0], [1.0]])).tolist()
        [[0.0], [1.0]]
    """
    group = current() if group is None else group
    return np.asarray(ranges) if group is None else merge_ranges(ranges, group.gather)


def merged_means(values: np.ndarray, weight: float = 1.0, group: Group | None = None):
    """``values`` averaged over the ranks (weighted by ``weight``, e.g. steps seen), for EMA
    ranges; unchanged outside a data-parallel run. Every rank must call it.

    Example:
        >>> merged_means(np.array([0.5, 2.0])).tolist()
        [0.5, 2.0]
    """
    group = current() if group is None else group
    return np.asarray(values) if group is None else merge_means(values, group.gather, weight)


def merged_observers(observers, group: Group | None = None) -> list:
    """:func:`~amct_bridge.calibration.merge.merge_observers` over the ranks; the observers
    themselves outside a data-parallel run. Every rank must call it.

    Example:
        >>> from amct_bridge.quant.observers import make_observer
        >>> obs = make_observer("minmax"); obs.update(np.array([1.0, 2.0]))
        >>> merged_observers([obs])[0] is obs
        True
    """
    group = current() if group is None else group
    return list(observers) if group is None else merge_observers(observers, group.gather)


def check_dataset(dataset, group: Group) -> None:
    """Refuse sharded data whose sample count the rank count does not divide; warn when no
    source of ``dataset`` is sharded (every rank then calibrates on all the data). The ranks
    agree on the outcome (:func:`~amct_bridge.calibration.merge.agree`): a refusal on one rank
    fails every rank, before any step.

    MindSpore's ``DistributedSampler`` pads the last shard with samples from the start (measured:
    9 samples on 2 ranks give ``[0, 2, 4, 6, 8]`` and ``[1, 3, 5, 7, 0]``), which the merge
    would count twice.

    Example:
        >>> # check_dataset(ds.NumpySlicesDataset(x, num_shards=2, shard_id=r), current())
    """
    error = None
    try:
        _check_dataset(dataset, group)
    except CalibrationError as err:
        error = err
    agree(group.gather, error, "the dataset check")


def _check_dataset(dataset, group: Group) -> None:
    if dataset is None:
        return
    sharded = False
    stack, seen = [dataset], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(getattr(node, "children", None) or [])
        shards = getattr(node, "num_shards", None)
        if not shards or int(shards) == 1:  # MindSpore's sources say 1 when not sharded
            continue
        sharded = True
        name = type(node).__name__
        if int(shards) != group.world:
            raise CalibrationError(
                f"dataset {name} is split into num_shards={shards}, but the run has "
                f"{group.world} ranks: give num_shards=get_group_size(), shard_id=get_rank()"
            )
        total = getattr(node, "source_len", None)
        if isinstance(total, int) and total >= 0:
            check_shards(total, group.world, where=f"dataset {name}")
        else:
            log.info("dataset %s: its sample count is unknown; not checked against the ranks", name)
    if not sharded:
        log.warning(
            "rank %d of %d: the dataset is not sharded (num_shards/shard_id), so every rank "
            "calibrates on the same batches: each batch counts %d times (min/max are unchanged)",
            group.rank,
            group.world,
            group.world,
        )
