"""End-to-end demo (run by `make demo`): train a small Keras CNN on scikit-learn's digits,
calibrate it with the QuantCalibration callback, check and convert the AMCT record, measure the
INT8 accuracy it gives with a per-layer report (HTML with plots), find pruning groups, export
ESP-DL v1 coefficients with a preview and the C++ files (coefficients, model class, app_main),
and measure the accuracy of the simulated chip next to float and fake-quant; export the same
model as ESP-DL v3 ``.espdl`` files and measure the simulated v3 chip too. Then the same chain
on a MindSpore network (``examples/mindspore_calibrate_export.py``).

Everything runs on the CPU in well under a minute; outputs go to ``out/demo/`` (or argv[1]).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from amct_bridge.cli import main as cli  # noqa: E402
from amct_bridge.keras import (  # noqa: E402
    QuantCalibration,
    evaluate_espdl,
    export_espdl,
    simulate,
)
from amct_bridge.records import load  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (no download), scaled to [0, 1], NHWC."""
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:1400], y[:1400], x[1400:], y[1400:]


def small_cnn() -> keras.Model:
    """Conv+BN+ReLU, depthwise, pointwise+BN+LeakyReLU, pool, flatten, Dense (all ESP-DL v1)."""
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv1")(inputs)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.ReLU(name="relu1")(x)
    x = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu", name="dw2")(x)
    x = keras.layers.Conv2D(24, 1, use_bias=False, name="pw2")(x)
    x = keras.layers.BatchNormalization(name="bn2")(x)
    x = keras.layers.LeakyReLU(negative_slope=0.1, name="lrelu2")(x)
    x = keras.layers.MaxPooling2D(2, name="pool")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    outputs = keras.layers.Dense(10, name="logits")(x)
    return keras.Model(inputs, outputs, name="digits_cnn")


def accuracy(model: keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of ``model`` on (x, y)."""
    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y))


def demo(out: Path) -> None:
    """Run every step, printing what a user would look at."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = digits()
    model = small_cnn()
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    print("== 1. train (float)")
    model.fit(x_train, y_train, epochs=15, batch_size=64, verbose=0)
    model_path = out / "digits_cnn.keras"
    model.save(model_path)

    print("== 2. calibrate: one callback in model.evaluate (AMCT's IFMR, INT8)")
    record_path = out / "record.txt"
    callback = QuantCalibration(record_path, algorithm="ifmr")
    model.evaluate(x_train[:512], y_train[:512], batch_size=64, verbose=0, callbacks=[callback])
    print(f"wrote {record_path} and {record_path.name}.calib.json")
    cli(["inspect", str(record_path)])
    cli(["validate", str(record_path)])

    print("\n== 3. the same record for AMCT-TF convert_model / MindSpore")
    cli(["convert-record", str(record_path), "--to", "tf", "-o", str(out / "record_tf.txt")])

    print("\n== 4. accuracy the record will give (quantize -> dequantize of inputs and weights)")
    float_acc = accuracy(model, x_test, y_test)
    int8_acc = accuracy(simulate(model, load(record_path)), x_test, y_test)
    print(f"float: {float_acc:.4f}   INT8 simulated: {int8_acc:.4f}")

    print("\n== 4b. per-layer report: SNR, ranges, sensitive layers (plots in report.html)")
    np.save(out / "x_test.npy", x_test)
    np.save(out / "y_test.npy", y_test)
    data = ["--data", str(out / "x_test.npy"), "--labels", str(out / "y_test.npy")]
    cli(
        [
            "report",
            "--record",
            str(record_path),
            "--model",
            str(model_path),
            *data,
            "--top-k",
            "1",
            "--html",
            str(out / "report.html"),
        ]
    )

    print("\n== 5. channel-pruning groups and 2:4 selective layers")
    cli(["prune-groups", str(model_path), "--selective", "--record", str(out / "prune.txt")])

    print("\n== 6. ESP-DL v1 export: config.json + npy, C++ coefficients, model class, app_main")
    espdl_dir = out / "espdl"
    np.save(out / "x_calib.npy", x_train[:512])  # exponents searched on the chip simulator
    args = ["--record", str(record_path), "--model", str(model_path), "--feature-type", "s8"]
    args += ["--target", "esp32s3", "--data", str(out / "x_calib.npy")]
    cli(["export-espdl", *args, "--out", str(espdl_dir), "--cpp", "digits_coefficient"])
    cli(["export-espdl", *args, "--preview"])

    print("\n== 7. accuracy on the chip before flashing: float, fake-quant, bit-exact chip")
    eval_args = ["--export", str(espdl_dir), "--model", str(model_path), "--record"]
    cli(["espdl-eval", *eval_args, str(record_path), *data, "--target", "esp32s3"])
    print("\nthe other ESP-DL v1 formats (same record, same test set):")
    for ftype, gran in (("s8", "per-channel"), ("s16", "per-tensor")):
        other = out / f"espdl_{ftype}_{gran}"
        export_espdl(
            model,
            record_path,
            other,
            feature_type=ftype,
            granularity=gran,
            target="esp32s3",
            calibration_data=x_train[:512],
        )
        ev = evaluate_espdl(
            other, model, x_test, y_test, record=load(record_path), target="esp32s3"
        )
        print(
            f"{ftype + ' ' + gran:<15} float {ev.float_acc:.4f}   fake-quant "
            f"{ev.fake_quant_acc:.4f}   chip {ev.chip_acc:.4f}"
        )

    print("\n== 7b. ESP-DL v3: one .espdl file per target (docs/espdl-v3.md)")
    v3_file = out / "digits_esp32s3.espdl"
    v3_args = ["--record", str(record_path), "--model", str(model_path), "--format", "espdl"]
    cli(["export-espdl", *v3_args, "--target", "esp32s3", "-o", str(v3_file)])
    cli(["espdl-run", str(v3_file), "--check"])  # the embedded test values, our simulator
    for target, ftype in (("esp32s3", "s8"), ("esp32p4", "s8"), ("esp32p4", "s16")):
        path = out / f"digits_{target}_{ftype}.espdl"
        export_espdl(
            model, record_path, path, format="espdl", target=target, feature_type=ftype,
            test_input=x_test[:1], overwrite=True,
        )  # fmt: skip
        ev = evaluate_espdl(path, model, x_test, y_test, record=load(record_path))
        worst = min(ev.layers, key=lambda e: e.snr_db)
        print(
            f"v3 {target} {ftype:<4} float {ev.float_acc:.4f}   fake-quant "
            f"{ev.fake_quant_acc:.4f}   v3 chip {ev.chip_acc:.4f}   lowest SNR "
            f"{worst.name} {worst.snr_db:.1f} dB"
        )

    print(
        "\n== 8. the same on MindSpore: QuantCalibration in Model.eval, simulate, prune, ESP-DL",
        flush=True,  # before the child process writes to the same stdout
    )
    # its own process: the MindSpore example needs no TensorFlow, and runs as users run it
    example = ROOT / "examples" / "mindspore_calibrate_export.py"
    env = {**os.environ, "GLOG_v": os.environ.get("GLOG_v", "3")}  # MindSpore: errors only
    cmd = [sys.executable, str(example), "--out", str(out / "mindspore")]
    subprocess.run(cmd, check=True, env=env)
    print(f"\nall outputs in {out}")


if __name__ == "__main__":
    demo(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "out" / "demo")
