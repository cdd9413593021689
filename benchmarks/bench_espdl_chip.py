"""Chip simulator speed: simulate_chip vs the float Keras predict of the same batch.

Run: .venv/bin/python benchmarks/bench_espdl_chip.py [--batch 32] [--alpha 0.25] [--size 96]

Models (weights=None, seeded, BatchNorm statistics randomised): keras.applications.MobileNet and
MobileNetV2 with every ReLU6 replaced by ReLU (the exporter refuses ReLU6: ESP-DL v1 cannot
clip), include_top=False + global average pooling + Dense(10). Exported at s8 per-tensor, s8
per-channel and s16, simulated for esp32 and esp32s3.
Prints for each the best-of-3 wall time of ``model.predict(batch)`` (baseline, same run) and
of ``simulate_chip(network, batch)``, their ratio (target: < 10), and the chip-vs-float error.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _common import best_of  # noqa: E402
from _keras_models import application, random_batch, randomize_bn  # noqa: E402

from amct_bridge.espdl.v1.chip import simulate_chip  # noqa: E402
from amct_bridge.espdl.v1.export import export_layers  # noqa: E402
from amct_bridge.espdl.v1.network import network_from_result  # noqa: E402
from amct_bridge.keras.espdl_weights import source_layers  # noqa: E402
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange  # noqa: E402


def relu_instead_of_relu6(base: keras.Model, name: str) -> keras.Model:
    """A copy of ``base`` with every ReLU(6) a plain ReLU, plus a Dense(10) head."""

    def clone(layer):
        if isinstance(layer, keras.layers.ReLU):
            return keras.layers.ReLU(name=layer.name)
        return layer.__class__.from_config(layer.get_config())

    body = keras.models.clone_model(base, clone_function=clone)
    body.set_weights(base.get_weights())
    out = keras.layers.Dense(10, name="logits")(body.output)
    return keras.Model(body.input, out, name=name)


def mobilenet_v1_relu(size: int, alpha: float) -> keras.Model:
    base = application("MobileNet", size, alpha=alpha, include_top=False, pooling="avg")
    return relu_instead_of_relu6(base, "mobilenet_v1_relu")


def mobilenet_v2_relu(size: int, alpha: float) -> keras.Model:
    base = application("MobileNetV2", size, alpha=alpha, include_top=False, pooling="avg")
    return relu_instead_of_relu6(base, "mobilenet_v2_relu")


def sidecar(model: keras.Model, data: np.ndarray) -> CalibrationStats:
    """min/max of every layer's input and output over ``data`` (what calibration records)."""
    layers = [x for x in model.layers if not isinstance(x, keras.layers.InputLayer)]
    outs = keras.Model(model.inputs, [x.output for x in layers]).predict(data, verbose=0)
    by_name = dict(zip([x.name for x in layers], outs, strict=True))
    stats = CalibrationStats(algorithm="minmax", batches=1)
    for layer in layers:
        ins = layer.input if isinstance(layer.input, list) else [layer.input]
        vals = [
            data
            if isinstance(t._keras_history.operation, keras.layers.InputLayer)
            else by_name[t._keras_history.operation.name]
            for t in ins
        ]
        lo = min(float(v.min()) for v in vals)
        hi = max(float(v.max()) for v in vals)
        out = by_name[layer.name]
        stats.layers[layer.name] = LayerStats(
            "Layer", TensorRange(lo, hi), TensorRange(float(out.min()), float(out.max()))
        )
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--alpha", type=float, default=0.25)
    args = parser.parse_args()
    data = random_batch(args.batch, args.size)
    print(f"batch {args.batch} x {args.size}x{args.size}x3, alpha {args.alpha}")
    print(
        f"{'model':<24} {'export':<16} {'target':<8} {'keras s':>8} {'chip s':>8} "
        f"{'ratio':>6} {'rel err':>8}"
    )
    for build in (mobilenet_v1_relu, mobilenet_v2_relu):
        model = build(args.size, args.alpha)
        randomize_bn(model)
        stats = sidecar(model, data)
        want = model.predict(data, verbose=0)
        keras_s = best_of(lambda m=model: m.predict(data, batch_size=args.batch, verbose=0))
        layers = source_layers(model)
        for ftype, gran in (("s8", "per-tensor"), ("s8", "per-channel"), ("s16", "per-tensor")):
            res = export_layers(layers, None, stats=stats, feature_type=ftype, granularity=gran)
            net = network_from_result(res)
            for target in ("esp32", "esp32s3"):
                chip_s = best_of(lambda n=net, t=target: simulate_chip(n, data, target=t))
                got = simulate_chip(net, data, target=target).output.to_float()
                err = float(np.abs(got - want).max() / np.abs(want).max())
                print(
                    f"{model.name:<24} {ftype + ' ' + gran:<16} {target:<8} {keras_s:>8.3f} "
                    f"{chip_s:>8.3f} {chip_s / keras_s:>6.2f} {err:>8.4f}"
                )


if __name__ == "__main__":
    main()
