"""Atomic file writes: a temp file in the same directory, fsync, then rename.

A crash or an error mid-write leaves the old file (or nothing), never half a file. The file gets
the mode an ordinary ``open(path, "w")`` would give it: an existing file keeps its mode, a new one
gets ``0o666`` less the process umask (``mkstemp`` alone would make every output 0600, unreadable
to another user or a container running under another uid). A temp is named ``.NAME.PID.*.tmp``:
a process killed mid-write (kill -9 runs no cleanup) leaves one, and the next write to the same
path removes it (:func:`sweep_stale_temps`).

Example:
    >>> import tempfile, pathlib
    >>> d = tempfile.mkdtemp()
    >>> atomic_write_bytes(pathlib.Path(d) / "a.txt", b"hi")
    >>> (pathlib.Path(d) / "a.txt").read_bytes()
    b'hi'
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; a set of files is then renamed without the lock
    fcntl = None

from amct_bridge.errors import AmctBridgeError


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows.

    ``os.umask`` can only be read by setting it, which races with other threads creating files;
    Linux reports it in ``/proc/self/status``.

    Example:
        >>> 0 <= current_umask() <= 0o777
        True
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temp_prefix(path: str | os.PathLike) -> str:
    """The name prefix of this process's temp files for ``path``: ``.NAME.PID.``.

    The writer's pid in the name lets a later run to the same path tell a temp left by a killed
    run (its pid gone) from one that a live writer is filling (:func:`sweep_stale_temps`).

    Example:
        >>> temp_prefix("out/model.espdl") == f".model.espdl.{os.getpid()}."
        True
    """
    return f".{Path(path).name}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # another user's live process (or an impossible pid: not ours)
    return True


def sweep_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove the temps that killed writers left beside ``path``; return what was removed.

    Only names of our own kind are touched: ``.NAME.PID.<random>.tmp`` / ``.old`` (files or
    directories) whose PID is no running process. A temp of a live writer, and every other
    file, stays.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / ".m.espdl.999999999.abc.tmp").write_bytes(b"half")  # no such pid
        >>> _ = (d / f".m.espdl.{os.getpid()}.def.tmp").write_bytes(b"live")
        >>> [p.name for p in sweep_stale_temps(d / "m.espdl")]
        ['.m.espdl.999999999.abc.tmp']
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    head = f".{path.name}."
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith(head) or not name.endswith((".tmp", ".old")):
            continue
        pid_text = name[len(head) :].split(".", 1)[0]
        if not pid_text.isdigit() or _pid_alive(int(pid_text)):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue  # another run swept it first, or it is not ours to remove
        removed.append(Path(entry.path))
    return removed


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.

    An existing file keeps its permission bits; a new file gets ``0o666 & ~umask``.
    """
    atomic_write_files({path: data})


def atomic_write_files(files: Mapping[str | os.PathLike, bytes]) -> None:
    """Write files that belong together (a record and its sidecar): all old or all new.

    Every file's data is written and fsynced to a temp file first; only then are the temps
    renamed over their targets, back to back, while holding an exclusive ``flock`` on each
    target directory. An error or KeyboardInterrupt while writing (where the time goes) leaves
    every previous file and removes the temps; two processes writing the same set at once
    (both through this function) commit one after the other, never interleaved. What remains
    is a crash between two renames (microseconds): then the earlier files are new.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> atomic_write_files({d / "r.txt": b"record", d / "r.txt.calib.json": b"{}"})
        >>> sorted(p.name for p in d.iterdir())
        ['r.txt', 'r.txt.calib.json']
    """
    temps: list[tuple[str, Path]] = []
    for path in files:
        sweep_stale_temps(path)
    try:
        for path, data in files.items():
            path = Path(path)
            temps.append((_write_temp(path, data), path))
        with _locked({path.parent for _, path in temps}):
            for tmp, path in temps:
                os.replace(tmp, path)
    except BaseException:
        for tmp, _ in temps:
            Path(tmp).unlink(missing_ok=True)  # a renamed one is gone already
        raise


def _write_temp(path: Path, data: bytes) -> str:
    """A fsynced temp file beside ``path`` holding ``data``, with ``path``'s future mode."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o666 & ~current_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent or ".")
    except OSError as err:
        raise AmctBridgeError(f"{path}: cannot write here: {err.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


@contextlib.contextmanager
def _locked(directories: set[Path]) -> Iterator[None]:
    """Hold an exclusive flock on each directory (sorted: no deadlock between two writers).

    A directory that cannot be opened or locked (no fcntl, a filesystem without flock) is
    written without the lock: single-file writes stay atomic, only the set's order is lost.
    """
    with contextlib.ExitStack() as stack:
        for directory in sorted(Path(d or ".").resolve() for d in directories):
            if fcntl is None:
                break
            try:
                fd = os.open(directory, os.O_RDONLY)
            except OSError:
                continue
            stack.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                continue
            stack.callback(fcntl.flock, fd, fcntl.LOCK_UN)
        yield


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
