"""How the callback behaves across fit / evaluate / predict, repeated runs, and what it leaves."""

import keras
import numpy as np
import pytest
from calib_models import (
    assert_c1_input_range,
    bn_fold,
    images,
    ref_act_factors,
    ref_arq,
    round_half_away,
    sequential_model,
)

from amct_bridge.keras import QuantCalibration
from amct_bridge.quant.observers import batch_stats, make_observer
from amct_bridge.records import load, validate
from amct_bridge.records.calibration import load_stats, sidecar_path


def _compiled(lr=0.0):
    model = sequential_model()
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
    return model


def test_no_trace_left_in_model(tmp_path):
    model = _compiled()
    x = images()
    before = model.predict(x, verbose=0)
    predict_fn = model.predict_function
    n_vars, config = len(model.variables), model.get_config()
    model.save(tmp_path / "before.keras")
    model.predict(x, verbose=0, callbacks=[QuantCalibration(tmp_path / "r.txt", algorithm="ifmr")])
    assert model.predict_function is predict_fn  # original compiled step back: same speed
    assert not [layer.name for layer in model.layers if "call" in vars(layer)]
    assert len(model.variables) == n_vars and model.get_config() == config
    np.testing.assert_array_equal(model.predict(x, verbose=0), before)
    model.save(tmp_path / "after.keras")
    reloaded = keras.models.load_model(tmp_path / "after.keras")
    assert [v.path for v in reloaded.variables] == [
        v.path for v in keras.models.load_model(tmp_path / "before.keras").variables
    ]
    np.testing.assert_array_equal(reloaded.predict(x, verbose=0), before)


def test_statistics_are_computed_in_the_compiled_step(tmp_path):
    model = _compiled()
    cb = QuantCalibration(tmp_path / "r.txt", algorithm="hfmg")
    model.predict(images(48), batch_size=4, verbose=0, callbacks=[cb])  # 12 batches
    assert load_stats(sidecar_path(tmp_path / "r.txt")).batches == 12
    # the wrappers' Python ran while tracing only: once per wrapped layer (c1, bn1, r1, ap, fc)
    assert cb._session.python_calls == 5


def test_fit_calibrates_training_batches(tmp_path):
    model = _compiled()
    x = images(32)
    x[5, 0, 0, 0] = 3.0
    path = tmp_path / "r.txt"
    cb = QuantCalibration(path, algorithm="minmax")
    model.fit(x, np.zeros((32, 5)), batch_size=8, epochs=2, verbose=0, callbacks=[cb])
    assert_c1_input_range(path, x.min(), 3.0)
    assert load_stats(sidecar_path(path)).batches == 8


def test_fit_on_validation_uses_only_validation_batches(tmp_path):
    model = _compiled()
    train, val = images(16), images(16, seed=9) + 2.0
    path = tmp_path / "r.txt"
    cb = QuantCalibration(path, algorithm="minmax", on="validation")
    model.fit(
        train,
        np.zeros((16, 5)),
        validation_data=(val, np.zeros((16, 5))),
        batch_size=8,
        epochs=2,
        verbose=0,
        callbacks=[cb],
    )
    assert_c1_input_range(path, val.min(), val.max())
    assert load_stats(sidecar_path(path)).batches == 4  # 2 validation batches x 2 epochs
    assert model.test_function is not None and "call" not in vars(model.get_layer("c1"))


@pytest.mark.parametrize("accumulate", [False, True])
def test_repeated_runs_reset_or_accumulate(tmp_path, accumulate):
    model = _compiled()
    first, second = images(16) * 5.0, images(16, seed=3)
    path = tmp_path / "r.txt"
    cb = QuantCalibration(path, algorithm="minmax", accumulate=accumulate)
    for data in (first, second):
        model.evaluate(data, np.zeros((16, 5)), batch_size=8, verbose=0, callbacks=[cb])
    both = np.concatenate([first, second])
    expected = both if accumulate else second
    assert_c1_input_range(path, expected.min(), expected.max())
    assert load_stats(sidecar_path(path)).batches == (4 if accumulate else 2)


def test_batch_num_stops_collecting_and_restores_step(tmp_path):
    model = _compiled()
    x = images(32)
    x[20, 0, 0, 0] = 9.0  # in batch 3 (of 8 samples): must be ignored with batch_num=2
    path = tmp_path / "r.txt"
    model.make_predict_function()
    fn = model.predict_function
    model.predict(
        x,
        batch_size=8,
        verbose=0,
        callbacks=[QuantCalibration(path, algorithm="minmax", batch_num=2)],
    )
    assert_c1_input_range(path, x[:16].min(), x[:16].max())
    assert load_stats(sidecar_path(path)).batches == 2
    assert model.predict_function is fn


