"""The C++ files of an export: coefficients, model class and an ``app_main.cpp`` example.

:func:`cpp_outputs` is what ``export(..., cpp="NAME")`` writes next to config.json:
``NAME.cpp`` / ``NAME.hpp`` (convert.py's text, :mod:`cpp_coefficients`), ``<model>_model.hpp``
(:mod:`cpp_model`) and ``app_main.cpp``, an ESP-IDF entry point that quantizes one float input
with the model's input exponent, runs the model and prints every output's integers, exponent
and shape. When the model class cannot be written (a layer ESP-DL v1 lacks...), the
coefficient files are still written and a note says why.

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.export import export_layers
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> layers = [SourceLayer("in", "input", attrs={"shape": (4,)}),
    ...           SourceLayer("fc", "dense", ["in"], "Dense",
    ...                       {"kernel": np.full((4, 2), 0.5, np.float32)},
    ...                       {"model_output": True})]
    >>> stats = CalibrationStats(layers={"fc": LayerStats("Dense", TensorRange(0, 1),
    ...                                                   TensorRange(-2, 2))})
    >>> files, notes = cpp_outputs(layers, export_layers(layers, None, stats=stats), "m")
    >>> sorted(files), notes
    (['app_main.cpp', 'm.cpp', 'm.hpp', 'm_model.hpp'], [])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from amct_bridge.errors import AmctBridgeError, ExportError
from amct_bridge.espdl import spec
from amct_bridge.espdl.cpp_coefficients import check_identifier, coefficient_files
from amct_bridge.espdl.cpp_model import ModelClass, model_class
from amct_bridge.espdl.source import SourceLayer

if TYPE_CHECKING:
    from amct_bridge.espdl.export import ExportResult

_I = "    "
_PER_LINE = 16


def _float_list(values: np.ndarray) -> str:
    items = [f"{np.float32(v)!s}f" for v in values]
    rows = [", ".join(items[i : i + _PER_LINE]) for i in range(0, len(items), _PER_LINE)]
    return (",\n" + _I).join(rows)


def app_main_text(
    model: ModelClass, input_shape: tuple[int, ...], example: np.ndarray | None = None
) -> str:
    """An ESP-IDF ``app_main.cpp`` running ``model`` on one input (``example``, HWC float, or
    zeros) and printing each output.

    Example:
        >>> m = ModelClass("NetModel", "net_model.hpp", "net", "s8", [], ["fc"], -7)
        >>> "set_shape({4})" in (
        ...     app_main_text(m, (4,)))
        True
    """
    if model.input_exponent is None:
        raise ExportError("app_main.cpp: the model input's exponent is unknown (no input range)")
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ExportError(f"app_main.cpp: input shape {shape} is not a known HWC shape")
    size = int(np.prod(shape))
    ctype = spec.CTYPE[model.feature_type]
    bits = spec.FEATURE_BITS[model.feature_type]
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if example is None:
        values = "0"
        what = "zeros: put one real input here (HWC, the float values the model was trained on)"
    else:
        ex = np.asarray(example, dtype=np.float32).reshape(-1)
        if ex.size != size or not np.all(np.isfinite(ex)):
            raise ExportError(f"app_main.cpp: example input must be {size} finite values")
        values, what = _float_list(ex), "the example input given to the export"
    cls, dims = model.class_name, ", ".join(str(s) for s in shape)
    prints = "".join(
        f'{_I}print_output("{name}", model.{name}.get_output());\n' for name in model.outputs
    )
    return f"""// Example ESP-IDF app for {cls} (written by amct-bridge): quantizes one input,
// runs the model and prints every output's integers (real = int * 2^exponent).
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "{model.header_name}"

#define INPUT_SIZE {size}

// {what}
static const float example_input[INPUT_SIZE] = {{
{_I}{values}}};
static __attribute__((aligned(16))) {ctype} input_element[INPUT_SIZE];

// q = clamp(round_half_to_even(x * 2^-exponent), {lo}, {hi}): nearbyintf() rounds half to even
// in the default rounding mode; ldexpf() scales by a power of two exactly.
static void quantize_input(const float *x, {ctype} *q, int n, int exponent)
{{
{_I}for (int i = 0; i < n; i++)
{_I}{{
{_I}{_I}float v = nearbyintf(ldexpf(x[i], -exponent));
{_I}{_I}q[i] = ({ctype})(v < {lo}.0f ? {lo}.0f : (v > {hi}.0f ? {hi}.0f : v));
{_I}}}
}}

static void print_output(const char *name, dl::Tensor<{ctype}> &output)
{{
{_I}printf("%s: exponent %d, shape", name, output.exponent);
{_I}for (size_t i = 0; i < output.shape.size(); i++)
{_I}{_I}printf(" %d", output.shape[i]);
{_I}printf("\\n");
{_I}{ctype} *element = output.get_element_ptr();
{_I}for (int i = 0; i < output.get_size(); i++)
{_I}{_I}printf("%d, ", (int)element[i]);
{_I}printf("\\n");
}}

extern "C" void app_main(void)
{{
{_I}quantize_input(example_input, input_element, INPUT_SIZE, {cls}::input_exponent);
{_I}dl::Tensor<{ctype}> input;
{_I}input.set_element(input_element).set_exponent({cls}::input_exponent).set_shape({{{dims}}}).set_auto_free(false);

{_I}{cls} model;
{_I}model.forward(input);

{prints}}}
"""


def _input_shape(layers: list[SourceLayer]) -> tuple[int, ...] | None:
    inputs = [layer for layer in layers if layer.op == "input"]
    shape = inputs[0].attrs.get("shape") if len(inputs) == 1 else None
    if shape is None or any(s is None for s in shape):
        return None
    return tuple(int(s) for s in shape)


def cpp_outputs(
    layers: list[SourceLayer],
    result: ExportResult,
    name: str,
    *,
    example: np.ndarray | None = None,
) -> tuple[dict[str, bytes], list[str]]:
    """The C++ files of an export (file name -> bytes) and notes on what was left out.

    ``name`` is convert.py's ``-n`` (namespace and coefficient file names); the model class is
    ``<name without _coefficient>_model.hpp``.

    Example:
        >>> cpp_outputs([], None, "bad name")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: C++ name (cpp) 'bad name' is not a C identifier ...
    """
    check_identifier(name, "C++ name (cpp)")
    if name == "app_main":
        raise ExportError("C++ name (cpp) 'app_main' would overwrite app_main.cpp: choose another")
    files = coefficient_files([layer.preview for layer in result.layers], name)
    notes = []
    try:
        model = model_class(layers, result, name)
    except AmctBridgeError as err:
        return files, [f"C++ model class not written: {err}"]
    files[model.header_name] = model.text.encode("utf-8")
    shape = _input_shape(layers)
    if shape is None:
        notes.append("app_main.cpp not written: the model input's shape is not known")
        return files, notes
    try:
        files["app_main.cpp"] = app_main_text(model, shape, example).encode("utf-8")
    except ExportError as err:
        notes.append(f"app_main.cpp not written: {err}")
    return files, notes
