"""What several benchmarks share (not a benchmark itself: ``make bench`` runs ``bench_*.py``).

``best_of`` is the timing rule of every ratio the benchmarks print: the best of a few wall
times, so a busy shared machine inflates the baseline and the measured run alike.

Example:
    >>> best_of(lambda: None, repeats=2) >= 0
    True
"""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(fn: Callable[[], object], repeats: int = 3) -> float:
    """The best wall time (seconds) of ``repeats`` calls of ``fn``.

    Example:
        >>> calls = []
        >>> _ = best_of(lambda: calls.append(1), repeats=3); len(calls)
        3
    """
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)
