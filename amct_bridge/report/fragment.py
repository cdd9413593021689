"""The AMCT simple-config fragment that keeps the most sensitive layers in float.

The text is protobuf text of ``proto/amct_simple_config.proto`` (``skip_layers`` entries, the
field the Keras callback's ``config=`` and ``amct-bridge calibrate --config`` read), made with
protobuf's own printer (so names are escaped as the parser expects) and checked by parsing it
back with :func:`amct_bridge.config.parse_simple_config`.

Example:
    >>> print(skip_fragment(["conv2", "fc"]), end="")
    skip_layers: "conv2"
    skip_layers: "fc"
"""

from __future__ import annotations

from google.protobuf import text_format

from amct_bridge.config import parse_simple_config
from amct_bridge.errors import RecordError
from amct_bridge.records._pb import amct_simple_config_pb2 as pb


def skip_fragment(names: list[str]) -> str:
    """``skip_layers: "name"`` lines for ``names``, verified to parse back to the same list.

    Example:
        >>> skip_fragment(['a"b'])
        'skip_layers: "a\\\\"b"\\n'
    """
    text = text_format.MessageToString(pb.AMCTConfig(skip_layers=names))
    parsed = parse_simple_config(text, source="<report fragment>").skip_layers
    if parsed != list(names):  # would be a bug in the printer or the reader: never print it
        raise RecordError(f"config fragment does not parse back: {parsed} != {names}")
    return text


def config_fragment(report) -> str:
    """The fragment for ``report`` (an :class:`amct_bridge.report.table.Report`): a comment
    saying what was measured, then the ``skip_layers`` lines; paste it into a simple config.

    Example:
        >>> from amct_bridge.report.table import Report
        >>> r = Report(rows=[], samples=8, skip_layers=["conv2"], snr_model_quantized=20.0,
        ...            snr_model_kept_float=31.5)
        >>> print(config_fragment(r), end="")
        # amct-bridge report: the 1 most sensitive layer(s) kept in float (8 samples)
        # model output SNR: all quantized 20.0 dB, these in float 31.5 dB
        skip_layers: "conv2"
    """
    if getattr(report, "no_drop", False):
        return (
            f"# amct-bridge report: no accuracy drop ({report.samples} samples: float "
            f"{report.float_accuracy:.4f}, all quantized {report.quantized_accuracy:.4f}), so no "
            "layer needs to stay in float\n"
        )
    n = len(report.skip_layers)
    lines = [
        f"# amct-bridge report: the {n} most sensitive layer(s) kept in float "
        f"({report.samples} samples)"
    ]
    if report.snr_model_quantized is not None and report.snr_model_kept_float is not None:
        lines.append(
            f"# model output SNR: all quantized {report.snr_model_quantized:.1f} dB, "
            f"these in float {report.snr_model_kept_float:.1f} dB"
        )
    if report.kept_float_accuracy is not None:
        lines.append(
            f"# accuracy: float {report.float_accuracy:.4f}, all quantized "
            f"{report.quantized_accuracy:.4f}, these in float {report.kept_float_accuracy:.4f}"
        )
    return "\n".join(lines) + "\n" + skip_fragment(report.skip_layers)
