"""Write an export directory all at once: build it next to ``out_dir``, then rename it into place.

Every file goes through ``atomic_write_bytes`` into a temporary sibling directory; only when all
are written is that directory renamed to ``out_dir`` (replacing an existing one only when asked).
A failure removes the temporary directory, so no half-written export is ever left behind. File
names must be plain names (no separators, no ``..``): nothing can land outside ``out_dir``.

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "model_espdl"
    >>> write_directory(out, {"config.json": b"{}"})
    >>> sorted(p.name for p in out.iterdir())
    ['config.json']
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.records.atomic import (
    atomic_write_bytes,
    current_umask,
    sweep_stale_temps,
    temp_prefix,
)


def npy_bytes(arr: np.ndarray) -> bytes:
    """``arr`` serialized as a .npy file (no pickle).

    Example:
        >>> npy_bytes(np.zeros(1, np.float32))[:6]
        b'\\x93NUMPY'
    """
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _check_file_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ExportError(f"refusing to write {name!r}: not a plain file name inside the output")


#: Longest file name most file systems take (ext4, XFS, APFS, NTFS: 255 bytes or characters).
MAX_NAME_BYTES = 255


def check_output_path(out: str | os.PathLike) -> Path:
    """Refuse an output path that cannot be written, before any long work (a search, a
    calibration): a name over 255 bytes, a NUL, a missing parent directory.

    Example:
        >>> check_output_path("out/" + "m" * 300)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: output name 'mmm...' is 300 bytes long, at most 255 ...
    """
    path = Path(out)
    text = str(out)
    if "\0" in text:
        raise ExportError(f"output path {text[:80]!r}: a NUL character cannot be in a file name")
    size = len(path.name.encode("utf-8", "surrogateescape"))
    if size > MAX_NAME_BYTES:
        raise ExportError(
            f"output name {path.name[:40] + '...'!r} is {size} bytes long, at most "
            f"{MAX_NAME_BYTES} expected"
        )
    parent = path.parent if str(path.parent) else Path(".")
    try:
        if not parent.is_dir():
            raise ExportError(f"{parent}: directory does not exist")
    except OSError as err:  # a parent component too long, a loop of links
        raise ExportError(f"output path {text[:80]!r}: {err.strerror or err}") from None
    return path


def _prepare_target(out_dir: Path, overwrite: bool) -> None:
    check_output_path(out_dir)
    if out_dir.exists() or out_dir.is_symlink():
        if not out_dir.is_dir() or out_dir.is_symlink():
            raise ExportError(f"{out_dir}: exists and is not a directory")
        if any(out_dir.iterdir()) and not overwrite:
            raise ExportError(
                f"{out_dir}: directory exists and is not empty; to replace it pass "
                "overwrite=True (CLI: --overwrite)"
            )
    if not out_dir.parent.is_dir():
        raise ExportError(f"{out_dir.parent}: directory does not exist")


def write_directory(
    out_dir: str | os.PathLike, files: dict[str, bytes], *, overwrite: bool = False
) -> None:
    """Create ``out_dir`` holding exactly ``files`` (name -> content), atomically.

    Example:
        >>> write_directory("/nonexistent-parent/x", {"a": b""})
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: /nonexistent-parent: directory does not exist
    """
    out_dir = Path(out_dir)
    for name in files:
        _check_file_name(name)
    _prepare_target(out_dir, overwrite)
    sweep_stale_temps(out_dir)  # temp directories of killed runs
    try:
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out_dir), suffix=".tmp", dir=out_dir.parent))
    except OSError as err:
        raise ExportError(
            f"{out_dir.parent}: cannot create a directory here: {err.strerror}"
        ) from None
    old: Path | None = None
    umask = current_umask()
    try:
        for name, data in files.items():
            target = tmp / name
            if target.resolve().parent != tmp.resolve():
                raise ExportError(f"refusing to write {name!r} outside {out_dir}")
            atomic_write_bytes(target, data)  # a new file: 0o666 & ~umask
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
        if out_dir.exists():
            old = Path(
                tempfile.mkdtemp(prefix=temp_prefix(out_dir), suffix=".old", dir=out_dir.parent)
            )
            os.rename(out_dir, old / "prev")
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / "prev").exists() and not out_dir.exists():
            os.rename(old / "prev", out_dir)  # put the previous export back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
