"""MindSpore quantization-aware training on scikit-learn's digits, then ESP-DL v1.

Two runs (GRAPH_MODE, CPU, no download):

* ``int8`` (default): a small CNN (Conv(4)+BN+ReLU, Conv(8, stride 2)+BN+ReLU, Flatten,
  Dense(10)) trained in float, fine-tuned with INT8 QAT (``quantize_aware``), its record written
  (``save_qat_record``), stripped (``strip_qat``) and exported to ESP-DL v1 (s8); prints the
  float, fake-quant (``simulate``) and chip-simulator accuracies side by side.
* ``--int4``: the comparison of docs/qat.md (MindSpore section): post-training INT4 (minmax
  input ranges, ARQ weights on the BN-fused kernels), a control fine-tuned in float for the same
  steps then post-training INT4, and INT4 QAT fine-tuned from the same float weights. The
  pixels are standardized per pixel as in ``examples/qat_digits.py`` (rare strokes become
  10-20 sigma outliers, which minmax INT4 cannot resolve).

Run: ``.venv/bin/python examples/mindspore_qat.py [--int4] [--seed N] [--out DIR]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from mindspore import dataset as ds
from mindspore.train import Model
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from amct_bridge.mindspore import calibrate, evaluate_espdl, export_espdl, simulate
from amct_bridge.mindspore.qat import quantize_aware, save_qat_record, strip_qat
from amct_bridge.quant.arq import arq_factors
from amct_bridge.quant.factors import activation_factors
from amct_bridge.quant.qat import record_range
from amct_bridge.records import LayerFactors, Record

SAMPLE = (1, 1, 8, 8)


class DigitsCNN(nn.Cell):
    """Conv(4)+BN+ReLU, Conv(8, stride 2)+BN+ReLU, Flatten, Dense(10): about 1k parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, pad_mode="valid", has_bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 8, 3, stride=2, pad_mode="valid", has_bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.relu2 = nn.ReLU()
        self.flatten = nn.Flatten()
        self.logits = nn.Dense(8 * 2 * 2, 10)

    def construct(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        return self.logits(self.flatten(x))


def digits(seed: int = 0, standardize: bool = True):
    """(x_train, x_test, y_train, y_test): NCHW float32 images, int32 labels.

    ``standardize``: per-pixel ``(x - mean) / (std + 0.01)`` with the training statistics.
    """
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, data.target.astype(np.int32), test_size=0.25, random_state=seed, stratify=data.target
    )
    if standardize:
        mean, std = x_tr.mean(axis=0), x_tr.std(axis=0) + 0.01
        x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    return x_tr.astype(np.float32), x_te.astype(np.float32), y_tr, y_te


def fit(net: nn.Cell, x, y, epochs: int, lr: float, seed: int) -> None:
    """Adam, batch 32, shuffled with ``seed`` (the same batches for every variant)."""
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, nn.Adam(net.trainable_params(), learning_rate=lr))
    ds.config.set_seed(seed)
    data = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=True).batch(32)
    model.train(epochs, data, dataset_sink_mode=False)


def accuracy(net: nn.Cell, x, y) -> float:
    net.set_train(False)
    return float(np.mean(net(Tensor(x)).asnumpy().argmax(axis=1) == y))


def ptq_int4(net: nn.Cell, x_calib, out: Path) -> tuple[nn.Cell, Record]:
    """Post-training INT4: minmax input ranges (the calibration callback's minmax record, read
    back as ranges), ARQ INT4 weights on the BN-fused kernels; returns the folded net (BN as
    exact identities, :func:`strip_qat` of an untrained QAT copy) and its record."""
    rec8 = calibrate(net, x_calib, out / "ptq8.txt", algorithm="minmax", batch_size=len(x_calib))
    folded = strip_qat(quantize_aware(net, sample_input=SAMPLE))
    cells = dict(folded.cells_and_names())
    record = Record(flavor="inner")
    for key, f in rec8.layers.items():
        lo, hi = record_range(f.scale_d, f.offset_d, 8)
        scale_d, offset_d = activation_factors(lo, hi, 4)
        layout = "OI" if isinstance(cells[key], nn.Dense) else "OIHW"
        scale_w, offset_w = arq_factors(cells[key].weight.asnumpy(), layout, num_bits=4)
        record.layers[key] = LayerFactors(
            scale_d=scale_d, offset_d=offset_d, scale_w=scale_w, offset_w=offset_w, dst_type="INT4"
        )
    return folded, record


