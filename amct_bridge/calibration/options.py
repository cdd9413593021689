"""Checks of calibration options shared by the adapters' callbacks (same messages everywhere).

A callback resolves its options once, when it is created, so a bad value stops the user before
any batch runs: :func:`check_choice` for enumerations, :func:`check_flavor` (DMQ needs the
"inner" flavor, INT16 a flavor with act_type), :func:`check_output` (the record and sidecar
paths are writable) and :func:`resolve_batch_num` (explicit value, else the config file's,
else every batch).

Example:
    >>> from amct_bridge.config import QuantConfig
    >>> resolve_batch_num(None, QuantConfig(), from_file=False) is None
    True
    >>> check_choice("flavor", "tf", ("inner", "mindspore"))
    Traceback (most recent call last):
    ...
    amct_bridge.errors.CalibrationError: flavor must be one of inner, mindspore; got 'tf'
"""

from __future__ import annotations

import os
from pathlib import Path

from amct_bridge.config import QuantConfig
from amct_bridge.errors import AmctBridgeError, CalibrationError
from amct_bridge.records.atomic import check_writable
from amct_bridge.records.calibration import sidecar_path

#: Record flavors whose schema has act_type (INT16 activations).
ACT_TYPE_FLAVORS = ("inner", "tf")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """CalibrationError unless ``value`` is one of ``choices``.

    Example:
        >>> check_choice("on", "auto", ("auto", "train"))
    """
    if value not in choices:
        raise CalibrationError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def check_flavor(config: QuantConfig, flavor: str) -> None:
    """CalibrationError when the settings ask for fields the record flavor cannot hold: DMQ
    (``tensor_balance_factor``) needs "inner"; INT16 activations need ``act_type`` ("inner",
    "tf"), else the INT16 offsets would read as INT8 ones (AMCT's range check fails them).

    Example:
        >>> check_flavor(QuantConfig(), "mindspore")
    """
    layers = [config.common, *config.by_type.values(), *config.by_name.values()]
    if flavor != "inner" and any(c.migration_strength is not None for c in layers):
        raise CalibrationError(
            f"DMQ (migration_strength) needs flavor 'inner': a {flavor!r} record cannot hold "
            "tensor_balance_factor, and its scale_w would not match the unbalanced weights"
        )
    if flavor not in ACT_TYPE_FLAVORS and any(c.act_type != "INT8" for c in layers):
        raise CalibrationError(
            f"act_type INT16 needs flavor 'inner' (or 'tf'): a {flavor!r} record cannot hold "
            "act_type, so its INT16 offsets would be read as INT8 ones"
        )


def check_output(record_path: str | os.PathLike) -> Path:
    """The record path, after checking it and its sidecar can be written (CalibrationError).

    Example:
        >>> import tempfile
        >>> check_output(os.path.join(tempfile.mkdtemp(), "r.txt")).name
        'r.txt'
    """
    path = Path(record_path)
    for target in (path, sidecar_path(path)):
        try:
            check_writable(target)
        except AmctBridgeError as err:
            raise CalibrationError(f"cannot write output: {err}") from None
    return path


def resolve_batch_num(batch_num: int | None, config: QuantConfig, from_file: bool) -> int | None:
    """Batches to gather: ``batch_num`` if given (>= 1), else a config file's ``batch_num``
    when the file sets it, else None (every batch of the run).

    Example:
        >>> resolve_batch_num(4, QuantConfig(), from_file=False)
        4
    """
    if batch_num is not None and int(batch_num) < 1:
        raise CalibrationError(f"batch_num must be >= 1 (or None for all), got {batch_num}")
    if batch_num:
        return int(batch_num)
    return config.batch_num if from_file and config.batch_num is not None else None
