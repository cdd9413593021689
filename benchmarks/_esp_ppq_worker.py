"""esp-ppq's side of ``compare_esp_ppq.py``: runs in an esp-ppq venv (``/opt/ppq/bin/python``),
never in the project's; imports only numpy, torch and esp_ppq.

Run (``compare_esp_ppq.py`` does): /opt/ppq/bin/python benchmarks/_esp_ppq_worker.py WORK KEY
[--settings s3_default,...] [--tqt-steps 500]

Reads ``WORK/KEY.json`` (the Keras layers, ``compare_esp_ppq.graph_spec``),
``WORK/KEY_weights.npz`` and ``WORK/KEY_data.npz`` (256 calibration digits, the test digits
and Keras's logits, NHWC), builds the PyTorch twin (NCHW: Keras's (kh, kw, cin, cout) kernels
to (cout, cin, kh, kw), depthwise (kh, kw, cin, m) to (cin·m, 1, kh, kw) with ``groups=cin``,
TensorFlow's "same" pads, the extra one after, as an explicit ``ZeroPad2d`` where they differ,
BatchNorm kept for esp-ppq to fold, Keras's activations: swish = x·sigmoid(x), hard_sigmoid =
relu6(x + 3) / 6, hard_swish = x · hard_sigmoid(x)), refuses to go on unless its logits on the
test digits are Keras's within 1e-4, and quantizes it with ``espdl_quantize_torch`` once per
setting (``SETTINGS``) to ``WORK/KEY_<setting>.espdl``. Writes ``WORK/KEY_result.json``: the
twin's max |logit difference|, and per setting its target, file, wall time and esp-ppq's own
(fake-quant executor) arg max and accuracy on the test digits.

Settings (all start from ``QuantizationSettingFactory.espdl_setting()``, 8 bits; ``s3_`` on
esp32s3, per-tensor weights, ``p4_`` on esp32p4, per-channel weights): ``default`` as is (KL
activation calibration); ``minmax``: activation ``calib_algorithm = "minmax"``; ``tqt``: TQT
with esp-dl's tutorial values (docs/en/tutorials/quantize_model_with_TQT.rst: 500 steps per
block, lr 1e-5, block_size 2, int_lambda 0.25) on the CPU; ``equalization``: layerwise
equalization with the same tutorial's values (iterations 4, value_threshold 0.4, opt_level 2;
the tutorial also swaps MobileNetV2's ReLU6 for ReLU, which would change the net: not done).
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "swish": F.silu,
    "silu": F.silu,
    "hard_sigmoid": F.hardsigmoid,  # relu6(x + 3) / 6, as Keras 3
    "hard_swish": F.hardswish,  # x * relu6(x + 3) / 6
    "hard_silu": F.hardswish,
    "softmax": lambda x: torch.softmax(x, 1),
}


class Twin(nn.Module):
    """The Keras net of ``spec`` in PyTorch (NCHW), with its weights."""

    def __init__(self, spec: list[dict], weights: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.spec = spec
        self.logits_only = False  # skip the final softmax (to compare logits with Keras)
        self.mods = nn.ModuleDict()
        for e in spec:
            w = [torch.tensor(weights[f"{e['name']}:{i}"]) for i in range(_count(weights, e))]
            mod = self._module(e, w)
            if mod is not None:
                self.mods[e["name"]] = mod

    @staticmethod
    def _module(e: dict, w: list[torch.Tensor]) -> nn.Module | None:
        kind = e["class"]
        if kind in ("Conv2D", "DepthwiseConv2D"):
            cin = e["in_shape"][2]
            k = e["kernel"]
            if kind == "Conv2D":
                kernel = w[0].permute(3, 2, 0, 1)
                groups = 1
            else:
                kernel = w[0].permute(2, 3, 0, 1).reshape(-1, 1, k[0], k[1])
                groups = cin
            top, bottom, left, right = e["pads"]
            sym = top == bottom and left == right
            conv = nn.Conv2d(
                cin, kernel.shape[0], tuple(k), tuple(e["strides"]),
                padding=(top, left) if sym else 0, dilation=tuple(e["dilation"]),
                groups=groups, bias=e.get("use_bias", True),
            )  # fmt: skip
            with torch.no_grad():
                conv.weight.copy_(kernel)
                if conv.bias is not None:
                    conv.bias.copy_(w[1])
            if sym:
                return conv
            return nn.Sequential(nn.ZeroPad2d((left, right, top, bottom)), conv)
        if kind == "Dense":
            lin = nn.Linear(w[0].shape[0], w[0].shape[1], bias=e.get("use_bias", True))
            with torch.no_grad():
                lin.weight.copy_(w[0].T)
                if lin.bias is not None:
                    lin.bias.copy_(w[1])
            return lin
        if kind == "BatchNormalization":
            c = w[-1].shape[0]
            bn = nn.BatchNorm2d(c, eps=e["epsilon"])
            it = iter(w)
            with torch.no_grad():
                bn.weight.copy_(next(it) if e.get("scale", True) else torch.ones(c))
                bn.bias.copy_(next(it) if e.get("center", True) else torch.zeros(c))
                bn.running_mean.copy_(next(it))
                bn.running_var.copy_(next(it))
            return bn.eval()
        if kind == "MaxPooling2D":
            if any(e["pads"]):
                raise ValueError(f"{e['name']}: MaxPooling2D with padding")
            return nn.MaxPool2d(tuple(e["kernel"]), tuple(e["strides"]))
        if kind == "ZeroPadding2D":
            (top, bottom), (left, right) = e["padding"]
            return nn.ZeroPad2d((left, right, top, bottom))
        if kind == "GlobalAveragePooling2D":
            return nn.AdaptiveAvgPool2d(1)
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The twin's output (probabilities; logits when ``logits_only``)."""
        values: dict[str, torch.Tensor] = {}
        last = self.spec[-1]["name"]
        for e in self.spec:
            kind, name = e["class"], e["name"]
            ins = [values[i] for i in e["inputs"]]
            if kind == "InputLayer":
                y = x
            elif name in self.mods:
                y = self.mods[name](ins[0])
                if kind == "GlobalAveragePooling2D" and not e.get("keepdims", False):
                    y = torch.flatten(y, 1)
            elif kind == "ReLU":
                if e.get("negative_slope") or e.get("threshold"):
                    raise ValueError(f"{name}: ReLU with a slope or threshold")
                top = e.get("max_value")
                y = F.relu(ins[0]) if top is None else torch.clamp(ins[0], 0.0, float(top))
            elif kind == "Activation":
                y = ins[0]
            elif kind == "Add":
                y = ins[0]
                for other in ins[1:]:
                    y = y + other
            elif kind == "Multiply":
                y = ins[0]
                for other in ins[1:]:
                    y = y * other
            elif kind == "Softmax":
                if ins[0].dim() != 2:
                    raise ValueError(f"{name}: Softmax on a rank-{ins[0].dim()} tensor")
                y = ins[0] if self.logits_only and name == last else torch.softmax(ins[0], 1)
            else:
                raise ValueError(f"{name}: {kind} has no PyTorch twin")
            act = e.get("activation", "linear")
            if act not in ACTIVATIONS:
                raise ValueError(f"{name}: activation {act!r} has no PyTorch twin")
            if not (self.logits_only and name == last and act == "softmax"):
                y = ACTIVATIONS[act](y)
            values[name] = y
        return values[last]


