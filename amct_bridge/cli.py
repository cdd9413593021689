"""The ``amct-bridge`` command (also ``python -m amct_bridge``).

Each subcommand lives in ``amct_bridge/commands/<name>.py``; frameworks are imported only by the
commands that need them, so ``amct-bridge inspect`` starts in a fraction of a second.

Example:
    >>> main(["validate", "--help"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from amct_bridge import __version__
from amct_bridge.commands import COMMAND_MODULES
from amct_bridge.errors import AmctBridgeError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand.

    Example:
        >>> "inspect" in build_parser().format_help()
        True
    """
    parser = argparse.ArgumentParser(
        prog="amct-bridge",
        description="Calibrate Keras models into Huawei AMCT record files, check and convert "
        "records, find pruning groups, and export ESP-DL v1 coefficients.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:  # a real import error inside the command must surface
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 problems found, 2 usage or input error).

    Example:
        >>> main(["validate", "/nonexistent.txt"])  # doctest: +SKIP
        2
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s"
    )
    if getattr(args, "model", None):  # commands given a Keras model import TensorFlow
        from amct_bridge.commands.common import quiet_tensorflow

        quiet_tensorflow()  # log levels set before TF's import; its start-up noise filtered
    try:
        return int(args.func(args) or 0)
    except AmctBridgeError as err:
        print(f"amct-bridge {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `amct-bridge inspect big.txt | head` is not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
