"""``amct-bridge espdl-run``: run an ESP-DL v3 ``.espdl`` file in the bit-exact simulator.

``--check`` runs the file's embedded test inputs and compares with its test outputs under the
rule of ESP-DL's ``Model::test()`` on the chip (:mod:`amct_bridge.espdl.v3.check`: int8 exact,
int16 within ±1, float32 within 2e-5, equal exponents): prints a line per output (how many values
were exact, the rule), ``test outputs equal: N/N``, and exits 0 when every output passes, 1
otherwise (naming the first differing output and position; when the file names no target, also
whether another target's rounding would pass). Otherwise
``--input`` gives the inputs (integers as they are; floats are quantized at the input's
exponent with the target's rounding), the outputs are summarised, and ``-o out.npz`` saves them
(the integers under each output's name, its exponent under ``NAME.exponent``). The simulator is
:func:`amct_bridge.espdl.v3.simulate_espdl` (docs/espdl-v3.md).

Example:
    amct-bridge espdl-run model.espdl --check
    amct-bridge espdl-run model.espdl --input x.npy -o out.npz --target esp32p4
"""

from __future__ import annotations

import argparse
import io

import numpy as np

from amct_bridge.commands.common import load_npy
from amct_bridge.errors import AmctBridgeError
from amct_bridge.espdl.v3 import CHIPS, EspdlModel, infer_target, read_espdl, simulate_espdl
from amct_bridge.espdl.v3.check import OutputCheck, check_outputs
from amct_bridge.espdl.v3.simulate import round_float
from amct_bridge.records.atomic import atomic_write_bytes