def _count(weights: dict, e: dict) -> int:
    n = 0
    while f"{e['name']}:{n}" in weights:
        n += 1
    return n


def _setting(name: str, tqt_steps: int):
    """(target, QuantizationSetting) of one of ``SETTINGS``."""
    from esp_ppq import QuantizationSettingFactory

    target = "esp32p4" if name.startswith("p4") else "esp32s3"
    s = QuantizationSettingFactory.espdl_setting()
    if name.endswith("minmax"):
        s.quantize_activation_setting.calib_algorithm = "minmax"
    if name.endswith("equalization"):  # esp-dl's quantize_model_with_TQT.rst example values
        s.equalization = True
        s.equalization_setting.iterations = 4
        s.equalization_setting.value_threshold = 0.4
        s.equalization_setting.opt_level = 2
        s.equalization_setting.interested_layers = None
    if name.endswith("tqt"):  # esp-dl's TQT tutorial values, on the CPU
        s.tqt_optimization = True
        s.tqt_optimization_setting.int_lambda = 0.25
        s.tqt_optimization_setting.steps = tqt_steps
        s.tqt_optimization_setting.lr = 1e-5
        s.tqt_optimization_setting.collecting_device = "cpu"
        s.tqt_optimization_setting.block_size = 2
    return target, s


