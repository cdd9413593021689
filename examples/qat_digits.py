"""INT4 quantization-aware training vs INT4 post-training calibration on scikit-learn's digits.

Trains a small CNN (Conv+BN+ReLU x2, Dense; ~1k parameters) on the 8x8 digits bundled with
scikit-learn (no download), its inputs standardized per pixel as a scikit-learn pipeline does
(``StandardScaler``: pixels that are almost always blank get a tiny std, so the rare stroke there
becomes an outlier of 10-20 sigma), then measures the int-simulated test accuracy of

1. post-training INT4: minmax input ranges on the training images (per-tensor activations) + ARQ
   weight scales on the BN-fused kernels (what a calibration record holds), run with ``simulate``;
2. the control: the same extra epochs QAT gets, in float, then post-training INT4 again;
3. INT4 QAT: ``quantize_aware(model, "INT4")`` fine-tuned from the same float weights, its record
   written by ``save_qat_record`` and simulated the same way;
4. an ablation: post-training INT4 of the float model with QAT's input ranges (is the gain only
   the ranges?).

Run: ``python examples/qat_digits.py [--epochs N] [--qat-epochs N] [--seed N] [--raw-pixels]``

Measured (CPU, TF 2.21; test accuracy on 450 images), see docs/qat.md for the table.
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

from amct_bridge.keras.qat import quantize_aware, save_qat_record, strip_qat  # noqa: E402
from amct_bridge.keras.rewrite import batchnorm_after, bn_scale, quantizable_layers  # noqa: E402
from amct_bridge.keras.simulate import simulate  # noqa: E402
from amct_bridge.quant.factors import activation_factors  # noqa: E402
from amct_bridge.records import LayerFactors, Record  # noqa: E402


def digits(seed: int = 0, standardize: bool = True):
    """(x_train, x_test, y_train, y_test): 8x8x1 images, labels 0..9.

    ``standardize``: per-pixel (x - mean) / (std + 0.01) with the training set's statistics
    (a StandardScaler); else the raw pixels / 16, in [0, 1].
    """
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    split = train_test_split(
        x, data.target, test_size=0.25, random_state=seed, stratify=data.target
    )
    if standardize:
        mean, std = split[0].mean(axis=0), split[0].std(axis=0) + 0.01
        split[0], split[1] = (split[0] - mean) / std, (split[1] - mean) / std
    return split


def small_cnn() -> keras.Model:
    """Conv(4)+BN+ReLU, Conv(8, stride 2)+BN+ReLU, Flatten, Dense(10): about 1k parameters."""
    x = keras.Input((8, 8, 1), name="image")
    y = keras.layers.Conv2D(4, 3, use_bias=False, name="conv1")(x)
    y = keras.layers.ReLU(name="relu1")(keras.layers.BatchNormalization(name="bn1")(y))
    y = keras.layers.Conv2D(8, 3, strides=2, use_bias=False, name="conv2")(y)
    y = keras.layers.ReLU(name="relu2")(keras.layers.BatchNormalization(name="bn2")(y))
    y = keras.layers.Dense(10, name="logits")(keras.layers.Flatten(name="flat")(y))
    return keras.Model(x, y, name="digits_cnn")


def minmax_int4_record(model: keras.Model, calib: np.ndarray) -> Record:
    """Post-training INT4 record: minmax input ranges, ARQ weight scales on BN-fused kernels."""
    layers = quantizable_layers(model)
    fused = batchnorm_after(model)
    probe = keras.Model(model.inputs, [layer.input for layer in layers.values()])
    inputs = probe.predict(calib, verbose=0)
    record = Record()
    for (key, layer), act in zip(layers.items(), inputs, strict=True):
        scale_d, offset_d = activation_factors(float(act.min()), float(act.max()), "INT4")
        kernel = layer.kernel.numpy()
        if key in fused:
            kernel = kernel * bn_scale(fused[key])
        axes = (0, 1, 2) if kernel.ndim == 4 else None  # Dense: one scale (AMCT)
        mx, mn = kernel.max(axis=axes), kernel.min(axis=axes)
        scale_w = np.atleast_1d(np.maximum(mx, -mn) / np.where(-mn >= mx, 8.0, 7.0))
        record.layers[key] = LayerFactors(
            scale_d=scale_d,
            offset_d=offset_d,
            scale_w=scale_w.astype("float32").tolist(),
            offset_w=[0] * scale_w.size,
            dst_type="INT4",
        )
    return record


def with_ranges(record: Record, ranges: Record) -> Record:
    """``record`` with the input ranges (scale_d/offset_d) of ``ranges`` (the ablation)."""
    out = Record()
    for key, factors in record.layers.items():
        other = ranges.layers[key]
        out.layers[key] = LayerFactors(
            scale_d=other.scale_d,
            offset_d=other.offset_d,
            scale_w=factors.scale_w,
            offset_w=factors.offset_w,
            dst_type="INT4",
        )
    return out


def fine_tune(model: keras.Model, x: np.ndarray, y: np.ndarray, epochs: int) -> None:
    """Adam(1e-3) for ``epochs`` epochs: the QAT schedule (also used for the float control)."""
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)


def accuracy(model: keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of ``model`` on (x, y)."""
    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y))


