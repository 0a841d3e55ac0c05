"""Kafka -> Delta Lake ingest: wire format, embedded broker, exactly-once micro-batches, ordered reads.

Importing this package does no I/O; the heavy clients load when a function that needs them runs.
"""

from __future__ import annotations

from ingest.broker import EmbeddedBroker, wait_for_kafka
from ingest.engine import IngestRun, IngestSummary, run_ingest
from ingest.errors import (
    BrokerStartError,
    BrokerUnavailableError,
    CommitConflictError,
    IngestError,
    InputError,
    TopicNotFoundError,
)
from ingest.maintenance import compact
from ingest.producer import MultimodalProducer, ensure_topic, produce_path
from ingest.reader import read_stream, read_table
from ingest.settings import IngestSettings
from ingest.tables import StreamTables, table_uri

__all__ = [
    "BrokerStartError",
    "BrokerUnavailableError",
    "CommitConflictError",
    "EmbeddedBroker",
    "IngestError",
    "IngestRun",
    "IngestSettings",
    "IngestSummary",
    "InputError",
    "MultimodalProducer",
    "StreamTables",
    "TopicNotFoundError",
    "compact",
    "ensure_topic",
    "produce_path",
    "read_stream",
    "read_table",
    "run_ingest",
    "table_uri",
    "wait_for_kafka",
]
