"""Helpers shared by the CLI subcommands.

Example:
    >>> load_keras_model("missing.keras")
    Traceback (most recent call last):
    ...
    amct_bridge.errors.AmctBridgeError: missing.keras: model file not found
"""

from __future__ import annotations

from pathlib import Path

from amct_bridge.errors import AmctBridgeError


def load_keras_model(path: str):
    """Load a .keras / .h5 model without compiling it; a bad file is an AmctBridgeError."""
    if not Path(path).is_file():
        raise AmctBridgeError(f"{path}: model file not found")
    import keras  # heavy: only when a command needs a model

    try:
        return keras.models.load_model(path, compile=False)
    except Exception as err:  # Keras raises many types for a bad file; name the file
        raise AmctBridgeError(f"{path}: cannot load Keras model: {err}") from None