def run(
    epochs: int = 20,
    qat_epochs: int = 6,
    record_path: str | None = None,
    seed: int = 0,
    lr: float = 1e-2,
    standardize: bool = True,
) -> dict:
    """Train, calibrate, QAT; returns the test accuracies (and the QAT record's path)."""
    keras.utils.set_random_seed(seed)
    x_train, x_test, y_train, y_test = digits(seed, standardize)
    model = small_cnn()
    model.compile(
        optimizer=keras.optimizers.Adam(lr), loss=keras.losses.SparseCategoricalCrossentropy(True)
    )
    model.fit(x_train, y_train, epochs=epochs, batch_size=32, verbose=0)
    ptq_record = minmax_int4_record(model, x_train)
    ptq = simulate(model, ptq_record)

    # Control: the same extra epochs in float, then post-training INT4 (is QAT more than training?)
    longer = keras.models.clone_model(model)
    longer.set_weights(model.get_weights())
    fine_tune(longer, x_train, y_train, qat_epochs)
    ptq_longer = simulate(longer, minmax_int4_record(longer, x_train))

    qat = quantize_aware(model, dst_type="INT4")
    fine_tune(qat, x_train, y_train, qat_epochs)
    path = record_path or os.path.join(tempfile.mkdtemp(), "qat_record.txt")
    record = save_qat_record(qat, path)
    qat_sim = simulate(strip_qat(qat), record)
    ablation = simulate(model, with_ranges(ptq_record, record))
    return {
        "float": accuracy(model, x_test, y_test),
        "ptq_int4": accuracy(ptq, x_test, y_test),
        "ptq_int4_after_float_fine_tuning": accuracy(ptq_longer, x_test, y_test),
        "qat_int4": accuracy(qat_sim, x_test, y_test),
        "ptq_int4_qat_ranges": accuracy(ablation, x_test, y_test),
        "record": path,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="float training epochs")
    parser.add_argument("--qat-epochs", type=int, default=6, help="QAT fine-tuning epochs")
    parser.add_argument("--record", default=None, help="where to write the QAT record")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, split and batches")
    parser.add_argument(
        "--raw-pixels", action="store_true", help="pixels / 16 in [0, 1] instead of standardized"
    )
    args = parser.parse_args()
    result = run(
        args.epochs, args.qat_epochs, args.record, args.seed, standardize=not args.raw_pixels
    )
    print(f"float                               : {result['float']:.4f}")
    print(f"INT4 post-training (minmax)         : {result['ptq_int4']:.4f}")
    print(f"control: float fine-tune, then PTQ  : {result['ptq_int4_after_float_fine_tuning']:.4f}")
    print(f"INT4 QAT (int-simulated)            : {result['qat_int4']:.4f}")
    print(f"ablation: PTQ with QAT's ranges     : {result['ptq_int4_qat_ranges']:.4f}")
    print(f"QAT record (+ .calib.json sidecar)  : {result['record']}")


if __name__ == "__main__":
    main()
