"""End-to-end demo (run by `make demo`): inspect, validate and convert a real AMCT record."""

from __future__ import annotations

import tempfile
from pathlib import Path

from amct_bridge.cli import main

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "data" / "amct" / "tf_mobilenet_v2_record_quantized.txt"


def demo() -> None:
    """Inspect, validate and convert the bundled MobileNetV2 record from Ascend/samples."""
    out = Path(tempfile.mkdtemp(prefix="amct_bridge_demo_"))
    print("== inspect (first rows)")
    main(["inspect", str(RECORD)])
    print("\n== validate")
    main(["validate", str(RECORD)])
    print("\n== convert-record --to mindspore")
    main(["convert-record", str(RECORD), "--to", "mindspore", "-o", str(out / "mindspore.txt")])
    print(f"\noutputs in {out}")


if __name__ == "__main__":
    demo()
