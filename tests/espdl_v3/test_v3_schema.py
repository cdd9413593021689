"""A damaged ``.espdl`` is refused before the simulator computes (issue 32): each case is one of
the issue's examples, made from a file of Espressif's operator suite and run the way users run
it, ``amct-bridge espdl-run FILE --check``. Every answer is exit 2 with one line naming the file,
the node or tensor and the field; none is an internal error, none allocates what the file asks.
"""

from __future__ import annotations

import math
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from amct_bridge.espdl.v3.reader import read_espdl
from amct_bridge.espdl.v3.schema import MAX_ELEMENTS, SCHEMAS, Attr, check_model
from amct_bridge.espdl.v3.simulate import supported_ops
from amct_bridge.espdl.v3.writer import espdl_bytes

SUITE = Path(__file__).resolve().parents[1] / "data" / "espdl_v3" / "ops_test" / "esp32s3_8"
CONV = SUITE / "Conv" / "08_depthwise_conv2d_ishap_1_16_3_3_kshap_16_1_3_3_relu_s8.espdl"
GEMM = SUITE / "Gemm" / "00_linear_ishap_1_16_kshap_16_16_relu_s8.espdl"
POOL = SUITE / "MaxPool" / "04_max_pooling_ishap_1_16_3_3_kshape_5_5_s8.espdl"
PAD = SUITE / "Pad" / "00_pad_ishap_64_pads_3_3_constant_1_s8.espdl"
RESIZE = SUITE / "Resize" / "10_resize_ishap_1_96_5_scale_2_nearest_s8.espdl"


def _node(model, op_type):
    return next(n for n in model.nodes if n.op_type == op_type)


def _attr(name, value, op_type=None):
    def change(model):
        node = _node(model, op_type) if op_type else model.nodes[0]
        node.attributes[name] = value
        node.attribute_types.pop(name, None)

    return change


def _initializer(op_type, index, data):
    def change(model):
        name = _node(model, op_type).inputs[index]
        model.initializers[name].data = np.asarray(data, model.initializers[name].data.dtype)

    return change


def _inputs(names):
    def change(model):
        model.nodes[0].inputs = names

    return change


def _test_input(data):
    def change(model):
        model.test_inputs[0].data = data

    return change


def _exponent(value):
    def change(model):
        model.outputs[0].exponents = [value]

    return change


CASES = [
    # (seed file, change, what the error line must say)
    (CONV, _attr("pads", [10000] * 4), "padded input of shape [1, 20003, 20003, 16]"),
    (CONV, _attr("pads", [-1, 0, 0, 0]), "attribute 'pads' is [-1, 0, 0, 0], expected integers"),
    (CONV, _attr("pads", [math.nan] * 4), "attribute 'pads' is [nan, nan, nan, nan], expected"),
    (CONV, _attr("strides", [0, 1]), "attribute 'strides' is [0, 1], expected integers in 1.."),
    (CONV, _attr("dilations", "2"), "'dilations' is '2', expected an integer or a list of int"),
    (CONV, _attr("group", math.nan), "attribute 'group' is nan, expected an integer"),
    (CONV, _attr("kernel_shape", "3"), "'kernel_shape' is '3', expected an integer or a list"),
    (CONV, _attr("quant_type", ["S8"]), "attribute 'quant_type' is ['S8'], expected a string"),
    (CONV, _attr("dilations", [9, 9]), "the dilated kernel is larger than the padded input"),
    (CONV, _initializer("Conv", 1, np.ones(4)), "dims [4], expected [kernel..., C, N]"),
    (POOL, _attr("kernel_shape", [60000] * 2, "MaxPool"), "kernel_shape [60000, 60000] is larger"),
    (POOL, _attr("strides", 0, "MaxPool"), "attribute 'strides' is 0, expected an integer in 1.."),
    (PAD, _initializer("Pad", 1, [10**8, 10**8]), "output of shape [200000064] ("),
    (PAD, _initializer("Pad", 1, [10**9, 10**9]), "output of shape [2000000064] ("),
    (RESIZE, _initializer("Resize", 2, [1, 1, 10**6]), "output of shape [1, 5000000, 96]"),
    (GEMM, _inputs([]), "has 0 inputs, expected 2..3"),
    (GEMM, _inputs(["", "x"]), "its first input has no name"),
    (GEMM, _test_input(np.zeros((1, 0), np.int8)), "holds no values (shape [1, 0])"),
    (GEMM, _exponent(2**33), "exponent 8589934592, expected -64..64"),
    (GEMM, _exponent(2**63 - 1), "expected -64..64"),
]


@pytest.mark.parametrize(("seed", "change", "message"), CASES)
def test_damaged_files_get_one_clean_line(tmp_path, seed, change, message):
    model = read_espdl(seed)
    change(model)
    path = tmp_path / "damaged.espdl"
    path.write_bytes(espdl_bytes(model))
    # a child under 1 GiB of address space: the pads of 10^9 allocated 3 GB before the fix
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2**30 + 2**29,) * 2);"
        "from amct_bridge import cli; sys.exit(cli.main(sys.argv[1:]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, "espdl-run", str(path), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, run.stderr
    assert len(lines) == 1 and str(path) in lines[0], run.stderr
    assert message in lines[0], lines[0]


def test_every_simulated_op_has_a_schema():
    """A new op module without a schema would skip the checks: the two lists are one."""
    assert sorted(SCHEMAS) == supported_ops()


def test_every_suite_file_passes_the_checks():
    """The checks refuse nothing Espressif's suite holds (every op, both bit widths, 4 chips)."""
    files = sorted(SUITE.parent.rglob("*.espdl"))
    assert len(files) > 500
    for path in files:
        check_model(read_espdl(path))


@pytest.mark.parametrize(
    ("spec", "good", "bad"),
    [
        (Attr("int", 0, 1), [0, 1], [2, -1, 1.0, True, "1", None, [1]]),
        (Attr("float"), [0.0, -1.5, 3], [math.nan, math.inf, "1.0", [1.0]]),
        (Attr("int_or_ints", 1), [1, [1, 2], []], [0, [0], [1.5], "1"]),
        (Attr("ints", length=(2, 2)), [[1, 2]], [[1], [1, 2, 3], 1]),
        (Attr("string", choices=("a",)), ["a"], ["b", 1, ["a"]]),
        (Attr("strings"), [["a", "b"], []], ["a", [1]]),
    ],
)
def test_attribute_specs_take_and_refuse(spec, good, bad):
    for value in good:
        assert spec.problem(value) is None, value
    for value in bad:
        assert spec.problem(value), value


def test_budget_is_above_any_chip_tensor():
    """The refusal bound is not a bound on real models: 32 MB (the largest PSRAM) fits."""
    assert MAX_ELEMENTS >= 32 * 2**20
    assert resource.getrlimit(resource.RLIMIT_AS)  # the child's limit is set with this module
