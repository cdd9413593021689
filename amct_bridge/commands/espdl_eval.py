"""``amct-bridge espdl-eval``: the simulated ESP-DL v1 chip's accuracy next to float and fake-quant.

Runs a labelled dataset through the float Keras model, the fake-quantized copy
(:func:`amct_bridge.keras.simulate` with the record) and the bit-exact chip simulator
(:func:`amct_bridge.espdl.v1.chip.simulate_chip` on the export directory), through
:func:`amct_bridge.keras.evaluate_espdl`, prints the three
accuracies side by side, then per chip layer the error of its dequantized output against the
float model's output of the same layer (SNR in dB, max abs error, share of saturated elements):
the layer whose exponent costs accuracy stands out before anything is flashed. With
``--mindspore module:factory [--ckpt F]`` instead of ``--model``: the MindSpore network, on NCHW
data (:func:`amct_bridge.mindspore.evaluate_espdl`); the comparison is in
:mod:`amct_bridge.espdl.evaluation`. With ``--format espdl``, ``--export`` is an ESP-DL v3
``.espdl`` file and either model kind runs against its simulator
(:mod:`amct_bridge.espdl.v3.evaluation`).

Example:
    amct-bridge espdl-eval --export model_espdl --model model.keras --record record.txt \\
        --data val.npz --target esp32s3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from amct_bridge.commands.common import add_mindspore_net, add_unsafe_load, load_npy
from amct_bridge.errors import AmctBridgeError, ExportError
from amct_bridge.espdl.evaluation import format_evaluation

__all__ = ["load_dataset"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``espdl-eval`` subcommand.

    Example:
        >>> p = argparse.ArgumentParser(); register(p.add_subparsers())
        >>> p.parse_args(["espdl-eval", "--export", "e", "--model", "m", "--data", "d"]).target
        ... # None: the export's own target
    """
    parser = subparsers.add_parser(
        "espdl-eval",
        help="accuracy of the simulated ESP-DL chip (v1 or v3) vs float and fake-quant, "
        "per-layer error",
        description="Run a labelled dataset through the float Keras model (or MindSpore "
        "network), the fake-quantized model (with --record) and the bit-exact ESP-DL chip "
        "simulator: ESP-DL v1 on an export directory, ESP-DL v3 on an .espdl file (--format "
        "espdl); print the accuracies and each chip layer's error against the float model. A "
        "model that is not a classifier for the labels (e.g. an autoencoder) gets the output's "
        "SNR and MSE instead of accuracies.",
    )
    parser.add_argument("--export", required=True, help="export directory (export-espdl --out)")
    parser.add_argument("--model", help="the Keras model file that was exported")
    add_mindspore_net(parser, "instead of --model; --data is then NCHW, as the network runs")
    parser.add_argument("--record", help="AMCT record: adds the fake-quant accuracy")
    parser.add_argument(
        "--data", required=True, help=".npz with x and y, or x.npy (labels: --labels)"
    )
    parser.add_argument(
        "--labels",
        help="y.npy (class indices or one-hot) when --data is x.npy; labels the model output "
        "is not a class vector for (an autoencoder's 0/1 anomaly labels) give its SNR and MSE "
        "instead of accuracies",
    )
    parser.add_argument(
        "--target",
        choices=("esp32", "esp32s2", "esp32c3", "esp32s3", "esp32p4", "c"),
        help="chip to simulate (default: the one the export was made for)",
    )
    parser.add_argument(
        "--format",
        choices=("v1", "espdl"),
        default=None,
        help="v1: --export is an export directory; espdl: an ESP-DL v3 .espdl file (default: "
        "espdl for an existing .espdl file, else v1)",
    )
    parser.add_argument("--input-exponent", type=int, help="override the export's input exponent")
    parser.add_argument("--limit", type=int, help="use the first N samples only")
    parser.add_argument("--batch-size", type=int, default=64, help="chip batch (default 64)")
    add_unsafe_load(parser)
    parser.set_defaults(func=run)


