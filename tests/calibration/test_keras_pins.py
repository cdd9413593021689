"""Keras calibration output is pinned: structure exactly, floats within a stated tolerance.

The files in tests/data/calibration_pins/ were written by the calibration code as it was before
the framework-free core (amct_bridge.calibration) was split out of the Keras adapter; see the
README there. Any change in what Keras users get (a factor, a key, the order of entries, a field
present or absent, an integer, a range in the sidecar) fails here with the differing lines.

How they are compared (pin_compare.py): every token of the record text and every key, string and
integer of the sidecar exactly; floats within a relative 1e-6 (``RTOL``), since TensorFlow's CPU
kernels pick their summation order from the processor's instruction set and so give ranges a few
float32 ulps apart on another CPU. A wrong formula moves a factor by far more. The integers a
pin holds must not sit on a rounding edge either, or another CPU could flip them: the tests below
check that a perturbation of 4 x RTOL of every range leaves each offset as pinned, and that the
same cases run with oneDNN limited to other instruction sets give the same pins.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pin_compare import RTOL, json_differences, pin_differences, record_text_differences
from pin_models import CASES, PINS, run_case

from amct_bridge.quant.factors import activation_factors
from amct_bridge.records import load


@pytest.mark.parametrize("case", sorted(CASES))
def test_record_and_sidecar_match_the_pins(case, tmp_path):
    returned = []
    record, sidecar = run_case(case, tmp_path, returned)
    differences = pin_differences(PINS, record, sidecar)
    assert not differences, "\n".join(differences[:40])
    # calibrate() returns the record without reading the file back: it must equal the read-back
    flavor = CASES[case][2].get("flavor", "inner")
    assert returned == [load(record, flavor=flavor)]


def test_pins_cover_every_record_field():
    # the pinned records must exercise what the core builds: folded and unfolded weights,
    # DMQ, shift_bit, skip_fusion, both flavors/key styles, histograms and runtime ranges
    texts = {p.name: p.read_text() for p in PINS.glob("*.record.txt")}
    joined = "\n".join(texts.values())
    for field in ("tensor_balance_factor", "shift_bit", "skip_fusion: true", "scale_w"):
        assert field in joined, field
    assert '"/' not in texts["cnn.record.txt"] and "/convolution" in texts["cnn_tf.record.txt"]
    sidecars = "\n".join(p.read_text() for p in PINS.glob("*.calib.json"))
    for kind in ('"Add"', '"Concatenate"', '"MaxPooling2D"', '"GlobalAveragePooling2D"'):
        assert kind in sidecars, kind


def _layer_of(key: str) -> str:
    """The Keras layer of a record key: itself, or the ``c1_1`` of a TF op key ``m/c1_1/op``."""
    if "/" not in key or not key.startswith("pin_"):
        return key
    return key.split("/")[1].rsplit("_", 1)[0]


@pytest.mark.parametrize("case", ["cnn", "cnn_tf", "branchy"])
def test_pinned_offsets_are_away_from_rounding_edges(case):
    """offset_d = -128 - round(min / scale_d): a pin whose ratio sits near .5 could round the
    other way on another CPU. Each offset must survive its range moved by 4 x RTOL of the
    range's largest bound, in every direction, and come from that sidecar range."""
    flavor = CASES[case][2].get("flavor", "inner")
    record = load(PINS / f"{case}.record.txt", flavor=flavor)
    layers = json.loads((PINS / f"{case}.record.txt.calib.json").read_text())["layers"]
    checked = 0
    for key, factors in record.layers.items():
        rng = layers[_layer_of(key)]["input"]
        lo, hi = rng["min"], rng["max"]
        assert activation_factors(lo, hi) == (pytest.approx(factors.scale_d), factors.offset_d)
        step = 4 * RTOL * max(abs(lo), abs(hi))
        for d_lo in (-step, step):
            for d_hi in (-step, step):
                assert activation_factors(lo + d_lo, hi + d_hi)[1] == factors.offset_d, key
        checked += 1
    assert checked == len(record.layers) >= 3


