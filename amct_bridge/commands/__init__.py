"""CLI subcommands: one module per command, each exposing ``register(subparsers)``.

Example:
    >>> from amct_bridge.commands import COMMAND_MODULES
    >>> "amct_bridge.commands.inspect" in COMMAND_MODULES
    True
"""

#: Modules whose ``register`` adds a subcommand, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "amct_bridge.commands.inspect",
    "amct_bridge.commands.validate",
    "amct_bridge.commands.convert_record",
    "amct_bridge.commands.calibrate",
    "amct_bridge.commands.prune_groups",
    "amct_bridge.commands.export_espdl",
    "amct_bridge.commands.espdl_convert",
    "amct_bridge.commands.espdl_eval",
    "amct_bridge.commands.espdl_run",
    "amct_bridge.commands.report",
)
