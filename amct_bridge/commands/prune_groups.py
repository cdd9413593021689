"""``amct-bridge prune-groups``: channel-pruning groups (and 2:4 layers) of a Keras model.

Example:
    amct-bridge prune-groups model.keras                       # table of groups and refusals
    amct-bridge prune-groups model.keras --json                # the same as JSON
    amct-bridge prune-groups model.keras --selective --record prune.txt --with-mask
    amct-bridge prune-groups --mindspore my_nets:resnet --input-shape 1,3,224,224 [--ckpt F]
"""

from __future__ import annotations

import argparse
import json

from amct_bridge.commands.common import add_mindspore_net, add_unsafe_load, load_keras_model
from amct_bridge.errors import GraphError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``prune-groups`` subcommand.

    Example:
        >>> p = argparse.ArgumentParser(); register(p.add_subparsers())
        >>> p.parse_args(["prune-groups", "m.keras", "--json"]).json
        True
    """
    parser = subparsers.add_parser(
        "prune-groups",
        help="list channel-pruning groups and refused layers of a Keras model or MindSpore net",
        description="Find the groups of layers whose channels must be pruned together "
        "(producers and every consumer with its channel range), each refused layer with a "
        "reason code, and optionally the layers eligible for 2:4 selective pruning.",
    )
    parser.add_argument("model", nargs="?", help="Keras model file (.keras / .h5)")
    add_mindspore_net(parser)
    parser.add_argument(
        "--input-shape", help="with --mindspore: input shape for the MindIR export, e.g. 1,3,16,16"
    )
    parser.add_argument("--record", help="write the PruneRecords to this AMCT record file")
    parser.add_argument(
        "--selective", action="store_true", help="add 2:4 selective pruning (mask_shape) records"
    )
    parser.add_argument(
        "--with-mask",
        action="store_true",
        help="with --selective: also write selective_mask, the 2:4 mask of the current weights",
    )
    parser.add_argument("--no-channel", action="store_true", help="leave out channel groups")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_unsafe_load(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the command; returns the exit code."""
    if args.with_mask and not args.selective:
        raise GraphError("--with-mask needs --selective")
    if args.record:
        from amct_bridge.records.atomic import check_writable

        check_writable(args.record)  # before the model loads, not after
    if args.mindspore:
        return _run_mindspore(args)
    if not args.model:
        raise GraphError("give a Keras model file or --mindspore module:factory")
    from amct_bridge.keras.graph import extract_graph
    from amct_bridge.keras.prune import prune_record, selective_masks

    model = load_keras_model(args.model, unsafe=args.unsafe_load)
    graph = extract_graph(model)

    def record(channel: bool, selective: bool, with_mask: bool):
        masks = selective_masks(model, graph) if with_mask else None
        return prune_record(model, channel=channel, selective=selective, masks=masks)

    return _output(args, graph, record)


def _run_mindspore(args: argparse.Namespace) -> int:
    """The same report and record for a MindSpore network (graph through MindIR); imports no
    Keras or TensorFlow."""
    from amct_bridge.commands.mindspore_net import load_mindspore_net, parse_input_shape
    from amct_bridge.mindspore.graph import extract_graph
    from amct_bridge.mindspore.prune import prune_record, selective_masks

    if args.model:
        raise GraphError("give either a Keras model file or --mindspore, not both")
    if not args.input_shape:
        raise GraphError("--mindspore needs --input-shape (e.g. 1,3,16,16) for the MindIR export")
    net = load_mindspore_net(args.mindspore, args.ckpt, weights_matter=False)
    graph = extract_graph(net, parse_input_shape(args.input_shape))

    def record(channel: bool, selective: bool, with_mask: bool):
        masks = selective_masks(net, graph=graph) if with_mask else None
        return prune_record(net, channel=channel, selective=selective, masks=masks, graph=graph)

    return _output(args, graph, record)


def _output(args: argparse.Namespace, graph, record) -> int:
    """Print the groups (table or JSON) and write the prune record if asked."""
    from amct_bridge.graph.groups import Discovery, discover_groups
    from amct_bridge.graph.report import format_table, to_json
    from amct_bridge.graph.selective import selective_candidates
    from amct_bridge.records import save

    discovery = Discovery() if args.no_channel else discover_groups(graph)
    selective = selective_candidates(graph) if args.selective else None
    if args.json:
        print(json.dumps(to_json(discovery, selective), indent=2))
    else:
        print(format_table(discovery, selective))
    if args.record:
        save(record(not args.no_channel, args.selective, args.with_mask), args.record)
    return 0
