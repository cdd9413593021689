"""`amct-bridge espdl-run` on a `.espdl` whose output is a Softmax (float32: any Keras
classifier exported with ``format="espdl"``) printed "exponent 0, range 0..0": the
probabilities were cast to int. It now prints their real range."""

import re

import keras
import numpy as np

from amct_bridge.cli import main
from amct_bridge.espdl.v3 import read_espdl
from amct_bridge.keras import calibrate, export_espdl


def test_a_softmax_output_prints_its_real_range(tmp_path, capsys):
    keras.utils.set_random_seed(2)
    inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu", name="c1")(inp)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    model = keras.Model(inp, keras.layers.Dense(3, activation="softmax", name="head")(x))
    xs = np.random.default_rng(0).uniform(0, 1, (16, 8, 8, 3)).astype("float32")
    calibrate(model, xs, tmp_path / "r.txt", algorithm="minmax")
    out = tmp_path / "m.espdl"
    export_espdl(model, tmp_path / "r.txt", out, format="espdl", target="esp32s3")
    assert main(["espdl-run", str(out), "--check"]) == 0
    text = capsys.readouterr().out
    want = next(t.data for t in read_espdl(out).test_outputs if t.name == "head")
    assert want.dtype == np.float32 and 0 < want.min() <= want.max() < 1
    line = next(x for x in text.splitlines() if x.startswith("output 'head'"))
    lo, hi = map(float, re.search(r"range (\S+)\.\.(\S+)$", line).groups())
    assert np.isclose(lo, want.min(), rtol=1e-5) and np.isclose(hi, want.max(), rtol=1e-5)
    assert "exponent" not in line
