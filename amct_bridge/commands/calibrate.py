"""``amct-bridge calibrate MODEL.keras --data FILE.npy|.npz -o record.txt``: calibrate a model.

Loads the Keras model and the calibration inputs, runs ``model.predict`` with
:class:`amct_bridge.keras.QuantCalibration` (Keras progress bar) and writes the AMCT record, its
calibration sidecar and optionally the matching frozen graph.

A MindSpore network instead: ``--mindspore module:factory [--ckpt FILE]`` (see
:mod:`amct_bridge.commands.mindspore_net`), run by :func:`amct_bridge.mindspore.calibrate`;
the record is the "mindspore" flavor unless ``--flavor inner``.

Example:
    >>> import argparse
    >>> sub = argparse.ArgumentParser().add_subparsers()
    >>> register(sub)
    >>> "calibrate" in sub.choices
    True
"""

from __future__ import annotations

import argparse
import sys

from amct_bridge.commands.common import (
    add_mindspore_net,
    add_unsafe_load,
    load_keras_model,
    load_npy,
)
from amct_bridge.config import ALGORITHMS
from amct_bridge.errors import CalibrationError
from amct_bridge.records.summary import flavor_phrase


def register(subparsers) -> None:
    """Add the ``calibrate`` subcommand."""
    p = subparsers.add_parser(
        "calibrate",
        help="calibrate a .keras model (or a MindSpore network) on .npy/.npz inputs and write "
        "an AMCT record",
        description="Run the model on calibration inputs with statistics gathered in its graph "
        "and write an AMCT record (plus <record>.calib.json with each layer's input/output "
        "ranges). Options mirror AMCT's create_quant_config; --config reads AMCT's own simple "
        "config file, explicit options override it.",
    )
    p.add_argument("model", nargs="?", help="Keras model file (.keras or .h5); or --mindspore")
    add_mindspore_net(p)
    p.add_argument("--data", required=True, help="inputs: .npy array or .npz (one array per input)")
    p.add_argument(
        "-o", "--output", "--record", required=True, help="record file to write (atomically)"
    )
    p.add_argument(
        "--batch-size", type=positive_int, default=32, help="samples per batch (default 32)"
    )
    p.add_argument("--batch-num", type=positive_int, help="batches to calibrate on (default: all)")
    p.add_argument("--config", help="AMCT simple config file (protobuf text)")
    p.add_argument("--algorithm", choices=ALGORITHMS, help="activation algorithm (default ifmr)")
    p.add_argument("--num-of-bins", type=int, help="hfmg histogram bins (1024/2048/4096/8192)")
    p.add_argument(
        "--activation-offset",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="asymmetric activations (AMCT default: on)",
    )
    p.add_argument(
        "--channel-wise",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="per-channel weight scales (default: on)",
    )
    p.add_argument(
        "--act-type",
        type=str.upper,  # any case, as the API
        choices=("INT8", "INT16"),
        help="activation type (default INT8; any case)",
    )
    p.add_argument("--skip-layers", default="", help="comma-separated layer names not to quantize")
    p.add_argument(
        "--skip-fusion-layers",
        default="",
        help="comma-separated layers whose BatchNormalization is not folded",
    )
    p.add_argument("--migration-strength", type=float, help="enable DMQ with this strength")
    p.add_argument("--joint-quant", action="store_true", default=None, help="write shift_bit")
    p.add_argument(
        "--flavor",
        choices=("inner", "tf", "mindspore"),
        help="record flavor (default: inner for Keras, mindspore for --mindspore)",
    )
    p.add_argument(
        "--keys",
        choices=("keras", "tf_op"),
        default="keras",
        help="record keys: Keras layer names or TF op names of the frozen graph",
    )
    p.add_argument("--frozen-graph", help="also write the matching frozen GraphDef (.pb)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_unsafe_load(p)
    p.set_defaults(func=run)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--batch-size 0`` is refused with exit 2).

    Example:
        >>> positive_int("8")
        8
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (>= 1), got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    """Load model and data, calibrate, report what was written."""
    if args.mindspore or args.ckpt:
        return _run_mindspore(args)
    if args.model is None:
        raise CalibrationError("give a Keras MODEL file or --mindspore MODULE:FACTORY")
    model = load_keras_model(args.model, unsafe=args.unsafe_load)
    data = load_keras_data(args.data, model)

    from amct_bridge.keras import calibrate

    options = _options(args)
    options.update(
        flavor=args.flavor or "inner", keys=args.keys, frozen_graph_path=args.frozen_graph
    )
    record = calibrate(
        model,
        data,
        args.output,
        batch_size=args.batch_size,
        verbose=0 if args.quiet else 1,
        **options,
    )
    _report(args, record)
    return 0


