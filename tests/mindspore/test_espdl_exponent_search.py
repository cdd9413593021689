"""`amct_bridge.mindspore.export_espdl(calibration_data=...)`: exponents searched on NCHW
calibration inputs (issue 23 §5) give a chip output error no larger than the range rule's, the
error measured here against the network's own outputs."""

from __future__ import annotations

import numpy as np
from isolate import in_fresh_process
from mindspore import Tensor
from nets import resnet_user

import amct_bridge.mindspore as ams
from amct_bridge.espdl.exponent_search import relative_error
from amct_bridge.espdl.v1.chip import simulate_chip


def test_searched_exponents_of_a_model_zoo_resnet_are_no_worse(tmp_path, request):
    if in_fresh_process(request):  # out += y leaves MindSpore's scopes changed: see isolate.py
        return
    net = resnet_user()  # model-zoo spelling: out += identity, pad_mode="pad"
    x = np.random.default_rng(0).normal(0, 1, (48, 3, 16, 16)).astype(np.float32)
    ref = net(Tensor(x)).asnumpy()
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    errors = {}
    for data in (None, x):
        res = ams.export_espdl(
            net, record, None, sample_input=x[:1], target="esp32s3", calibration_data=data
        )
        chip = simulate_chip(res, x.transpose(0, 2, 3, 1)).output.to_float()
        errors["max" if data is None else "search"] = relative_error(ref, chip)
    assert any("exponents searched" in w for w in res.warnings)
    sources = [s for layer in res.layers for s in layer.sources.values()]
    assert any("searched on the calibration data" in s for s in sources)
    assert errors["search"] <= errors["max"]
