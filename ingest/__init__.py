"""Kafka -> Delta Lake ingest: wire format, embedded broker, exactly-once micro-batches, ordered reads.

Table locations (``StreamTables``) and the exactly-once commit are :mod:`mmlake.lake`'s.

Importing this package does no I/O; the heavy clients load when a function that needs them runs.
"""

from __future__ import annotations

from mmlake.ingest.broker import EmbeddedBroker, wait_for_kafka
from mmlake.ingest.engine import IngestRun, IngestSummary, run_ingest
from mmlake.ingest.errors import BrokerStartError, BrokerUnavailableError, IngestError, TopicNotFoundError
from mmlake.ingest.maintenance import compact
from mmlake.ingest.producer import MultimodalProducer, ensure_topic, produce_path
from mmlake.ingest.reader import read_stream, read_table
from mmlake.ingest.settings import IngestSettings

__all__ = [
    "BrokerStartError",
    "BrokerUnavailableError",
    "EmbeddedBroker",
    "IngestError",
    "IngestRun",
    "IngestSettings",
    "IngestSummary",
    "MultimodalProducer",
    "TopicNotFoundError",
    "compact",
    "ensure_topic",
    "produce_path",
    "read_stream",
    "read_table",
    "run_ingest",
    "wait_for_kafka",
]
