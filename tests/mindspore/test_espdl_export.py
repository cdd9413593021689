"""ESP-DL v1 export of MindSpore networks (``amct_bridge.mindspore.export_espdl`` and the CLI).

The MindSpore nets and their Keras twins carry the same weights (converted in twin_weights.py
from MindSpore's layouts with explicit loops) and the same layer names, and are checked to
compute the same float function. Calibrated once with the Keras callback (minmax), the record
and sidecar are keyed by names both share, so the two exports must be equal: config.json,
coefficient integers, runtime layers and the chip graph. The chip simulator then runs the
MindSpore export against the MindSpore net's own float outputs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import keras
import mindspore as ms
import numpy as np
import pytest
from isolate import in_fresh_process
from mindspore import nn, ops
from nets import resnet_tiny
from twin_weights import copy_weights, dense_rows_nhwc

import amct_bridge.keras as akeras
import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.mindspore.espdl_weights import source_layers
from amct_bridge.records import LayerFactors, Record, load, save
from amct_bridge.records.calibration import (
    CalibrationStats,
    LayerStats,
    TensorRange,
    sidecar_path,
)

#: chip output vs the MindSpore float output, max abs error / max |float output| (as for Keras
#: models in tests/espdl/test_chip_keras.py: int16 keeps ~15 bits per layer, int8 ~7).
#: Measured here: s16 2e-4 .. 2.1e-3 (ResNet-style: 1.7e-3), s8 3e-2 .. 8.2e-2 (per-tensor and
#: per-channel).
TOLERANCE = {"s16": 0.005, "s8": 0.2}
BN_EPS = 1e-5  # MindSpore's default; the Keras twins use it too


# ---- the networks ---------------------------------------------------------------------------
class Block(nn.Cell):
    """Residual block: conv-bn-relu-conv-bn, + identity (functional), relu."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, has_bias=True)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu2 = nn.ReLU()

    def construct(self, x):
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(y + x)


class Branchy(nn.Cell):
    """Stem (pad_mode='pad', padding 1 = SAME) + BN + ReLU, residual block, depthwise + BN +
    LeakyReLU, 1x1 conv + PReLU, a side 1x1 conv, channel concat, max pool, global average
    pool, Flatten, Dense."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, pad_mode="pad", padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.block = Block(8)
        self.dw = nn.Conv2d(8, 8, 3, group=8, has_bias=True)
        self.dw_bn = nn.BatchNorm2d(8)
        self.dw_act = nn.LeakyReLU(0.1)
        self.pw = nn.Conv2d(8, 6, 1, has_bias=True)
        self.pw_act = nn.PReLU(6, 0.2)
        self.side = nn.Conv2d(8, 4, 1)
        self.mp = nn.MaxPool2d(2, 2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(10, 3)

    def construct(self, x):
        x = self.block(self.relu(self.bn(self.stem(x))))
        p = self.pw_act(self.pw(self.dw_act(self.dw_bn(self.dw(x)))))
        c = self.mp(ops.concat((p, self.side(x)), 1))
        return self.fc(self.flatten(self.gap(c)))


class FlatDense(nn.Cell):
    """conv (valid, 8x8 -> 6x6, 4 ch), max pool -> 3x3, Flatten (36 = 4 ch x 9), Dense, Dense."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="valid", has_bias=True)
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(36, 8, activation="relu")
        self.fc2 = nn.Dense(8, 2)

    def construct(self, x):
        return self.fc2(self.fc1(self.flatten(self.pool(self.conv(x)))))


def _randomize(net: nn.Cell, seed: int) -> nn.Cell:
    """Random weights and BN statistics (so BN folding and biases are not trivial)."""
    rng = np.random.default_rng(seed)
    for _, p in net.parameters_and_names():
        shape = tuple(p.shape)
        if p.name.endswith(("moving_variance", "gamma")):
            value = rng.uniform(0.5, 1.5, shape)
        elif p.name.endswith("pw_act.w"):
            value = rng.uniform(0.05, 0.3, shape)
        else:
            value = rng.normal(0, 0.3, shape)
        p.set_data(ms.Tensor(value.astype(np.float32)))
    return net


