"""MindSpore prune records (inner flavor), 2:4 masks on MindSpore layouts, and the CLI."""

from __future__ import annotations

import json
import os

import mindspore as ms
import nets
import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.commands.mindspore_net import load_mindspore_net
from amct_bridge.errors import AmctBridgeError
from amct_bridge.graph.selective import unpack_mask
from amct_bridge.mindspore import (
    apply_selective_masks,
    extract_graph,
    prune_discovery,
    prune_record,
    selective_masks,
)
from amct_bridge.records import LayerFactors, Record, load, save, validate


@pytest.fixture(autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)


def node_tuple(node) -> tuple:
    extra = tuple((a.name, a.value) for a in node.attrs if a.name not in ("type", "begin", "end"))
    return (node.name, node.get("type"), node.get("begin"), node.get("end"), extra)


def test_records_round_trip_and_validate(tmp_path):
    net = nets.flatten_dense()
    record = prune_record(net, nets.INPUT_SHAPES["flatten_dense"])
    assert record.flavor == "inner"
    path = tmp_path / "prune.txt"
    save(record, path)
    back = load(path)
    assert validate(back) == []
    assert back.prune_records == record.prune_records
    first = back.prune_records[0]
    assert [node_tuple(n) for n in first.producers] == [("conv", "Conv2D", 0, 4, ())]
    assert [node_tuple(n) for n in first.consumers] == [
        ("pool", "MaxPool", 0, 4, ()),
        ("flatten", "Reshape", 0, 16, (("multiplier", 4),)),
        ("fc1", "MatMul", 0, 16, (("multiplier", 4),)),
    ]
    assert [node_tuple(n) for n in back.prune_records[1].producers] == [("fc1", "MatMul", 0, 8, ())]


def test_resnet_record_has_one_prune_record_per_group_with_every_add_producer():
    net = nets.resnet_tiny()
    shape = nets.INPUT_SHAPES["resnet_tiny"]
    base = Record(layers={"layer1.0.conv1": LayerFactors(scale_d=0.1, offset_d=0)})
    record = prune_record(net, shape, record=base)
    discovery = prune_discovery(net, shape)
    assert len(record.prune_records) == len(discovery.groups) == 6
    stage2 = next(r for r in record.prune_records if r.producers[0].name == "layer2.0.conv2")
    assert [n.name for n in stage2.producers] == [
        "layer2.0.conv2",
        "layer2.0.down.0",
        "layer2.1.conv2",
    ]
    assert {n.get("type") for n in stage2.consumers} >= {"AddV2", "FusedBatchNormV3", "MatMul"}
    # the quantized layer lists its group's producers (prune_producer) and consumers
    factors = record.layers["layer1.0.conv1"]
    assert factors.prune_producer == ["conv1", "layer1.0.conv2", "layer1.1.conv2"]
    assert factors.prune_consumer == ["layer1.0.bn1", "layer1.0.relu", "layer1.0.conv2"]


def test_two_four_masks_on_oihw_and_dense_weights():
    net = nets.sequential_net()
    graph = extract_graph(net, nets.INPUT_SHAPES["sequential_net"])
    masks = selective_masks(net, graph=graph)
    assert sorted(masks) == ["0", "4", "7"]
    for name in masks:
        w = next(c for n, c in net.cells_and_names() if n == name).weight.asnumpy()
        mask = masks[name]
        assert mask.shape == w.shape
        # brute force: in each run of 4 input channels (axis 1 for OIHW and (out, in)), the
        # 2 largest |w| are kept
        moved = np.moveaxis(np.abs(w), 1, -1).reshape(-1, w.shape[1])
        kept = np.moveaxis(mask, 1, -1).reshape(-1, w.shape[1])
        for row, keep in zip(moved, kept, strict=True):
            for start in range(0, row.size, 4):
                run = row[start : start + 4]
                order = sorted(range(run.size), key=lambda i: (-run[i], i))[: min(2, run.size)]
                assert sorted(np.flatnonzero(keep[start : start + 4]).tolist()) == sorted(order)
    apply_selective_masks(net, masks)
    assert np.all(net[0].weight.asnumpy()[~masks["0"]] == 0)
    record = prune_record(net, graph=graph, channel=False, selective=True, masks=masks)
    sel = record.prune_records[0].selective_prune
    assert sel.get("mask_shape") == [6, 3, 3, 3]  # OIHW, as MindSpore stores the weight
    np.testing.assert_array_equal(unpack_mask(sel.get("selective_mask"), (6, 3, 3, 3)), masks["0"])


def test_cli_prune_groups_with_a_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    net = nets.resnet_tiny()
    for _, p in net.parameters_and_names():
        p.set_data(ms.Tensor(np.full(p.shape, 0.5, np.float32)))
    ckpt = tmp_path / "w.ckpt"
    ms.save_checkpoint(net, str(ckpt))
    record_path = tmp_path / "prune.txt"
    spec = f"{nets.__file__}:resnet_tiny"
    args = ["prune-groups", "--mindspore", spec, "--input-shape", "1,3,16,16"]
    assert main([*args, "--ckpt", str(ckpt), "--json", "--record", str(record_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in data["groups"][0]["producers"]] == [
        "conv1",
        "layer1.0.conv2",
        "layer1.1.conv2",
    ]
    assert data["refusals"][0]["layer"] == "fc"
    assert len(load(record_path).prune_records) == 6
    assert main(args) == 0
    assert "group 1: 8 channels" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == ["prune.txt", "w.ckpt"]  # nothing else left behind
    loaded = load_mindspore_net(spec, str(ckpt))
    assert all(np.all(p.asnumpy() == 0.5) for _, p in loaded.parameters_and_names())


def test_cli_module_spec_and_bad_checkpoint(tmp_path, capsys):
    loaded = load_mindspore_net(f"{nets.__file__}:depthwise_net")
    other = nets.group_conv_net()  # conv 1 weight (16, 2, 3, 3) where depthwise has (16, 1, 3, 3)
    ckpt = tmp_path / "other.ckpt"
    ms.save_checkpoint(other, str(ckpt))
    with pytest.raises(AmctBridgeError) as err:
        load_mindspore_net(f"{nets.__file__}:depthwise_net", str(ckpt))
    text = str(err.value)
    assert "does not fit SequentialCell" in text
    assert "1.weight (16, 2, 3, 3) in the checkpoint, (16, 1, 3, 3) in the network" in text
    assert "2.gamma missing from the checkpoint" in text
    assert type(loaded).__name__ == "SequentialCell"
    code = main(["prune-groups", "--mindspore", "nets_missing_mod:f", "--input-shape", "1,3,8,8"])
    assert code == 2 and "cannot import 'nets_missing_mod'" in capsys.readouterr().err
    code = main(["prune-groups", "--mindspore", f"{nets.__file__}:resnet_tiny"])
    assert code == 2 and "needs --input-shape" in capsys.readouterr().err


def test_cli_takes_a_dotted_module_from_the_working_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(nets.__file__))))
    record_path = tmp_path / "r.txt"
    args = ["prune-groups", "--mindspore", "tests.mindspore.nets:concat_net"]
    assert main([*args, "--input-shape", "1,3,8,8", "--record", str(record_path)]) == 0
    assert "group 3: 2 channels" in capsys.readouterr().out
    offsets = [
        (n.name, n.get("begin"), n.get("end"))
        for r in load(record_path).prune_records
        for n in r.consumers
        if n.name == "head"
    ]
    assert offsets == [("head", 0, 4), ("head", 4, 10), ("head", 10, 12)]
