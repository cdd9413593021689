"""``amct-bridge espdl-eval``: the simulated ESP-DL v1 chip's accuracy next to float and fake-quant.

Runs a labelled dataset through the float Keras model, the fake-quantized copy
(:func:`amct_bridge.keras.simulate` with the record) and the bit-exact chip simulator
(:func:`amct_bridge.espdl.chip.simulate_chip` on the export directory), prints the three
accuracies side by side, then per chip layer the error of its dequantized output against the
float model's output of the same layer (SNR in dB, max abs error, share of saturated elements):
the layer whose exponent costs accuracy stands out before anything is flashed.

Example:
    amct-bridge espdl-eval --export model_espdl --model model.keras --record record.txt \\
        --data val.npz --target esp32s3
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from amct_bridge.commands.common import add_unsafe_load, load_npy
from amct_bridge.errors import AmctBridgeError, ExportError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``espdl-eval`` subcommand.

    Example:
        >>> p = argparse.ArgumentParser(); register(p.add_subparsers())
        >>> p.parse_args(["espdl-eval", "--export", "e", "--model", "m", "--data", "d"]).target
        ... # None: the export's own target
    """
    parser = subparsers.add_parser(
        "espdl-eval",
        help="accuracy of the simulated ESP-DL v1 chip vs float and fake-quant, per-layer error",
        description="Run a labelled dataset through the float Keras model, the fake-quantized "
        "model (with --record) and the bit-exact ESP-DL v1 chip simulator on an export "
        "directory; print the accuracies and each chip layer's error against the float model.",
    )
    parser.add_argument("--export", required=True, help="export directory (export-espdl --out)")
    parser.add_argument("--model", required=True, help="the Keras model file that was exported")
    parser.add_argument("--record", help="AMCT record: adds the fake-quant accuracy")
    parser.add_argument(
        "--data", required=True, help=".npz with x and y, or x.npy (labels: --labels)"
    )
    parser.add_argument("--labels", help="y.npy (class indices or one-hot) when --data is x.npy")
    parser.add_argument(
        "--target",
        choices=("esp32", "esp32s2", "esp32c3", "esp32s3"),
        help="chip to simulate (default: the one the export was made for)",
    )
    parser.add_argument("--input-exponent", type=int, help="override the export's input exponent")
    parser.add_argument("--limit", type=int, help="use the first N samples only")
    parser.add_argument("--batch-size", type=int, default=64, help="chip batch (default 64)")
    add_unsafe_load(parser)
    parser.set_defaults(func=run)


def load_dataset(data: str, labels: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x, class indices) from an .npz (arrays ``x`` and ``y``) or x.npy + y.npy.

    Example:
        >>> load_dataset("/nonexistent.npz")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.AmctBridgeError: /nonexistent.npz: cannot read the dataset: ...
    """
    if labels is None:
        archive = load_npy(data, "the dataset")  # never unpickles; names a damaged file
        if not hasattr(archive, "files") or not {"x", "y"} <= set(archive.files):
            raise AmctBridgeError(f"{data}: expected an .npz with arrays 'x' and 'y'")
        x, y = archive["x"], archive["y"]
    else:
        x, y = load_npy(data, "inputs"), load_npy(labels, "labels")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] > 1:
        y = y.argmax(axis=1)  # one-hot
    y = y.reshape(-1)
    if len(y) != len(x):
        raise AmctBridgeError(f"{data}: {len(x)} inputs but {len(y)} labels")
    return np.asarray(x), y.astype(np.int64)


def _accuracy(scores: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(scores.reshape(len(y), -1).argmax(axis=1) == y))


@dataclass
class LayerError:
    """A chip layer's output against the float model's output of the same layer."""

    name: str
    keras_layer: str
    kind: str
    exponent: int
    snr_db: float
    max_abs: float
    saturated: float
    approximate: bool


@dataclass
class Evaluation:
    """Accuracies (None: not computed) and the per-layer errors."""

    samples: int
    float_acc: float
    fake_quant_acc: float | None
    chip_acc: float
    target: str
    layers: list[LayerError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """10·log10(Σref² / Σ(ref − got)²); inf when equal.

    Example:
        >>> round(snr_db(np.array([1.0, -1.0]), np.array([1.1, -1.0])), 1)
        23.0
    """
    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def _predict(model, x: np.ndarray, batch: int) -> list[np.ndarray]:
    """Eager batched calls: ``predict`` on several models retraces and floods stderr."""
    import keras

    parts: list[list[np.ndarray]] = []
    for start in range(0, len(x), batch):
        outs = model(x[start : start + batch], training=False)
        outs = outs if isinstance(outs, list | tuple) else [outs]
        parts.append([np.asarray(keras.ops.convert_to_numpy(o)) for o in outs])
    return [np.concatenate(col) for col in zip(*parts, strict=True)]


def _float_outputs(model, x: np.ndarray, names: list[str], batch: int) -> dict[str, np.ndarray]:
    import keras

    found = {}
    for name in names:
        try:
            found[name] = model.get_layer(name).output
        except ValueError:
            continue  # nested ("outer/inner") or not a layer: no float reference
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs  # as the model is called
    probe = keras.Model(inputs, list(found.values()))
    return dict(zip(found, _predict(probe, x, batch), strict=True))


def _layer_errors(net, chip: dict, floats: dict, bits: int) -> list[LayerError]:
    top, bottom = 2 ** (bits - 1) - 1, -(2 ** (bits - 1))
    result = []
    for layer in net.layers:
        keras_name = layer.fused[-1] if layer.fused else layer.source
        if keras_name not in floats:
            continue
        ref = floats[keras_name]
        values = chip[layer.name]
        got = np.ldexp(values.astype(np.float64), chip["exp:" + layer.name])
        if got.size != ref.size:
            continue
        got = got.reshape(ref.shape)
        result.append(
            LayerError(
                layer.name,
                keras_name,
                layer.kind,
                chip["exp:" + layer.name],
                snr_db(ref, got),
                float(np.max(np.abs(ref - got))) if ref.size else 0.0,
                float(np.mean((values == top) | (values == bottom))) if values.size else 0.0,
                chip["approx:" + layer.name],
            )
        )
    return result


def _chip_output(net, model) -> str:
    """The chip output computing the model's first output: the graph lists its outputs in
    execution order, which need not be the model's output order."""
    first = model.outputs[0]._keras_history.operation.name
    for name in net.outputs:
        layer = next(x for x in net.layers if x.name == name)
        if first in (layer.source, *layer.fused):
            return name
    return net.outputs[0]  # e.g. a skipped final Softmax: the chip's output is its input