__all__ = ["quantize_input"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``espdl-run`` subcommand.

    Example:
        >>> p = argparse.ArgumentParser(); register(p.add_subparsers())
        >>> p.parse_args(["espdl-run", "m.espdl", "--check"]).check
        True
    """
    parser = subparsers.add_parser(
        "espdl-run",
        help="run an ESP-DL v3 .espdl model in the bit-exact simulator (--check: its test values)",
        description="Simulate an ESP-DL v3 .espdl model with the integer arithmetic of the "
        "ESP-DL runtime. --check runs the file's embedded test inputs and compares the outputs "
        "with its test outputs (exit 0 all equal, 1 otherwise); without it, --input gives the "
        "inputs and -o saves the outputs.",
    )
    parser.add_argument("file", help=".espdl model (EDL2; EDL1 and PDL packs too)")
    parser.add_argument(
        "--check", action="store_true", help="compare with the file's test outputs (exit 1 if not)"
    )
    parser.add_argument(
        "--input",
        action="append",
        metavar="[NAME=]FILE",
        help=".npy per model input, in input order or NAME=FILE, or one .npz keyed by input name "
        "(default: the file's test inputs). Integers are used as they are, floats are quantized "
        "at the input's exponent",
    )
    parser.add_argument("-o", "--output", help="write the outputs to this .npz")
    parser.add_argument(
        "--target",
        choices=CHIPS,
        metavar="CHIP",
        help="chip to simulate: " + ", ".join(CHIPS) + " (default: the file's target metadata, "
        "else guessed from the filter layouts; esp32s31 runs the esp32p4 kernels, esp32 and "
        "the C chips the c kernels)",
    )
    parser.add_argument("--model-name", help="model to run from a PDL pack")
    parser.set_defaults(func=run)


def quantize_input(
    array: np.ndarray, exponent: int, dtype: np.dtype, half_even: bool
) -> np.ndarray:
    """Integers of a model input: integer arrays unchanged (checked against ``dtype``'s range),
    floats rounded at ``exponent`` (``tool::round`` of the target) and saturated.

    Example:
        >>> quantize_input(np.array([0.5, -0.26, 9.0]), -2, np.dtype(np.int8), False).tolist()
        [2, -1, 36]
        >>> quantize_input(np.array([300]), -2, np.dtype(np.int8), False)
        Traceback (most recent call last):
        ...
        amct_bridge.errors.AmctBridgeError: input integers 300..300 do not fit int8
    """
    info = np.iinfo(dtype)
    if array.dtype.kind in "iu":
        low, high = int(array.min(initial=0)), int(array.max(initial=0))
        if low < info.min or high > info.max:
            raise AmctBridgeError(
                f"input integers {int(array.min())}..{int(array.max())} do not fit {dtype}"
            )
        return array.astype(dtype)
    if array.dtype.kind != "f":
        raise AmctBridgeError(f"input of dtype {array.dtype}: integers or floats expected")
    scaled = (array.astype(np.float64) * 2.0**-exponent).astype(np.float32)
    return np.clip(round_float(scaled, half_even), info.min, info.max).astype(dtype)


def _load_inputs(model: EspdlModel, specs: list[str], half_even: bool) -> dict[str, np.ndarray]:
    names = [v.name for v in model.inputs]
    given: dict[str, np.ndarray] = {}
    positional = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if sep and name in names:
            given[name] = load_npy(path, f"input {name!r}")
            continue
        loaded = load_npy(spec, "the input")
        if isinstance(loaded, dict):
            given.update(loaded)
        else:
            positional.append(loaded)
    free = [n for n in names if n not in given]
    if len(positional) > len(free):
        raise AmctBridgeError(
            f"{model.source}: {len(positional)} input arrays for {len(free)} free inputs "
            f"({', '.join(free) or 'none'})"
        )
    given.update(zip(free, positional, strict=False))
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise AmctBridgeError(
            f"{model.source}: no model input named {', '.join(map(repr, unknown))} "
            f"(inputs: {', '.join(names)})"
        )
    out = {}
    for info in model.inputs:
        if info.name not in given:
            raise AmctBridgeError(f"{model.source}: no value for input {info.name!r}")
        if info.elem_type == 1:  # a float input: the model's QuantizeLinear quantizes it
            out[info.name] = np.asarray(given[info.name], np.float32)
            continue
        dtype = np.dtype(np.int16 if info.elem_type == 5 else np.int8)
        try:
            out[info.name] = quantize_input(given[info.name], info.exponent, dtype, half_even)
        except AmctBridgeError as err:
            raise AmctBridgeError(f"{model.source}: input {info.name!r}: {err}") from None
    return out


def run(args: argparse.Namespace) -> int:
    """Simulate; with ``--check`` compare with the test outputs (0 all equal, 1 otherwise)."""
    model = read_espdl(args.file, args.model_name)
    target, reason = infer_target(model, args.target)
    inputs = None  # the file's test inputs
    if args.check:
        if args.input:
            raise AmctBridgeError("--check runs the file's own test inputs; drop --input")
        if not model.test_inputs or not model.test_outputs:
            raise AmctBridgeError(f"{args.file}: has no test inputs/outputs to --check against")
    elif args.input:
        inputs = _load_inputs(model, args.input, target == "esp32p4")
    result = simulate_espdl(model, inputs, target)
    print(f"{args.file}: target {target} ({reason})")
    for note in result.notes:
        print(f"note: {note}")
    for name, values in result.outputs.items():
        shape = f"output {name!r}: shape {list(values.shape)}, {values.dtype}"
        if values.size == 0:
            print(f"{shape}, empty")
            continue
        if np.issubdtype(values.dtype, np.floating):  # a Softmax output: real values
            print(f"{shape} (real values), range {values.min():.6g}..{values.max():.6g}")
            continue
        exponent = result.exponents.get(name)
        print(f"{shape}, exponent {exponent}, range {int(values.min())}..{int(values.max())}")
    if args.output:
        buffer = io.BytesIO()
        arrays = dict(result.outputs)
        for name in result.outputs:
            if name in result.exponents:
                arrays[f"{name}.exponent"] = np.array(result.exponents[name], np.int64)
        np.savez(buffer, **arrays)
        atomic_write_bytes(args.output, buffer.getvalue())
        print(f"wrote {args.output}")
    if not args.check:
        return 0
    checks = _check(model, result.outputs, result.exponents)
    for check in checks:
        print(check.summary())
    equal = sum(c.ok for c in checks)
    print(f"test outputs equal: {equal}/{len(checks)}")
    if equal == len(checks):
        return 0
    first = next(c.first for c in checks if not c.ok)
    print(f"first difference: {first}")
    if args.target is None and not model.target:
        print(_other_rounding(model, target))
    return 1


def _check(model: EspdlModel, outputs, exponents) -> list[OutputCheck]:
    expected = {t.name: t.data for t in model.test_outputs}
    want = {t.name: t.exponent for t in model.test_outputs if len(t.exponents) == 1}
    return check_outputs(outputs, expected, exponents, want)


def _other_rounding(model: EspdlModel, target: str) -> str:
    """Whether the file passes for the other target family: the file named no target, so the
    one assumed may be wrong (esp-ppq 1.3.12 writes none)."""
    passing = []
    for other in ("esp32s3", "esp32p4", "c"):
        if other == target:
            continue
        try:
            result = simulate_espdl(model, None, other)
        except AmctBridgeError:
            continue
        if all(c.ok for c in _check(model, result.outputs, result.exponents)):
            passing.append(other)
    if passing:
        return (
            f"the file names no target and {target} was assumed; it passes as "
            f"{' and '.join(passing)}: run with --target {passing[0]}"
        )
    return (
        f"the file names no target and {target} was assumed; it fails as every other target too "
        "(--target chooses one)"
    )
