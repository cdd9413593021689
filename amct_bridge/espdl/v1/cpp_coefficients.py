"""Write ``NAME.cpp`` + ``NAME.hpp`` exactly as ESP-DL v1.1.0's convert.py does, from any Python.

convert.py is a closed binary for CPython 3.6-3.9. Its integers are predicted by
:mod:`amct_bridge.espdl.v1.preview`; this module renders them in the tool's text, byte for byte
(checked against every real output in ``tests/data/espdl_v1_golden/text``):

- ``NAME.hpp``: ``#pragma once``, ``<stdint.h>``, ``"dl_constant.hpp"``, then in
  ``namespace NAME`` one getter declaration per constant (filter, bias, activation, per layer in
  config order);
- ``NAME.cpp``: per layer, the per-channel filter exponents (``-q 1``), the elements in the chip's
  order (16-byte aligned, 512 values a line, ``%6d`` joined by ``", "``), the
  ``Filter``/``Bias``/``Activation`` constant and its getter (body indented by four spaces and a
  tab, as the tool does).

Names are pasted into C++ and file names, so NAME and every layer name must be C identifiers
(convert.py does not check; we refuse with the offending name).

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.v1.preview import preview_layer
    >>> p = preview_layer("fc", {"operation": "fully_connected", "feature_type": "s8"},
    ...                   {"fc_filter": np.full((1, 1, 1, 2), 0.5, np.float32)})
    >>> print(coefficient_text([p], "m_coefficient")[1])  # doctest: +NORMALIZE_WHITESPACE
    #pragma once
    #include <stdint.h>
    #include "dl_constant.hpp"
    namespace m_coefficient
    {
        const dl::Filter<int8_t> *get_fc_filter();
    }
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.naming import CPP_KEYWORDS
from amct_bridge.espdl.v1 import spec
from amct_bridge.espdl.v1.preview import LayerPreview, QuantizedTensor, load_set, preview_set
from amct_bridge.records.atomic import atomic_write_files

#: Values per line in the tool's element arrays.
VALUES_PER_LINE = 512

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INDENT = "    "


def check_identifier(name: str, what: str) -> None:
    """Refuse a name convert.py would paste into C++ (or a file name) unusable.

    Example:
        >>> check_identifier("conv.1", "layer name")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: layer name 'conv.1' is not a C identifier ...
    """
    if not isinstance(name, str) or not _IDENT.match(name) or name in CPP_KEYWORDS:
        raise ExportError(
            f"{what} {name!r} is not a C identifier ([A-Za-z_][A-Za-z0-9_]*, no C++ keyword): "
            "it becomes part of C++ names and file names"
        )


def _elements(values: np.ndarray) -> str:
    """The tool's element list: ``%6d`` values joined by ``", "``, 512 a line, closed by ``};``."""
    items = [f"{int(v):6d}" for v in np.asarray(values).ravel()]
    lines = [
        f"{_INDENT * 2}" + ", ".join(items[i : i + VALUES_PER_LINE])
        for i in range(0, len(items), VALUES_PER_LINE)
    ]
    return ",\n".join(lines) + "};"


def _array(ctype: str, name: str, values: np.ndarray) -> str:
    return (
        f"{_INDENT}const static __attribute__((aligned(16))) {ctype} {name}[] = {{\n"
        f"{_elements(values)}\n\n"
    )


def _constant(kind: str, ctype: str, name: str, args: str) -> str:
    return (
        f"{_INDENT}const static {kind}<{ctype}> {name}({args});\n"
        f"{_INDENT}const {kind}<{ctype}> *get_{name}()\n"
        f"{_INDENT}{{\n"
        f"{_INDENT}\treturn &{name};\n"
        f"{_INDENT}}}\n\n"
    )


def _shape(shape: tuple[int, ...]) -> str:
    return "{" + ", ".join(str(int(s)) for s in shape) + "}"


def _filter(t: QuantizedTensor) -> tuple[str, str]:
    text = ""
    if isinstance(t.exponent, np.ndarray):
        exps = ", ".join(str(int(e)) for e in t.exponent)
        text += f"{_INDENT}const static int8_t {t.name}_exponent[] = {{{exps}}};\n"
        exp = f"{t.name}_exponent, {t.exponent.size}"
    else:
        exp = str(int(t.exponent))
    text += _array(t.ctype, f"{t.name}_element", t.values)
    args = f"{t.name}_element, {exp}, {_shape(t.shape)}, {{1, 1}}"
    return text + _constant("Filter", t.ctype, t.name, args), f"Filter<{t.ctype}>"


def _bias(t: QuantizedTensor) -> tuple[str, str]:
    exp = (
        spec.PER_CHANNEL_BIAS_PLACEHOLDER if isinstance(t.exponent, np.ndarray) else int(t.exponent)
    )
    text = _array(t.ctype, f"{t.name}_element", t.values)
    args = f"{t.name}_element, {exp}, {{{t.values.size},}}"
    return text + _constant("Bias", t.ctype, t.name, args), f"Bias<{t.ctype}>"


def _activation(p: LayerPreview) -> tuple[str, str]:
    name, ctype, text = f"{p.name}_activation", spec.CTYPE[p.feature_type], ""
    args = str(p.activation_type)
    a = p.activation
    if a is not None:
        text = _array(a.ctype, f"{name}_element", a.values)
        args += f", {name}_element, {int(a.exponent)}, {{{a.values.size},}}"
    return text + _constant("Activation", ctype, name, args), f"Activation<{ctype}>"


