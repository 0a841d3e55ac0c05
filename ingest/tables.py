"""The Arrow schemas of the tables ingest writes: ``raw``, ``late`` and ``dlq``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from mmlake.lake import UTC_US, count_rows, scan

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from mmlake.lake import StreamTables

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

RAW_SCHEMA = pa.schema(
    [
        ("record_id", pa.string()),
        ("sample_id", pa.string()),
        ("modality", pa.string()),
        ("content_type", pa.string()),
        ("event_time", UTC_US),
        ("ingest_time", UTC_US),
        ("payload", pa.binary()),
        ("payload_sha256", pa.string()),
        ("size_bytes", pa.int64()),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("kafka_key", pa.binary()),
        ("headers", HEADERS_TYPE),
        ("event_date", pa.date32()),
    ]
)

LATE_SCHEMA = RAW_SCHEMA.insert(RAW_SCHEMA.get_field_index("event_date"), pa.field("watermark", UTC_US))

DLQ_SCHEMA = pa.schema(
    [
        ("error_code", pa.string()),
        ("error", pa.string()),
        ("payload", pa.binary()),
        ("kafka_key", pa.binary()),
        ("headers", HEADERS_TYPE),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("kafka_timestamp", UTC_US),
        ("ingest_time", UTC_US),
    ]
)

#: Table name -> (schema, partition columns). Order is the commit order of a micro-batch: raw first,
#: so that the routing that depends on raw (duplicates, record-id conflicts) is pinned by raw's commit
#: before a side table records its outcome (a replay after a crash then decides the same way).
TABLES: dict[str, tuple[pa.Schema, list[str]]] = {
    "raw": (RAW_SCHEMA, ["event_date"]),
    "late": (LATE_SCHEMA, ["event_date"]),
    "dlq": (DLQ_SCHEMA, []),
}


def ensure(tables: StreamTables, name: str) -> DeltaTable:
    """Open ``raw``, ``late`` or ``dlq`` of a stream, creating it empty (schema, partitioning) if missing."""
    schema, partitions = TABLES[name]
    return tables.ensure(name, schema, partitions)


def outcome_counts(tables: StreamTables) -> dict[str, int]:
    """Rows in each of the stream's ``raw``, ``late`` and ``dlq`` tables (0 for a missing table)."""
    counts = {}
    for name in ("raw", "late", "dlq"):
        dt = tables.open(name)
        counts[name] = 0 if dt is None else count_rows(dt)
    return counts


def dead_letter_reasons(tables: StreamTables) -> list[str]:
    """The distinct ``error_code`` values of the stream's dead-letter table, sorted."""
    dt = tables.open("dlq")
    if dt is None:
        return []
    codes = scan(dt, ["error_code"]).column("error_code").to_pylist()
    return sorted(set(codes))
