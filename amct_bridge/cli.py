"""The ``amct-bridge`` command (also ``python -m amct_bridge``).

Each subcommand lives in ``amct_bridge/commands/<name>.py``; frameworks are imported only by the
commands that need them, so ``amct-bridge inspect`` starts in a fraction of a second.

No input makes the command print a Python traceback: our own errors (``AmctBridgeError``) are one
``amct-bridge COMMAND: error: ...`` message and exit code 2; anything else is a bug, reported as
one ``internal error`` line and exit code 70 (``EX_SOFTWARE``); Ctrl-C exits with 130. ``--debug``
(before or after the command) adds the traceback (docs/errors.md).

Example:
    >>> main(["validate", "--help"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback

from amct_bridge import __version__
from amct_bridge.commands import COMMAND_MODULES
from amct_bridge.errors import AmctBridgeError

#: Exit codes: 2 usage or input error (argparse's own too), 70 internal error (a bug), 130 Ctrl-C.
EXIT_INPUT_ERROR = 2
EXIT_INTERNAL_ERROR = 70
EXIT_INTERRUPTED = 130

VERBOSE_HELP = "log progress details and every layer of a warning repeated for many layers"
DEBUG_HELP = "show the Python traceback of an error (for bug reports)"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand.

    Example:
        >>> "inspect" in build_parser().format_help()
        True
    """
    parser = argparse.ArgumentParser(
        prog="amct-bridge",
        description="Calibrate Keras models and MindSpore networks into Huawei AMCT record "
        "files, check and convert records, find pruning groups, and export for ESP-DL: "
        "ESP-DL v1 (config.json + coefficient .npy set, C++ files) or ESP-DL v3 (one .espdl "
        "file, --format espdl), each with its bit-exact chip simulator (espdl-eval).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:  # a real import error inside the command must surface
                raise
            continue
        module.register(subparsers)
    for sub in subparsers.choices.values():  # `amct-bridge calibrate ... --debug` works too
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
        sub.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 problems found, 2 usage or input error,
    70 internal error, 130 interrupted). Never lets a traceback out unless ``--debug``.

    Example:
        >>> main(["validate", "/nonexistent.txt"])  # doctest: +SKIP
        2
    """
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)  # before parsing succeeds
    command = "amct-bridge"
    try:
        args = build_parser().parse_args(argv)
        debug, command = args.debug, f"amct-bridge {args.command}"
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(levelname)s: %(message)s",
        )
        # -v: our DEBUG lines too (every layer of a warning folded into one line)
        logging.getLogger("amct_bridge").setLevel(logging.DEBUG if args.verbose else logging.NOTSET)
        if not args.verbose:
            # MindSpore's C++ log (a failed compile's stack and source dump) comes before our
            # one-line summary; GLOG_v must be set before MindSpore's import: behind -v
            os.environ.setdefault("GLOG_v", "4")
        if getattr(args, "model", None):  # commands given a Keras model import TensorFlow
            from amct_bridge.commands.common import quiet_tensorflow

            quiet_tensorflow()  # log levels set before TF's import; its start-up noise filtered
        return int(args.func(args) or 0)
    except AmctBridgeError as err:
        _traceback(debug)
        print(f"{command}: error: {error_text(str(err))}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except BrokenPipeError:  # `amct-bridge inspect big.txt | head` is not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        _traceback(debug)
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:  # a bug: one line, the traceback on request
        _traceback(debug)
        print(f"{command}: {internal_error_line(err, debug)}", file=sys.stderr)
        return EXIT_INTERNAL_ERROR


def internal_error_line(err: BaseException, debug: bool = False) -> str:
    """The one line an unexpected exception becomes (no traceback, no newline).

    Example:
        >>> internal_error_line(ValueError("bad\\nthing"))
        'internal error: ValueError: bad thing (rerun with --debug for the traceback)'
    """
    text = error_text(" ".join(str(err).split())) or "(no message)"
    hint = "" if debug else " (rerun with --debug for the traceback)"
    return f"internal error: {type(err).__name__}: {text}{hint}"


#: Longest error message printed: a name from a model or a file (a 5,000-character layer name,
#: a 1 MB one-line record) must not make the error longer than the terminal can show.
MAX_ERROR_CHARS = 2000


def error_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """An error message as printed: control characters (a NUL in a layer name) escaped, and
    cut to ``limit`` characters with how much was left out.

    Example:
        >>> error_text("layer 'a\\x00b' refused")
        "layer 'a\\\\x00b' refused"
        >>> error_text("x" * 30, limit=10)
        'xxxxxxxxxx... (20 more characters)'
    """
    clean = "".join(
        c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode("ascii")
        for c in text
    )
    if len(clean) <= limit:
        return clean
    return f"{clean[:limit]}... ({len(clean) - limit} more characters)"


def _traceback(debug: bool) -> None:
    if debug:
        traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
