"""Generate amct_bridge/records/_pb/*_pb2.py from proto/*.proto (run: `make proto`).

protoc writes top-level imports (``import basic_info_pb2``); they are rewritten to package-relative
ones so the generated modules live inside amct_bridge. The test suite calls ``generate()`` into a
temp dir and compares with the committed files, so schema and code cannot drift apart.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
OUT_DIR = PROTO_DIR.parent / "amct_bridge" / "records" / "_pb"


def run_protoc(args: list[str]) -> None:
    """Run grpc_tools' protoc (a dev dependency) on proto/ in a child process.

    In-process protoc crashes once TensorFlow's own protobuf/absl copies are loaded.
    """
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"protoc failed ({result.returncode}): {result.stderr.strip()}")


def generate(out_dir: Path = OUT_DIR) -> list[Path]:
    """Compile every proto/*.proto into ``out_dir``; return the written files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.name) for p in PROTO_DIR.glob("*.proto"))
    run_protoc([f"--python_out={out_dir}", *protos])
    written = []
    for name in protos:
        path = out_dir / (name[: -len(".proto")] + "_pb2.py")
        text = re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", path.read_text(), flags=re.M)
        path.write_text(text)
        written.append(path)
    init = out_dir / "__init__.py"
    init.write_text('"""Generated from proto/ by proto/generate.py. Do not edit."""\n')
    return [init, *written]


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR):
        print(path)
