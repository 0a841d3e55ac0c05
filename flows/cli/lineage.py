"""``mmlake lineage graph`` and ``mmlake lineage explain``: the OpenLineage events kept in the lake."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mmlake.flows.cli.options import add_lake, ingest_settings, positive_int, stream_name

if TYPE_CHECKING:
    from mmlake.flows.cli.options import Commands


def register(commands: Commands) -> None:
    p = commands.add_parser("lineage", help="query the lineage events kept in the lake (<lake>/_lineage/)")
    lineage = p.add_subparsers(dest="lineage_command", required=True, metavar="COMMAND")
    p = lineage.add_parser("graph", help="jobs and datasets upstream and downstream of a dataset")
    p.add_argument("--dataset", required=True, help="a dataset name, or a unique suffix of one (demo/raw)")
    p.add_argument("--depth", type=positive_int, default=2)
    add_lake(p)
    p.set_defaults(func=graph)
    p = lineage.add_parser("explain", help="provenance of one record, from Kafka to drift windows")
    p.add_argument("--stream", required=True, type=stream_name)
    p.add_argument("--record-id", required=True)
    add_lake(p)
    p.set_defaults(func=explain)


def graph(args: argparse.Namespace) -> int:
    from mmlake.lineage.query import format_graph, lineage_graph, load_events

    settings = ingest_settings(args, writes=False)
    events = load_events(settings.lake, dict(settings.storage_options))
    for line in format_graph(lineage_graph(events, args.dataset, args.depth)):
        print(line)
    return 0


def explain(args: argparse.Namespace) -> int:
    from mmlake.lineage.query import explain_record, format_explain

    settings = ingest_settings(args, writes=False)
    info = explain_record(settings.lake, args.stream, args.record_id, dict(settings.storage_options))
    for line in format_explain(info):
        print(line)
    return 0
