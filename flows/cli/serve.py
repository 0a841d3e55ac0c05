"""``mmlake serve`` (the stream's flows on their schedules) and ``mmlake demo``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mmlake.flows.cli.options import (
    add_kafka,
    add_lake,
    check_partitions,
    ingest_settings,
    non_negative_int,
    partitions,
    positive_int,
    read_text,
    stream_name,
    topic_name,
)

if TYPE_CHECKING:
    from mmlake.flows.cli.options import Commands


def register(commands: Commands) -> None:
    p = commands.add_parser("serve", help="serve the stream's flows on their schedules (pipeline, cache warm-up)")
    p.add_argument("--topic", required=True, type=topic_name)
    p.add_argument("--stream", required=True, type=stream_name)
    p.add_argument(
        "--interval",
        type=positive_int,
        default=60,
        metavar="SECONDS",
        help="the pipeline (ingest, then preprocess, then drift) every SECONDS (default 60)",
    )
    p.add_argument(
        "--stages",
        default="ingest,preprocess,drift",
        help="the pipeline's stages (default all three; 'ingest' serves ingest alone)",
    )
    p.add_argument(
        "--partitions",
        type=partitions,
        help="only these Kafka partitions, e.g. 0,2: several serve processes can split a topic",
    )
    p.add_argument(
        "--cache-interval",
        type=non_negative_int,
        default=300,
        metavar="SECONDS",
        help="the cache warm-up every SECONDS (default 300; 0: not served)",
    )
    p.add_argument("--cache-url", help="the SafeCache server whose entries a drift alarm invalidates")
    p.add_argument("--cache-token-file", help="a file holding the bearer token for --cache-url")
    add_lake(p)
    add_kafka(p)
    p.set_defaults(func=serve)

    p = commands.add_parser("demo", help="the whole pipeline on generated data with the embedded broker")
    p.add_argument("--lake", default="./lake")
    p.add_argument("--samples", type=positive_int, default=1600)
    p.set_defaults(func=demo)


def serve(args: argparse.Namespace) -> int:
    from mmlake.flows.deployments import serve_pipeline
    from mmlake.flows.stages import parse_pipeline_stages

    settings = ingest_settings(args, writes=True)
    stages = ",".join(parse_pipeline_stages(args.stages))
    if "ingest" in stages:
        check_partitions(settings, args.topic, args.partitions)
    token = read_text(args.cache_token_file, "token file").strip() if args.cache_token_file else None
    serve_pipeline(
        topic=args.topic,
        stream=args.stream,
        lake=settings.lake,
        bootstrap=settings.kafka_bootstrap,
        partitions=args.partitions,
        stages=stages,
        interval_s=args.interval,
        cache_interval_s=args.cache_interval,
        cache_url=args.cache_url,
        token=token,
    )
    return 0


def demo(args: argparse.Namespace) -> int:
    from mmlake.flows.demo import run_demo

    return run_demo(lake=args.lake, samples=args.samples)
