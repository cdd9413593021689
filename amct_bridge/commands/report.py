"""``amct-bridge report --record r.txt --model m.keras --data x.npy [--labels y.npy]
[--html out.html]``: per-layer quantization report of a record (docs/report.md).

A MindSpore network instead of ``--model``: ``--mindspore module:factory [--ckpt FILE]`` (see
:mod:`amct_bridge.commands.mindspore_net`); ``--data`` is then NCHW, as the network runs, and
of an .npz the first arrays are the network's inputs (as many as its ``construct`` takes), one
more is the labels (an .npz with x and y, as espdl-eval reads).

Prints the table (input and clip ranges, saturated share, scale/offset, weight scale spread,
SNR of each layer alone and cumulative, model SNR, accuracy drop with labels), the most
sensitive layers and an AMCT simple-config fragment keeping them in float. ``--html`` writes
one self-contained page with the plots (matplotlib: ``pip install 'amct-bridge[report]'``).

Example:
    >>> import argparse
    >>> sub = argparse.ArgumentParser().add_subparsers()
    >>> register(sub)
    >>> "report" in sub.choices
    True
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from amct_bridge.commands.calibrate import load_keras_data, load_mindspore_data, positive_int
from amct_bridge.commands.common import (
    add_mindspore_net,
    add_unsafe_load,
    load_keras_model,
    load_npy,
)
from amct_bridge.errors import CalibrationError
from amct_bridge.records.atomic import atomic_write_bytes, check_writable

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add the ``report`` subcommand."""
    p = subparsers.add_parser(
        "report",
        help="per-layer quantization report of a record (SNR, ranges, sensitive layers)",
        description="Run the Keras model (or MindSpore network) float and simulated with the "
        "record (each layer "
        "alone, and all layers) on the data; print per layer the input and clip ranges, the "
        "saturated share, scale/offset, weight scale spread, SNR (dB) and, with --labels, the "
        "accuracy drop; then the top-K sensitive layers and an AMCT config fragment "
        "(skip_layers) with the accuracy when they are kept in float.",
    )
    p.add_argument("--record", required=True, help="AMCT record (its .calib.json is read too)")
    p.add_argument("--model", help="float Keras model (.keras or .h5); or --mindspore")
    add_mindspore_net(p)
    p.add_argument(
        "--data",
        required=True,
        help="inputs: .npy array or .npz (one per input; --mindspore: the inputs in file "
        "order, then optionally the labels, e.g. an .npz with x and y)",
    )
    p.add_argument(
        "--labels",
        help=".npy class labels (index or one-hot): accuracy columns; labels the model output "
        "is not a class vector for (e.g. 0/1 anomaly labels of an autoencoder) give the output's "
        "SNR and MSE instead",
    )
    p.add_argument("--html", help="write a self-contained HTML report with plots here")
    p.add_argument("--json", help="write the table as JSON here")
    p.add_argument("--top-k", type=int, default=3, help="sensitive layers to list (default 3)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="samples per batch")
    p.add_argument("--max-samples", type=positive_int, help="use the first N samples only")
    add_unsafe_load(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the report, print it, write the files asked for."""
    import numpy as np

    from amct_bridge.report import plots, text_table, write_html

    if args.top_k < 0:
        raise CalibrationError(f"--top-k must be >= 0, got {args.top_k}")
    if (args.model is None) == (args.mindspore is None):
        raise CalibrationError("give either --model (Keras) or --mindspore MODULE:FACTORY")
    if args.ckpt and not args.mindspore:
        raise CalibrationError("--ckpt goes with --mindspore MODULE:FACTORY")
    for path in (args.json, args.html):  # before the model runs, not after
        if path:
            check_writable(path)
    if args.mindspore:
        from amct_bridge.commands.mindspore_net import load_mindspore_net
        from amct_bridge.mindspore.report import quant_report

        data = load_mindspore_data(args.data, "report")
        model = load_mindspore_net(args.mindspore, args.ckpt)
        data, labels_in_data = _mindspore_inputs(model, data, args)
    else:
        from amct_bridge.keras.report import quant_report

        model = load_keras_model(args.model, unsafe=args.unsafe_load)
        data = load_keras_data(args.data, model)
        labels_in_data = None
    labels = None
    if args.mindspore and labels_in_data is not None:
        labels = labels_in_data
    if args.labels:
        labels = load_npy(args.labels, "labels")  # never unpickles
        n = len(data[0] if isinstance(data, (list, tuple)) else data)
        if not isinstance(labels, np.ndarray) or labels.ndim == 0 or len(labels) != n:
            got = labels.shape if isinstance(labels, np.ndarray) else "an .npz archive"
            raise CalibrationError(
                f"{args.labels}: expected one label per sample of {args.data} ({n}), got {got}"
            )
    if args.max_samples:
        cut = slice(0, args.max_samples)
        if isinstance(data, (list, tuple)):
            data = type(data)(a[cut] for a in data)
        else:
            data = data[cut]
        labels = None if labels is None else labels[cut]
    report = quant_report(
        model, args.record, data, labels, top_k=args.top_k, batch_size=args.batch_size
    )
    print(text_table(report), end="")
    if args.json:
        atomic_write_bytes(args.json, (json.dumps(report.to_dict(), indent=1) + "\n").encode())
        print(f"wrote {args.json}")
    if args.html:
        write_html(report, args.html)
        reason = plots.missing_reason()
        print(f"wrote {args.html}" + (f" (tables only: {reason})" if reason else ""))
        if reason:
            print(f"amct-bridge report: note: no plots: {reason}", file=sys.stderr)
    return 0


def _mindspore_inputs(net, data, args: argparse.Namespace):
    """(network inputs, labels or None) of the --data arrays: as many leading arrays as
    ``net.construct`` takes (as ``calibrate`` does); one array after them is the labels (an
    .npz with x and y, as espdl-eval reads it) unless --labels is given."""
    if not isinstance(data, tuple):
        return data, None
    from amct_bridge.mindspore.session import input_count

    count = input_count(net, len(data))
    inputs, extra = data[:count], data[count:]
    inputs = inputs[0] if len(inputs) == 1 else inputs
    if not extra:
        return inputs, None
    if len(extra) == 1 and not args.labels:
        log.info(
            "%s: array %d taken as the labels (after the network's inputs)", args.data, count + 1
        )
        return inputs, extra[0]
    raise CalibrationError(
        f"{args.data}: holds {len(data)} arrays, but {type(net).__name__}.construct takes "
        f"{count} input(s); the arrays after the inputs can only be one, the labels (and then "
        "without --labels)"
    )
