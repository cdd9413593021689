"""The calibration core on its own (no framework): layouts, chain rule, names, errors.

A toy adapter (core_toy.py) implements the documented contract with numpy, so these tests
pin what both adapters rely on. References are independent: numpy BN folding and ARQ written
out here, and the same weights in Keras and MindSpore layouts giving the same record.
"""

from __future__ import annotations

import numpy as np
import pytest
from core_toy import CONV, DENSE, ToySession, chain_graph

from amct_bridge.calibration import LayerDesc, ModelDesc, build_record, finish_record
from amct_bridge.calibration.plan import batchnorm_chains, make_plan
from amct_bridge.config import LayerQuantConfig, QuantConfig
from amct_bridge.errors import CalibrationError
from amct_bridge.records.calibration import CalibrationStats, LayerShape

RNG = np.random.default_rng(0)
BN = {
    "gamma": RNG.uniform(0.5, 2.0, 4).astype("float32"),
    "beta": RNG.uniform(-0.5, 0.5, 4).astype("float32"),
    "mean": RNG.uniform(-0.3, 0.3, 4).astype("float32"),
    "var": RNG.uniform(0.5, 2.0, 4).astype("float32"),
    "eps": 1e-3,
}


def _config(**common) -> QuantConfig:
    extra = {k: common.pop(k) for k in ("joint_quant",) if k in common}
    return QuantConfig(common=LayerQuantConfig(algorithm="minmax", options={}, **common), **extra)


def _conv_bn_model(kernel, layout, kind="Conv2d", channel_axis=-1, bias=None, parts=(CONV,)):
    layers = {
        "c1": LayerDesc(
            "c1",
            kind,
            parts,
            params={"kernel": kernel, "layout": layout, "bias": bias, "channel_axis": channel_axis},
        ),
        "bn1": LayerDesc("bn1", "BatchNorm2d", params=dict(BN)),
        "r1": LayerDesc("r1", "ReLU", activation=True),
    }
    graph = chain_graph(conv_kind=kind)
    return ModelDesc("toy", layers, graph, {}, (kind,), ("BatchNorm2d",), (kind,))


def _batches(shape, channel_axis, n=3):
    out = []
    for i in range(n):
        x = np.random.default_rng(10 + i).normal(0.2, 1.0, shape).astype("float32")
        y = np.random.default_rng(20 + i).normal(0.0, 2.0, shape[:-1] + (4,)).astype("float32")
        if channel_axis == 1:  # NCHW: the same values, channels moved
            x, y = np.moveaxis(x, -1, 1), np.moveaxis(y, -1, 1)
        z = np.maximum(y, 0)
        out.append(
            {("c1", "input"): x, ("c1", "output"): y, ("r1", "input"): y, ("r1", "output"): z}
        )
    return out


def _record(model, config, batches, batch_num=None):
    session = ToySession(model, config, batch_num)
    session.run(batches)
    assert session.settle_for_write(require_batches=True)
    record, stats, folds = build_record(session)
    return finish_record(record, "inner")[1], stats, folds, session


def _ref_arq(out_major: np.ndarray) -> list[float]:
    """ARQ per row of an (out, rest) matrix: max(|max|, |min|)/127, /128 when |min| >= |max|."""
    hi, lo = out_major.max(axis=1), out_major.min(axis=1)
    return np.where(np.abs(lo) >= np.abs(hi), np.abs(lo) / 128, np.abs(hi) / 127).tolist()


