"""``amct-bridge validate FILE``: AMCT's record checks, one line per problem."""

from __future__ import annotations

import argparse

from amct_bridge.records import load, validate
from amct_bridge.records.flavors import FLAVORS, a_record
from amct_bridge.records.summary import written_flavor


def register(subparsers) -> None:
    """Add the ``validate`` subcommand."""
    parser = subparsers.add_parser(
        "validate",
        help="check a record file against AMCT's rules",
        description="Check a record file (text or binary) the way AMCT's parser does: offset "
        "ranges per act_type/dst_type, positive finite scales, offset_w all 0, shift_bit, "
        "tensor_balance_factor bounds, prune node attrs, and the fields the flavor allows. "
        "Prints one line per problem as FILE:LINE: layer 'x': field: why. "
        "With the calibration sidecar beside it (FILE.calib.json), also checks that the record "
        "holds every layer the calibration wrote (a record cut short still parses). "
        "Exit status: 0 no problem, 1 problems found, 2 the file cannot be read or parsed.",
    )
    parser.add_argument("file", help="record file (record.txt or binary)")
    parser.add_argument(
        "--flavor",
        choices=sorted(FLAVORS),
        help="check as this flavor (default: the flavor it was written as, which its "
        "calibration sidecar FILE.calib.json names; else detected from the content: the "
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
    # the flavor it was written as (its sidecar says), else the one its text shows
    flavor = args.flavor or written_flavor(args.file) or record.flavor
    problems = [str(p) for p in validate(record, flavor)]
    problems += _sidecar_problems(args.file, record)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{args.file}: {len(problems)} problem(s) as {a_record(flavor)}")
        return 1
    print(
        f"{args.file}: ok ({a_record(flavor)}, {len(record.layers)} layers, "
        f"{len(record.prune_records)} prune records)"
    )
    return 0


def _sidecar_problems(path: str, record) -> list[str]:
    """A record cut at an entry boundary parses and passes every rule: the sidecar beside it
    (``<record>.calib.json``) lists the keys written with it and tells."""
    from amct_bridge.records.calibration import load_stats, record_lacks, sidecar_path

    side = sidecar_path(path)
    if not side.is_file():
        return []
    stats = load_stats(side)  # an unreadable sidecar is an error of its own, with its name
    if stats.record_keys is None:
        return []  # written before the sidecar listed the record's keys
    lacking = [key for key in stats.record_keys if key not in record.layers]
    return [record_lacks(lacking, path, str(side))] if lacking else []
