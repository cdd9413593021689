"""The C++ files of an export: coefficients, model class and an ``app_main.cpp`` example.

:func:`cpp_outputs` is what ``export(..., cpp="NAME")`` writes next to config.json:
``NAME.cpp`` / ``NAME.hpp`` (convert.py's text, :mod:`cpp_coefficients`), ``<model>_model.hpp``
(:mod:`cpp_model`) and ``app_main.cpp``, an ESP-IDF entry point that quantizes one float input
with the model's input exponent, runs the model and prints every output's integers, exponent
and shape. When the model class cannot be written (a layer ESP-DL v1 lacks...), the
coefficient files are still written and a note says why.

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.v1.export import export_layers
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> layers = [SourceLayer("in", "input", attrs={"shape": (4,)}),
    ...           SourceLayer("fc", "dense", ["in"], "Dense",
    ...                       {"kernel": np.full((4, 2), 0.5, np.float32)},
    ...                       {"model_output": True})]
    >>> stats = CalibrationStats(layers={"fc": LayerStats("Dense", TensorRange(0, 1),
    ...                                                   TensorRange(-2, 2))})
    >>> files, notes = cpp_outputs(export_layers(layers, None, stats=stats), "m")
    >>> sorted(files), notes
    (['app_main.cpp', 'm.cpp', 'm.hpp', 'm_model.hpp'], [])
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from amct_bridge.errors import AmctBridgeError, ExportError
from amct_bridge.espdl.v1 import spec
from amct_bridge.espdl.v1.cpp_coefficients import check_identifier, coefficient_files
from amct_bridge.espdl.v1.cpp_model import model_class
from amct_bridge.espdl.v1.cpp_types import ModelClass
from amct_bridge.espdl.v1.network import (
    Network,
    graph_from_json,
    network_from_parts,
    network_from_result,
)
from amct_bridge.espdl.v1.preview import load_set

if TYPE_CHECKING:
    from amct_bridge.espdl.v1.result import ExportResult

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


def model_files(
    net: Network, name: str, *, example: np.ndarray | None = None
) -> tuple[dict[str, bytes], list[str]]:
    """``<model>_model.hpp`` and ``app_main.cpp`` of chip graph ``net`` (coefficients ``name``),
    and notes on what was left out (the app needs the input's shape and exponent).

    Example:
        >>> from amct_bridge.espdl.v1.network import NetLayer, Network
        >>> net = Network("s8", False, [NetLayer("r", "ReLU", ["input"])], input_exponent=-7)
        >>> files, notes = model_files(net, "n")
        >>> sorted(files), notes
        (['n_model.hpp'], ["app_main.cpp not written: the model input's shape is not known"])
    """
    check_identifier(name, "C++ name (cpp)")
    model = model_class(net, name)
    files = {model.header_name: model.text.encode("ascii")}
    if model.input_shape is None:
        return files, ["app_main.cpp not written: the model input's shape is not known"]
    try:
        files["app_main.cpp"] = app_main_text(model, model.input_shape, example).encode("ascii")
    except ExportError as err:
        return files, [f"app_main.cpp not written: {err}"]
    return files, []


def cpp_outputs(
    result: ExportResult, name: str, *, example: np.ndarray | None = None
) -> tuple[dict[str, bytes], list[str]]:
    """The C++ files of an export (file name -> bytes) and notes on what was left out.

    ``name`` is convert.py's ``-n`` (namespace and coefficient file names); the model class
    (``<name without _coefficient>_model.hpp``) is built on the export's chip graph
    (:func:`amct_bridge.espdl.v1.network.network_from_result`).

    Example:
        >>> cpp_outputs(None, "bad name")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: C++ name (cpp) 'bad name' is not a C identifier ...
    """
    check_identifier(name, "C++ name (cpp)")
    if name == "app_main":
        raise ExportError("C++ name (cpp) 'app_main' would overwrite app_main.cpp: choose another")
    files = coefficient_files([layer.preview for layer in result.layers], name)
    try:
        extra, notes = model_files(network_from_result(result), name, example=example)
    except AmctBridgeError as err:
        return files, [f"C++ model class not written: {err}"]
    return {**files, **extra}, notes


def set_model_files(
    in_dir: str | os.PathLike,
    name: str,
    *,
    graph: str | os.PathLike | None = None,
    per_channel: bool = False,
    config_name: str = "config.json",
) -> tuple[dict[str, bytes], list[str]]:
    """Model class (and app) of a convert.py input set, not written: (files, notes).

    The chip graph is ``in_dir/export.json``'s (an export of this package) or the graph JSON
    file ``graph`` (any set, e.g. ESP-DL's tutorial).

    Example:
        >>> set_model_files("/nonexistent", "m")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: /nonexistent/config.json: cannot read: ...
    """
    in_dir = Path(in_dir)
    config, arrays = load_set(in_dir, config_name)
    where = str(graph) if graph is not None else str(in_dir / "export.json")
    doc = graph_from_json(graph if graph is not None else in_dir / "export.json")
    if graph is None:
        if not doc.get("graph"):
            why = doc.get("graph_error", "written before the chip graph existed")
            raise ExportError(f"{where}: no chip graph ({why}): pass --graph FILE")
        doc = doc["graph"]
    net = network_from_parts(doc, config, arrays, per_channel=per_channel, where=where)
    return model_files(net, name)
