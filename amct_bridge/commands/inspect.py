"""``amct-bridge inspect FILE``: a readable table of a record and its pruning groups."""

from __future__ import annotations

import argparse

from amct_bridge.records import load
from amct_bridge.records.flavors import FLAVORS
from amct_bridge.records.summary import (
    flavor_phrase,
    layer_table,
    prune_summary,
    written_flavor,
)


def register(subparsers) -> None:
    """Add the ``inspect`` subcommand."""
    parser = subparsers.add_parser(
        "inspect",
        help="show a record as a table (factors per layer, pruning groups)",
        description="Print one row per layer (scale_d, offset_d, number of weight channels, "
        "scale_w range, act/wts/dst types, extra fields such as skip_fusion, shift_bit, "
        "tensor_balance_factor, prune links) and a summary of the pruning groups.",
    )
    parser.add_argument("file", help="record file (text or binary)")
    parser.add_argument("--flavor", choices=sorted(FLAVORS), help="parse as this flavor")
    parser.add_argument(
        "--keep-last",
        action="store_true",
        help="accept duplicate layer keys, keeping the last (as AMCT does)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the table."""
    record = load(args.file, args.flavor, on_duplicate="keep_last" if args.keep_last else "error")
    written = args.flavor or written_flavor(args.file)  # the sidecar says how it was written
    print(f"{args.file}: {flavor_phrase(record, written)}, {len(record.layers)} layers")
    if record.layers:
        print(layer_table(record))
    if record.prune_records:
        print(prune_summary(record))
    return 0
