"""What a file that is not the expected one looks like, from its first bytes.

Used where a user passed the wrong file (a ``.npy`` as a record, a text file as a ``.keras``
model): saying "looks like a NumPy .npy file" helps more than a protobuf or zip error.

Example:
    >>> describe_bytes(b"\\x93NUMPY\\x01\\x00v\\x00{'descr': '<f4'")
    'a NumPy .npy file (magic \\\\x93NUMPY)'
    >>> describe_bytes(b"record { key: 'a' }") is None
    True
"""

from __future__ import annotations

import io
import json
import os
import zipfile

#: Leading bytes -> what the file is (checked in order).
_MAGIC = (
    (b"\x93NUMPY", "a NumPy .npy file (magic \\x93NUMPY)"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (magic \\x89HDF; e.g. a Keras .h5 model or weights)"),
    (b"\x1f\x8b", "a gzip file (magic \\x1f\\x8b)"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"\x7fELF", "an ELF executable or library"),
)


def describe_bytes(data: bytes) -> str | None:
    """A short description of ``data``'s file type, or None when it is none of the known kinds.

    Known kinds: NumPy ``.npy``; zip archives, told apart as Keras ``.keras`` (config.json +
    model.weights.h5), NumPy ``.npz`` (only .npy members) or other zip; HDF5; JSON; gzip;
    PNG/JPEG; ELF; pickle. Plain text and protobuf are not recognised (None).

    Example:
        >>> describe_bytes(b'{"layers": []}')
        'a JSON file'
    """
    for magic, what in _MAGIC:
        if data.startswith(magic):
            return what
    if data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a Python pickle"  # PROTO opcode + protocol; no protobuf record starts so
    if data.startswith(b"PK\x03\x04") or data.startswith(b"PK\x05\x06"):
        return _describe_zip(data)
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None
        return "a JSON file"
    return None


def describe_file(path: str | os.PathLike) -> str | None:
    """:func:`describe_bytes` of the file at ``path`` (None if it cannot be read).

    Example:
        >>> describe_file("/nonexistent") is None
        True
    """
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return None
    if data.startswith(b"PK"):  # a zip's directory is at its end: read the whole file
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
    return describe_bytes(data)


def _describe_zip(data: bytes) -> str:
    try:
        names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return "a zip archive (magic PK)"
    if "config.json" in names and any(n.endswith(".h5") for n in names):
        return "a Keras .keras model archive (zip with config.json)"
    if names and all(n.endswith(".npy") for n in names):
        return f"a NumPy .npz archive (zip of {len(names)} .npy arrays)"
    return f"a zip archive (magic PK, {len(names)} members)"
