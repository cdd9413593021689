"""Compare calibration outputs with their pins: structure exactly, floats within a tolerance.

TensorFlow's CPU kernels (oneDNN, Eigen) choose their code path, and so their summation order,
from the processor's instruction set. The same calibration run gives activation ranges a few
float32 ulps apart on two CPUs (seen: ``-16.188982009887695`` against ``-16.188980102539062``,
1.2e-7 relative). Everything else a pin guards is compared exactly:

- the record text token by token: keys, field names, their order, which fields are present, the
  braces of the layout; integers (``offset_d``, ``offset_w``, ``shift_bit``) and booleans equal;
- the sidecar JSON: the same keys in the same order, the same strings and integers (``batches``,
  ``kind``, ``algorithm``).

Floats are equal within ``RTOL`` = 1e-6 relative: eight float32 ulps, and about ten times what
two instruction sets were seen to give (the fixed 6 tests of the first report differed by at most
1.3e-7). A wrong formula is off by far more than that (a range from another layer, a clip ratio
one search step away: 1e-3 and up). A sidecar range is compared relative to the largest bound of
its tensor, not to the bound itself: a minimum near zero comes from a sum of terms as large as the
tensor's values, so its error is a fraction of those.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

#: relative tolerance for floats that a TensorFlow reduction computed (see the module docstring)
RTOL = 1e-6

# A text-format token: a quoted string, a number, a word or a single punctuation mark.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|\w+|\S')
_FLOAT = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+[eE][-+]?\d+|\d+\.?\d*[eE][-+]?\d+)$")
_INT = re.compile(r"[-+]?\d+$")


def close(a: float, b: float, scale: float | None = None, rtol: float = RTOL) -> bool:
    """True when ``a`` and ``b`` differ by at most ``rtol`` of ``scale`` (default: the larger).

    >>> close(0.0328819, 0.0328819044), close(1.0, 1.001)
    (True, False)
    """
    ref = max(abs(a), abs(b)) if scale is None else scale
    return abs(a - b) <= rtol * ref or a == b


def record_text_differences(expected: str, actual: str, rtol: float = RTOL) -> list[str]:
    """Where two record texts differ: every token equal, floats within ``rtol``; [] if none.

    >>> record_text_differences("scale_d: 0.0328819\\n", "scale_d: 0.0328819044\\n")
    []
    >>> record_text_differences("offset_d: 3\\n", "offset_d: 4\\n")
    ['line 1: 3 -> 4 (an integer: exact)']
    """
    out: list[str] = []
    exp_lines, act_lines = expected.splitlines(), actual.splitlines()
    if len(exp_lines) != len(act_lines):
        out.append(f"{len(exp_lines)} lines pinned, {len(act_lines)} now")
    for number, (e_line, a_line) in enumerate(zip(exp_lines, act_lines, strict=False), 1):
        e_tok, a_tok = _TOKEN.findall(e_line), _TOKEN.findall(a_line)
        # the indentation is layout too
        if (
            len(e_tok) != len(a_tok)
            or e_line[: len(e_line) - len(e_line.lstrip())]
            != a_line[: len(a_line) - len(a_line.lstrip())]
        ):
            out.append(f"line {number}: {e_line.strip()!r} -> {a_line.strip()!r}")
            continue
        for e, a in zip(e_tok, a_tok, strict=True):
            if e == a:
                continue
            if _FLOAT.match(e) and _FLOAT.match(a):
                if not close(float(e), float(a), rtol=rtol):
                    out.append(f"line {number}: {e} -> {a} (a float: rtol {rtol:g})")
            elif _INT.match(e) and _INT.match(a):
                out.append(f"line {number}: {e} -> {a} (an integer: exact)")
            else:
                out.append(f"line {number}: {e_line.strip()!r} -> {a_line.strip()!r}")
    return out


def _range_scale(node: dict) -> float | None:
    """The largest bound of a sidecar tensor range ({"min", "max", ...}), else None."""
    if "min" in node and "max" in node:
        values = [abs(v) for v in node.values() if isinstance(v, float)]
        return max(values, default=0.0)
    return None


def json_differences(
    expected: object,
    actual: object,
    rtol: float = RTOL,
    where: str = "",
    scale: float | None = None,
) -> list[str]:
    """Where two parsed JSON values differ: same keys in the same order, same strings, ints and
    booleans, floats within ``rtol`` (of their range's largest bound inside a tensor range).

    >>> json_differences({"r": {"min": -1e-9, "max": 4.0}}, {"r": {"min": 2e-7, "max": 4.0}})
    []
    >>> json_differences({"batches": 3}, {"batches": 2})
    ['/batches: 3 -> 2']
    """
    if isinstance(expected, dict) and isinstance(actual, dict):
        if list(expected) != list(actual):
            return [f"{where or '/'}: keys {list(expected)} -> {list(actual)}"]
        inner = _range_scale(expected)
        out: list[str] = []
        for key in expected:
            out += json_differences(expected[key], actual[key], rtol, f"{where}/{key}", inner)
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} items -> {len(actual)}"]
        out = []
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            out += json_differences(e, a, rtol, f"{where}[{i}]", scale)
        return out
    if type(expected) is float and type(actual) is float:
        if math.isfinite(expected) and close(expected, actual, scale, rtol):
            return []
        if expected == actual:
            return []
    elif type(expected) is type(actual) and expected == actual:
        return []
    return [f"{where}: {expected!r} -> {actual!r}"]


def pin_differences(pinned: Path, record: Path, sidecar: Path) -> list[str]:
    """Differences of a record and its sidecar from the pinned pair of the same names."""
    out = [
        f"{record.name}: {d}"
        for d in record_text_differences(
            (pinned / record.name).read_text(encoding="utf-8"), record.read_text(encoding="utf-8")
        )
    ]
    expected = json.loads((pinned / sidecar.name).read_text(encoding="utf-8"))
    actual = json.loads(sidecar.read_text(encoding="utf-8"))
    out += [f"{sidecar.name}: {d}" for d in json_differences(expected, actual)]
    return out