def branchy() -> nn.Cell:
    """Factory for the CLI: Branchy with the test's weights, input (1, 3, 8, 8)."""
    return _randomize(Branchy(), 1)


def branchy_untrained() -> nn.Cell:
    """Factory for the CLI with --ckpt: Branchy with MindSpore's initial weights."""
    ms.set_seed(7)
    return Branchy()


def flat_dense() -> nn.Cell:
    return _randomize(FlatDense(), 2)


# ---- Keras twins (weights converted in twin_weights.py, independently of the adapter) -----
def _bn(name: str):
    return keras.layers.BatchNormalization(epsilon=BN_EPS, name=name)


def keras_branchy(net: nn.Cell) -> keras.Model:
    L = keras.layers  # noqa: N806
    x = keras.Input((8, 8, 3), name="input0")
    y = L.ReLU(name="relu")(
        _bn("bn")(L.Conv2D(8, 3, padding="same", use_bias=False, name="stem")(x))
    )
    z = L.Conv2D(8, 3, padding="same", use_bias=False, name="block.conv1")(y)
    z = L.ReLU(name="block.relu1")(_bn("block.bn1")(z))
    z = _bn("block.bn2")(L.Conv2D(8, 3, padding="same", name="block.conv2")(z))
    y = L.ReLU(name="block.relu2")(L.Add(name="block.add_op0")([z, y]))
    d = _bn("dw_bn")(L.DepthwiseConv2D(3, padding="same", name="dw")(y))
    d = L.LeakyReLU(negative_slope=0.1, name="dw_act")(d)
    p = L.PReLU(shared_axes=[1, 2], name="pw_act")(L.Conv2D(6, 1, padding="same", name="pw")(d))
    s = L.Conv2D(4, 1, padding="same", use_bias=False, name="side")(y)
    c = L.MaxPooling2D(2, name="mp")(L.Concatenate(name="concat_op0")([p, s]))
    g = L.Flatten(name="flatten")(L.GlobalAveragePooling2D(keepdims=True, name="gap")(c))
    model = keras.Model(x, L.Dense(3, name="fc")(g))
    copy_weights(model, net)
    return model


def keras_flat_dense(net: nn.Cell) -> keras.Model:
    L = keras.layers  # noqa: N806
    x = keras.Input((8, 8, 3), name="input0")
    y = L.MaxPooling2D(2, name="pool")(L.Conv2D(4, 3, name="conv")(x))
    y = L.Dense(8, activation="relu", name="fc1")(L.Flatten(name="flatten")(y))
    model = keras.Model(x, L.Dense(2, name="fc2")(y))
    copy_weights(model, net, flatten_chw=("fc1", 4, 9))
    return model


def ms_forward(net: nn.Cell, x_nchw: np.ndarray) -> np.ndarray:
    net.set_train(False)
    return net(ms.Tensor(x_nchw)).asnumpy()


_CALIBRATED: dict = {}


def _calibrated(which: str, tmp_path_factory) -> tuple:
    """(name, MindSpore net, Keras twin, NCHW data, record calibrated on the twin), cached."""
    if which not in _CALIBRATED:
        _CALIBRATED[which] = _calibrate(which, tmp_path_factory.mktemp(which) / "record.txt")
    return _CALIBRATED[which]


