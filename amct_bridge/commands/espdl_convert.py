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
import sys

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
    notes: list[str] = []
    if args.model_class:
        more, notes = set_model_files(args.input_root, args.name, graph=args.graph, **options)
        files.update(more)
    for path in write_files(args.output_root, files):
        print(f"wrote {path}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0
