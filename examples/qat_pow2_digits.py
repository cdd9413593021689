"""Power-of-two QAT vs AMCT-scale QAT vs post-training quantization, on the ESP-DL v3 chip.

A small swish / hard-swish / squeeze-excite / Softmax CNN is trained on scikit-learn's 8x8 digits
(bundled, no download; pixels standardized per pixel as a StandardScaler does, so rare strokes
are outliers of 10-20 sigma), then exported to an ESP-DL v3 ``.espdl`` (esp32s3, s8) four ways
and run on the bit-exact chip simulator:

1. PTQ: ``calibrate`` (AMCT's IFMR, the default) on 256 training images, export;
2. control: the fine-tuning epochs QAT gets, in float, then PTQ again;
3. AMCT-scale QAT: ``quantize_aware(model)`` (INT8, EMA ranges, asymmetric, per-channel ARQ
   weights), ``save_qat_record``, ``strip_qat``, export;
4. power-of-two QAT: ``quantize_aware(model, power_of_two=True)`` (TQT: learned thresholds,
   every chip tensor quantized, per-tensor weights at the export's exponent), the same steps;
   ``pow2_calib``: the same with its thresholds started at the PTQ calibration
   (``init_record``); with ``--ema`` also the EMA-threshold variant.

Printed: test accuracy (float, chip) per variant, and for power-of-two QAT how many of the
test images' output integers equal the QAT model's fake-quantized outputs (all, when the export
reproduces the training). Run: ``python examples/qat_pow2_digits.py --seed 0 [--ema]``
(~2-3 min per seed with --ema on 2 busy CPU cores). Figures: docs/qat.md, "Power-of-two QAT".
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

from amct_bridge.espdl.v3 import read_espdl, simulate_espdl  # noqa: E402
from amct_bridge.espdl.v3.evaluation import quantize_input  # noqa: E402
from amct_bridge.keras import calibrate, export_espdl  # noqa: E402
from amct_bridge.keras.qat import quantize_aware, save_qat_record, strip_qat  # noqa: E402


def digits(seed: int = 0, standardize: bool = True):
    """(x_train, x_test, y_train, y_test): 8x8x1 images, labels 0..9 (test: 25 %)."""
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    split = train_test_split(
        x, data.target, test_size=0.25, random_state=seed, stratify=data.target
    )
    if standardize:
        mean, std = split[0].mean(axis=0), split[0].std(axis=0) + 0.01
        split[0], split[1] = (split[0] - mean) / std, (split[1] - mean) / std
    return split


def se_net() -> keras.Model:
    """A MobileNetV3-like net: Conv+BN+hard-swish stem, depthwise Conv+BN+hard-swish with
    squeeze-excite (GAP, 1x1 conv ReLU, 1x1 conv, hard-sigmoid, Multiply), 1x1 projection+BN,
    depthwise (stride 2)+BN+swish, 1x1 Conv+BN+swish, GAP, Dense, Softmax (~2k parameters)."""
    layers = keras.layers
    x = keras.Input((8, 8, 1), name="image")
    a = layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem")(x)
    a = layers.Activation("hard_swish", name="stem_hs")(
        layers.BatchNormalization(name="stem_bn")(a)
    )
    b = layers.DepthwiseConv2D(3, padding="same", use_bias=False, name="dw1")(a)
    b = layers.Activation("hard_swish", name="dw1_hs")(layers.BatchNormalization(name="dw1_bn")(b))
    s = layers.GlobalAveragePooling2D(keepdims=True, name="se_gap")(b)
    s = layers.Conv2D(4, 1, activation="relu", name="se_fc1")(s)
    s = layers.Activation("hard_sigmoid", name="se_gate")(layers.Conv2D(16, 1, name="se_fc2")(s))
    b = layers.Multiply(name="se_mul")([b, s])
    b = layers.BatchNormalization(name="pw1_bn")(
        layers.Conv2D(16, 1, use_bias=False, name="pw1")(b)
    )
    b = layers.Add(name="res")([a, b])
    c = layers.DepthwiseConv2D(3, strides=2, padding="same", use_bias=False, name="dw2")(b)
    c = layers.Activation("swish", name="dw2_sw")(layers.BatchNormalization(name="dw2_bn")(c))
    c = layers.Conv2D(32, 1, use_bias=False, name="pw2")(c)
    c = layers.Activation("swish", name="pw2_sw")(layers.BatchNormalization(name="pw2_bn")(c))
    y = layers.Dense(10, name="fc")(layers.GlobalAveragePooling2D(name="gap")(c))
    return keras.Model(x, layers.Softmax(name="prob")(y), name="se_net")


def chip(model: keras.Model, record: str, out: str, x: np.ndarray) -> np.ndarray:
    """The simulated esp32s3 chip's output (float) on ``x`` of the v3 export of ``model``."""
    export_espdl(model, record, out, format="espdl", target="esp32s3", feature_type="s8")
    espdl = read_espdl(out)
    res = simulate_espdl(espdl, quantize_input(espdl, x, "esp32s3"), "esp32s3")
    return res.outputs[espdl.outputs[0].name]


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the comparison; return the figures by name.

    Example:
        >>> # main(["--seed", "0"])["pow2_chip"]
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=30, help="float training epochs")
    parser.add_argument("--qat-epochs", type=int, default=6, help="fine-tuning epochs")
    parser.add_argument("--ema", action="store_true", help="also power-of-two QAT, EMA")
    parser.add_argument("--raw-pixels", action="store_true", help="pixels / 16, no scaling")
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    x_tr, x_te, y_tr, y_te = digits(args.seed, standardize=not args.raw_pixels)
    loss = "sparse_categorical_crossentropy"
    model = se_net()
    model.compile(keras.optimizers.Adam(1e-2), loss)
    model.fit(x_tr, y_tr, epochs=args.epochs, batch_size=32, verbose=0)
    acc = lambda p: float(np.mean(np.argmax(p, axis=1) == y_te))  # noqa: E731
    figures = {"float": acc(model.predict(x_te, verbose=0))}
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        calibrate(model, x_tr[:256], path("ptq.txt"))
        figures["ptq_chip"] = acc(chip(model, path("ptq.txt"), path("ptq.espdl"), x_te))

        control = keras.models.clone_model(model)
        control.set_weights(model.get_weights())
        control.compile(keras.optimizers.Adam(1e-3), loss)
        control.fit(x_tr, y_tr, epochs=args.qat_epochs, batch_size=32, verbose=0)
        calibrate(control, x_tr[:256], path("control.txt"))
        figures["control_float"] = acc(control.predict(x_te, verbose=0))
        figures["control_chip"] = acc(chip(control, path("control.txt"), path("c.espdl"), x_te))

        calibrated = {"power_of_two": True, "init_record": path("ptq.txt")}
        variants = [("amct", {}), ("pow2", {"power_of_two": True}), ("pow2_calib", calibrated)]
        if args.ema:
            variants.append(("pow2_ema", {"power_of_two": True, "activation_range": "ema"}))
        for name, options in variants:
            keras.utils.set_random_seed(args.seed)  # the same batches for every variant
            qat = quantize_aware(model, **options)
            qat.compile(keras.optimizers.Adam(1e-3), loss)
            qat.fit(x_tr, y_tr, epochs=args.qat_epochs, batch_size=32, verbose=0)
            save_qat_record(qat, path(f"{name}.txt"))
            fake = qat.predict(x_te, verbose=0)
            on_chip = chip(strip_qat(qat), path(f"{name}.txt"), path(f"{name}.espdl"), x_te)
            figures[f"{name}_fake_quant"] = acc(fake)
            figures[f"{name}_chip"] = acc(on_chip)
            if name.startswith("pow2"):  # the chip's probabilities vs the QAT model's
                figures[f"{name}_max_diff"] = float(np.abs(on_chip - fake).max())
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value:.4f}")
    return figures


if __name__ == "__main__":
    main()