def _run_mindspore(args: argparse.Namespace) -> int:
    """``--mindspore module:factory [--ckpt FILE]``: calibrate a MindSpore network."""
    if not args.mindspore:
        raise CalibrationError("--ckpt goes with --mindspore MODULE:FACTORY")
    if args.model is not None:
        raise CalibrationError(f"give either a Keras MODEL ({args.model}) or --mindspore, not both")
    if args.keys != "keras" or args.frozen_graph:
        raise CalibrationError("--keys and --frozen-graph are Keras options (TF op names)")
    from amct_bridge.commands.mindspore_net import load_mindspore_net

    data = load_mindspore_data(args.data)
    net = load_mindspore_net(args.mindspore, args.ckpt)
    from amct_bridge.mindspore import calibrate

    options = _options(args)
    options["flavor"] = args.flavor or "mindspore"
    record = calibrate(net, data, args.output, batch_size=args.batch_size, **options)
    _report(args, record)
    return 0


def load_mindspore_data(path: str, what: str = "calibration"):
    """The .npy array, or the .npz arrays in file order (one per network input), as float32;
    a clear error for no numbers or no samples (``what``: the command's word for the data).

    Example:
        >>> import os, tempfile
        >>> import numpy as np
        >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
        >>> np.save(path, np.ones((2, 3), np.int8))
        >>> load_mindspore_data(path).dtype
        dtype('float32')
    """
    import numpy as np

    loaded = load_npy(path, f"{what} data")
    arrays = [loaded] if isinstance(loaded, np.ndarray) else [loaded[n] for n in loaded.files]
    for array in arrays:
        if array.dtype.kind not in "iubf":
            raise CalibrationError(f"{path}: holds {array.dtype}; expected numbers")
        if array.ndim == 0 or len(array) == 0:
            raise CalibrationError(f"{path}: holds 0 samples; {what} needs at least one")
    arrays = [a.astype(np.float32) if a.dtype != np.float32 else a for a in arrays]
    return arrays[0] if len(arrays) == 1 else tuple(arrays)


def _options(args: argparse.Namespace) -> dict:
    """The QuantCalibration options both frameworks share."""
    if args.num_of_bins and (args.algorithm or ("hfmg" if args.config else "ifmr")) != "hfmg":
        raise CalibrationError(
            f"--num-of-bins applies to --algorithm hfmg (AMCT's hfmg_quantize.num_of_bins), "
            f"not {args.algorithm or 'ifmr'}"
        )
    return {
        "config": args.config,
        "algorithm": args.algorithm,
        "algorithm_options": {"num_of_bins": args.num_of_bins} if args.num_of_bins else None,
        "batch_num": args.batch_num,
        "activation_offset": args.activation_offset,
        "channel_wise": args.channel_wise,
        "act_type": args.act_type,
        "skip_layers": _names(args.skip_layers),
        "skip_fusion_layers": _names(args.skip_fusion_layers),
        "migration_strength": args.migration_strength,
        "joint_quant": args.joint_quant,
    }


