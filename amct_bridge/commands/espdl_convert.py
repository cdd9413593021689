"""``amct-bridge espdl-convert``: a drop-in replacement for ESP-DL v1.1's ``convert.py``.

Same flags as the tool (``-t/--target_chip -i/--input_root [-j/--json_file_name] -n/--name
-o/--output_root [-q/--quant 0|1]``), same ``NAME.cpp`` / ``NAME.hpp`` text, byte for byte, on
any Python this package supports (the tool's binary needs CPython 3.6-3.9 and exits 0 with a
message elsewhere). Unlike the tool, it refuses names that are not C identifiers, NaN/integer
arrays and missing files with an error and exit code 2.

``--model-class`` also writes the model class and ``app_main.cpp`` from the chip graph of an
amct-bridge export (``export.json``) or of ``--graph FILE`` (docs/espdl-export.md).

Example:
    amct-bridge espdl-convert -t esp32s3 -i model_espdl -n model_coefficient -o main/model -q 0
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.spec import TARGETS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``espdl-convert`` subcommand.

    Example:
        >>> p = argparse.ArgumentParser(); register(p.add_subparsers())
        >>> a = p.parse_args(["espdl-convert", "-t", "esp32s3", "-i", "d", "-n", "m", "-o", "o"])
        >>> a.target_chip, a.quant, a.json_file_name
        ('esp32s3', 0, 'config.json')
    """
    parser = subparsers.add_parser(
        "espdl-convert",
        help="write ESP-DL v1 coefficient NAME.cpp/.hpp from config.json + npy (like convert.py)",
        description="Quantize a convert.py input directory (config.json + npy) into the C++ "
        "coefficient files ESP-DL v1.1's tools/convert_tool/convert.py writes, byte for byte.",
    )
    parser.add_argument("-t", "--target_chip", required=True, choices=TARGETS, help="chip")
    parser.add_argument(
        "-i", "--input_root", required=True, help="directory of config.json and the npy files"
    )
    parser.add_argument(
        "-j", "--json_file_name", default="config.json", help="config file name in input_root"
    )
    parser.add_argument("-n", "--name", required=True, help="name of the output files/namespace")
    parser.add_argument("-o", "--output_root", required=True, help="directory of the outputs")
    parser.add_argument(
        "-q",
        "--quant",
        type=int,
        choices=(0, 1),
        default=0,
        help="0 per-tensor (default), 1 per-channel (s8 only)",
    )
    parser.add_argument(
        "--model-class",
        action="store_true",
        help="also write <model>_model.hpp and app_main.cpp from the chip graph in "
        "input_root/export.json (an amct-bridge export) or --graph",
    )
    parser.add_argument(
        "--graph", metavar="FILE", help="chip graph JSON for --model-class (any convert.py set)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Convert; returns the exit code. Everything is computed before anything is written."""
    from amct_bridge.espdl.v1.cpp_app import set_model_files
    from amct_bridge.espdl.v1.cpp_coefficients import set_files, write_files

    if args.graph is not None and not args.model_class:
        raise ExportError("--graph is read with --model-class")
    if args.model_class and args.name == "app_main":
        raise ExportError("-n app_main would overwrite app_main.cpp: choose another name")
    options = {"per_channel": args.quant == 1, "config_name": args.json_file_name}
    files = set_files(args.input_root, args.name, target=args.target_chip, **options)
    # convert.py checks no shapes: a bias or filter of another layer converts silently
    check_set_shapes(args.input_root, args.graph, config_name=args.json_file_name)
    notes: list[str] = []
    if args.model_class:
        more, notes = set_model_files(args.input_root, args.name, graph=args.graph, **options)
        files.update(more)
    for path in write_files(args.output_root, files):
        print(f"wrote {path}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


#: The chip simulator's words for coefficients that do not fit their layer's input.
_SHAPE_ERROR = re.compile(
    r"^chip layer '([^']+)' \(\w+\): (input has \d+ channels|input .* does not give)"
)


def check_set_shapes(
    directory: str | Path, graph: str | Path | None = None, config_name: str = "config.json"
) -> None:
    """Refuse a set whose coefficient arrays do not fit together, naming the file: convert.py
    converts any array shape, and the runtime reads past the end of a short bias.

    Every bias (and PReLU/LeakyReLU alpha of more than one value) must have one value per
    output channel of its filter. With a chip graph (``directory``'s export.json, or
    ``graph``), each filter must also take its input's channels: they come from the graph, by
    one zero sample through the chip simulator (its per-layer shape checks). A set without a
    graph has no input widths to check against; the last layer's output width is in no file.

    Example:
        >>> check_set_shapes("/nonexistent")  # not a set: nothing to check (its reader says why)
    """
    import numpy as np

    from amct_bridge.espdl.v1.chip import simulate_chip
    from amct_bridge.espdl.v1.network import load_network
    from amct_bridge.espdl.v1.preview import load_set

    directory = Path(directory)
    if not (directory / config_name).is_file():
        return  # not a convert set (an .espdl file, a missing directory): its reader says so
    config, arrays = load_set(directory, config_name)
    for layer, entry in config.items():
        _check_lengths(directory, layer, entry, arrays)
    if graph is None and not (directory / "export.json").is_file():
        return
    try:
        net = load_network(directory, graph)
    except ExportError:
        return  # no usable graph: the model class (or espdl-eval) says why, where it needs one
    if net.input_shape is None:
        return
    zeros = np.zeros((1, *net.input_shape), np.float32)
    try:
        simulate_chip(net, zeros, input_exponent=net.input_exponent or 0)
    except ExportError as err:
        found = _SHAPE_ERROR.match(str(err))
        if found is None:
            return  # not a shape problem (e.g. Concat exponents): espdl-eval reports those
        layer = net.layer(found.group(1))
        path = _filter_path(directory, layer.coefficients or layer.name)
        where = str(graph) if graph is not None else str(directory / "export.json")
        source = [net.layer(s) for s in layer.inputs if s in {x.name for x in net.layers}]
        feeds = [x for x in source if x.coefficients]
        before = "".join(
            f"; its input comes from {x.describe()}, whose "
            f"{_filter_path(directory, x.coefficients).name} has shape "
            f"{_shape(_filter_path(directory, x.coefficients))}"
            for x in feeds
        )
        raise ExportError(
            f"{path}: filter of shape {_shape(path)} does not fit the chip graph ({where}): "
            f"{err}{before}; was a file replaced, or the set mixed with another export?"
        ) from None


def _filter_path(directory: Path, name: str) -> Path:
    files = [directory / f"{name}_{part}.npy" for part in ("filter", "kernel")]
    return next((f for f in files if f.is_file()), files[0])


def _shape(path: Path) -> tuple:
    import numpy as np

    return np.load(path, mmap_mode="r", allow_pickle=False).shape  # read by load_set before


def _check_lengths(directory: Path, layer: str, entry: object, arrays: dict) -> None:
    """A bias / alpha with another count of values than its filter's output channels."""
    from amct_bridge.espdl.v1 import spec

    operation = entry.get("operation") if isinstance(entry, dict) else None
    w = arrays.get(f"{layer}_filter", arrays.get(f"{layer}_kernel"))
    if operation not in spec.OPERATIONS or w is None:
        return  # the preview names what is missing
    given = w.shape
    if operation == "fully_connected" and w.ndim == 2:
        w = w.reshape((1, 1, *w.shape))
    if w.ndim != 4:
        return
    channels = int(w.shape[spec.OPERATIONS[operation].channel_axis])
    for part in ("bias", "activation"):
        values = arrays.get(f"{layer}_{part}")
        if values is None or values.size == channels or (part == "activation" and values.size == 1):
            continue
        path = directory / f"{layer}_{part}.npy"
        raise ExportError(
            f"{path}: {values.size} values of shape {values.shape}, but "
            f"{_filter_path(directory, layer).name} of shape {given} has {channels} output "
            f"channels: one {part if part == 'bias' else 'alpha'} value per channel"
        )
