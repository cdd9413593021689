"""ESP-DL v3 simulator speed: simulate_espdl vs the float Keras predict of the same batch.

Run: .venv/bin/python benchmarks/bench_espdl_v3.py [--batch 32] [--alpha 0.35] [--size 96]

Model: keras.applications.MobileNetV2 (weights=None, seeded, BatchNorm statistics randomised so
activations do not vanish), alpha 0.35, 96x96, its own ReLU6 (Clip in v3) and softmax head.
Calibrated with amct_bridge.keras.calibrate (minmax) on the batch, exported to ``.espdl`` for
esp32s3 / esp32p4 / c, s8 and s16, and for esp32p4 with per-channel filter exponents
(``per-ch``: the same files with one exponent per output channel). Prints for each the
best-of-3 wall time of
``model.predict(batch)`` (baseline, same run) and of ``simulate_espdl(model, batch)``, their
ratio (goal: <= 5), the chip-vs-float error of the probabilities and the top-1 agreement.
Then exports MobileNetV3Small and EfficientNetV2B0 (weights=None, 96x96) and prints what
became of their layers (nothing refused).

``--accuracy``: instead, trains MobileNetV2 (alpha 0.35, 32x32, weights=None) on scikit-learn's
digits (upscaled to 32x32x3, 10 epochs, BN momentum 0.9), calibrates it (IFMR) and prints
float, fake-quant and simulated v3 chip accuracy on the held-out digits per target and feature
type, with the three layers of lowest SNR (where the power-of-two exponents cost most).
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import best_of  # noqa: E402
from _keras_models import application, random_batch, randomize_bn  # noqa: E402

from amct_bridge.espdl.v3 import read_espdl, simulate_espdl  # noqa: E402
from amct_bridge.espdl.v3.evaluation import quantize_input  # noqa: E402
from amct_bridge.keras import calibrate, export_espdl  # noqa: E402


def accuracy(tmp: Path, epochs: int = 10) -> None:
    """A small MobileNetV2 trained on digits: float / fake-quant / v3 chip accuracy."""
    from sklearn.datasets import load_digits

    from amct_bridge.keras import evaluate_espdl

    digits = load_digits()
    x = np.repeat(np.kron(digits.images / 16.0, np.ones((4, 4)))[..., None], 3, axis=-1)
    x = (x * 2 - 1).astype("float32")
    y = digits.target
    idx = np.random.default_rng(0).permutation(len(x))
    train, test = idx[:1400], idx[1400:]
    model = application("MobileNetV2", 32, alpha=0.35, classes=10)
    for layer in model.layers:  # MobileNetV2's 0.999 would not settle in a few hundred steps
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.9
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x[train], y[train], epochs=epochs, batch_size=32, verbose=0)
    record = tmp / "mnv2_digits.txt"
    calibrate(model, x[train[:256]], record)
    print(f"MobileNetV2 a0.35 32x32 on digits ({len(test)} test images)")
    for target, ftype in (("esp32s3", "s8"), ("esp32p4", "s8"), ("esp32s3", "s16")):
        out = tmp / f"digits_{target}_{ftype}.espdl"
        export_espdl(model, record, out, format="espdl", target=target, feature_type=ftype)
        ev = evaluate_espdl(out, model, x[test], y[test], record=record)
        worst = sorted(ev.layers, key=lambda e: e.snr_db)[:3]
        lows = ", ".join(f"{e.name} {e.snr_db:.1f} dB (exp {e.exponent})" for e in worst)
        print(
            f"{target:<8} {ftype:<4} float {ev.float_acc:.4f}  fake-quant {ev.fake_quant_acc:.4f}"
            f"  v3 chip {ev.chip_acc:.4f}  lowest SNR: {lows}"
        )


def per_channel(espdl) -> None:
    """Give every Conv/Gemm filter one exponent per output channel (e, e-1, e-2 cycling), as
    esp-ppq writes for esp32p4: the same work, larger shifts on some channels (the speed of the
    per-channel path; the outputs then differ from the per-tensor export's)."""
    for node in espdl.nodes:
        if node.op_type in ("Conv", "Gemm"):
            w = espdl.initializers[node.inputs[1]]
            n = w.dims[-1] if int(node.attributes.get("group", 1)) == 1 else w.dims[-2]
            w.exponents = [w.exponents[0] - (c % 3) for c in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--alpha", type=float, default=0.35)
    parser.add_argument("--accuracy", action="store_true", help="the trained-digits accuracy")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    if args.accuracy:
        accuracy(tmp)
        return
    data = random_batch(args.batch, args.size)
    model = application("MobileNetV2", args.size, alpha=args.alpha, classes=10)
    randomize_bn(model)
    record = tmp / "mobilenet_v2.txt"
    calibrate(model, data, record, algorithm="minmax")
    want = model.predict(data, verbose=0)
    keras_s = best_of(lambda: model.predict(data, batch_size=args.batch, verbose=0))
    print(f"MobileNetV2 alpha {args.alpha}, batch {args.batch} x {args.size}x{args.size}x3")
    print(
        f"{'export':<12} {'target':<8} {'keras s':>8} {'sim s':>8} {'ratio':>6} "
        f"{'max err':>8} {'top-1 =':>7}"
    )
    rows = [("esp32s3", "s8"), ("esp32p4", "s8"), ("c", "s8"), ("esp32s3", "s16")]
    rows += [("esp32p4", "s8 per-ch"), ("esp32p4", "s16 per-ch")]
    for target, label in rows:
        ftype = label.split()[0]
        out = tmp / f"mnv2_{target}_{label.replace(' ', '_')}.espdl"
        export_espdl(model, record, out, format="espdl", target=target, feature_type=ftype)
        espdl = read_espdl(out)
        if "per-ch" in label:
            per_channel(espdl)
        ints = quantize_input(espdl, data, target)
        sim_s = best_of(lambda m=espdl, q=ints: simulate_espdl(m, q))
        got = simulate_espdl(espdl, ints).outputs[espdl.outputs[0].name]
        err = f"{float(np.abs(got - want).max()):>8.4f}"
        agree = f"{float(np.mean(got.argmax(1) == want.argmax(1))):>7.2f}"
        if "per-ch" in label:  # exponents changed for the timing: the values mean nothing
            err, agree = f"{'-':>8}", f"{'-':>7}"
        print(
            f"{label:<12} {target:<8} {keras_s:>8.3f} {sim_s:>8.3f} {sim_s / keras_s:>6.2f} "
            f"{err} {agree}"
        )
    for name in ("MobileNetV3Small", "EfficientNetV2B0"):
        app = application(name, 96)
        images = random_batch(4, 96, 0, 255)
        rec = tmp / f"{name}.txt"
        calibrate(app, images, rec, algorithm="minmax")
        res = export_espdl(app, rec, tmp / f"{name}.espdl", format="espdl", target="esp32s3")
        counts = collections.Counter(x.status for x in res.layers)
        ops = collections.Counter(n.op_type for n in res.model.nodes)
        print(f"{name}: {dict(counts)}; nodes {dict(ops)}")


if __name__ == "__main__":
    main()