def load_dataset(data: str, labels: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x, labels) from an .npz (arrays ``x`` and ``y``) or x.npy + y.npy; labels as given
    (class indices, one-hot rows, or labels that are not classes: no accuracy then).

    Example:
        >>> load_dataset("/nonexistent.npz")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.AmctBridgeError: /nonexistent.npz: cannot read the dataset: ...
    """
    if labels is None:
        archive = load_npy(data, "the dataset")  # never unpickles; names a damaged file
        if not hasattr(archive, "files"):  # an .npy: the inputs alone
            raise AmctBridgeError(
                f"{data}: a .npy array holds no labels and --labels is missing: pass --labels "
                "y.npy (class indices or one-hot), or an .npz with arrays 'x' and 'y' as --data"
            )
        if not {"x", "y"} <= set(archive.files):
            have = ", ".join(repr(name) for name in archive.files) or "none"
            raise AmctBridgeError(
                f"{data}: expected an .npz with arrays 'x' and 'y' (it has {have}), or x.npy as "
                "--data with --labels y.npy"
            )
        x, y = archive["x"], archive["y"]
    else:
        x, y = load_npy(data, "inputs"), load_npy(labels, "labels")
    from amct_bridge.report.metrics import class_indices

    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.reshape(-1)
    if y.ndim == 0 or len(y) != len(x):
        raise AmctBridgeError(f"{data}: {len(x)} inputs but {y.size} labels")
    indices, one_hot, _ = class_indices(y)
    if one_hot is not None:
        y = indices  # one-hot rows: their class indices
    # other labels are kept as given: labels that are not classes (floats, targets) give no
    # accuracy, the evaluation says why (amct_bridge.report.metrics.classification_problem)
    return np.asarray(x), y


def run(args: argparse.Namespace) -> int:
    """Run the evaluation; returns the exit code."""
    from amct_bridge.commands.common import load_keras_model

    if args.format is None:  # export-espdl --format espdl wrote a file: take it as such
        is_file = Path(args.export).is_file() and Path(args.export).suffix == ".espdl"
        args.format = "espdl" if is_file else "v1"
    if args.format == "espdl":
        if not Path(args.export).is_file() or Path(args.export).suffix != ".espdl":
            raise ExportError(f"{args.export}: expected an .espdl file with --format espdl")
        if args.input_exponent is not None:
            raise AmctBridgeError("--format espdl runs at the file's input exponent")
    elif args.target in ("esp32p4", "c"):
        raise AmctBridgeError(f"--target {args.target} is an ESP-DL v3 target: add --format espdl")
    elif not Path(args.export).is_dir():
        raise ExportError(f"{args.export}: export directory not found")
    x, y = load_dataset(args.data, args.labels)
    if args.limit is not None:
        x, y = x[: args.limit], y[: args.limit]
    if args.batch_size < 1:
        raise AmctBridgeError(f"--batch-size {args.batch_size}: expected >= 1")
    if (args.model is None) == (args.mindspore is None):
        raise AmctBridgeError("give either --model (a Keras file) or --mindspore MODULE:FACTORY")
    if args.ckpt and not args.mindspore:
        raise AmctBridgeError("--ckpt goes with --mindspore MODULE:FACTORY")
    record = None
    if args.record is not None:
        from amct_bridge.records import load

        record = load(args.record)
    if args.mindspore:
        from amct_bridge.commands.mindspore_net import load_mindspore_net
        from amct_bridge.mindspore import evaluate_espdl as run_eval

        model = load_mindspore_net(args.mindspore, args.ckpt)
        if x.dtype != np.float32:
            x = x.astype(np.float32)  # MindSpore casts no input (as calibrate --mindspore)
    else:
        from amct_bridge.keras.espdl_eval import evaluate_espdl as run_eval

        model = load_keras_model(args.model, unsafe=args.unsafe_load)
    from amct_bridge.commands.espdl_convert import check_set_shapes

    if args.format == "v1":  # a v1 export set: name the .npy that does not fit, not its layer
        check_set_shapes(args.export)
    ev = run_eval(
        args.export,
        model,
        x,
        y,
        record=record,
        target=args.target,
        input_exponent=args.input_exponent,
        batch_size=args.batch_size,
    )
    from amct_bridge.commands.common import print_warnings

    print_warnings(ev.warnings)  # a warning many layers get: one line, the layers at -v
    print(format_evaluation(ev))
    return 0