def test_steps_per_execution_reads_every_step(tmp_path):
    model = sequential_model()
    model.compile(loss="mse", steps_per_execution=3)
    x = images(40)
    x[37, 1, 1, 1] = -4.0  # last, partial execution
    path = tmp_path / "r.txt"
    model.evaluate(
        x,
        np.zeros((40, 5)),
        batch_size=8,
        verbose=0,
        callbacks=[QuantCalibration(path, algorithm="minmax")],
    )
    assert_c1_input_range(path, -4.0, x.max())
    assert load_stats(sidecar_path(path)).batches == 5


def test_ifmr_in_graph_histograms_match_numpy_observer(tmp_path):
    """The default algorithm from in-graph summaries equals IFMR fed the same batches on host."""
    model = _compiled()
    x = images(32)
    path = tmp_path / "r.txt"
    model.predict(x, batch_size=16, verbose=0, callbacks=[QuantCalibration(path)])
    record = load(path)
    assert validate(record) == []
    fc_in = keras.Model(model.inputs, model.get_layer("fc").input).predict(x, verbose=0)
    obs = make_observer("ifmr")
    for batch in (fc_in[:16], fc_in[16:]):
        obs.update_stats(batch_stats(batch, obs.bins))
    scale, offset = obs.factors()
    assert record.layers["fc"].scale_d == pytest.approx(scale, rel=1e-4)
    assert abs(record.layers["fc"].offset_d - offset) <= 1
    assert load_stats(sidecar_path(path)).algorithm == "ifmr"


@pytest.mark.parametrize("algorithm", ["hfmg", "ifmr", "percentile"])
def test_grid_accumulation_matches_per_batch_observers(tmp_path, algorithm):
    """40 batches whose range keeps growing (grids move, batches overflow, headroom is
    added): the record's scale_d is within 0.5 % of an observer fed every batch's own
    histogram on the host, for every quantized input."""
    model = _compiled()
    x = images(320, seed=3) * np.linspace(0.5, 4.0, 320, dtype="float32")[:, None, None, None]
    path = tmp_path / "r.txt"
    cb = QuantCalibration(path, algorithm=algorithm)
    model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
    record = load(path)
    for name in ("c1", "ap", "fc"):
        layer_in = keras.Model(model.inputs, model.get_layer(name).input).predict(x, verbose=0)
        obs = make_observer(algorithm)
        for start in range(0, 320, 8):
            obs.update_stats(batch_stats(layer_in[start : start + 8], obs.bins))
        scale, offset = obs.factors()
        assert record.layers[name].scale_d == pytest.approx(scale, rel=5e-3), name
        assert abs(record.layers[name].offset_d - offset) <= 1, name


def test_sidecar_only_tensors_get_min_max_not_the_algorithm(tmp_path):
    """c1's output (BN folded, read only by the ReLU) is not a record input: min/max only,
    its sidecar range is the raw extremes. r1's output feeds the average pool (quantized,
    data factors): HFMG."""
    model = _compiled()
    x = images(32)
    x[3, 5, 5] = 40.0  # outliers HFMG clips away downstream
    path = tmp_path / "r.txt"
    cb = QuantCalibration(path, algorithm="hfmg")
    model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
    kinds = {(o.point.key, o.point.role): o.observer.algorithm for o in cb._session.observed}
    assert kinds == {
        ("c1", "input"): "hfmg",
        ("c1", "output"): "minmax",
        ("r1", "output"): "hfmg",
        ("ap", "output"): "minmax",  # Flatten reads it, fc observes its own input
        ("fc", "input"): "hfmg",
        ("fc", "output"): "minmax",
    }
    stats = load_stats(sidecar_path(path))
    c1_out = keras.Model(model.inputs, model.get_layer("bn1").output).predict(x, verbose=0)
    assert (stats.layers["c1"].output.min, stats.layers["c1"].output.max) == (
        float(c1_out.min()),
        float(c1_out.max()),
    )
    r1 = stats.layers["r1"].output
    assert r1.max < r1.observed_max  # clipped: the algorithm ran there
    assert stats.layers["ap"].input == r1