def _calibrate(which: str, record: Path) -> tuple:
    ms_net = branchy() if which == "branchy" else flat_dense()
    model = (keras_branchy if which == "branchy" else keras_flat_dense)(ms_net)
    data = np.random.default_rng(3).uniform(0, 1, (6, 3, 8, 8)).astype(np.float32)
    nhwc = data.transpose(0, 2, 3, 1)
    # the twins compute the same function (the layouts above are right)
    want = ms_forward(ms_net, data)
    got = model.predict(nhwc, verbose=0)
    assert np.allclose(got, want, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    akeras.calibrate(model, nhwc, record, algorithm="minmax", batch_size=3)
    return which, ms_net, model, data, record


@pytest.fixture(scope="module", params=["branchy", "flat_dense"])
def twins(request, tmp_path_factory):
    return _calibrated(request.param, tmp_path_factory)


# ---- (1) same export as the Keras twin ------------------------------------------------------
def _ints(res):
    out = {}
    for layer in res.layers:
        p = layer.preview
        out[layer.name] = [
            (np.asarray(t.values).tolist(), np.asarray(t.exponent).tolist())
            for t in (p.filter, p.bias, p.activation)
            if t is not None
        ]
    return out


@pytest.mark.parametrize(
    "ftype, granularity", [("s8", "per-tensor"), ("s16", "per-tensor"), ("s8", "per-channel")]
)
def test_same_export_as_the_keras_twin(twins, ftype, granularity):
    which, ms_net, model, _, record = twins
    opts = {"feature_type": ftype, "granularity": granularity}
    k = akeras.export_espdl(model, record, None, **opts)
    m = ams.export_espdl(ms_net, record, None, sample_input=(1, 3, 8, 8), **opts)
    assert m.config == k.config
    assert _ints(m) == _ints(k)
    for a, b in zip(m.layers, k.layers, strict=True):
        assert a.fused == b.fused and a.sources == b.sources
        assert np.allclose(a.coefficients.filter, b.coefficients.filter, atol=1e-6)
    assert [r.to_json() for r in m.runtime] == [r.to_json() for r in k.runtime]
    assert m.graph == k.graph and m.graph_error is None
    assert m.warnings == k.warnings
    expected = {
        "branchy": ["stem", "block.conv1", "block.conv2", "dw", "pw", "side", "fc"],
        "flat_dense": ["conv", "fc1", "fc2"],
    }[which]
    assert [x.source for x in m.layers] == expected
    if which == "branchy":  # what was fused, worked by hand from the network
        assert [x.fused for x in m.layers][:4] == [
            ["stem", "bn", "relu"],
            ["block.conv1", "block.bn1", "block.relu1"],
            ["block.conv2", "block.bn2"],
            ["dw", "dw_bn", "dw_act"],
        ]
        assert m.config["pw"]["activation"] == {"type": "PReLU"}
        wanted = ("Add2D", "Concat", "MaxPool2D", "GlobalAveragePool2D")
        classes = [r.espdl_class for r in m.runtime if r.espdl_class in wanted]
        assert classes == list(wanted)


def test_source_layers_layouts():
    """OIHW -> HWIO, depthwise (C, 1, kH, kW) -> (kH, kW, C, 1), Dense (out, in) -> (in, out)."""
    net = branchy()
    layers = {x.name: x for x in source_layers(net, (1, 3, 8, 8))}
    stem = net.stem.weight.asnumpy()
    assert layers["stem"].weights["kernel"][2, 1, 0, 5] == stem[5, 0, 2, 1]
    dw = net.dw.weight.asnumpy()
    assert layers["dw"].weights["kernel"].shape == (3, 3, 8, 1)
    assert layers["dw"].weights["kernel"][0, 2, 6, 0] == dw[6, 0, 0, 2]
    assert np.array_equal(layers["fc"].weights["kernel"], net.fc.weight.asnumpy().T)
    assert layers["input0"].attrs["shape"] == (8, 8, 3)
    assert layers["stem"].attrs["padding"] == "same"  # pad_mode='pad', padding=1, stride 1
    assert layers["concat_op0"].attrs["axis"] == -1  # NCHW axis 1 -> the chip's channels
    bn = layers["dw_bn"]
    assert bn.attrs["epsilon"] == pytest.approx(BN_EPS)
    assert np.array_equal(bn.weights["variance"], net.dw_bn.moving_variance.asnumpy())
    assert layers["dw_act"].attrs["alpha"] == pytest.approx(0.1)


def test_pools_and_skipped_softmax():
    """Pool attrs come from the cell (MindSpore's AvgPool2d stride defaults to 1); a Softmax at
    the end is left to the host (issue 23 §2: no longer refused): the chip's output is its
    input."""
    net = nn.SequentialCell(
        [
            nn.Conv2d(3, 4, 3),
            nn.AvgPool2d(2),
            nn.MaxPool2d(3, 2, pad_mode="same"),
            nn.Flatten(),
            nn.Dense(64, 3),
            nn.Softmax(),
        ]
    )
    layers = {x.name: x for x in source_layers(net, (1, 3, 8, 8))}
    assert (layers["1"].kind, layers["1"].attrs["pool_size"], layers["1"].attrs["strides"]) == (
        "AveragePooling2D",
        (2, 2),
        (1, 1),
    )
    assert (layers["2"].attrs["strides"], layers["2"].attrs["padding"]) == ((2, 2), "same")
    r = TensorRange(-1.0, 1.0)
    stats = CalibrationStats(layers={k: LayerStats("Cell", r, r) for k in layers})
    res = ams.export_espdl(net, None, None, sample_input=(1, 3, 8, 8), stats=stats)
    assert res.skipped == [] and [(h.layer, h.function, h.reads) for h in res.host] == [
        ("5", "softmax", "4")
    ]
    assert res.graph["outputs"] == ["l_4"]  # the Dense (C identifier of "4")
    assert res.graph["host"][0]["chip"] == "l_4"


# ---- (2) the chip runs the MindSpore export close to the MindSpore net ----------------------
@pytest.mark.parametrize("ftype, granularity", [("s16", "per-tensor"), ("s8", "per-channel")])
def test_chip_simulation_close_to_mindspore(twins, tmp_path, ftype, granularity):
    _, ms_net, _, data, record = twins
    out = tmp_path / "espdl"
    ams.export_espdl(
        ms_net, record, out, sample_input=data[:1], feature_type=ftype, granularity=granularity
    )
    chip = simulate_chip(out, data.transpose(0, 2, 3, 1))  # the chip takes NHWC
    assert chip.warnings == []  # every bias is quantized for the scale the chip adds it at
    want = ms_forward(ms_net, data)
    got = chip.output.to_float()
    assert got.shape == want.shape
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < TOLERANCE[ftype], err


def _hooked_sidecar(net: nn.Cell, data: np.ndarray) -> CalibrationStats:
    """Input/output min/max of every leaf cell (all its call sites merged, as the MindSpore
    probes do), read with PyNative forward hooks: independent of the exporter and of Keras."""
    seen: dict[str, list] = {}

    def hook(name):
        def fn(cell, args, output):
            for side, t in (("input", args[0]), ("output", output)):
                v = t.asnumpy()
                lo, hi = seen.setdefault(f"{name}:{side}", [np.inf, -np.inf])
                seen[f"{name}:{side}"] = [min(lo, float(v.min())), max(hi, float(v.max()))]

        return fn

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    leaves = [(n, c) for n, c in net.cells_and_names() if n and not c.name_cells()]
    handles = [c.register_forward_hook(hook(n)) for n, c in leaves]
    try:
        ms_forward(net, data)
    finally:
        for h in handles:
            h.remove()
        ms.set_context(mode=mode)
    stats = CalibrationStats(algorithm="minmax", batches=1)
    for name, _ in leaves:
        rng = {k: TensorRange(*seen[f"{name}:{k}"]) for k in ("input", "output")}
        stats.layers[name] = LayerStats("Cell", rng["input"], rng["output"])
    return stats


def test_resnet_blocks_with_downsample_on_the_chip():
    """ResNet-style (nested blocks, 1x1 downsample, one ReLU cell called twice per block, global
    pool, Flatten, Dense) with a sidecar from the MindSpore net itself (no Keras twin)."""
    net = _randomize(resnet_tiny(), 4)
    data = np.random.default_rng(5).uniform(0, 1, (3, 3, 16, 16)).astype(np.float32)
    stats = _hooked_sidecar(net, data)
    res = ams.export_espdl(net, None, None, sample_input=data[:1], stats=stats, feature_type="s16")
    assert res.graph_error is None and res.skipped == []
    assert [x.source for x in res.layers if x.source.startswith("layer2.0")] == [
        "layer2.0.conv1",
        "layer2.0.conv2",
        "layer2.0.down.0",
    ]
    adds = [r for r in res.runtime if r.espdl_class == "Add2D"]
    assert [r.source for r in adds] == [f"layer{i}.{j}.add_op0" for i in (1, 2) for j in (0, 1)]
    chip = simulate_chip(res, data.transpose(0, 2, 3, 1))
    want = ms_forward(net, data)
    err = float(np.abs(chip.output.to_float() - want).max() / np.abs(want).max())
    assert err < TOLERANCE["s16"], err


def test_flatten_dense_rows_reordered_for_nhwc():
    """The chip flattens NHWC: without reordering the Dense rows the outputs would differ."""
    net = flat_dense()
    fc1 = {x.name: x for x in source_layers(net, (1, 3, 8, 8))}["fc1"]
    w = net.fc1.weight.asnumpy()  # (8, 36): column c*9 + s
    assert np.array_equal(fc1.weights["kernel"], dense_rows_nhwc(w, 4, 9))
    x = np.random.default_rng(0).normal(size=(2, 4, 3, 3)).astype(np.float32)  # NCHW map
    want = x.reshape(2, -1) @ w.T  # what MindSpore computes
    got = x.transpose(0, 2, 3, 1).reshape(2, -1) @ fc1.weights["kernel"]  # the chip's order
    assert np.allclose(got, want, atol=1e-5)
    assert not np.allclose(x.transpose(0, 2, 3, 1).reshape(2, -1) @ w.T, want, atol=1e-2)


# ---- (3) CLI --------------------------------------------------------------------------------
def test_cli_round_trip(tmp_path_factory, tmp_path, capsys):
    _, ms_net, _, _, record = _calibrated("branchy", tmp_path_factory)
    ms_record = tmp_path / "ms_record.txt"
    save(Record(dict(load(record).layers)), ms_record, flavor="mindspore")
    sidecar_path(ms_record).write_bytes(sidecar_path(record).read_bytes())
    ckpt = tmp_path / "w.ckpt"
    ms.save_checkpoint(ms_net, str(ckpt))
    out = tmp_path / "espdl"
    spec = f"{Path(__file__)}:branchy_untrained"
    argv = ["export-espdl", "--mindspore", spec, "--ckpt", str(ckpt), "--input-shape", "1,3,8,8"]
    code = main([*argv, "--record", str(ms_record), "--out", str(out), "--feature-type", "s16"])
    assert code == 0, capsys.readouterr().err
    assert "wrote 7 layers" in capsys.readouterr().out
    want = ams.export_espdl(ms_net, record, None, sample_input=(1, 3, 8, 8), feature_type="s16")
    assert json.loads((out / "config.json").read_text()) == want.config
    for layer in want.layers:
        saved = np.load(out / f"{layer.name}_filter.npy")
        assert np.array_equal(saved, layer.coefficients.filter)
    names = json.loads((out / "names.json").read_text())
    assert names["block_conv1"] == "block.conv1"
    # --preview prints, writes nothing; --input-shape is required
    code = main([*argv, "--record", str(ms_record), "--preview"])
    assert code == 0 and "block_conv1" in capsys.readouterr().out
    bad = tmp_path / "x"
    code = main(
        ["export-espdl", "--mindspore", spec, "--record", str(ms_record), "--out", str(bad)]
    )
    assert code == 2 and "--input-shape" in capsys.readouterr().err
    assert not bad.exists()


# ---- (4) errors -----------------------------------------------------------------------------
def test_record_with_unknown_cells_says_did_you_mean():
    factors = LayerFactors(scale_d=0.01, offset_d=0)
    rec = Record({"block.cnv1": factors, "stem": factors, "spare": factors, "zzz": factors})
    net = branchy()
    net.spare = nn.Conv2d(3, 3, 1)  # a cell construct never calls
    with pytest.raises(ExportError) as err:
        ams.export_espdl(net, rec, None, sample_input=(1, 3, 8, 8))
    assert str(err.value) == (
        "record keys that are not cells of Branchy (is this the network the record was made "
        "for?): 'block.cnv1' (did you mean 'block.conv1'?), 'spare' (a cell construct never "
        "calls), 'zzz'"
    )


def test_depthwise_multiplier_2_is_refused():
    net = nn.SequentialCell([nn.Conv2d(3, 8, 3), nn.Conv2d(8, 16, 3, group=8), nn.ReLU()])
    with pytest.raises(ExportError, match=r"layer '1' \(Conv2d\): depth_multiplier 2: ESP-DL v1"):
        ams.export_espdl(net, None, None, sample_input=(1, 3, 8, 8))


class _Unsupported(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=(0, 1, 0, 1))
        self.sig = nn.Sigmoid()
        self.up = nn.Conv2dTranspose(4, 4, 2, stride=2)
        self.pool = nn.MaxPool2d(3, 1, pad_mode="pad", padding=1)
        self.flatten = nn.Flatten()

    def construct(self, x):
        return self.flatten(self.pool(self.up(self.sig(self.conv(x)))))


def test_unsupported_cells_are_named_with_reasons():
    with pytest.raises(ExportError) as err:
        ams.export_espdl(_Unsupported(), None, None, sample_input=(1, 3, 8, 8))
    *lines, hint = str(err.value).splitlines()[1:]
    assert hint.startswith("to export the rest, pass --skip-unsupported (Python: skip_unsupported")
    # the conv's explicit padding (0, 1, 0, 1) exports now (PADDING_NOT_SET): not listed
    assert lines[0] == "  layer 'sig' (Sigmoid): MindSpore nn.Sigmoid has no ESP-DL v1 equivalent"
    assert (
        "layer 'up' (Conv2dTranspose): nn.Conv2dTranspose: ESP-DL v1 has no transposed"
        in (lines[1])
    )
    assert lines[2] == "  layer 'pool' (MaxPool2d): pooling with pad_mode='pad': use " + (
        "pad_mode='same' or 'valid'"
    )
    assert "layer 'flatten' (Flatten): Flatten of an NCHW map with H*W > 1" in lines[3]
    assert len(lines) == 4


class _Padded(nn.Cell):
    def __init__(self, padding) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, pad_mode="pad", padding=padding, has_bias=True)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.conv(x))


