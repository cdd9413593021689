"""Wrong inputs to `amct-bridge export-espdl`, as a new user gives them.

- ``--data`` of the wrong shape: the export printed "exponents not searched: the chip cannot
  run the export" and wrote the set anyway (exit 0), although the user asked for a search on
  that file; now exit 2, the file and both shapes named, nothing written.
- ``--stats`` of another calibration whose layer names partly overlap this model's: the error
  said "no calibrated output range for 'c2' in the calibration sidecar" without saying which
  sidecar, nor that it was written with another record (its ``record_keys``). A sidecar that
  describes its model (issue 33) is refused as another model's before that."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.keras import calibrate, export_espdl

L = keras.layers


def _model(second: bool) -> keras.Model:
    keras.utils.set_random_seed(1)
    inp = keras.Input((10, 10, 3), name="img")
    x = L.Conv2D(4, 3, activation="relu", name="c1")(inp)
    if second:
        x = L.Conv2D(4, 3, activation="relu", name="c2")(x)
    return keras.Model(inp, L.Dense(3, name="fc")(L.Flatten(name="flat")(x)))


def test_wrong_data_shape_is_refused_by_file_and_nothing_is_written(tmp_path, capsys):
    model = _model(True)
    model.save(tmp_path / "m.keras")
    x = np.random.default_rng(0).uniform(0, 1, (8, 10, 10, 3)).astype("float32")
    calibrate(model, x, tmp_path / "r.txt", algorithm="minmax")
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((4, 8, 8, 3), np.float32))
    out = tmp_path / "e"
    args = ["export-espdl", "--record", str(tmp_path / "r.txt"), "--model"]
    code = main([*args, str(tmp_path / "m.keras"), "--out", str(out), "--data", str(bad)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{bad}: array of shape (4, 8, 8, 3) does not fit model input 'img'" in err
    assert "(N, 10, 10, 3)" in err
    assert not out.exists()
    with pytest.raises(ExportError, match=r"calibration_data of shape \(4, 8, 8, 3\) does not"):
        export_espdl(model, tmp_path / "r.txt", out, calibration_data=np.load(bad))
    assert not out.exists()
    # the right shape still searches
    good = tmp_path / "x.npy"
    np.save(good, x)
    code = main([*args, str(tmp_path / "m.keras"), "--out", str(out), "--data", str(good)])
    assert code == 0, capsys.readouterr().err
    assert (out / "config.json").is_file()


def test_sidecar_of_another_calibration_is_named_with_its_record(tmp_path, capsys):
    x = np.random.default_rng(0).uniform(0, 1, (8, 10, 10, 3)).astype("float32")
    one, two = _model(False), _model(True)
    calibrate(one, x, tmp_path / "one.txt", algorithm="minmax")  # keys c1, fc
    calibrate(two, x, tmp_path / "two.txt", algorithm="minmax")  # keys c1, c2, fc
    two.save(tmp_path / "two.keras")
    side = tmp_path / "one.txt.calib.json"
    args = ["export-espdl", "--record", str(tmp_path / "two.txt"), "--stats", str(side)]
    # the sidecar describes the model it was written for (issue 33 §9): refused, by layer
    code = main([*args, "--model", str(tmp_path / "two.keras"), "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "e").exists()
    assert f"{side}: calibration sidecar: written for another model: layer 'c2' (Conv2D" in err
    # a sidecar written before it described the model: the warnings below, as before
    doc = json.loads(side.read_text())
    del doc["model"]
    side.write_text(json.dumps(doc))
    # c2's output range is found (fc's input range in one's sidecar): exported, with a warning
    code = main([*args, "--model", str(tmp_path / "two.keras"), "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"{side}: this calibration sidecar was written with another record" in err
    assert "it lists no 'c2' of the record" in err
    code = main(
        [
            *args,
            "--model",
            str(tmp_path / "two.keras"),
            "--format",
            "espdl",
            "-o",
            str(tmp_path / "m.espdl"),
        ]
    )
    assert code == 0
    assert "written with another record" in capsys.readouterr().err

    # where no range is found at all, the error names the sidecar and says the same
    three = keras.Model(two.input, L.Concatenate(name="cat")([two.get_layer("c2").output] * 2))
    three.save(tmp_path / "three.keras")
    calibrate(three, x, tmp_path / "three.txt", algorithm="minmax")
    code = main(
        [
            "export-espdl",
            "--record",
            str(tmp_path / "three.txt"),
            "--stats",
            str(side),
            "--model",
            str(tmp_path / "three.keras"),
            "--out",
            str(tmp_path / "e3"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"no calibrated output range for 'c2' in the calibration sidecar {side}" in err
    assert "written with a record that has no 'c2'" in err
    assert not (tmp_path / "e3").exists()