def test_int16_with_dmq_balances_activations_and_weights(tmp_path):
    model = _compiled()
    x = images(16) * np.array([1.0, 4.0, 0.25], "float32")  # unbalanced channels
    path = tmp_path / "r.txt"
    cb = QuantCalibration(path, algorithm="minmax", act_type="INT16", migration_strength=0.5)
    model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
    record = load(path)
    assert validate(record) == []
    c1 = record.layers["c1"]
    w = bn_fold(model.get_layer("c1").kernel, model.get_layer("bn1"))
    x_amax = np.abs(x).max(axis=(0, 1, 2))
    w_amax = np.abs(w).max(axis=(0, 1, 3))
    f = np.sqrt(x_amax) / np.sqrt(w_amax)  # alpha 0.5: amax|x|^a / amax|W|^(1-a)
    np.testing.assert_allclose(c1.tensor_balance_factor, f, rtol=1e-5)
    lo, hi = (x.min(axis=(0, 1, 2)) / f).min(), (x.max(axis=(0, 1, 2)) / f).max()
    scale, offset = ref_act_factors(lo, hi, bits=16)
    assert c1.act_type == "INT16"
    assert c1.scale_d == pytest.approx(scale, rel=1e-5) and c1.offset_d == offset
    np.testing.assert_allclose(c1.scale_w, ref_arq(w * f[None, None, :, None], 3), rtol=1e-5)
    assert record.layers["ap"].tensor_balance_factor == []  # never on AvgPool


def test_joint_quant_writes_worst_case_shift_bits(tmp_path):
    model = _compiled()
    path = tmp_path / "r.txt"
    cb = QuantCalibration(path, algorithm="minmax", joint_quant=True)
    model.predict(images(16), batch_size=8, verbose=0, callbacks=[cb])
    c1 = load(path).layers["c1"]
    w = bn_fold(model.get_layer("c1").kernel, model.get_layer("bn1"))
    q = np.clip(round_half_away(w / np.asarray(c1.scale_w)), -128, 127)
    acc = np.abs(q).sum(axis=(0, 1, 2)) * 255  # asymmetric INT8 activations span 0..255
    expected = np.clip(np.ceil(np.log2(acc / 32767)), 1, 16)
    assert c1.shift_bit == expected.astype(int).tolist()


def test_skip_layers_and_skip_fusion(tmp_path):
    model = _compiled()
    path = tmp_path / "r.txt"
    cb = QuantCalibration(path, algorithm="minmax", skip_layers=["fc"], skip_fusion_layers=["c1"])
    model.predict(images(16), verbose=0, callbacks=[cb])
    record = load(path)
    assert list(record.layers) == ["c1", "ap"]
    assert record.layers["c1"].skip_fusion is True
    np.testing.assert_allclose(
        record.layers["c1"].scale_w, ref_arq(model.get_layer("c1").kernel, 3), rtol=2e-6
    )


def test_config_file_sets_batch_num(tmp_path, data_dir):
    model = _compiled()
    x = images(32)
    x[30, 0, 0, 0] = 7.0
    path = tmp_path / "r.txt"
    cb = QuantCalibration(
        path, config=data_dir / "amct" / "tf_yolo_v3_quant.cfg", algorithm="minmax"
    )
    assert cb.batch_num == 1
    model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
    assert_c1_input_range(path, x[:8].min(), x[:8].max())


def test_save_every_epoch_writes_during_fit(tmp_path):
    model = _compiled()
    path = tmp_path / "r.txt"
    seen = []

    class Peek(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(path.exists())

    cb = QuantCalibration(path, algorithm="minmax", save_every_epoch=True)
    model.fit(
        images(16), np.zeros((16, 5)), batch_size=8, epochs=2, verbose=0, callbacks=[cb, Peek()]
    )
    assert seen == [True, True]


def test_config_overrides_and_skipped_types_reach_the_record(tmp_path):
    from amct_bridge.config import parse_simple_config

    config = parse_simple_config(
        """
        skip_layer_types: "AvgPool"
        common_config { arq_quantize { channel_wise: false } }
        override_layer_configs {
            layer_name: "fc"
            calibration_config { hfmg_quantize { num_of_bins: 1024 dst_type: INT16 } }
        }
        """
    )
    model = _compiled()
    path = tmp_path / "r.txt"
    model.predict(images(16), verbose=0, callbacks=[QuantCalibration(path, config=config)])
    record = load(path)
    assert list(record.layers) == ["c1", "fc"]
    assert len(record.layers["c1"].scale_w) == 1  # channel_wise false: one scale
    assert record.layers["fc"].act_type == "INT16" and record.layers["c1"].act_type is None
    assert load_stats(sidecar_path(path)).algorithm == "hfmg,ifmr"
