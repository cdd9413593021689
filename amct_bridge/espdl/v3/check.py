"""Compare simulated outputs with a file's test outputs under the chip's own rule.

ESP-DL's ``dl::Model::test()`` (``dl/model/src/dl_model_base.cpp``, ``TensorBase::equal`` in
``dl_tensor_base.cpp``) checks each test output's element type, shape and exponent, then its
values: int16 within ±1 (esp-ppq computes int16 references in float32, so a value at an exact
half step can be one off), every other type within an absolute 2e-5, which makes int8 exact and
float32 outputs (Softmax probabilities) equal to 2e-5; a NaN matches only a NaN. This module
applies that rule and counts how many values were exact, so that ``espdl-run --check`` says
what it compared instead of casting floats to integers.

Example:
    >>> r = check_output("y", np.array([3, 5], np.int16), np.array([3, 4], np.int16))
    >>> r.ok, r.exact, r.size, r.rule
    (True, 1, 2, 'within ±1')
    >>> check_output("p", np.float32([0.25, 0.75]), np.float32([0.1, 0.1])).ok
    False
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["FLOAT_TOLERANCE", "INT16_TOLERANCE", "OutputCheck", "check_output", "check_outputs"]

#: ``dl::Model::test()``'s epsilon for int16 outputs (``1 + 1e-5``): ±1.
INT16_TOLERANCE = 1
#: ``dl::Model::test()``'s absolute epsilon for every other type (int8 exact, float32 2e-5).
FLOAT_TOLERANCE = 2e-5


@dataclass
class OutputCheck:
    """The result of comparing one output: the rule, how many values were exact or within it.

    Example:
        >>> print(OutputCheck("y", "int8", 4, 4, 4, "compared exactly", True, None).summary())
        output 'y' (int8, compared exactly): 4/4 exact
        >>> print(OutputCheck("z", "int16", 9, 7, 9, "within ±1", True, None).summary())
        output 'z' (int16, within ±1): 7/9 exact, 9/9 within ±1
    """

    name: str
    dtype: str
    size: int
    exact: int
    within: int
    rule: str
    ok: bool
    first: str | None

    def summary(self) -> str:
        """One line: the output, its type and rule, how many values were exact and within it."""
        line = f"output {self.name!r} ({self.dtype}, {self.rule}): {self.exact}/{self.size} exact"
        if self.rule != "compared exactly":
            line += f", {self.within}/{self.size} {self.rule}"
        return line


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in float32 units in the last place (sign-magnitude order)."""
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.abs(ia - ib).max(initial=0))


def check_output(
    name: str,
    got: np.ndarray,
    want: np.ndarray,
    got_exponent: int | None = None,
    want_exponent: int | None = None,
) -> OutputCheck:
    """Compare one simulated output with its expected values as ``dl::Model::test()`` does.

    The rule follows the expected tensor's type: int16 ±1, float32 absolute 2e-5 (NaN only
    against NaN), any other integer type exact. Exponents, when both are given, must be equal.

    Example:
        >>> print(check_output("y", np.array([1, 2], np.int8), np.array([1, 3], np.int8)).first)
        output 'y': 1 of 2 values differ; first at index (1,): simulated 2, expected 3
    """
    want = np.asarray(want)
    got = np.asarray(got)
    kind = "float32" if want.dtype.kind == "f" else str(want.dtype)
    if want.dtype.kind == "f":
        rule = f"within {FLOAT_TOLERANCE:g}"
    elif want.dtype == np.int16:
        rule = f"within ±{INT16_TOLERANCE}"
    else:
        rule = "compared exactly"

    def fail(why: str) -> OutputCheck:
        return OutputCheck(name, kind, int(want.size), 0, 0, rule, False, f"output {name!r}: {why}")

    if got.size != want.size:
        return fail(f"simulated shape {list(got.shape)}, expected {list(want.shape)}")
    if (got.dtype.kind == "f") != (want.dtype.kind == "f"):
        return fail(f"simulated {got.dtype}, expected {want.dtype}")
    if got_exponent is not None and want_exponent is not None and got_exponent != want_exponent:
        return fail(f"simulated exponent {got_exponent}, expected {want_exponent}")
    got = got.reshape(want.shape)
    if want.dtype.kind == "f":
        g, w = got.astype(np.float64), want.astype(np.float64)
        both_nan = np.isnan(g) & np.isnan(w)
        exact = (g == w) | both_nan
        with np.errstate(invalid="ignore"):
            close = (np.abs(g - w) <= FLOAT_TOLERANCE) | both_nan
    else:
        delta = np.abs(got.astype(np.int64) - want.astype(np.int64))
        exact = delta == 0
        close = delta <= (INT16_TOLERANCE if want.dtype == np.int16 else 0)
    first = None
    if not close.all():
        where = tuple(int(i) for i in np.argwhere(~close)[0])
        have, expect = got[where].item(), want[where].item()
        first = (
            f"output {name!r}: {int((~close).sum())} of {close.size} values differ; first at "
            f"index {where}: simulated {have}, expected {expect}"
        )
        if want.dtype.kind == "f":
            first += f" (largest difference {_ulps(got, want)} ulps)"
    return OutputCheck(
        name, kind, int(want.size), int(exact.sum()), int(close.sum()), rule, first is None, first
    )


def check_outputs(
    got: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    got_exponents: Mapping[str, int] | None = None,
    expected_exponents: Mapping[str, int] | None = None,
) -> list[OutputCheck]:
    """:func:`check_output` for every expected output, in the file's order.

    Example:
        >>> want = {"y": np.int8([1]), "z": np.int8([0])}
        >>> [c.ok for c in check_outputs({"y": np.int8([1])}, want)]
        [True, False]
    """
    results = []
    for name, want in expected.items():
        have = got.get(name)
        if have is None:
            w = np.asarray(want)
            results.append(
                OutputCheck(
                    name,
                    str(w.dtype),
                    int(w.size),
                    0,
                    0,
                    "",
                    False,
                    f"output {name!r}: not computed",
                )
            )
            continue
        results.append(
            check_output(
                name,
                have,
                want,
                (got_exponents or {}).get(name),
                (expected_exponents or {}).get(name),
            )
        )
    return results
