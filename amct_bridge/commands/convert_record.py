"""``amct-bridge convert-record IN --to tf|mindspore -o OUT``: change a record's flavor."""

from __future__ import annotations

import argparse

from amct_bridge.records import convert, load
from amct_bridge.records.atomic import atomic_write_files, check_writable
from amct_bridge.records.calibration import load_stats, sidecar_path
from amct_bridge.records.flavors import FLAVORS
from amct_bridge.records.io import record_bytes


def register(subparsers) -> None:
    """Add the ``convert-record`` subcommand."""
    parser = subparsers.add_parser(
        "convert-record",
        help="convert a record to another flavor, listing what is dropped",
        description="Convert a record between flavors: 'inner' (AMCT-TF calibration/QAT/pruning), "
        "'tf' (what AMCT-TF convert_model reads) and 'mindspore'. Fields the target cannot hold "
        "(prune records, tensor_balance_factor, cluster, dst_type, shift_bit for tf; also "
        "act_type/wts_type for mindspore) are dropped and each is reported. The calibration "
        "sidecar IN.calib.json, if any, is copied to OUT.calib.json (the layer keys are the "
        "same; the flavor it names becomes the target's), so an ESP-DL export of OUT finds "
        "its ranges.",
    )
    parser.add_argument("input", help="record file to read")
    parser.add_argument("--to", required=True, choices=sorted(FLAVORS), help="target flavor")
    parser.add_argument("-o", "--output", required=True, help="record file to write (atomically)")
    parser.add_argument("--binary", action="store_true", help="write binary protobuf, not text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Convert and write; report dropped fields."""
    check_writable(args.output)  # a directory or a missing folder: a message, not a traceback
    record = load(args.input)
    converted, dropped = convert(record, args.to)
    files = {args.output: record_bytes(converted, binary=args.binary)}
    sidecar, out_sidecar = sidecar_path(args.input), sidecar_path(args.output)
    if sidecar.is_file() and sidecar.resolve() != out_sidecar.resolve():
        stats = load_stats(sidecar)  # a damaged sidecar: its own message, nothing written
        files[out_sidecar] = sidecar.read_bytes()  # same layer keys: the ranges still apply
        if stats.flavor is not None:  # it names the flavor written: now the converted one
            stats.flavor = args.to
            files[out_sidecar] = stats.to_json().encode()
    atomic_write_files(files)  # the record and its sidecar: all old or all new
    for line in dropped:
        print(f"dropped: {line}")
    print(
        f"wrote {args.output} ({args.to!r}, {len(converted.layers)} layers, "
        f"{len(dropped)} dropped item(s))" + (f" and {out_sidecar}" if len(files) > 1 else "")
    )
    return 0