@pytest.mark.parametrize(
    "padding, pads",
    # (0, 1, 0, 1) is SAME_END here: no explicit pads
    [((0, 1, 0, 1), None), (1, [1, 0, 1, 0]), ((2, 0, 1, 1), [2, 0, 1, 0])],
)
def test_explicit_conv_padding_exports_the_pads_the_windows_read(padding, pads):
    """pad_mode='pad' on 8x8 at stride 2: the pads past the last window are never read, so the
    export writes the ones that are (PADDING_NOT_SET), and the chip matches MindSpore."""
    net = _randomize(_Padded(padding), 7)
    data = np.random.default_rng(8).uniform(-1, 1, (3, 3, 8, 8)).astype(np.float32)
    stats = _hooked_sidecar(net, data)
    res = ams.export_espdl(net, None, None, sample_input=data[:1], stats=stats, feature_type="s16")
    assert [x.pads for x in res.layers][:1] == [pads]
    chip = simulate_chip(res, data.transpose(0, 2, 3, 1))
    want = ms_forward(net, data).transpose(0, 2, 3, 1)  # the chip's map is NHWC
    assert chip.output.values.shape == want.shape == (3, 4, 4, 4)
    err = float(np.abs(chip.output.to_float() - want).max() / np.abs(want).max())
    assert err < TOLERANCE["s16"], err


