"""Warnings of an ESP-DL v1 export: coefficients convert.py will clip, biases that round to 0, and
Concats whose input exponents still differ (the v1 runtime asserts they are equal).

The checks every format shares are in :mod:`amct_bridge.espdl.checks`.

Example:
    >>> unresolved_concats(["layer 'x' (Add): a note"], [])
    ["layer 'x' (Add): a note"]
"""

from __future__ import annotations

from amct_bridge.espdl.v1.preview import LayerPreview
from amct_bridge.espdl.v1.runtime import RuntimeLayer, concat_resolved


def saturation_warnings(name: str, preview: LayerPreview) -> list[str]:
    """One line per coefficient tensor that convert.py will clip, and one when most of the
    biases round to 0 (the preview's ``bias0`` column above 50 %).

    Example:
        >>> import numpy as np
        >>> from amct_bridge.espdl.v1.preview import preview_layer
        >>> p = preview_layer("c", {"operation": "conv2d", "feature_type": "s8"},
        ...                   {"c_filter": np.ones((1, 1, 1, 1), np.float32)})
        >>> saturation_warnings("c", p)
        []
    """
    result = []
    for what, t in (("bias", preview.bias), ("activation alpha", preview.activation)):
        if t is not None and t.saturated:
            exp = t.exponent if isinstance(t.exponent, int) else "per-channel"
            result.append(
                f"layer {name!r}: {t.saturated} of {t.values.size} {what} values saturate at "
                f"exponent {exp} ({t.ctype}): the chip will use clipped values"
            )
    bias = preview.bias
    if bias is not None and 2 * bias.zeroed > bias.values.size:  # most channels lose their bias
        exp = bias.exponent if isinstance(bias.exponent, int) else "per-channel"
        result.append(
            f"layer {name!r}: {bias.zeroed} of {bias.values.size} bias values are nonzero but "
            f"round to 0 at exponent {exp} ({bias.ctype}): the chip runs those channels without "
            "their bias"
        )
    return result


def unresolved_concats(loose: list[str], runtime: list[RuntimeLayer]) -> list[str]:
    """Notes on Concats whose inputs still differ (the loose-input note, else our own).

    Example:
        >>> unresolved_concats([], [RuntimeLayer("c", "c", "Concatenate", "Concat", -5,
        ...                                      [-5, -6], "")])  # doctest: +ELLIPSIS
        ["layer 'c' (Concatenate): input exponents [-5, -6] are not all known and equal ..."]
    """
    notes = []
    for item in runtime:
        if item.espdl_class != "Concat" or concat_resolved(item):
            continue
        mine = [note for note in loose if note.startswith(f"layer {item.source!r} (")]
        notes += mine or [
            f"layer {item.source!r} (Concatenate): input exponents {item.input_exponents} are not "
            "all known and equal (the runtime asserts they are): give every input the exponent "
            f"{item.output_exponent}"
        ]
    concat = {item.source for item in runtime if item.espdl_class == "Concat"}
    others = [n for n in loose if not any(n.startswith(f"layer {c!r} (") for c in concat)]
    return others + notes
