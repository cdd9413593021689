"""Side by side with Espressif's esp-ppq on the same three nets, weights and digits.

Needs a second venv with esp-ppq (and torch, onnx): ``/opt/ppq`` by default, ``--ppq DIR``
(its ``bin/python`` runs ``benchmarks/_esp_ppq_worker.py``). esp-ppq is no dependency of this
project: this script only starts that interpreter. Not a ``bench_*`` file, so ``make bench``
skips it. About 15 minutes on 2 cores (MobileNetV2: 3 minutes of training, 4.5 of esp-ppq's
TQT; docs/espdl-v3.md, "Side by side with esp-ppq", has the figures).

Run: .venv/bin/python benchmarks/compare_esp_ppq.py [--ppq /opt/ppq] [--keep DIR]
[--settings s3_default,p4_default,...] [--tqt-steps 500]

In this venv: the nets of ``bench_espdl_v3_search.py --accuracy`` (its ``_nets``, ``_digits``,
``trained_net``: 1400 training digits, 397 held out, seed 0, calibrated on 256 training digits)
and our v3 s8 exports of them on esp32s3 and esp32p4, the range rule and searched on 512
training digits (``v3_predictions``). Each net's layers, weights, the same 256 calibration
digits and the 397 test digits (with Keras's logits) go to a temporary directory; the worker
builds a PyTorch twin of each net (NCHW), checks its logits against Keras's (max |diff| <=
1e-4) and quantizes it with ``esp_ppq.api.espdl_quantize_torch`` (s8, ``espdl_setting()``, the
256 digits in 8 batches of 32) to one ``.espdl`` per setting (``_esp_ppq_worker.SETTINGS``).
Back here every esp-ppq file runs on our simulator (``read_espdl``, ``quantize_input`` with the
file's input exponent and the target's rounding, ``simulate_espdl``) on the 397 test digits.
Prints per net: float accuracy, ours (range rule, searched) per target, esp-ppq per setting
(its own fake-quant accuracy beside it, from esp-ppq's executor, as a check that our simulator
reads its file as esp-ppq meant it), and each tool's wall time (ours: calibrate + export or
calibrate + search + export; esp-ppq: its whole ``espdl_quantize_torch`` call, ONNX export
included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
from bench_espdl_v3_search import _nets, trained_net, v3_predictions  # noqa: E402

from amct_bridge.espdl.v3 import read_espdl, simulate_espdl  # noqa: E402
from amct_bridge.espdl.v3.evaluation import quantize_input  # noqa: E402

HERE = Path(__file__).resolve().parent
LAYERS = {
    "InputLayer", "Conv2D", "DepthwiseConv2D", "BatchNormalization", "ReLU", "Activation",
    "ZeroPadding2D", "Add", "Multiply", "GlobalAveragePooling2D", "MaxPooling2D", "Dense",
    "Softmax",
}  # fmt: skip
KEYS = ("activation", "use_bias", "epsilon", "center", "scale", "max_value", "negative_slope",
        "threshold", "keepdims", "axis", "depth_multiplier")  # fmt: skip


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's "same" padding of one axis: (before, after), the extra one after."""
    span = (kernel - 1) * dilation + 1
    total = max((-(-size // stride) - 1) * stride + span - size, 0)
    return total // 2, total - total // 2


def graph_spec(model) -> list[dict]:
    """``model``'s layers in order, each with its class, inputs and the settings the PyTorch
    twin needs (convs: explicit (top, bottom, left, right) pads for "same")."""
    spec = []
    for layer in model.layers:
        kind = type(layer).__name__
        if kind not in LAYERS:
            raise ValueError(f"{layer.name}: {kind} has no PyTorch twin in _esp_ppq_worker.py")
        cfg = layer.get_config()
        entry = {"name": layer.name, "class": kind, "inputs": []}
        if kind != "InputLayer":
            node = layer._inbound_nodes[0]
            entry["inputs"] = [t._keras_history[0].name for t in node.input_tensors]
            entry["in_shape"] = [int(d) for d in node.input_tensors[0].shape[1:]]
        for key in KEYS:
            if key in cfg:
                entry[key] = cfg[key]
        if kind in ("Conv2D", "DepthwiseConv2D", "MaxPooling2D"):
            k = cfg.get("kernel_size") or cfg["pool_size"]
            s = cfg["strides"]
            d = cfg.get("dilation_rate", (1, 1))
            h, w = entry["in_shape"][:2]
            pads = (0, 0, 0, 0)
            if cfg["padding"] == "same":
                pads = _same_pads(h, k[0], s[0], d[0]) + _same_pads(w, k[1], s[1], d[1])
            entry.update(kernel=list(k), strides=list(s), dilation=list(d), pads=list(pads))
            if kind == "Conv2D" and cfg.get("groups", 1) != 1:
                raise ValueError(f"{layer.name}: grouped Conv2D")
        if kind == "ZeroPadding2D":
            entry["padding"] = [list(p) for p in cfg["padding"]]
        spec.append(entry)
    return spec


def keras_logits(model, x: np.ndarray) -> np.ndarray:
    """The input of ``model``'s final softmax (a Softmax layer, or a Dense's activation)."""
    import keras

    last = model.layers[-1]
    inner = keras.Model(model.input, last.input).predict(x, verbose=0)
    if type(last).__name__ == "Softmax":
        return inner
    if type(last).__name__ == "Dense" and last.get_config()["activation"] == "softmax":
        kernel, *bias = last.get_weights()
        return inner @ kernel + (bias[0] if bias else 0)
    raise ValueError(f"{last.name}: the net should end in a softmax")


def _ours(model, record, x, y, train, test, calib_time: float) -> list[tuple]:
    """(tool, setting, target, accuracy, seconds) of our range-rule and searched exports."""
    rows = []
    for target in ("esp32s3", "esp32p4"):
        for data in (None, x[train[:512]]):
            pred, took = v3_predictions(model, record, x[test], target, data)
            rule = "range rule" if data is None else "searched (512 digits)"
            acc = float(np.mean(pred == y[test]))
            rows.append(("ours", rule, target, acc, calib_time + took, None))
    return rows


def _esp_ppq(y_test: np.ndarray, x_test, result: dict) -> list[tuple]:
    """(tool, setting, target, accuracy on our simulator, seconds, (esp-ppq's own accuracy,
    how often its arg max is our simulator's)) of every file the worker wrote for ``key``."""
    rows = []
    for setting, info in result["settings"].items():
        if "error" in info:
            rows.append(("esp-ppq", setting, info["target"], None, info["seconds"], None))
            continue
        m = read_espdl(info["file"])
        shape = tuple(m.inputs[0].shape)  # esp-ppq writes NHWC, batch 1; batches simulate
        xs = x_test if shape[-1] == x_test.shape[-1] else x_test.transpose(0, 3, 1, 2)
        q = quantize_input(m, xs.reshape(len(xs), *shape[1:]), info["target"])
        out = next(iter(simulate_espdl(m, q, info["target"]).outputs.values()))
        preds = out.reshape(len(xs), -1).argmax(-1)
        acc = float(np.mean(np.array(preds) == y_test))
        same = float(np.mean(np.array(preds) == np.array(info["ppq_predictions"])))
        own = (info["ppq_accuracy"], same)
        rows.append(("esp-ppq", setting, info["target"], acc, info["seconds"], own))
    return rows


def main() -> None:
    """Train, export ours, run the esp-ppq worker, score everything on our simulator."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ppq", default="/opt/ppq", help="the esp-ppq venv")
    parser.add_argument("--keep", help="write the nets and .espdl files here (kept)")
    parser.add_argument("--settings", default="", help="comma-separated worker settings")
    parser.add_argument("--tqt-steps", type=int, default=500)
    args = parser.parse_args()
    python = Path(args.ppq) / "bin" / "python"
    if not python.exists():
        sys.exit(f"no esp-ppq venv at {args.ppq} (--ppq DIR: a venv with esp-ppq installed)")
    work = Path(args.keep or tempfile.mkdtemp(prefix="esp_ppq_"))
    work.mkdir(parents=True, exist_ok=True)
    tables = []
    for name, size, channels, epochs, build in _nets():
        start = time.perf_counter()
        model, record, x, y, train, test, calib = trained_net(size, channels, epochs, build, work)
        trained = time.perf_counter() - start
        key = name.split()[0].replace("/", "_")
        float_acc = float(np.mean(model.predict(x[test], verbose=0).argmax(-1) == y[test]))
        print(f"{name}: trained in {trained:.0f} s, float {float_acc:.4f}", flush=True)
        weights = {f"{layer.name}:{i}": w for layer in model.layers
                   for i, w in enumerate(layer.get_weights())}  # fmt: skip
        np.savez(work / f"{key}_weights.npz", **weights)
        np.savez(
            work / f"{key}_data.npz",
            calib=x[train[:256]],
            test=x[test],
            labels=y[test],
            logits=keras_logits(model, x[test]),
        )
        (work / f"{key}.json").write_text(json.dumps(graph_spec(model)))
        rows = _ours(model, record, x, y, train, test, calib)
        cmd = [str(python), str(HERE / "_esp_ppq_worker.py"), str(work), key]
        cmd += ["--tqt-steps", str(args.tqt_steps)]
        if args.settings:
            cmd += ["--settings", args.settings]
        start = time.perf_counter()
        subprocess.run(cmd, check=True)
        print(f"  esp-ppq worker: {time.perf_counter() - start:.0f} s", flush=True)
        result = json.loads((work / f"{key}_result.json").read_text())
        rows += _esp_ppq(y[test], x[test], result)
        tables.append((name, float_acc, result["twin_max_diff"], rows))
        for row in rows:
            print("  ", row, flush=True)
    print("\n| net | tool, setting | target | chip accuracy (our simulator) | esp-ppq's own"
          " (same arg max) | wall time |\n|---|---|---|---|---|---|")  # fmt: skip
    for name, float_acc, diff, rows in tables:
        print(f"| {name} (twin logits max diff {diff:.1e}) | float | | {float_acc:.4f} | | |")
        for tool, setting, target, acc, took, ppq_acc in rows:
            shown = "failed" if acc is None else f"{acc:.4f}"
            own = "" if ppq_acc is None else f"{ppq_acc[0]:.4f} ({100 * ppq_acc[1]:.1f} %)"
            print(f"| | {tool}, {setting} | {target} | {shown} | {own} | {took:.1f} s |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