def test_call_sites_share_the_cells_ranges(tmp_path):
    """A ReLU called twice has one sidecar entry: its second site (``relu@1``) uses it."""

    class Twice(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.relu = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1), nn.ReLU()

        def construct(self, x):
            return self.relu(self.b(self.relu(self.a(x))))

    r = TensorRange(0.0, 3.0)
    stats = CalibrationStats(layers={"a": LayerStats("Conv2D", input=TensorRange(0, 1))})
    stats.layers["relu"] = LayerStats("ReLU", input=r, output=r)
    res = ams.export_espdl(Twice(), None, None, sample_input=(1, 3, 4, 4), stats=stats)
    b = {x.source: x for x in res.layers}["b"]
    assert b.fused == ["b", "relu@1"]
    assert b.sources["output_exponent"] == "sidecar output range of 'relu@1'"
    assert res.config["b"]["output_exponent"] == math.ceil(math.log2(3.0 / 127))
    assert "relu@1" not in stats.layers  # the caller's sidecar is not modified


def test_skipped_cells_still_export_with_their_calibrated_exponents(tmp_path):
    """The report's fragment (skip_layers) then the export: skipped cells keep their sidecar
    ranges, so the export gives the full calibration's config.json (minmax: same ranges) and a
    note per cell the record leaves out (the export stopped on 'no calibrated output range')."""
    net = resnet_tiny()
    x = np.random.default_rng(2).normal(0, 1, (8, 3, 16, 16)).astype(np.float32)
    ams.calibrate(net, x, tmp_path / "full.txt", algorithm="minmax")
    skip = ["fc", "layer2.0.down.0"]
    ams.calibrate(net, x, tmp_path / "skip.txt", algorithm="minmax", skip_layers=skip)
    assert not set(skip) & set(load(tmp_path / "skip.txt").layers)
    full = ams.export_espdl(net, tmp_path / "full.txt", tmp_path / "ef", sample_input=x[:1])
    part = ams.export_espdl(net, tmp_path / "skip.txt", tmp_path / "es", sample_input=x[:1])
    configs = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("ef", "es")]
    assert configs[0] == configs[1]
    notes = [w for w in part.warnings if "has no record entry" in w]
    assert [n.split("'")[1] for n in notes] == ["layer2.0.down.0", "fc"]
    assert not [w for w in full.warnings if "has no record entry" in w]