def evaluate(
    export_dir: str | Path,
    model,
    x: np.ndarray,
    y: np.ndarray,
    *,
    record=None,
    target: str | None = None,
    input_exponent: int | None = None,
    batch_size: int = 64,
) -> Evaluation:
    """Float, fake-quant (if ``record``) and chip accuracy of ``model`` / its export on (x, y).

    Example:
        >>> evaluate.__name__
        'evaluate'
    """
    from amct_bridge.espdl.chip import simulate_chip
    from amct_bridge.espdl.network import load_network

    net = load_network(export_dir)
    if net.input_shape is not None and tuple(x.shape[1:]) != tuple(net.input_shape):
        raise ExportError(
            f"{export_dir}: the exported network takes inputs of shape {tuple(net.input_shape)} "
            f"(HWC), the data has {tuple(x.shape[1:])}: is it the export of this model?"
        )
    float_scores = _predict(model, x, batch_size)[0]
    fq_acc = None
    if record is not None:
        from amct_bridge.keras import simulate

        fq_acc = _accuracy(_predict(simulate(model, record), x, batch_size)[0], y)
    chip: dict = {}
    warnings: list[str] = []
    parts: dict[str, list[np.ndarray]] = {layer.name: [] for layer in net.layers}
    for start in range(0, len(x), batch_size):
        res = simulate_chip(net, x[start : start + batch_size], target, input_exponent)
        warnings, simulated = res.warnings, res.target
        for name, tensor in res.layers.items():
            parts[name].append(tensor.values)
            chip["exp:" + name] = tensor.exponent
            chip["approx:" + name] = tensor.approximate
    for name, values in parts.items():
        chip[name] = np.concatenate(values) if values else np.zeros(0)
    out = _chip_output(net, model)
    scores = np.ldexp(chip[out].astype(np.float64), chip["exp:" + out])
    floats = _float_outputs(
        model,
        x,
        [layer.fused[-1] if layer.fused else layer.source for layer in net.layers],
        batch_size,
    )
    return Evaluation(
        len(y),
        _accuracy(np.asarray(float_scores), y),
        fq_acc,
        _accuracy(scores, y),
        simulated if len(x) else (target or net.target or "esp32"),
        _layer_errors(net, chip, floats, net.bits),
        warnings,
    )


def format_evaluation(ev: Evaluation) -> str:
    """The report ``espdl-eval`` prints.

    Example:
        >>> print(format_evaluation(Evaluation(10, 0.9, None, 0.8, "esp32")))
        ... # doctest: +NORMALIZE_WHITESPACE
        samples: 10
        float accuracy:      0.9000
        fake-quant accuracy: n/a (no --record)
        chip accuracy:       0.8000 (esp32, bit-exact simulator)
    """
    fq = "n/a (no --record)" if ev.fake_quant_acc is None else f"{ev.fake_quant_acc:.4f}"
    lines = [
        f"samples: {ev.samples}",
        f"float accuracy:      {ev.float_acc:.4f}",
        f"fake-quant accuracy: {fq}",
        f"chip accuracy:       {ev.chip_acc:.4f} ({ev.target}, bit-exact simulator)",
    ]
    if ev.layers:
        width = max(len("layer"), *(len(e.name) for e in ev.layers))
        lines += ["", "per-layer error of the chip against the float model:"]
        lines.append(
            f"{'layer':<{width}}  {'class':<19} {'exp':>4} {'SNR dB':>7} {'max abs':>10} "
            f"{'sat %':>6}  keras layer"
        )
        for e in ev.layers:
            mark = "  (approximate arithmetic)" if e.approximate else ""
            lines.append(
                f"{e.name:<{width}}  {e.kind:<19} {e.exponent:>4} {e.snr_db:>7.1f} "
                f"{e.max_abs:>10.4g} {100 * e.saturated:>6.2f}  {e.keras_layer}{mark}"
            )
        worst = min(ev.layers, key=lambda e: e.snr_db)
        lines.append(f"lowest SNR: {worst.name} ({worst.snr_db:.1f} dB)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the evaluation; returns the exit code."""
    from amct_bridge.commands.common import load_keras_model

    if not Path(args.export).is_dir():
        raise ExportError(f"{args.export}: export directory not found")
    x, y = load_dataset(args.data, args.labels)
    if args.limit is not None:
        x, y = x[: args.limit], y[: args.limit]
    if args.batch_size < 1:
        raise AmctBridgeError(f"--batch-size {args.batch_size}: expected >= 1")
    model = load_keras_model(args.model, unsafe=args.unsafe_load)
    record = None
    if args.record is not None:
        from amct_bridge.records import load

        record = load(args.record)
    ev = evaluate(
        args.export,
        model,
        x,
        y,
        record=record,
        target=args.target,
        input_exponent=args.input_exponent,
        batch_size=args.batch_size,
    )
    for warning in ev.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(format_evaluation(ev))
    return 0