def _report(args: argparse.Namespace, record) -> None:
    from amct_bridge.records.calibration import load_stats, sidecar_path

    stats = load_stats(sidecar_path(args.output))
    phrase = flavor_phrase(record, record.flavor)
    print(
        f"wrote {args.output}: {phrase}, {len(record.layers)} layers, "
        f"{stats.algorithm}, {stats.batches} batches; and {sidecar_path(args.output)}"
        + (f" and {args.frozen_graph}" if args.frozen_graph else "")
    )


def _names(text: str) -> list[str] | None:
    names = [n.strip() for n in text.split(",") if n.strip()]
    return names or None


def load_keras_data(path: str, model):
    """The .npy array, or the .npz arrays by ``model``'s input names (one array: any name),
    checked against the model's inputs (count, sample count, shape) and cast to their dtype.

    Example:
        >>> # x = load_keras_data("x.npz", model)  # a list for a model with several inputs
    """
    import numpy as np

    loaded = load_npy(path, "calibration data")  # never unpickles; names a damaged file
    names = [t.name for t in model.inputs]
    if isinstance(loaded, np.ndarray):
        arrays = [loaded]
    elif len(loaded.files) == 1:
        arrays = [loaded[loaded.files[0]]]
    else:
        missing = [n for n in names if n not in loaded.files]
        if missing:
            raise CalibrationError(
                f"{path}: has arrays {loaded.files}; expected one array per model input "
                f"named {names} (missing {missing})"
            )
        arrays = [loaded[n] for n in names]
    if len(arrays) != len(names):
        raise CalibrationError(f"{path}: 1 array for a model with {len(names)} inputs {names}")
    labels = names if len(arrays) > 1 else [getattr(loaded, "files", [""])[0]]
    counts = {label: (len(a) if a.ndim else None) for label, a in zip(labels, arrays, strict=True)}
    if 0 in counts.values():  # Keras would only warn "Your input ran out of data"
        raise CalibrationError(f"{path}: holds 0 samples; calibration needs at least one")
    if len(set(counts.values())) > 1:
        # Keras would stop with "Data cardinality is ambiguous" and a traceback.
        listed = ", ".join(f"{label!r}: {count}" for label, count in counts.items())
        raise CalibrationError(
            f"{path}: the arrays have different sample counts (first axis) ({listed}); every "
            "model input needs one row per sample"
        )
    arrays = [
        _as_input_dtype(a, t, path, label)
        for a, t, label in zip(arrays, model.inputs, labels, strict=True)
    ]
    for array, tensor in zip(arrays, model.inputs, strict=True):
        expected = tuple(tensor.shape[1:])
        if array.ndim != len(expected) + 1 or any(
            e is not None and e != a for e, a in zip(expected, array.shape[1:], strict=True)
        ):
            raise CalibrationError(
                f"{path}: array of shape {array.shape} does not fit model input "
                f"{tensor.name!r} of shape (N, {', '.join(map(str, expected))})"
            )
    return arrays[0] if len(arrays) == 1 else arrays


def _as_input_dtype(array, tensor, path: str, label: str):
    """Integer/bool data for a float input is cast to the input's dtype, with a note: Keras
    would cast it silently; the note says so, and when the values are not exact in float32."""
    import numpy as np

    dtype = np.dtype(getattr(tensor.dtype, "name", tensor.dtype) or "float32")
    if array.dtype.kind not in "iubf":  # Keras: a traceback (strings) or a silent cast (complex)
        raise CalibrationError(
            f"{path}: {f'array {label!r}' if label else 'the array'} is {array.dtype}; expected "
            f"numbers (float, integer or bool) for the model input {tensor.name!r} ({dtype})"
        )
    if dtype.kind != "f" or array.dtype.kind not in "iub":
        return array
    cast = array.astype(dtype)
    lossy = array.size and not np.array_equal(cast.astype(array.dtype), array)
    note = (
        f"amct-bridge calibrate: note: {path}: {f'array {label!r}' if label else 'the array'} "
        f"is {array.dtype}; cast to "
        f"{dtype} for the model's float input"
        + (" (some values are not exact in float: they were rounded)" if lossy else "")
    )
    print(note, file=sys.stderr)
    return cast
