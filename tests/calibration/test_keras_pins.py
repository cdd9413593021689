"""Keras calibration output is pinned byte for byte (record text and sidecar JSON).

The files in tests/data/calibration_pins/ were written by the calibration code as it was before
the framework-free core (amct_bridge.calibration) was split out of the Keras adapter; see the
README there. Any change in what Keras users get (a factor, a key, the order of entries, a range
in the sidecar) fails here with a unified diff.
"""

import difflib

import pytest
from pin_models import CASES, PINS, run_case

from amct_bridge.records import load


def _diff(expected: bytes, actual: bytes, name: str) -> str:
    lines = difflib.unified_diff(
        expected.decode().splitlines(),
        actual.decode().splitlines(),
        f"pinned/{name}",
        f"now/{name}",
        lineterm="",
        n=2,
    )
    return "\n".join(list(lines)[:60])


@pytest.mark.parametrize("case", sorted(CASES))
def test_record_and_sidecar_are_byte_identical(case, tmp_path):
    returned = []
    record, sidecar = run_case(case, tmp_path, returned)
    for path in (record, sidecar):
        expected = (PINS / path.name).read_bytes()
        actual = path.read_bytes()
        assert actual == expected, _diff(expected, actual, path.name)
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
