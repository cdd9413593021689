"""`make demo` works: the end-to-end example runs and leaves every promised output."""

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
    page = (out / "report.html").read_text()  # the per-layer report, with its plots
    assert page.count("data:image/png;base64,") == 3 and "skip_layers: &quot;" in page
