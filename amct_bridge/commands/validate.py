"""``amct-bridge validate FILE``: AMCT's record checks, one line per problem."""

from __future__ import annotations

import argparse

from amct_bridge.records import load, validate
from amct_bridge.records.flavors import FLAVORS, a_record


def register(subparsers) -> None:
    """Add the ``validate`` subcommand."""
    parser = subparsers.add_parser(
        "validate",
        help="check a record file against AMCT's rules",
        description="Check a record file (text or binary) the way AMCT's parser does: offset "
        "ranges per act_type/dst_type, positive finite scales, offset_w all 0, shift_bit, "
        "tensor_balance_factor bounds, prune node attrs, and the fields the flavor allows. "
        "Prints one line per problem as FILE:LINE: layer 'x': field: why. "
        "Exit status: 0 no problem, 1 problems found, 2 the file cannot be read or parsed.",
    )
    parser.add_argument("file", help="record file (record.txt or binary)")
    parser.add_argument(
        "--flavor",
        choices=sorted(FLAVORS),
        help="check as this flavor (default: detected from the content: the "
        "narrowest of inner > tf > mindspore that holds every field)",
    )
    parser.add_argument(
        "--keep-last",
        action="store_true",
        help="accept duplicate layer keys / fields, keeping the last (as AMCT does)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the problems of ``args.file``; 1 if there are any."""
    # Parse with the widest schema so that fields a flavor lacks are listed as problems
    # (AMCT would stop at the first one with a parse error).
    record = load(args.file, on_duplicate="keep_last" if args.keep_last else "error")
    problems = validate(record, args.flavor)
    for problem in problems:
        print(problem)
    flavor = args.flavor or record.flavor
    if problems:
        print(f"{args.file}: {len(problems)} problem(s) as {a_record(flavor)}")
        return 1
    print(
        f"{args.file}: ok ({a_record(flavor)}, {len(record.layers)} layers, "
        f"{len(record.prune_records)} prune records)"
    )
    return 0
