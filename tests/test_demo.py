"""`make demo` works: the end-to-end example runs and leaves every promised output, including
those of examples/mindspore_calibrate_export.py, which it runs as users run it (its own process)."""

import json
import subprocess
import sys
from pathlib import Path

from amct_bridge.records import load, validate

ROOT = Path(__file__).resolve().parent.parent


def test_demo_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = load(out / "record.txt")
    assert list(record.layers) == ["conv1", "dw2", "pw2", "logits"]
    assert validate(record) == []
    assert load(out / "record_tf.txt", "tf").layers == record.layers
    prune = load(out / "prune.txt", "inner")
    assert prune.prune_records and validate(prune) == []
    config = json.loads((out / "espdl" / "config.json").read_text())
    assert list(config) == ["conv1", "dw2", "pw2", "logits"]
    line = next(x for x in result.stdout.splitlines() if x.startswith("float:"))
    float_acc, int8_acc = float(line.split()[1]), float(line.split()[4])
    assert float_acc > 0.85 and abs(float_acc - int8_acc) < 0.03
    # the C++ files and the chip's accuracy next to float and fake-quant (espdl-eval)
    names = ["digits_coefficient.cpp", "digits_coefficient.hpp", "digits_model.hpp"]
    assert all((out / "espdl" / name).is_file() for name in [*names, "app_main.cpp"])
    lines = result.stdout.splitlines()
    labels = ("float accuracy:", "fake-quant accuracy:", "chip accuracy:")
    figures = {x.split(":")[0]: float(x.split()[2]) for x in lines if x.startswith(labels)}
    assert figures["float accuracy"] == float_acc  # the same test set as step 4
    assert figures["fake-quant accuracy"] == int8_acc
    chip = next(x for x in lines if x.startswith("chip accuracy:"))
    assert "(esp32s3, bit-exact simulator)" in chip
    assert float_acc - 0.1 < figures["chip accuracy"] <= 1.0  # s8 per-tensor
    others = {x.split()[1]: float(x.split()[-1]) for x in lines if x.startswith(("s8 ", "s16 "))}
    assert set(others) == {"per-channel", "per-tensor"}
    assert abs(others["per-tensor"] - float_acc) < 0.02  # s16: the chip is nearly float
    page = (out / "report.html").read_text()  # the per-layer report, with its plots
    assert page.count("data:image/png;base64,") == 3
    # a skip_layers suggestion only when quantizing costs accuracy (issue 23 §6)
    if "no accuracy drop" in page:
        assert "skip_layers: &quot;" not in page
    else:
        assert "skip_layers: &quot;" in page
    # 8: the MindSpore chain, examples/mindspore_calibrate_export.py
    ms_record = load(out / "mindspore" / "record.txt", "inner")
    assert list(ms_record.layers) == ["stem", "block.conv1", "block.conv2", "fc"]
    assert validate(ms_record) == []
    assert (out / "mindspore" / "espdl" / "config.json").is_file()
    ms_start = next(i for i, x in enumerate(lines) if x.startswith("== 8."))
    ms_figures = {x[:22].strip(): x[22:].strip() for x in lines[ms_start + 1 :]}
    assert ms_figures["quantized cells"] == "4" and ms_figures["prune groups"] == "2"
    assert ms_figures["ESP-DL layers"] == "4"
    ms_float = float(ms_figures["float accuracy"])
    assert ms_float > 0.7  # the synthetic task is learnable
    assert abs(float(ms_figures["simulated accuracy"]) - ms_float) <= 0.03
    assert abs(float(ms_figures["chip (int8) accuracy"]) - ms_float) < 0.05
    # stem and block.conv2 feed the same add (one group); block.conv1 alone; fc is the output
    pruned = load(out / "mindspore" / "record_pruned.txt", "inner")
    producers = sorted(sorted(n.name for n in r.producers) for r in pruned.prune_records)
    assert producers == [["block.conv1"], ["block.conv2", "stem"]]
    assert json.loads((out / "mindspore" / "espdl" / "config.json").read_text())