SETTINGS = (
    "s3_default", "p4_default", "s3_minmax", "p4_minmax", "s3_tqt", "p4_equalization",
)  # fmt: skip


def _ppq_predictions(graph, x: np.ndarray) -> list[int]:
    """esp-ppq's own executor (its fake quantization): arg max on each test digit."""
    from esp_ppq.executor import TorchExecutor

    executor = TorchExecutor(graph, device="cpu")
    preds = []
    for i in range(len(x)):
        out = executor.forward(inputs=torch.tensor(x[i : i + 1]))[0]
        preds.append(int(out.reshape(-1).argmax()))
    return preds


def main() -> None:
    """Build and check the twin, quantize it with each setting, write the result file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("key")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--tqt-steps", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    from esp_ppq.api import espdl_quantize_torch

    work, key = args.work, args.key
    spec = json.loads((work / f"{key}.json").read_text())
    weights = dict(np.load(work / f"{key}_weights.npz"))
    data = np.load(work / f"{key}_data.npz")
    calib = data["calib"].transpose(0, 3, 1, 2).copy()
    test = data["test"].transpose(0, 3, 1, 2).copy()
    twin = Twin(spec, weights).eval()
    twin.logits_only = True
    with torch.no_grad():
        logits = twin(torch.tensor(test)).numpy()
    twin.logits_only = False
    diff = float(np.abs(logits - data["logits"]).max())
    print(f"{key}: twin logits max |diff| from Keras {diff:.2e}", flush=True)
    if diff > 1e-4:
        raise SystemExit(f"{key}: the PyTorch twin is not the Keras net (max diff {diff:.2e})")
    result = {"twin_max_diff": diff, "settings": {}}
    batches = [torch.tensor(calib[i : i + 32]) for i in range(0, len(calib), 32)]
    for name in args.settings.split(","):
        target, setting = _setting(name, args.tqt_steps)
        path = work / f"{key}_{name}.espdl"
        info = {"target": target, "file": str(path)}
        start = time.perf_counter()
        try:
            graph = espdl_quantize_torch(
                model=twin,
                espdl_export_file=str(path),
                calib_dataloader=batches,
                calib_steps=len(batches),
                input_shape=[1, *calib.shape[1:]],
                target=target,
                num_of_bits=8,
                collate_fn=lambda b: b.float(),
                setting=setting,
                device="cpu",
                error_report=False,
                export_test_values=False,
                verbose=0,
            )
            info["seconds"] = time.perf_counter() - start
            info["ppq_predictions"] = preds = _ppq_predictions(graph, test)
            info["ppq_accuracy"] = float(np.mean(np.array(preds) == data["labels"]))
        except Exception as err:  # noqa: BLE001 - a failed setting is a result, not a crash
            info.setdefault("seconds", time.perf_counter() - start)
            info["error"] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
        shown = {k: v for k, v in info.items() if k != "ppq_predictions"}
        print(f"{key} {name}: {shown}", flush=True)
        result["settings"][name] = info
    (work / f"{key}_result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
