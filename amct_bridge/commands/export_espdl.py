"""``amct-bridge export-espdl``: record + Keras model or MindSpore network -> ESP-DL v1
config.json + npy set (``--format v1``, the default) or one ESP-DL v3 ``.espdl`` file
(``--format espdl``).

Example:
    amct-bridge export-espdl --record record.txt --model model.keras --out model_espdl \\
        --feature-type s8 --granularity per-channel --target esp32s3 --preview
    amct-bridge export-espdl --mindspore my_nets:resnet --ckpt resnet.ckpt \\
        --input-shape 1,3,32,32 --record record.txt --out resnet_espdl
    amct-bridge export-espdl --set model_espdl --cpp model_coefficient --target esp32s3
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from amct_bridge.commands.common import (
    add_mindspore_net,
    add_unsafe_load,
    load_keras_model,
    print_warnings,
)
from amct_bridge.errors import ExportError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``export-espdl`` subcommand.

    Example:
        >>> p = argparse.ArgumentParser(); register(p.add_subparsers())
        >>> p.parse_args(["export-espdl", "--model", "m.keras", "--out", "o"]).feature_type
        's8'
    """
    parser = subparsers.add_parser(
        "export-espdl",
        help="export for ESP-DL: a v1 config.json + coefficient .npy set, or a v3 .espdl file",
        description="Export a calibrated model for ESP-DL, exponents from the calibration "
        "sidecar (<record>.calib.json) and the record. --format v1 (default): what ESP-DL "
        "v1.1's convert.py reads, one config.json entry per Conv2D/DepthwiseConv2D/Dense "
        "(BatchNorm folded, ReLU/LeakyReLU/PReLU fused) plus coefficient .npy files (and, with "
        "--cpp, the C++ files). --format espdl: one ESP-DL v3 .espdl file (the v3 runtime's "
        "operators, e.g. softmax, sigmoid, ReLU6 and unfolded BatchNorm run on the chip).",
    )
    parser.add_argument("--record", help="AMCT record file (its sidecar is read if present)")
    parser.add_argument("--model", help="Keras model file (.keras / .h5)")
    add_unsafe_load(parser)
    add_mindspore_net(parser, "NCHW; the coefficients are written NHWC, the chip's layout")
    parser.add_argument(
        "--input-shape", help="with --mindspore: the network's input shape, e.g. 1,3,32,32"
    )
    parser.add_argument(
        "--set",
        dest="input_set",
        metavar="DIR",
        help="an existing convert.py input directory (config.json + npy): print its preview "
        "(--preview) or write its C++ files (--cpp NAME, into --out or DIR)",
    )
    parser.add_argument(
        "--out",
        "-o",
        help="output directory (created; must not exist or be empty); --format espdl: the "
        ".espdl file",
    )
    parser.add_argument(
        "--format",
        choices=("v1", "espdl"),
        default="v1",
        help="v1: ESP-DL v1 convert.py input (default); espdl: one ESP-DL v3 .espdl file",
    )
    parser.add_argument(
        "--test-input",
        metavar="X.npy",
        help="--format espdl: float input whose first sample is embedded as the test input "
        "(default: a seeded input inside the calibrated range)",
    )
    parser.add_argument("--stats", help="calibration sidecar (default: <record>.calib.json)")
    parser.add_argument(
        "--feature-type",
        choices=("s8", "s16", "auto"),
        default="s8",
        help="int8 or int16 (default s8); auto (--format espdl, with --data): int8 with the "
        "fewest int16 layers that keep the simulated chip within --max-drop of the float "
        "model on --data (mixed precision; the choice is printed)",
    )
    parser.add_argument(
        "--max-drop",
        type=float,
        default=None,
        metavar="FRACTION",
        help="--feature-type auto: the largest drop allowed on --data (default 0.01): for a "
        "classifier the share of samples whose arg-max differs from the float model's, else "
        "the output RMS error relative to the float output range",
    )
    parser.add_argument(
        "--granularity",
        choices=("per-tensor", "per-channel"),
        default=None,
        help="filter exponents: convert.py -q 0 / -q 1 (per-channel: s8 only); default "
        "per-tensor, with --preview --set the granularity in the set's export.json",
    )
    parser.add_argument(
        "--target",
        choices=("esp32", "esp32s2", "esp32c3", "esp32s3", "esp32p4", "c"),
        default=None,
        help="chip: element order in the preview and the convert.py command in export.json "
        "(default: esp32); --format espdl: esp32s3 (default), esp32p4 or c",
    )
    parser.add_argument(
        "--data",
        metavar="X.npy",
        help="calibration inputs (.npy, or .npz with x; as the model takes them: NHWC for "
        "Keras, NCHW for --mindspore): the exponents (and bias corrections; --format espdl on "
        "esp32p4 also per-channel filter exponents) are searched on them, the chip simulator "
        "as judge, on the first min(512, max(32, 2**21 // values per sample)) samples for "
        "--format v1 (at most 512 and about 2**21 input values: a 96x96x3 input uses the first "
        "75), min(512, max(32, 2**18 // values per sample)) for --format espdl (a 48x48x3 "
        "input uses the first 37, 96x96x3 the first 32)",
    )
    parser.add_argument(
        "--exponents",
        choices=("max", "search"),
        default=None,
        help="max: each exponent covers its calibrated range (the range rule); search: the "
        "exponents and bias corrections (--format espdl on esp32p4: and per-channel filters) "
        "with the smallest chip output error on --data, never more than the range rule's "
        "(default: search with --data, else max)",
    )
    parser.add_argument(
        "--skip-unsupported", action="store_true", help="leave out layers ESP-DL v1 cannot take"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    parser.add_argument(
        "--cpp",
        metavar="NAME",
        help="also write convert.py's NAME.cpp/NAME.hpp, the model class and app_main.cpp",
    )
    parser.add_argument(
        "--preview",
        action="store_true",
        help="print per layer the exponents and the share of saturated values; write nothing",
    )
    parser.set_defaults(func=run)


def _run_set(args: argparse.Namespace) -> int:
    """``--set DIR``: preview an existing convert.py input set, or write its C++ files."""
    if args.format == "espdl" or args.target in ("esp32p4", "c"):
        flag = "--format espdl" if args.format == "espdl" else f"--target {args.target}"
        raise ExportError(f"--set reads an ESP-DL v1 set: {flag} does not apply")
    args.target = args.target or "esp32"
    flags = {"--model": args.model, "--mindspore": args.mindspore, "--record": args.record}
    flags["--data"] = args.data
    given = [flag for flag, value in {**flags, "--stats": args.stats}.items() if value]
    if given:
        raise ExportError(
            f"--set DIR reads an existing set; {', '.join(given)} would be ignored: leave "
            f"{'it' if len(given) == 1 else 'them'} out (or export the model without --set)"
        )
    if args.preview and args.cpp:
        raise ExportError("--preview writes nothing: drop it to write the --cpp files of --set")
    if not args.preview and not args.cpp:
        raise ExportError(
            "--set reads an existing set: use it with --preview (print the exponents) or "
            "--cpp NAME (write convert.py's NAME.cpp/.hpp)"
        )
    granularity = _granularity(args)
    from amct_bridge.commands.espdl_convert import check_set_shapes

    check_set_shapes(args.input_set)  # against export.json's chip graph, naming the file
    if args.cpp:
        return _set_cpp(args, granularity)
    from amct_bridge.espdl.v1.preview import load_set, preview_set
    from amct_bridge.espdl.v1.report import format_set_preview

    config, arrays = load_set(args.input_set)
    per_channel = granularity == "per-channel"
    previews = preview_set(config, arrays, target=args.target, per_channel=per_channel)
    print(format_set_preview(previews))
    return 0


def _set_cpp(args: argparse.Namespace, granularity: str) -> int:
    """convert.py's NAME.cpp/.hpp of the set (any convert.py input directory), plus the model
    class and app_main.cpp when the set is an export of this package with a chip graph."""
    from amct_bridge.errors import AmctBridgeError
    from amct_bridge.espdl.v1.cpp_app import set_model_files
    from amct_bridge.espdl.v1.cpp_coefficients import set_files, write_files

    if args.cpp == "app_main":
        raise ExportError("--cpp app_main would overwrite app_main.cpp: choose another name")
    per_channel = granularity == "per-channel"
    files = set_files(args.input_set, args.cpp, target=args.target, per_channel=per_channel)
    notes: list[str] = []
    if (Path(args.input_set) / "export.json").is_file():
        try:
            more, notes = set_model_files(args.input_set, args.cpp, per_channel=per_channel)
            files.update(more)
        except AmctBridgeError as err:  # the coefficient files are still what convert.py writes
            notes = [f"C++ model class not written: {err}"]
    else:
        notes = [
            f"C++ model class not written: {args.input_set} has no export.json (a set made by "
            "hand or by another tool); write it with `amct-bridge espdl-convert --model-class "
            "--graph FILE`"
        ]
    out = Path(args.out or args.input_set)
    existing = [name for name in files if (out / name).exists()]
    if existing and not args.overwrite:
        raise ExportError(
            f"{out}: {', '.join(existing)} already exist: pass --overwrite to replace them"
        )
    for path in write_files(out, files):
        print(f"wrote {path}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _granularity(args: argparse.Namespace) -> str:
    """--granularity, else the set's own (its export.json), else per-tensor; warns on a
    mismatch with the export."""
    exported = _set_granularity(Path(args.input_set) / "export.json")
    granularity = args.granularity or exported or "per-tensor"
    if exported and granularity != exported:
        print(
            f"warning: previewing {granularity} but {args.input_set}/export.json says the set "
            f"was exported {exported}",
            file=sys.stderr,
        )
    return granularity


def _set_granularity(path: Path) -> str | None:
    """The granularity an exported set was made with (its export.json), None if unknown."""
    if not path.is_file():
        return None  # a set made by hand or by another tool
    try:
        value = json.loads(path.read_text()).get("granularity")
    except (OSError, ValueError, AttributeError) as err:
        raise ExportError(f"{path}: cannot read the export report: {err}") from None
    return value if value in ("per-tensor", "per-channel") else None


def _exporter(args: argparse.Namespace):
    """``(export entry, model)`` of the framework adapter ``args`` name.

    The core exporter takes framework-free layers only; each adapter has its own entry
    ``export_espdl(model, record, out_dir, **options)``. Keras: ``--model``; MindSpore:
    ``--mindspore module:factory [--ckpt F] --input-shape 1,3,H,W``.
    """
    if args.mindspore:
        if args.model:
            raise ExportError("give either --model (Keras) or --mindspore, not both")
        if not args.input_shape:
            raise ExportError("--mindspore needs --input-shape (e.g. 1,3,32,32) for its graph")
        from amct_bridge.commands.mindspore_net import load_mindspore_net, parse_input_shape
        from amct_bridge.mindspore import export_espdl as ms_export

        shape = parse_input_shape(args.input_shape)
        net = load_mindspore_net(args.mindspore, args.ckpt)
        return functools.partial(ms_export, sample_input=shape), net
    if args.ckpt or args.input_shape:
        raise ExportError("--ckpt and --input-shape go with --mindspore")
    from amct_bridge.keras import export_espdl

    return export_espdl, load_keras_model(args.model, unsafe=args.unsafe_load)


def _run_v3(args: argparse.Namespace) -> int:
    """``--format espdl``: write one ESP-DL v3 .espdl file."""
    import numpy as np

    v1_only = {"--preview": args.preview, "--cpp": args.cpp, "--granularity": args.granularity}
    given = [flag for flag, value in v1_only.items() if value]
    if given:  # per-channel filters in v3: searched with --data (esp32p4), not --granularity
        raise ExportError(f"{given[0]} is for --format v1")
    target = args.target or "esp32s3"
    if target not in ("esp32s3", "esp32p4", "c"):
        raise ExportError(f"--target {target} is an ESP-DL v1 chip: use esp32s3, esp32p4 or c")
    test_input = None
    if args.test_input:
        try:
            test_input = np.load(args.test_input, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ExportError(f"{args.test_input}: cannot read the test input: {err}") from None
    if args.feature_type == "auto" and args.data is None:
        raise ExportError(
            "--feature-type auto picks the int16 layers by running the simulated chip on "
            "calibration data: add --data X.npy (or choose --feature-type s8 or s16)"
        )
    if args.max_drop is not None and args.feature_type != "auto":
        raise ExportError("--max-drop goes with --feature-type auto")
    mixed = {} if args.max_drop is None else {"max_drop": args.max_drop}
    data = _search_data(args)
    export_espdl, model = _exporter(args)
    _check_data(args, model, data)
    result = export_espdl(
        model,
        args.record,
        args.out,
        format="espdl",
        stats=args.stats,
        feature_type=args.feature_type,
        target=target,
        test_input=test_input,
        skip_unsupported=args.skip_unsupported,
        overwrite=args.overwrite,
        calibration_data=data,
        exponents=args.exponents,
        **mixed,
    )
    said = result.mixed.summary() if result.mixed is not None else None
    for warning in result.warnings:
        if warning != said:
            print(f"warning: {warning}", file=sys.stderr)
    print(f"wrote {result.path} ({target}, {args.feature_type}, {len(result.model.nodes)} nodes)")
    if said is not None:
        print(said)
        if result.layer_bits:  # the chosen layers and the pools / activations after them
            print(f"int16 nodes: {', '.join(result.layer_bits)}")
    for name, head in result.fused.items():
        print(f"fused: {name} into {head}")
    for problem in result.skipped:
        print(f"skipped: {problem}")
    return 0


def _search_data(args: argparse.Namespace):
    """``--data`` (None without it); refuses ``--exponents search`` without it."""
    if args.exponents == "search" and args.data is None:
        raise ExportError("--exponents search scores candidates on calibration data: add --data")
    return None if args.data is None else _calibration_inputs(args.data)


def _check_data(args: argparse.Namespace, model, data) -> None:
    """A Keras model's ``--data`` must fit its inputs: refused naming the file, before
    anything is written."""
    if data is None or not args.model:
        return
    from amct_bridge.errors import CalibrationError
    from amct_bridge.keras.calibrate import check_data_shapes

    try:
        check_data_shapes(model, data)
    except CalibrationError as err:
        raise ExportError(f"{args.data}: {str(err).replace('data', 'array', 1)}") from None


def _calibration_inputs(path: str):
    """``--data``: an array (.npy) or the ``x`` of an .npz, as float32."""
    import numpy as np

    from amct_bridge.commands.common import load_npy

    loaded = load_npy(path, "calibration inputs")
    if not isinstance(loaded, np.ndarray):
        if "x" not in loaded:
            raise ExportError(f"{path}: expected an .npy array or an .npz with an array 'x'")
        loaded = loaded["x"]
    if loaded.ndim < 2 or not np.issubdtype(loaded.dtype, np.number):
        raise ExportError(f"{path}: expected numeric inputs with a batch axis, got {loaded.shape}")
    return loaded.astype(np.float32)


def run(args: argparse.Namespace) -> int:
    """Run the export; returns the exit code."""
    from amct_bridge.espdl.refusals import chip_cannot_run, grouped_lines
    from amct_bridge.espdl.v1.report import format_preview

    if args.input_set is not None:
        return _run_set(args)
    if args.model is None and args.mindspore is None:
        raise ExportError(
            "--model (Keras) or --mindspore MODULE:FACTORY is required (or --preview --set DIR "
            "for an existing set)"
        )
    if args.preview and args.cpp:
        raise ExportError("--preview writes nothing: drop it to write the --cpp files")
    if not args.preview and not args.out:
        raise ExportError("--out is required (or use --preview to only print the exponents)")
    if args.stats is None and args.record is None:
        raise ExportError("give --record and/or --stats: the exponents come from them")
    if args.record is not None and not Path(args.record).is_file():
        raise ExportError(f"{args.record}: record file not found")
    if args.format == "espdl":
        return _run_v3(args)
    if args.feature_type == "auto" or args.max_drop is not None:
        flag = "--feature-type auto" if args.feature_type == "auto" else "--max-drop"
        raise ExportError(f"{flag} (mixed int8 / int16 layers) is for --format espdl")
    if args.target in ("esp32p4", "c"):
        raise ExportError(f"--target {args.target} is an ESP-DL v3 target: add --format espdl")
    args.target = args.target or "esp32"
    data = _search_data(args)
    export_espdl, model = _exporter(args)
    _check_data(args, model, data)
    result = export_espdl(
        model,
        args.record,
        None if args.preview else args.out,
        stats=args.stats,
        feature_type=args.feature_type,
        granularity=args.granularity or "per-tensor",
        target=args.target,
        skip_unsupported=args.skip_unsupported,
        overwrite=args.overwrite,
        cpp=args.cpp,
        calibration_data=data,
        exponents=args.exponents,
    )
    # in the preview too (e.g. biases that round to 0); one line for a warning many layers get
    print_warnings(result.warnings, "export.json" if not args.preview else "")
    if args.preview:
        print(format_preview(result))
    else:
        print(f"wrote {len(result.layers)} layers to {result.out_dir}")
        for item in result.host:  # a final softmax / sigmoid (export.json "host")
            print(f"left to the host: {item}")
        for line in grouped_lines(result.skipped, "skipped: "):  # an explanation once
            print(line)
    if result.graph is None:  # said last: the run looked fine up to here
        print(f"warning: {chip_cannot_run(result.graph_error)}", file=sys.stderr)
    return 0
