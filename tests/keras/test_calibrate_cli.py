"""calibrate() convenience and the ``amct-bridge calibrate`` command on real files."""

import numpy as np
import pytest
from calib_models import images, ref_act_factors, sequential_model

from amct_bridge.cli import main
from amct_bridge.keras import calibrate
from amct_bridge.records import load
from amct_bridge.records.calibration import load_stats, sidecar_path


def test_calibrate_function_returns_written_record(tmp_path):
    model = sequential_model()
    x = images(40)
    x[39, 0, 0, 0] = 5.0  # in batch 4: outside batch_num=2
    record = calibrate(model, x, tmp_path / "r.txt", batch_size=10, algorithm="minmax", batch_num=2)
    assert record == load(tmp_path / "r.txt", flavor="inner")
    scale, offset = ref_act_factors(x[:20].min(), x[:20].max())
    assert record.layers["c1"].scale_d == pytest.approx(scale, rel=1e-6)
    assert record.layers["c1"].offset_d == offset


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "seq.keras"
    sequential_model().save(path)
    return path


def test_cli_writes_record_sidecar_and_graph(tmp_path, model_file, capsys):
    x = images(24)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "record.txt"
    code = main(
        [
            "calibrate",
            str(model_file),
            "--data",
            str(tmp_path / "x.npy"),
            "-o",
            str(out),
            "--batch-size",
            "8",
            "--algorithm",
            "minmax",
            "--keys",
            "tf_op",
            "--flavor",
            "tf",
            "--frozen-graph",
            str(tmp_path / "m.pb"),
            "--skip-layers",
            "fc",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "3/3" in text  # Keras progress bar: 3 batches of 8
    assert "wrote" in text and "2 layers" in text and "3 batches" in text
    record = load(out, flavor="tf")
    assert sorted(record.layers) == ["seq_1/ap_1/AvgPool", "seq_1/c1_1/convolution"]
    scale, offset = ref_act_factors(x.min(), x.max())
    assert record.layers["seq_1/c1_1/convolution"].scale_d == pytest.approx(scale, rel=1e-6)
    assert load_stats(sidecar_path(out)).batches == 3
    assert (tmp_path / "m.pb").stat().st_size > 0


def test_cli_npz_and_config(tmp_path, model_file, data_dir, capsys):
    np.savez(tmp_path / "x.npz", images=images(16))
    out = tmp_path / "r.txt"
    cfg = data_dir / "amct" / "tf_yolo_v3_quant.cfg"
    code = main(
        [
            "calibrate",
            str(model_file),
            "--data",
            str(tmp_path / "x.npz"),
            "-o",
            str(out),
            "--config",
            str(cfg),
            "--batch-size",
            "4",
            "-q",
        ]
    )
    assert code == 0
    assert load_stats(sidecar_path(out)).batches == 1  # the config's batch_num
    assert load_stats(sidecar_path(out)).algorithm == "ifmr"


@pytest.mark.parametrize(
    "make_data, message",
    [
        (lambda p: np.save(p / "x.npy", np.zeros((4, 5, 5, 3), "float32")), "does not fit model"),
        (lambda p: (p / "x.npy").write_text("not numpy"), "cannot read calibration data"),
    ],
)
def test_cli_bad_data_is_named(tmp_path, model_file, capsys, make_data, message):
    make_data(tmp_path)
    code = main(
        [
            "calibrate",
            str(model_file),
            "--data",
            str(tmp_path / "x.npy"),
            "-o",
            str(tmp_path / "r.txt"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "x.npy" in err
    assert not (tmp_path / "r.txt").exists()


def test_cli_missing_model(tmp_path, capsys):
    assert main(["calibrate", str(tmp_path / "no.keras"), "--data", "x.npy", "-o", "r.txt"]) == 2
    assert "model file not found" in capsys.readouterr().err


def test_cli_two_input_model_from_named_npz(tmp_path, capsys):
    import keras

    a, b = keras.Input((6,), name="a"), keras.Input((4,), name="b")
    out = keras.layers.Dense(3, name="fc")(keras.layers.Concatenate()([a, b]))
    path = tmp_path / "two.keras"
    keras.Model([a, b], out).save(path)
    rng = np.random.default_rng(0)
    xa, xb = rng.uniform(-1, 1, (12, 6)), rng.uniform(0, 5, (12, 4))
    np.savez(tmp_path / "x.npz", a=xa, b=xb)
    code = main(
        [
            "calibrate",
            str(path),
            "--data",
            str(tmp_path / "x.npz"),
            "-q",
            "-o",
            str(tmp_path / "r.txt"),
            "--algorithm",
            "minmax",
            "--batch-size",
            "4",
        ]
    )
    assert code == 0, capsys.readouterr().err
    scale, offset = ref_act_factors(min(xa.min(), xb.min()), max(xa.max(), xb.max()))
    fc = load(tmp_path / "r.txt").layers["fc"]
    assert fc.scale_d == pytest.approx(scale, rel=1e-6) and fc.offset_d == offset
    np.savez(tmp_path / "bad.npz", a=xa, c=xb)
    assert (
        main(
            [
                "calibrate",
                str(path),
                "--data",
                str(tmp_path / "bad.npz"),
                "-q",
                "-o",
                str(tmp_path / "r2.txt"),
            ]
        )
        == 2
    )
    assert "missing ['b']" in capsys.readouterr().err
