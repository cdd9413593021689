"""Issue 30: keras.applications that use only ops the ESP-DL v3 runtime has export with nothing
refused: each with ``weights=None`` at the smallest input Keras accepts (32x32; Xception 71x71),
calibrated on 2 random images, exported for esp32s3 s8 with ``skip_unsupported=False``, the
file read back and its embedded test outputs re-simulated equal (``espdl-run --check``).
ConvNeXtTiny has the same check in test_v3_lower_keras_layers.py. Each case takes 3-9 s on 2
cores (NASNetMobile, 845 nodes, the slowest)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.keras import calibrate, export_espdl

A = keras.applications

#: name -> (constructor, input size, input range, v3 ops the file must hold, layer kinds that
#: must be exported (not only passed through)).
CASES = {
    # its AveragePooling2D(3, strides=1, padding="same"): AveragePool + the border factor Mul
    "NASNetMobile": (A.NASNetMobile, 32, (-1, 1), {"AveragePool", "Mul", "Slice"}, {"Cropping2D"}),
    # BatchNormalization after a ReLU / Concatenate folds into no conv: Mul + Add
    "DenseNet121": (A.DenseNet121, 32, (-1, 1), {"Concat", "Mul", "Add"}, {"BatchNormalization"}),
    "Xception": (A.Xception, 71, (-1, 1), {"Conv", "MaxPool", "Add"}, {"SeparableConv2D"}),
    "EfficientNetV2B0": (A.EfficientNetV2B0, 32, (0, 255), {"Swish", "Mul"}, {"Multiply"}),
    "MobileNetV3Large": (A.MobileNetV3Large, 32, (0, 255), {"HardSwish", "Mul"}, {"Multiply"}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_application_exports_with_nothing_refused(name, tmp_path):
    build, size, (lo, hi), ops, kinds = CASES[name]
    keras.utils.set_random_seed(0)
    model = build(weights=None, input_shape=(size, size, 3), classes=4)
    data = np.random.default_rng(0).uniform(lo, hi, (2, size, size, 3)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    out = tmp_path / "m.espdl"
    res = export_espdl(
        model, record, out, format="espdl", target="esp32s3", feature_type="s8",
        test_input=data[:1], skip_unsupported=False,
    )  # fmt: skip
    refused = [(x.name, x.reason) for x in res.layers if x.status == "refused"]
    assert refused == []
    assert kinds <= {x.kind for x in res.layers if x.status == "exported"}
    back = read_espdl(out)
    assert ops <= {n.op_type for n in back.nodes}
    sim = simulate_espdl(back, None)
    assert back.test_outputs
    for t in back.test_outputs:
        np.testing.assert_array_equal(sim.outputs[t.name], t.data)
