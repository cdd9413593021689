"""What several benchmarks share (not a benchmark itself: ``make bench`` runs ``bench_*.py``).

``best_of`` is the timing rule of every ratio the benchmarks print: the best of a few wall
times, so a busy shared machine inflates the baseline and the measured run alike.

Example:
    >>> best_of(lambda: None, repeats=2) >= 0
    True
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path


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


def msrun_env(root: str | os.PathLike) -> dict[str, str]:
    """The environment for ``msrun`` workers: this venv's ``bin/`` first on ``PATH`` (msrun
    starts ``python`` from there) and ``root`` on ``PYTHONPATH``.

    Example:
        >>> msrun_env("/repo")["PYTHONPATH"].split(os.pathsep)[0]
        '/repo'
    """
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def msrun_command(log_dir: str | os.PathLike, args: list[str], workers: int = 2) -> list[str]:
    """``msrun`` with ``workers`` local CPU workers on a free port, running ``args``.

    Example:
        >>> msrun_command("/tmp/log", ["w.py"])[:3]
        ['msrun', '--worker_num=2', '--local_worker_num=2']
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [
        "msrun",
        f"--worker_num={workers}",
        f"--local_worker_num={workers}",
        f"--master_port={port}",
        f"--log_dir={log_dir}",
        "--join=True",
        *args,
    ]
