"""Exception types of amct_bridge: every error a user can act on is one of these.

Example:
    >>> from amct_bridge.errors import RecordError
    >>> try:
    ...     raise RecordError("record.txt:3:5: unknown field 'scal_d'")
    ... except RecordError as err:
    ...     print(err)
    record.txt:3:5: unknown field 'scal_d'
"""


class AmctBridgeError(Exception):
    """Base class of all errors raised on purpose by amct_bridge."""


class RecordError(AmctBridgeError):
    """A record file cannot be read, written or converted (the message names file/line/field)."""


class ValidationError(RecordError):
    """A record breaks AMCT's rules; ``problems`` lists each one."""

    def __init__(self, problems: list) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class QuantError(AmctBridgeError):
    """Quantization math got input it cannot turn into factors (NaN/Inf, bad bit width...)."""


class GraphError(AmctBridgeError):
    """A model graph cannot be read into the graph IR."""


class ExportError(AmctBridgeError):
    """An ESP-DL export was refused (unsupported layer, bad shape, missing range...)."""


class CalibrationError(AmctBridgeError):
    """Calibration was misconfigured or saw bad data (names the layer and batch)."""
