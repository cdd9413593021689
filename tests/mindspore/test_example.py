"""examples/mindspore_calibrate_export.py runs end to end (GRAPH_MODE) and its outputs hold up
against independent checks: the record's keys are the cells worked out by hand, the prune groups
are the ones the residual add couples, the ESP-DL files exist, and the simulated and on-chip int8
accuracies stay within a few points of the float accuracy."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import mindspore as ms

from amct_bridge.records import load

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mindspore_calibrate_export.py"


def test_example_runs(tmp_path):
    spec = importlib.util.spec_from_file_location("mindspore_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # MindSpore's graph parser looks the cells' module up
    spec.loader.exec_module(example)
    figures = example.run(tmp_path, ms.GRAPH_MODE)
    rec = load(tmp_path / "record.txt")
    assert list(rec.layers) == ["stem", "block.conv1", "block.conv2", "fc"]
    assert figures["quantized cells"] == 4 and figures["ESP-DL layers"] == 4
    # stem and block.conv2 feed the same add (one group); block.conv1 alone; fc is the output
    pruned = load(tmp_path / "record_pruned.txt", flavor="inner")
    producers = sorted(sorted(n.name for n in r.producers) for r in pruned.prune_records)
    assert producers == [["block.conv1"], ["block.conv2", "stem"]]
    assert figures["prune groups"] == 2
    assert json.loads((tmp_path / "espdl" / "config.json").read_text())
    assert figures["float accuracy"] > 0.7  # the synthetic task is learnable
    assert abs(figures["simulated accuracy"] - figures["float accuracy"]) <= 0.03
    assert abs(figures["chip (int8) accuracy"] - figures["float accuracy"]) <= 0.05
