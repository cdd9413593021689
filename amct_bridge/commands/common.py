"""Helpers shared by the CLI subcommands.

Example:
    >>> load_keras_model("missing.keras")
    Traceback (most recent call last):
    ...
    amct_bridge.errors.AmctBridgeError: missing.keras: model file not found
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

from amct_bridge.errors import AmctBridgeError
from amct_bridge.records.sniff import describe_file

#: TensorFlow's C++ start-up lines that TF_CPP_MIN_LOG_LEVEL cannot hide: they are written
#: while the library loads, before absl logging is initialised (see docs/keras.md, "Logs").
_STARTUP_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called"
    r"|cudart_stub\.cc|cuda_platform\.cc|cuda_executor\.cc|cpu_feature_guard\.cc"
    r"|To enable the following instructions:"
    r"|port\.cc:\d+\] oneDNN custom operations are on"
    r"|Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation placer already registered"
)

#: Log level for TensorFlow's C++ logs when the user set none: 3 hides INFO/WARNING and the
#: "failed call to cuInit" ERROR of every CPU-only run; real failures still raise exceptions.
DEFAULT_TF_LOG_LEVEL = "3"


def quiet_tensorflow() -> None:
    """Import Keras/TensorFlow with their start-up log lines filtered out of stderr.

    Sets ``TF_CPP_MIN_LOG_LEVEL`` (if unset) before TensorFlow is imported, then imports it
    with file descriptor 2 captured; captured lines that are not known start-up noise are
    written back to stderr. With ``TF_CPP_MIN_LOG_LEVEL=0`` nothing is filtered.

    Example:
        >>> quiet_tensorflow()  # doctest: +SKIP
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_TF_LOG_LEVEL)
    if "tensorflow" in sys.modules:
        return
    if os.environ["TF_CPP_MIN_LOG_LEVEL"].strip() in ("", "0"):
        import keras  # noqa: F401  (the user asked for every log line)

        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import keras  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", "replace")
    kept = [line for line in text.splitlines() if not _STARTUP_NOISE.search(line)]
    if kept:
        print("\n".join(kept), file=sys.stderr)


#: Help of ``--unsafe-load``, the only way the CLI deserializes code stored in a model file.
UNSAFE_LOAD_HELP = (
    "load Python code stored in the model file (Lambda layers): only for a file you trust; "
    "without it such a model is refused (Keras safe_mode)"
)


def add_unsafe_load(parser: argparse.ArgumentParser) -> None:
    """Add ``--unsafe-load`` to a command that takes a Keras model.

    Example:
        >>> p = argparse.ArgumentParser(); add_unsafe_load(p)
        >>> p.parse_args(["--unsafe-load"]).unsafe_load
        True
    """
    parser.add_argument("--unsafe-load", action="store_true", help=UNSAFE_LOAD_HELP)


def add_mindspore_net(parser: argparse.ArgumentParser, note: str = "") -> None:
    """Add ``--mindspore MODULE:FACTORY`` and ``--ckpt FILE`` (read by
    :func:`amct_bridge.commands.mindspore_net.load_mindspore_net`); ``note`` ends the help.

    Example:
        >>> p = argparse.ArgumentParser(); add_mindspore_net(p)
        >>> p.parse_args(["--mindspore", "nets:resnet", "--ckpt", "w.ckpt"]).ckpt
        'w.ckpt'
    """
    parser.add_argument(
        "--mindspore",
        metavar="MODULE:FACTORY",
        help="a MindSpore network instead: module:function or file.py:function returning the "
        "nn.Cell" + (f" ({note})" if note else ""),
    )
    parser.add_argument("--ckpt", help="with --mindspore: checkpoint to load into the network")


def load_keras_model(path: str, *, unsafe: bool = False):
    """Load a .keras / .h5 model without compiling it; a bad file is an AmctBridgeError.

    A file that is not a Keras archive is named for what it looks like (Keras itself reports
    such a ``.keras`` file as "File not found"). The model loads with Keras' ``safe_mode``:
    a Lambda layer holding Python bytecode is refused unless ``unsafe`` (CLI ``--unsafe-load``).

    Example:
        >>> load_keras_model("missing.keras")
        Traceback (most recent call last):
        ...
        amct_bridge.errors.AmctBridgeError: missing.keras: model file not found
    """
    if not Path(path).is_file():
        raise AmctBridgeError(f"{path}: model file not found")
    _check_model_file(path)
    quiet_tensorflow()
    import keras  # heavy: only when a command needs a model

    try:
        return keras.models.load_model(path, compile=False, safe_mode=not unsafe)
    except Exception as err:  # Keras raises many types for a bad file; name the file
        if not unsafe and "safe_mode" in str(err):
            raise AmctBridgeError(
                f"{path}: refused to load: the model holds Python code (a Lambda layer), which "
                "could do anything when loaded; if you trust the file, rerun with --unsafe-load"
            ) from None
        raise AmctBridgeError(f"{path}: cannot load Keras model: {_one_line(err)}") from None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


