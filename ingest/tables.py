"""The Delta tables of one stream: where they live and their Arrow schemas."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from deltalake import DeltaTable

UTC_US = pa.timestamp("us", tz="UTC")
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

#: Table name -> (schema, partition columns). Order is the commit order of a micro-batch.
TABLES: dict[str, tuple[pa.Schema, list[str]]] = {
    "dlq": (DLQ_SCHEMA, []),
    "late": (LATE_SCHEMA, ["event_date"]),
    "raw": (RAW_SCHEMA, ["event_date"]),
}


def table_uri(lake: str, stream: str, table: str) -> str:
    """Location of ``<lake>/<stream>/<table>``; a local lake path is made absolute."""
    if "://" not in lake:
        lake = os.path.abspath(lake)
    return f"{lake.rstrip('/')}/{stream}/{table}"


@dataclass(frozen=True)
class StreamTables:
    """The locations of one stream's tables and the storage options to open them with."""

    lake: str
    stream: str
    storage_options: dict[str, str] = field(default_factory=dict)

    def uri(self, table: str) -> str:
        return table_uri(self.lake, self.stream, table)

    def open(self, table: str) -> DeltaTable | None:
        """The table at its latest version, or None if it does not exist yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri(table), storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def ensure(self, table: str) -> DeltaTable:
        """Open the table, creating it empty (with its schema and partitioning) if it is missing."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        existing = self.open(table)
        if existing is not None:
            return existing
        schema, partitions = TABLES[table]
        try:
            return DeltaTable.create(
                self.uri(table),
                schema,
                mode="ignore",  # a concurrent creator may win; then we open theirs
                partition_by=partitions or None,
                storage_options=self.storage_options or None,
                name=f"{self.stream}.{table}",
            )
        except DeltaError:
            found = self.open(table)
            if found is None:
                raise
            return found
