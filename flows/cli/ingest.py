"""``mmlake ingest``, ``mmlake compact`` and ``mmlake read``: a stream's raw, late and dead-letter tables."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mmlake.errors import MmlakeError
from mmlake.flows.cli.options import (
    add_kafka,
    add_lake,
    cancel_on_signals,
    check_partitions,
    ingest_settings,
    non_negative_float,
    partitions,
    positive_int,
    stream_name,
    topic_name,
)

if TYPE_CHECKING:
    from mmlake.flows.cli.options import Commands


def register(commands: Commands) -> None:
    p = commands.add_parser("ingest", help="ingest a topic into a stream's Delta tables (exactly once)")
    p.add_argument("--topic", required=True, type=topic_name)
    p.add_argument("--stream", required=True, type=stream_name)
    add_lake(p)
    add_kafka(p)
    p.add_argument("--follow", action="store_true", help="keep going until stopped (default: what is there now)")
    p.add_argument("--max-records", type=positive_int, help="stop after reading this many records")
    p.add_argument("--partitions", type=partitions, help="only these partitions, e.g. 0,2 (default: all)")
    p.add_argument("--allowed-lateness", type=non_negative_float, metavar="SECONDS")
    p.add_argument(
        "--kafka-client",
        choices=["kafka-python", "confluent-kafka"],
        help="the client to read with (default: $MMLAKE_KAFKA_CLIENT or confluent-kafka)",
    )
    p.set_defaults(func=ingest)

    p = commands.add_parser("compact", help="z-order a stream's tables by event time, checkpoint and vacuum")
    p.add_argument("--stream", required=True, type=stream_name)
    add_lake(p)
    p.add_argument("--retention-hours", type=non_negative_float, default=168.0)
    p.set_defaults(func=compact)

    p = commands.add_parser("read", help="print a stream's rows in event-time order")
    p.add_argument("--stream", required=True, type=stream_name)
    add_lake(p)
    p.add_argument("--from", dest="start", help="first event time (RFC 3339 or epoch ms), inclusive")
    p.add_argument("--to", dest="end", help="last event time, exclusive")
    p.add_argument("--table", choices=["raw", "late"], default="raw")
    p.add_argument("--limit", type=positive_int, default=20, help="rows to print (default 20)")
    p.set_defaults(func=read)


def ingest(args: argparse.Namespace) -> int:
    from mmlake.ingest.errors import TopicNotFoundError
    from mmlake.ingest.producer import topic_exists

    settings = ingest_settings(args, writes=True)
    # Fail fast, before Prefect spends seconds starting, when the broker or the topic is not there.
    if not topic_exists(settings.kafka_bootstrap, args.topic, settings.kafka_timeout_s):
        raise TopicNotFoundError(f"topic {args.topic!r} does not exist at {settings.kafka_bootstrap}")
    check_partitions(settings, args.topic, args.partitions)
    from mmlake.flows.ingest import ingest_stream

    summary = ingest_stream(
        topic=args.topic,
        stream=args.stream,
        settings=settings,
        partitions=args.partitions,
        follow=args.follow,
        max_records=args.max_records,
        cancel=cancel_on_signals(),
    )
    print(summary.line())
    return 0


def compact(args: argparse.Namespace) -> int:
    from mmlake.ingest.maintenance import compact

    settings = ingest_settings(args, writes=True)
    report = compact(
        settings.lake, args.stream, retention_hours=args.retention_hours, storage_options=dict(settings.storage_options)
    )
    if not report:
        raise MmlakeError(f"stream {args.stream!r} has no tables under {settings.lake}")
    for table, stats in report.items():
        print(
            f"{args.stream}/{table}: z-ordered by event_time, {stats['files_removed']} files -> "
            f"{stats['files_added']}, vacuumed {stats['vacuumed']}, version {stats['version']}"
        )
    return 0


def read(args: argparse.Namespace) -> int:
    from mmlake.ingest.reader import count_rows, read_stream

    settings = ingest_settings(args, writes=False)
    shown = 0
    cols = ["event_time", "modality", "sample_id", "record_id", "kafka_partition", "kafka_offset"]
    options = dict(settings.storage_options)
    batches = read_stream(
        settings.lake, args.stream, args.start, args.end, table=args.table, columns=cols, storage_options=options
    )
    try:
        for batch in batches:
            for row in batch.to_pylist():
                if shown >= args.limit:
                    more = (
                        count_rows(
                            settings.lake, args.stream, args.start, args.end, table=args.table, storage_options=options
                        )
                        - shown
                    )
                    print(f"... {more} more row{'s' if more != 1 else ''} (--limit N shows more)")
                    return 0
                print(
                    f"{row['event_time'].isoformat()}  {row['modality']:<5}  {row['sample_id']}  "
                    f"{row['record_id'][:12]}  p{row['kafka_partition']}@{row['kafka_offset']}"
                )
                shown += 1
    finally:
        # Release the Delta scan before the interpreter exits: Arrow data of a deltalake scan still
        # alive at exit can abort the process while delta-rs's runtime shuts down.
        batches.close()
        del batches
        import gc

        gc.collect()
    return 0
