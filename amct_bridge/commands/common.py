"""Helpers shared by the CLI subcommands.

Example:
    >>> load_keras_model("missing.keras")
    Traceback (most recent call last):
    ...
    amct_bridge.errors.AmctBridgeError: missing.keras: model file not found
"""

from __future__ import annotations

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


def load_keras_model(path: str):
    """Load a .keras / .h5 model without compiling it; a bad file is an AmctBridgeError.

    A file that is not a Keras archive is named for what it looks like (Keras itself reports
    such a ``.keras`` file as "File not found").
    """
    if not Path(path).is_file():
        raise AmctBridgeError(f"{path}: model file not found")
    _check_model_file(path)
    quiet_tensorflow()
    import keras  # heavy: only when a command needs a model

    try:
        return keras.models.load_model(path, compile=False)
    except Exception as err:  # Keras raises many types for a bad file; name the file
        raise AmctBridgeError(f"{path}: cannot load Keras model: {err}") from None


def _check_model_file(path: str) -> None:
    suffix = Path(path).suffix.lower()
    if suffix == ".keras":
        ok = zipfile.is_zipfile(path)
        if ok:
            with zipfile.ZipFile(path) as archive:
                ok = "config.json" in archive.namelist()
        expected = "a .keras model is a zip archive with config.json (model.save('m.keras'))"
    elif suffix in (".h5", ".hdf5"):
        with open(path, "rb") as f:
            ok = f.read(8) == b"\x89HDF\r\n\x1a\n"
        expected = "a .h5 model is an HDF5 file"
    else:
        return  # let Keras judge other formats
    if not ok:
        kind = describe_file(path) or _text_or_unknown(path)
        raise AmctBridgeError(f"{path}: not a Keras model file: it looks like {kind}; {expected}")


def _text_or_unknown(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "an unknown binary file (neither zip nor HDF5)"
    return "a text file" if head else "an empty file"
