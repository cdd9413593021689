"""A native TensorFlow op for the calibration summaries, built on first use.

Calibrating with a histogram algorithm (ifmr, hfmg) summarises every observed activation of
every step: min, max, element count and a histogram on the host's grid (or, when the batch is
not inside it, over the batch's own range). With stock TF ops that is two reductions, a dozen
small ops and ``tf.histogram_fixed_width``, whose CPU kernel is mostly a single-threaded count
loop. The ``AmctSummary`` op in ``summary_op.cc`` does it in one op with the same results bit
for bit (see that file for the exact definition): one op per tensor instead of a dozen, and
faster per value where many values share a bin (ReLU outputs: 1.76 against 1.97 ns), slower
where they spread (normal data: 1.82 against 1.21 ns; ``bench_keras_callback.py --op-speed``).

It is compiled once per TensorFlow version with the machine's C++ compiler (``$CXX``, else
``c++``/``g++``/``clang++``) and TensorFlow's own flags (``tf.sysconfig``), into
``$AMCT_BRIDGE_CACHE`` (default ``~/.cache/amct_bridge``); that takes about 6 s, and later
processes load the cached library. Where it cannot be built or loaded (no compiler, a read-only
cache, TensorFlow without headers) :func:`load` logs one warning saying why and returns
``None``, and calibration uses the stock TF ops: same records, slower.
``AMCT_BRIDGE_NATIVE_OPS=0`` turns the native op off.

Example:
    >>> import tensorflow as tf
    >>> from amct_bridge.keras import native
    >>> lo, hi, count, inside, hist = native.summary(
    ...     tf.constant([0.0, 0.4, 1.0]), tf.constant([0.0, 1.0]), 2)
    >>> float(lo), float(hi), int(count), bool(inside), hist.numpy().tolist()
    (0.0, 1.0, 3, True, [2, 1])
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import tensorflow as tf

__all__ = ["library_path", "load", "min_max", "reset", "summary"]

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("summary_op.cc")
_OFF = {"0", "false", "no", "off"}
_LOCK = threading.Lock()  # replica threads may trace, and so load, at the same time


def _flags() -> list[str]:
    return ["-shared", "-fPIC", "-O3", "-w", *tf.sysconfig.get_compile_flags()]


def library_path() -> Path:
    """Where the compiled op lives: one file per TF version, source and compiler flags.

    Example:
        >>> library_path().name.startswith("summary_op-tf")
        True
    """
    root = os.environ.get("AMCT_BRIDGE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "amct_bridge"
    )
    key = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_flags()).encode()).hexdigest()[:12]
    return Path(root) / f"summary_op-tf{tf.__version__}-{key}.so"


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        found = shutil.which(name) if name else None
        if found:
            return found
    raise OSError("no C++ compiler found ($CXX, c++, g++ or clang++)")


def _build(target: Path) -> None:
    """Compile the op to ``target`` (atomically: a temp file renamed into place)."""
    cxx = _compiler()
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    cmd = [cxx, *_flags(), str(_SOURCE), "-o", tmp, *tf.sysconfig.get_link_flags()]
    try:
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise OSError(f"{cxx} exited with {done.returncode}:\n{tail}")
        os.replace(tmp, target)
        log.info("built %s in %.1f s", target, time.perf_counter() - start)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load():
    """The loaded op module, built first if needed; ``None`` where that is not possible (the
    reason is logged once as a warning) or ``AMCT_BRIDGE_NATIVE_OPS=0``.

    Example:
        >>> load() is None or hasattr(load(), "amct_summary")
        True
    """
    with _LOCK:
        return _load()


def reset() -> None:
    """Forget what :func:`load` found, so that its next call looks again (after changing
    ``AMCT_BRIDGE_NATIVE_OPS``, ``CXX`` or ``AMCT_BRIDGE_CACHE`` in a running process).

    Example:
        >>> reset(); load() is None or hasattr(load(), "amct_min_max")
        True
    """
    with _LOCK:
        _load.cache_clear()


@functools.cache
def _load():
    if os.environ.get("AMCT_BRIDGE_NATIVE_OPS", "1").strip().lower() in _OFF:
        return None
    try:
        target = library_path()
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            # one build at a time across processes (multi-worker runs start together)
            with open(target.with_suffix(".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not target.exists():
                    _build(target)
        return tf.load_op_library(str(target))
    except (OSError, subprocess.SubprocessError, tf.errors.OpError) as exc:
        log.warning(
            "native summary op unavailable (%s); calibration uses stock TF ops instead "
            "(same records, slower)",
            exc,
        )
        return None


def _op_for(values: tf.Tensor):
    """The op module if it is loaded and takes ``values`` (float32 only)."""
    return load() if values.dtype == tf.float32 else None


def summary(values: tf.Tensor, grid: tf.Tensor, nbins: int) -> tuple[tf.Tensor, ...] | None:
    """``(min, max, count, inside, histogram)`` of float32 ``values`` by the native op, or
    ``None`` when it is not available (the caller then uses stock TF ops).

    ``grid`` is ``[lo, hi]`` (``[inf, -inf]``: none); ``inside`` says whether the values lie in
    it, and the histogram (``nbins`` int32 counts) is over the grid if so, else over
    ``[min, max]`` (``[min, min + 1]`` when they are equal), all zeros if min or max is NaN/Inf.

    Example:
        >>> out = summary(tf.constant([5.0, -1.0]), tf.constant([0.0, 4.0]), 4)
        >>> bool(out[3]), out[4].numpy().tolist()
        (False, [1, 0, 0, 1])
    """
    op = _op_for(values)
    return None if op is None else tuple(op.amct_summary(values, grid, nbins=int(nbins)))


def min_max(values: tf.Tensor) -> tuple[tf.Tensor, ...] | None:
    """``(min, max, count)`` of float32 ``values`` in one pass by the native op (both NaN if a
    value is NaN, as ``tf.reduce_min``/``reduce_max`` give), or ``None`` when the op is not
    available.

    Example:
        >>> [float(v) for v in min_max(tf.constant([[3.0, -2.0], [0.5, 7.0]]))]
        [-2.0, 7.0, 4.0]
    """
    op = _op_for(values)
    return None if op is None else tuple(op.amct_min_max(values))
