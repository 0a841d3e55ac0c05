"""``mmlake broker`` (the embedded Kafka-compatible broker) and ``mmlake produce``."""

from __future__ import annotations

import argparse
import signal
from typing import TYPE_CHECKING

from mmlake.flows.cli.options import add_kafka, ingest_settings, port, positive_int, topic_name

if TYPE_CHECKING:
    from mmlake.flows.cli.options import Commands


def register(commands: Commands) -> None:
    p = commands.add_parser("broker", help="run the embedded Kafka-compatible broker (in memory, or durable on S3)")
    p.add_argument("--port", type=port, default=9092)
    p.add_argument(
        "--storage",
        default="memory://",
        help="memory:// (default: a restart forgets the topics) or s3://BUCKET/ (the log survives "
        "restarts; AWS_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION as usual)",
    )
    p.set_defaults(func=broker)

    p = commands.add_parser("produce", help="produce a folder of files or a JSONL manifest into a topic")
    p.add_argument("path", help="a folder (.png .jpg .wav .txt) or a JSONL manifest")
    p.add_argument("--topic", required=True, type=topic_name)
    p.add_argument("--partitions", type=positive_int, default=1, help="partitions if the topic is created")
    add_kafka(p)
    p.set_defaults(func=produce)


def broker(args: argparse.Namespace) -> int:
    from mmlake.ingest.broker import EmbeddedBroker

    running = EmbeddedBroker(port=args.port, storage=args.storage).start(die_with_parent=True)
    kept = "in memory" if running.storage.startswith("memory://") else f"log in {running.storage}"
    print(f"embedded Kafka broker (Tansu, {kept}) at {running.bootstrap}; Ctrl-C stops it", flush=True)

    def terminate(*_: object) -> None:
        raise KeyboardInterrupt  # leave wait() and stop the broker in the finally below

    signal.signal(signal.SIGTERM, terminate)
    try:
        running.wait()
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()
    return 0


def produce(args: argparse.Namespace) -> int:
    from mmlake.ingest.producer import produce_path

    settings = ingest_settings(args, writes=False)
    sent = produce_path(
        args.path, args.topic, settings.kafka_bootstrap, partitions=args.partitions, timeout_s=settings.kafka_timeout_s
    )
    print(f"produced {sent} records to {args.topic} at {settings.kafka_bootstrap}")
    return 0