def coefficient_text(previews: list[LayerPreview], name: str) -> tuple[str, str]:
    """The ``(NAME.cpp, NAME.hpp)`` texts convert.py writes for ``previews`` (config order).

    Example:
        >>> from amct_bridge.espdl.v1.preview import preview_layer
        >>> p = preview_layer("c", {"operation": "conv2d", "feature_type": "s16"},
        ...                   {"c_filter": np.ones((1, 1, 1, 1), np.float32)})
        >>> [line for line in coefficient_text([p], "m")[0].splitlines() if "Filter" in line][0]
        '    const static Filter<int16_t> c_filter(c_filter_element, -14, {1, 1, 1, 1}, {1, 1});'
    """
    check_identifier(name, "coefficient name (-n)")
    body, decls = [], []
    for p in previews:
        check_identifier(p.name, "layer name")
        parts = [(_filter(p.filter), p.filter.name)]
        if p.bias is not None:
            parts.append((_bias(p.bias), p.bias.name))
        if p.activation_type is not None:
            parts.append((_activation(p), f"{p.name}_activation"))
        for (text, kind), const in parts:
            body.append(text)
            decls.append(f"{_INDENT}const dl::{kind} *get_{const}();\n")
    cpp = f'#include "{name}.hpp"\nusing namespace dl;\n\nnamespace {name}\n{{\n'
    cpp += "".join(body) + "}\n"
    hpp = '#pragma once\n\n#include <stdint.h>\n#include "dl_constant.hpp"\n\n'
    hpp += f"namespace {name}\n{{\n" + "".join(decls) + "}\n"
    return cpp, hpp


def coefficient_files(previews: list[LayerPreview], name: str) -> dict[str, bytes]:
    """``{"NAME.cpp": ..., "NAME.hpp": ...}`` as bytes (ASCII, ``\\n`` line ends, as the tool).

    Example:
        >>> from amct_bridge.espdl.v1.preview import preview_layer
        >>> p = preview_layer("c", {"operation": "conv2d", "feature_type": "s8"},
        ...                   {"c_filter": np.ones((1, 1, 1, 1), np.float32)})
        >>> sorted(coefficient_files([p], "m"))
        ['m.cpp', 'm.hpp']
    """
    cpp, hpp = coefficient_text(previews, name)
    return {f"{name}.cpp": cpp.encode("ascii"), f"{name}.hpp": hpp.encode("ascii")}


def _check_unreproduced_keys(config: dict) -> None:
    for layer, entry in config.items():
        if not isinstance(entry, dict):
            raise ExportError(f"config.json layer {layer!r}: expected an object, got {entry!r}")
        odd = [k for k in ("stride", "dilation") if k in entry]
        if odd:
            raise ExportError(
                f"config.json layer {layer!r}: key {odd[0]!r} is undocumented (convert.py evals "
                "it) and its output is not reproduced; remove it (strides belong in the model "
                "class, not in the coefficients)"
            )


def _check_arrays(config: dict, arrays: dict[str, np.ndarray], in_dir: Path) -> None:
    """Refuse what convert.py turns into broken C++ (integer arrays -> ``None`` exponents) or
    an exception without a file name (NaN)."""
    for layer in config:
        for suffix in ("filter", "kernel", "bias", "activation"):
            arr = arrays.get(f"{layer}_{suffix}")
            if arr is None:
                continue
            path = in_dir / f"{layer}_{suffix}.npy"
            if not np.issubdtype(arr.dtype, np.floating):
                raise ExportError(
                    f"{path}: dtype {arr.dtype}, expected float32 (convert.py writes a `None` "
                    "exponent for integer arrays)"
                )
            if not np.all(np.isfinite(arr)):
                raise ExportError(f"{path}: contains NaN or Inf")


def set_files(
    in_dir: str | os.PathLike,
    name: str,
    *,
    target: str = "esp32",
    per_channel: bool = False,
    config_name: str = "config.json",
) -> dict[str, bytes]:
    """``NAME.cpp`` / ``NAME.hpp`` of a convert.py input set, computed and checked, not written.

    Example:
        >>> set_files("/nonexistent", "m")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: /nonexistent/config.json: cannot read: ...
    """
    check_identifier(name, "coefficient name (-n)")
    config, arrays = load_set(in_dir, config_name)
    _check_unreproduced_keys(config)
    _check_arrays(config, arrays, Path(in_dir))
    previews = preview_set(config, arrays, target=target, per_channel=per_channel)
    return coefficient_files(previews, name)


def write_files(out_dir: str | os.PathLike, files: dict[str, bytes]) -> list[Path]:
    """Write ``files`` into ``out_dir`` (created if its parent exists), atomically as one set.

    Example:
        >>> write_files("/nonexistent/x", {"a.cpp": b""})
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: /nonexistent/x: not a directory, and its parent ...
    """
    out = Path(out_dir)
    if not out.is_dir():
        if out.exists() or not out.parent.is_dir():
            raise ExportError(f"{out}: not a directory, and its parent does not exist")
        out.mkdir()
    # one set: a .hpp never declares what the .cpp beside it (an older one) does not define
    atomic_write_files({out / file_name: data for file_name, data in files.items()})
    return [out / file_name for file_name in files]


def convert_set(
    in_dir: str | os.PathLike,
    name: str,
    out_dir: str | os.PathLike,
    *,
    target: str = "esp32",
    per_channel: bool = False,
    config_name: str = "config.json",
) -> list[Path]:
    """convert.py's job: read ``in_dir`` (config.json + npy), write ``out_dir/NAME.{cpp,hpp}``.

    Everything is computed and checked before anything is written; each file is replaced
    atomically. ``out_dir`` is created if its parent exists; other files in it are left alone.

    Example:
        >>> convert_set("/nonexistent", "m", "/tmp")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: /nonexistent/config.json: cannot read: ...
    """
    files = set_files(in_dir, name, target=target, per_channel=per_channel, config_name=config_name)
    return write_files(out_dir, files)