def test_a_resnet_as_users_write_it_trains_groups_and_runs_on_the_chip(tmp_path, request):
    """``out += identity`` (InplaceAddExt) and ``pad_mode='pad', padding=1`` convs at stride 1
    and 2 (refused before: 'functional InplaceAddExt has no ESP-DL v1 equivalent', 'neither
    SAME nor VALID'): trained a few steps, it gives the residual prune groups, exports with
    the stride-2 pads the windows read (1, 0: PADDING_NOT_SET), and the chip's arg max equals
    the float network's."""
    if in_fresh_process(request):  # out += y: see isolate.py
        return
    from mindspore import dataset as ds
    from mindspore.train import Model
    from nets import resnet_user

    from amct_bridge.mindspore import calibrate, prune_discovery

    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)  # as the model zoo trains
    try:
        _users_resnet(tmp_path, calibrate, prune_discovery, resnet_user, ds, Model)
    finally:
        ms.set_context(mode=before)


def _users_resnet(tmp_path, calibrate, prune_discovery, resnet_user, ds, Model):
    net = resnet_user()
    rng = np.random.default_rng(6)
    x = rng.uniform(0, 1, (12, 3, 16, 16)).astype(np.float32)
    y = (x[:, 0].mean((1, 2)) > x[:, 1].mean((1, 2))).astype(np.int32)
    data = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(4)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    Model(net, loss, nn.SGD(net.trainable_params(), 0.01)).train(1, data)

    groups = prune_discovery(net, (1, 3, 16, 16)).groups
    residual = [
        g for g in groups if any(m.name == "layer1.0.inplaceaddext_op0" for m in g.consumers)
    ]
    assert len(residual) == 1
    assert {m.name for m in residual[0].producers} == {"conv1", "layer1.0.conv2", "layer1.1.conv2"}

    record = tmp_path / "record.txt"
    calibrate(net, x, record, algorithm="minmax")
    res = ams.export_espdl(net, record, tmp_path / "espdl", sample_input=x[:1], feature_type="s16")
    assert res.graph_error is None and res.skipped == []
    pads = {x.source: x.pads for x in res.layers}
    assert pads["layer2.0.conv1"] == [1, 0, 1, 0]  # stride 2: the bottom/right pad is not read
    assert pads["layer1.0.conv1"] is None  # stride 1, padding 1: SAME
    adds = [r.source for r in res.runtime if r.espdl_class == "Add2D"]
    assert adds == [f"layer{i}.{j}.inplaceaddext_op0" for i in (1, 2) for j in (0, 1)]
    chip = simulate_chip(res, x.transpose(0, 2, 3, 1))
    want = ms_forward(net, x)
    err = float(np.abs(chip.output.to_float() - want).max() / np.abs(want).max())
    assert err < TOLERANCE["s16"], err
    assert (chip.output.to_float().argmax(1) == want.argmax(1)).all()
