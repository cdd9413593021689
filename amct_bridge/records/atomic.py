"""Atomic file writes: a temp file in the same directory, fsync, then rename.

A crash or an error mid-write leaves the old file (or nothing), never half a file.

Example:
    >>> import tempfile, pathlib
    >>> d = tempfile.mkdtemp()
    >>> atomic_write_bytes(pathlib.Path(d) / "a.txt", b"hi")
    >>> (pathlib.Path(d) / "a.txt").read_bytes()
    b'hi'
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from amct_bridge.errors import AmctBridgeError


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    except OSError as err:
        raise AmctBridgeError(f"{path}: cannot write here: {err.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(path: str | os.PathLike) -> None:
    """Fail now (not after an hour of training) if ``path`` cannot be written atomically.

    Example:
        >>> check_writable("/nonexistent-dir/record.txt")
        Traceback (most recent call last):
        ...
        amct_bridge.errors.AmctBridgeError: /nonexistent-dir/record.txt: directory does not exist
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise AmctBridgeError(f"{path}: directory does not exist")
    if path.is_dir():
        raise AmctBridgeError(f"{path}: is a directory, expected a file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise AmctBridgeError(f"{path}: file is not writable")
    # Probe with a real temp file: os.access says yes to root even on a read-only mount.
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
    except OSError as err:
        raise AmctBridgeError(f"{path}: directory is not writable ({err.strerror})") from None
    os.close(fd)
    os.unlink(probe)
