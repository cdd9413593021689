"""Checks shared by the ESP-DL fuzz targets (SourceLayer lists and Keras models): the written
set is what the export computed, convert.py's job (the .cpp/.hpp writer) works on it, and the
chip simulator runs the export in memory and from disk with the same integers.

Example:
    >>> from fuzz_checks import check_written, check_chip  # used after a successful export
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
from fuzz_support import attempt

from amct_bridge.espdl import load_set, preview_set, tool_output
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.espdl.v1.cpp_coefficients import convert_set


def check_written(result, out: Path, options: dict) -> None:
    """The set on disk is what the export computed, and convert.py's job works on it."""
    assert all(p.parent == out for p in out.rglob("*")), "a file escaped the output directory"
    config, arrays = load_set(out)
    assert config == result.config
    assert json.loads((out / "names.json").read_text()) == result.names
    per_channel = options["granularity"] == "per-channel"
    again, err = attempt(
        "espdl.preview(set)",
        preview_set,
        config,
        arrays,
        target=options["target"],
        per_channel=per_channel,
        kind="medium",
    )
    assert err is None, err  # the exporter previewed every entry before writing it
    assert tool_output(again) == tool_output([layer.preview for layer in result.layers])
    with tempfile.TemporaryDirectory() as tmp:
        written, err = attempt(
            "espdl.convert_set",
            convert_set,
            out,
            "coeffs",
            tmp,
            target=options["target"],
            per_channel=per_channel,
            kind="medium",
        )
        if err is None:
            assert sorted(p.name for p in written) == ["coeffs.cpp", "coeffs.hpp"]
            cpp = (Path(tmp) / "coeffs.cpp").read_text()
            assert all(f"{name}_filter" in cpp for name in config)


def check_chip(result, out: Path, x: np.ndarray, target: str) -> None:
    """The simulator runs the export, or says (ExportError) why it cannot."""
    if result.graph is None:
        assert result.graph_error
        return
    with warnings.catch_warnings():  # numpy's overflow / invalid-cast warnings: garbage integers
        warnings.simplefilter("error", RuntimeWarning)
        mem, err = attempt("espdl.simulate_chip", simulate_chip, result, x, target, kind="medium")
        disk, err2 = attempt(
            "espdl.simulate_chip(dir)", simulate_chip, out, x, target, kind="medium"
        )
    assert (err is None) == (err2 is None), (err, err2)
    if err is None:
        assert list(mem.layers) == list(disk.layers)
        for name, tensor in mem.layers.items():
            assert np.array_equal(tensor.values, disk.layers[name].values), name
            assert tensor.exponent == disk.layers[name].exponent, name
            bits = 8 if result.feature_type == "s8" else 16
            assert np.all(np.abs(tensor.values) <= 2 ** (bits - 1)), name
