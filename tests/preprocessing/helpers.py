"""Raw tables for preprocessing tests, written straight to Delta with the raw schema (the ingest
tests cover how rows get there; here the raw table is only the input)."""

from __future__ import annotations

import hashlib

import pyarrow as pa

from ingest.synth import samples
from ingest.tables import RAW_SCHEMA, StreamTables

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_US_PER_DAY = 86_400_000_000


def raw_rows(parts: list[tuple[str, str, bytes, int]]) -> pa.Table:
    """Raw rows from (sample_id, modality, payload, event time in ms)."""
    rows = []
    for i, (sample_id, modality, payload, at_ms) in enumerate(parts):
        us = at_ms * 1000
        rid = hashlib.sha256(f"{modality}|{us}|".encode() + payload).hexdigest()
        rows.append({
            "record_id": rid, "sample_id": sample_id, "modality": modality, "content_type": None,
            "event_time": us, "ingest_time": us, "payload": payload,
            "payload_sha256": hashlib.sha256(payload).hexdigest(), "size_bytes": len(payload),
            "kafka_topic": "t", "kafka_partition": 0, "kafka_offset": i, "kafka_key": sample_id.encode(),
            "headers": [], "event_date": us // _US_PER_DAY,
        })
    schema = pa.schema([f.with_type(pa.int64()) if f.name in ("event_time", "ingest_time") else
                        f.with_type(pa.int32()) if f.name == "event_date" else f for f in RAW_SCHEMA])
    return pa.Table.from_pylist(rows, schema=schema).cast(RAW_SCHEMA)


def write_raw(lake: str, stream: str, parts: list[tuple[str, str, bytes, int]]) -> pa.Table:
    from deltalake import write_deltalake

    table = raw_rows(parts)
    dt = StreamTables(lake, stream).ensure("raw")
    write_deltalake(dt, table, mode="append", partition_by=["event_date"])
    return table


def synth_parts(count: int, *, start_ms: int = T0_MS, span_ms: int = 2 * _US_PER_DAY // 1000, seed: int = 0,
                image_size: int = 48) -> list[tuple[str, str, bytes, int]]:
    """``count`` generated samples (image, caption, every 4th an audio tone) spread over ``span_ms``."""
    return [(p.sample_id, p.modality, p.payload, p.event_time_ms)
            for p in samples(count, start_ms=start_ms, span_ms=span_ms, seed=seed, image_size=image_size)]