class NpzArrays(dict):
    """The arrays of an .npz read in full: ``files`` and ``[name]`` as ``np.load`` gives them.

    Example:
        >>> NpzArrays(a=1).files
        ['a']
    """

    @property
    def files(self) -> list[str]:
        """Array names, in the archive's order."""
        return list(self)


def load_npy(path: str, what: str = "data"):
    """``np.load`` of a .npy (an array) or .npz (an :class:`NpzArrays`), never unpickling.

    Object arrays are stored as pickles, and unpickling can run any code: such a file is
    refused with a message saying so, as is a truncated or damaged file.

    Example:
        >>> load_npy("missing.npy", "labels")
        Traceback (most recent call last):
        ...
        amct_bridge.errors.AmctBridgeError: missing.npy: cannot read labels: file not found
    """
    import numpy as np

    if not Path(path).is_file():
        missing = "is a directory" if Path(path).is_dir() else "file not found"
        raise AmctBridgeError(f"{path}: cannot read {what}: {missing}")
    if not (_starts_with(path, b"\x93NUMPY") or _starts_with(path, b"PK")):
        # np.load takes any other file for a pickle ("allow_pickle=False"): say what it is.
        kind = describe_file(path) or _text_or_unknown(path)
        never = " (never loaded: unpickling can run code)" if "pickle" in kind else ""
        raise AmctBridgeError(
            f"{path}: cannot read {what}: not a .npy/.npz file: it looks like {kind}{never}"
        )
    name = None
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            return loaded
        with loaded:
            arrays = NpzArrays()
            for name in loaded.files:
                arrays[name] = loaded[name]
            return arrays
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        where = f"{path}: array {name!r}" if name else path
        if "allow_pickle" in str(err):
            raise AmctBridgeError(
                f"{where}: holds pickled Python objects (an object array), which amct-bridge "
                f"never loads (unpickling can run code); save {what} as a numeric array"
            ) from None
        raise AmctBridgeError(
            f"{where}: cannot read {what}: not a valid .npy/.npz file ({_one_line(err)})"
        ) from None


def _check_model_file(path: str) -> None:
    suffix = Path(path).suffix.lower()
    if suffix == ".keras":
        ok = zipfile.is_zipfile(path)
        if not ok and _starts_with(path, b"PK\x03\x04"):
            raise AmctBridgeError(
                f"{path}: truncated or damaged .keras file: it starts as a zip archive but its "
                "table of contents (at the end) is missing; save the model again"
            )
        if ok:
            with zipfile.ZipFile(path) as archive:
                ok = "config.json" in archive.namelist()
        expected = "a .keras model is a zip archive with config.json (model.save('m.keras'))"
    elif suffix in (".h5", ".hdf5"):
        with open(path, "rb") as f:
            ok = f.read(8) == b"\x89HDF\r\n\x1a\n"
        expected = "a .h5 model is an HDF5 file"
    else:  # Keras 3 reads nothing else; its own message lists formats, not what the file is
        kind = describe_file(path) or _text_or_unknown(path)
        raise AmctBridgeError(
            f"{path}: not a Keras model file: expected a .keras or .h5 file, this one looks "
            f"like {kind}"
        )
    if not ok:
        kind = describe_file(path) or _text_or_unknown(path)
        raise AmctBridgeError(f"{path}: not a Keras model file: it looks like {kind}; {expected}")


def _starts_with(path: str, magic: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(len(magic)) == magic


def _text_or_unknown(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "an unknown binary file (neither zip nor HDF5)"
    return "a text file" if head else "an empty file"


def print_warnings(warnings: list[str], where: str = "") -> None:
    """Print ``warning: ...`` lines on stderr, a warning repeated for many layers once with a
    count and its first layers (:func:`amct_bridge.espdl.refusals.group_repeated`); every
    folded message is logged at DEBUG (``-v`` shows them). ``where`` says where the full list
    is kept (e.g. ``export.json``).

    Example:
        >>> print_warnings([])  # nothing to print
    """
    import logging

    from amct_bridge.espdl.refusals import group_repeated

    lines, folded = group_repeated(warnings)
    log = logging.getLogger(__name__)
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)
    if folded:
        keep = f"; all of them in {where}" if where else ""
        print(f"note: -v lists every folded warning{keep}", file=sys.stderr)
    for group in folded:
        for message in group:
            log.debug("%s", message)