def test_dmq_offsets_come_from_exact_ranges():
    """DMQ's balanced ranges are not in the sidecar, so the edge test above cannot recompute
    them. Its two offsets are portable by construction instead: c1 reads the model input (a
    min/max reduction is exact on every CPU) and tr a ReLU output (min 0: offset -128)."""
    record = load(PINS / "dmq.record.txt")
    layers = json.loads((PINS / "dmq.record.txt.calib.json").read_text())["layers"]
    assert layers["tr"]["input"]["min"] == 0.0 and record.layers["tr"].offset_d == -128
    factory, seed, _ = CASES["dmq"]
    from pin_models import _data

    x = _data(factory().input_shape[1:], seed)[:24]  # batch_num 3 of batch 8
    c1 = layers["c1"]["input"]
    assert (c1["observed_min"], c1["observed_max"]) == (float(x.min()), float(x.max()))


# Instruction sets oneDNN can be held to on any x86-64 CPU this suite runs on; each picks other
# kernels (and summation orders) than the default. TF_ENABLE_ONEDNN_OPTS=0 uses Eigen instead.
_KERNELS = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    "eigen": {"TF_ENABLE_ONEDNN_OPTS": "0"},
}

_RUN = """
import sys
sys.path.insert(0, {here!r})
from pin_models import CASES, run_case
for case in sorted(CASES):
    run_case(case, {out!r})
"""


@pytest.mark.parametrize("kernels", sorted(_KERNELS))
def test_pins_hold_with_other_kernels(kernels, tmp_path):
    """The same cases with TensorFlow's other kernels (another CPU, as far as one machine can
    show it) give floats that differ from the pins but stay within RTOL, and the same rest."""
    env = {**os.environ, **_KERNELS[kernels]}
    code = _RUN.format(here=str(Path(__file__).parent), out=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    differences = []
    for case in sorted(CASES):
        record = tmp_path / f"{case}.record.txt"
        differences += pin_differences(PINS, record, Path(f"{record}.calib.json"))
    assert not differences, "\n".join(differences[:40])


def test_the_comparison_catches_what_the_pins_guard():
    """Mutations of a pinned record and sidecar that a portable comparison must still fail."""
    text = (PINS / "cnn.record.txt").read_text()
    assert record_text_differences(text, text) == []
    few_ulps = text.replace("scale_d: 0.0303536206", "scale_d: 0.0303536236")  # 1e-7 relative
    assert record_text_differences(text, few_ulps) == []
    mutations = {
        "a float off by 1e-5": text.replace("0.0303536206", "0.0303539206"),
        "an integer": text.replace("offset_d: 3", "offset_d: 4"),
        "a key": text.replace('key: "c2"', 'key: "c3"'),
        "a field": text.replace("offset_d: 3\n", "", 1),
        "a field renamed": text.replace("offset_d: 3", "offset_w: 3", 1),
        "a flag": text.replace("skip_fusion: true", "skip_fusion: false"),
        "indentation": text.replace("    scale_d", "  scale_d", 1),
    }
    for what, mutated in mutations.items():
        assert mutated != text, what
        assert record_text_differences(text, mutated), what
    side = json.loads((PINS / "branchy.record.txt.calib.json").read_text())
    assert json_differences(side, json.loads(json.dumps(side))) == []
    layer = side["layers"]["dw"]["input"]
    bumped = json.loads(json.dumps(side))
    bumped["layers"]["dw"]["input"]["min"] = layer["min"] * (1 + 1e-7)
    assert json_differences(side, bumped) == []
    for what, change in {
        "a range": lambda s: s["layers"]["dw"]["input"].update(min=layer["min"] * 1.0001),
        "batches": lambda s: s.update(batches=2),
        "a kind": lambda s: s["layers"]["dw"].update(kind="Conv2D"),
        "a layer dropped": lambda s: s["layers"].pop("bn_dw"),
        "key order": lambda s: s["layers"].update({"dw": s["layers"].pop("dw")}),
    }.items():
        mutated = json.loads(json.dumps(side))
        change(mutated)
        assert json_differences(side, mutated), what