def test_conv_bn_record_is_the_same_in_keras_and_mindspore_layouts():
    hwio = RNG.uniform(-0.5, 0.5, (3, 3, 2, 4)).astype("float32")
    bias = RNG.uniform(-0.1, 0.1, 4).astype("float32")
    oihw = np.ascontiguousarray(hwio.transpose(3, 2, 0, 1))
    cfg = _config(migration_strength=0.5, joint_quant=True)
    keras_text, keras_stats, _, _ = _record(
        _conv_bn_model(hwio, "HWIO", bias=bias), cfg, _batches((2, 5, 5, 2), -1)
    )
    ms_text, ms_stats, folds, _ = _record(
        _conv_bn_model(oihw, "OIHW", channel_axis=1, bias=bias), cfg, _batches((2, 5, 5, 2), 1)
    )
    assert ms_text == keras_text
    # the sidecars agree but for the kernel shapes of its model, each in its own layout
    assert keras_stats.model["c1"] == LayerShape("Conv2d", (3, 3, 2, 4), "HWIO")
    assert ms_stats.model["c1"] == LayerShape("Conv2d", (4, 2, 3, 3), "OIHW")
    keras_stats.model = ms_stats.model = None
    assert ms_stats.to_json() == keras_stats.to_json()
    assert "tensor_balance_factor" in ms_text and "shift_bit" in ms_text
    # the fold the record describes: W * gamma / sqrt(var + eps) per output channel (axis 0)
    s = BN["gamma"] / np.sqrt(BN["var"] + BN["eps"])
    (fold,) = folds
    np.testing.assert_allclose(fold.folded.kernel, oihw * s[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(
        fold.folded.bias, (bias - BN["mean"]) * s + BN["beta"], rtol=1e-5, atol=1e-7
    )
    assert fold.original.kernel is oihw and fold.folded.layout == "OIHW"


def test_scale_w_is_arq_of_the_folded_kernel_per_output_channel():
    oihw = RNG.uniform(-0.5, 0.5, (4, 2, 3, 3)).astype("float32")
    _, _, _, session = _record(
        _conv_bn_model(oihw, "OIHW", 1), _config(), _batches((2, 4, 4, 2), 1)
    )
    record, _, _ = build_record(session)
    s = BN["gamma"] / np.sqrt(BN["var"] + BN["eps"])
    ref = _ref_arq((oihw * s[:, None, None, None]).reshape(4, -1))
    assert record.layers["c1"].scale_w == pytest.approx(ref, rel=1e-6)
    # the folded BN is not a record entry; its output range is the conv's in the sidecar
    assert list(record.layers) == ["c1"]


def test_skip_fusion_uses_the_raw_kernel_and_says_so():
    oihw = RNG.uniform(-0.5, 0.5, (4, 2, 3, 3)).astype("float32")
    cfg = QuantConfig(
        common=LayerQuantConfig(algorithm="minmax", options={}), skip_fusion_layers=["c1"]
    )
    _, _, folds, session = _record(_conv_bn_model(oihw, "OIHW", 1), cfg, _batches((2, 4, 4, 2), 1))
    record, _, _ = build_record(session)
    assert folds == [] and record.layers["c1"].skip_fusion is True
    assert record.layers["c1"].scale_w == pytest.approx(_ref_arq(oihw.reshape(4, -1)), rel=1e-6)


@pytest.mark.parametrize(
    ("keras_layout", "ms_layout", "shape", "to_ms", "channels"),
    [
        # Dense: Keras (in, out) "IO", MindSpore (out, in) "OI"; per tensor either way
        ("IO", "OI", (6, 4), lambda k: k.T, 1),
        # Conv2DTranspose: Keras (kH, kW, out, in) "HWOI", MindSpore (in, out, kH, kW) "IOHW"
        ("HWOI", "IOHW", (3, 3, 4, 2), lambda k: k.transpose(3, 2, 0, 1), 4),
        # depthwise, C=2, m=2: Keras (kH, kW, C, m) "HWCM", MindSpore (C*m, 1, kH, kW) "OIHW"
        ("HWCM", "OIHW", (3, 3, 2, 2), lambda k: k.reshape(3, 3, 4).transpose(2, 0, 1)[:, None], 4),
    ],
)
def test_layouts_give_equal_weight_factors(keras_layout, ms_layout, shape, to_ms, channels):
    kernel = RNG.uniform(-0.5, 0.5, shape).astype("float32")
    part = DENSE if keras_layout == "IO" else CONV
    texts = []
    for k, layout in ((kernel, keras_layout), (np.ascontiguousarray(to_ms(kernel)), ms_layout)):
        layers = {"c1": LayerDesc("c1", "K", (part,), params={"kernel": k, "layout": layout})}
        model = ModelDesc("toy", layers)  # no graph: no fusion, layer order
        batches = [
            {("c1", "input"): np.full((2, 2), v), ("c1", "output"): np.ones(2)} for v in (1, 3)
        ]
        texts.append(_record(model, _config(joint_quant=True), batches)[0])
    assert texts[0] == texts[1]
    assert texts[0].count("scale_w:") == channels


def test_chain_rule():
    def chains(**kw):
        model = _conv_bn_model(np.zeros((4, 2, 1, 1), "float32"), "OIHW")
        model.graph = chain_graph(**kw)
        return {k: key for k, (key, _) in batchnorm_chains(model).items()}

    assert chains() == {"c1": "bn1"}
    assert chains(activation="relu") == {}  # a fused activation sits between conv and BN
    assert chains(extra_reader=True) == {}  # the conv output is read by someone else too
    off = _conv_bn_model(np.zeros((4, 2, 1, 1), "float32"), "OIHW")
    off.layers["bn1"].params["on_channels"] = False  # BN over another axis: not foldable
    assert batchnorm_chains(off) == {}
    no_graph = _conv_bn_model(np.zeros((4, 2, 1, 1), "float32"), "OIHW")
    no_graph.graph = None
    assert batchnorm_chains(no_graph) == {}


def test_unknown_skip_name_suggests_the_close_one():
    model = _conv_bn_model(np.zeros((4, 2, 1, 1), "float32"), "OIHW")
    with pytest.raises(CalibrationError, match=r"skip_layers: no layer named 'c_1'.*'c1'"):
        make_plan(model, QuantConfig(skip_layers=["c_1"]))
    with pytest.raises(CalibrationError, match=r"skip_fusion_layers: no layer named 'bn_1'"):
        make_plan(model, QuantConfig(skip_fusion_layers=["bn_1"]))


def test_skipping_a_layer_that_is_not_quantized_warns(caplog):
    model = _conv_bn_model(np.zeros((4, 2, 1, 1), "float32"), "OIHW")
    with caplog.at_level("WARNING", logger="amct_bridge.calibration.plan"):
        plan = make_plan(model, QuantConfig(skip_layers=["bn1"]))
    assert [t.key for t in plan.quantized] == ["c1"]  # nothing changed
    assert "skip_layers: 'bn1' (BatchNorm2d) is not a quantizable layer" in caplog.text
    assert "quantizable types: Conv2d" in caplog.text


def test_nothing_left_to_quantize_names_model_and_kinds():
    model = _conv_bn_model(np.zeros((4, 2, 1, 1), "float32"), "OIHW")
    with pytest.raises(CalibrationError, match=r"'toy' has no quantizable layer left.*Conv2d"):
        make_plan(model, QuantConfig(skip_layers=["c1"]))


def test_the_sidecar_describes_the_model(tmp_path):
    """Issue 33 §9 and §8: the sidecar lists the calibrated model (every planned layer's kind,
    each weighted part's kernel shape and layout) and the record's flavor; both survive the
    JSON round trip."""
    oihw = RNG.uniform(-0.5, 0.5, (4, 2, 3, 3)).astype("float32")
    session = ToySession(_conv_bn_model(oihw, "OIHW", channel_axis=1), _config())
    session.run(_batches((2, 4, 4, 2), 1))
    assert session.settle_for_write(require_batches=True)
    record, stats, _ = build_record(session)
    assert stats.model["c1"] == LayerShape("Conv2d", oihw.shape, "OIHW")  # the kernel given
    assert stats.model["bn1"].kernel is None and stats.model["bn1"].kind == "BatchNorm2d"
    from amct_bridge.calibration.records import Built, write_outputs
    from amct_bridge.records.calibration import load_stats, sidecar_path

    record, text = finish_record(record, "tf")
    write_outputs(Built(record, text, stats), tmp_path / "r.txt")
    back = load_stats(sidecar_path(tmp_path / "r.txt"))
    assert back.flavor == "tf" and back.model == stats.model
    assert CalibrationStats.from_json(back.to_json()) == back


def test_nan_names_layer_role_batch_and_folded_bn():
    oihw = RNG.uniform(-0.5, 0.5, (4, 2, 3, 3)).astype("float32")
    batches = _batches((2, 4, 4, 2), 1)
    batches[1][("c1", "output")] = batches[1][("c1", "output")].copy()
    batches[1][("c1", "output")][0, 0, 0, 0] = np.inf
    session = ToySession(_conv_bn_model(oihw, "OIHW", 1), _config())
    with pytest.raises(
        CalibrationError, match=r"layer 'c1': output \(after its folded 'bn1'\) of batch 1"
    ):
        session.run(batches)


def test_zero_batches_and_batch_num():
    oihw = RNG.uniform(-0.5, 0.5, (4, 2, 3, 3)).astype("float32")
    session = ToySession(_conv_bn_model(oihw, "OIHW", 1), _config())
    session.run([])
    assert session.settle_for_write() is False
    with pytest.raises(CalibrationError, match=r"no calibration batch was seen for model 'toy'"):
        session.settle_for_write(require_batches=True)
    session = ToySession(_conv_bn_model(oihw, "OIHW", 1), _config(), batch_num=2)
    session.run(_batches((2, 4, 4, 2), 1, n=3))
    assert session.batches == 2 and not session.inst.installed
    # the third batch was not seen: c1's input range is that of the first two
    _, stats, _ = build_record(session)
    first_two = np.concatenate([b[("c1", "input")].ravel() for b in _batches((2, 4, 4, 2), 1)[:2]])
    assert stats.layers["c1"].input.observed_max == pytest.approx(float(first_two.max()))


def test_shared_tensor_is_observed_once():
    oihw = RNG.uniform(-0.5, 0.5, (4, 2, 3, 3)).astype("float32")
    session = ToySession(_conv_bn_model(oihw, "OIHW", 1), _config())
    session.new_run()
    # c1's output (after the folded BN) is r1's input: one point for both
    assert session.tensors[("c1", "output")] == session.tensors[("r1", "input")]
    assert [(o.point.key, o.point.role) for o in session.observed] == [
        ("c1", "input"),
        ("c1", "output"),
        ("r1", "output"),
    ]


@pytest.mark.parametrize("offset", [True, False])
def test_a_range_below_flt_epsilon_warns_that_amct_makes_its_scale_1(caplog, offset):
    """AMCT's ProcessScale turns a scale below FLT_EPSILON (1.19e-7) into 1.0: valid and
    AMCT's own rule, but every value then quantizes to one level (found by a new-user trial on
    an untrained MobileNet whose activations shrink to 1e-6). Worked by hand: inputs within
    +-1e-6 give a raw scale of 2e-6 / 255 = 7.8e-9 (offset) or 1e-6 / 127 (symmetric)."""
    oihw = RNG.uniform(-0.5, 0.5, (4, 2, 1, 1)).astype("float32")
    model = _conv_bn_model(oihw, "OIHW", channel_axis=1)
    tiny = _batches((2, 3, 3, 2), 1)
    for b in tiny:
        b[("c1", "input")] = np.clip(b[("c1", "input")], -1, 1) * 1e-6
    config = _config()
    config.activation_offset = offset
    with caplog.at_level("WARNING", logger="amct_bridge.calibration.records"):
        record = _built(model, config, tiny)
    assert record.layers["c1"].scale_d == 1.0  # AMCT's rule, kept
    assert "layer 'c1': its input range" in caplog.text and "below FLT_EPSILON" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="amct_bridge.calibration.records"):
        record = _built(model, config, _batches((2, 3, 3, 2), 1))
    assert record.layers["c1"].scale_d != 1.0 and "FLT_EPSILON" not in caplog.text
    zeros = _batches((2, 3, 3, 2), 1)
    for b in zeros:
        b[("c1", "input")] = np.zeros_like(b[("c1", "input")])
    with caplog.at_level("WARNING", logger="amct_bridge.calibration.records"):
        record = _built(model, config, zeros)  # all zero: scale 1.0, nothing to say
    assert record.layers["c1"].scale_d == 1.0 and "FLT_EPSILON" not in caplog.text


def _built(model, config, batches):
    session = ToySession(model, config)
    session.run(batches)
    assert session.settle_for_write(require_batches=True)
    return build_record(session)[0]