def int4_study(seed: int = 0, epochs: int = 20, qat_epochs: int = 6, out: Path | None = None):
    """PTQ INT4 vs control vs QAT INT4 test accuracies (docs/qat.md, MindSpore section)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(seed)
    x_tr, x_te, y_tr, y_te = digits(seed)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) if out is None else out
        net = DigitsCNN()
        fit(net, x_tr, y_tr, epochs, 1e-2, seed)
        res = {"float": accuracy(net, x_te, y_te)}
        folded, rec = ptq_int4(net, x_tr, out)
        res["PTQ INT4"] = simulate(folded, rec, x_te, y_te).accuracy

        control = DigitsCNN()
        ms.load_param_into_net(control, {p.name: p.clone() for p in net.get_parameters()})
        fit(control, x_tr, y_tr, qat_epochs, 1e-3, seed + 1)
        folded_c, rec_c = ptq_int4(control, x_tr, out)
        res["control"] = simulate(folded_c, rec_c, x_te, y_te).accuracy

        qat = quantize_aware(net, "INT4", sample_input=SAMPLE)
        fit(qat, x_tr, y_tr, qat_epochs, 1e-3, seed + 1)
        rec_q = save_qat_record(qat, out / "qat4.txt")
        res["QAT INT4"] = simulate(strip_qat(qat), rec_q, x_te, y_te).accuracy
    return res


def run_int8(out: Path, seed: int = 0, epochs: int = 20, qat_epochs: int = 2) -> dict:
    """Float training, INT8 QAT, record, strip, ESP-DL v1 export; returns the figures."""
    start = time.perf_counter()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(seed)
    x_tr, x_te, y_tr, y_te = digits(seed, standardize=False)
    net = DigitsCNN()
    fit(net, x_tr, y_tr, epochs, 1e-2, seed)
    figures = {"float (before QAT)": accuracy(net, x_te, y_te)}
    qat = quantize_aware(net, "INT8", sample_input=SAMPLE)
    fit(qat, x_tr, y_tr, qat_epochs, 1e-3, seed + 1)
    record = out / "qat_record.txt"
    save_qat_record(qat, record)  # + qat_record.txt.calib.json
    plain = strip_qat(qat)
    ms.save_checkpoint(plain, str(out / "deploy.ckpt"))  # loads into DigitsCNN()
    res = export_espdl(plain, record, out / "espdl", sample_input=x_te[:1], feature_type="s8")
    ev = evaluate_espdl(out / "espdl", plain, x_te, y_te, record=record)
    figures.update(
        {
            "ESP-DL layers": len(res.layers),
            "float (stripped QAT)": ev.float_acc,
            "fake-quant (record)": ev.fake_quant_acc,
            "chip (ESP-DL v1 s8)": ev.chip_acc,
            "seconds": time.perf_counter() - start,
        }
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--int4", action="store_true", help="PTQ INT4 vs control vs QAT INT4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="output directory (default: a temporary one)")
    args = parser.parse_args()
    if args.int4:
        figures = int4_study(args.seed)
    elif args.out is None:
        with tempfile.TemporaryDirectory() as tmp:
            figures = run_int8(Path(tmp), args.seed)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        figures = run_int8(args.out, args.seed)
        print(f"outputs in {args.out}: qat_record.txt (+ .calib.json), deploy.ckpt, espdl/")
    for name, value in figures.items():
        print(f"{name:22} {value:.3f}" if isinstance(value, float) else f"{name:22} {value}")


if __name__ == "__main__":
    main()
