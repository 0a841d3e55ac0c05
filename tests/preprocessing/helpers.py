"""Raw tables for preprocessing tests, written straight to Delta with the raw schema (the ingest
tests cover how rows get there; here the raw table is only the input)."""

from __future__ import annotations

import hashlib

import pyarrow as pa

from mmlake.ingest.synth import samples
from mmlake.ingest.tables import RAW_SCHEMA, ensure
from mmlake.lake import StreamTables

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_US_PER_DAY = 86_400_000_000


def raw_rows(parts: list[tuple[str, str, bytes, int]]) -> pa.Table:
    """Raw rows from (sample_id, modality, payload, event time in ms)."""
    rows = []
    for i, (sample_id, modality, payload, at_ms) in enumerate(parts):
        us = at_ms * 1000
        rid = hashlib.sha256(f"{modality}|{us}|".encode() + payload).hexdigest()
        rows.append(
            {
                "record_id": rid,
                "sample_id": sample_id,
                "modality": modality,
                "content_type": None,
                "event_time": us,
                "ingest_time": us,
                "payload": payload,
                "payload_sha256": hashlib.sha256(payload).hexdigest(),
                "size_bytes": len(payload),
                "kafka_topic": "t",
                "kafka_partition": 0,
                "kafka_offset": i,
                "kafka_key": sample_id.encode(),
                "headers": [],
                "event_date": us // _US_PER_DAY,
            }
        )
    schema = pa.schema(
        [
            f.with_type(pa.int64())
            if f.name in ("event_time", "ingest_time")
            else f.with_type(pa.int32())
            if f.name == "event_date"
            else f
            for f in RAW_SCHEMA
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema).cast(RAW_SCHEMA)


def write_raw(lake: str, stream: str, parts: list[tuple[str, str, bytes, int]]) -> pa.Table:
    from deltalake import write_deltalake

    table = raw_rows(parts)
    dt = ensure(StreamTables(lake, stream), "raw")
    write_deltalake(dt, table, mode="append", partition_by=["event_date"])
    return table


def synth_parts(
    count: int, *, start_ms: int = T0_MS, span_ms: int = 2 * _US_PER_DAY // 1000, seed: int = 0, image_size: int = 48
) -> list[tuple[str, str, bytes, int]]:
    """``count`` generated samples (image, caption, every 4th an audio tone) spread over ``span_ms``."""
    return [
        (p.sample_id, p.modality, p.payload, p.event_time_ms)
        for p in samples(count, start_ms=start_ms, span_ms=span_ms, seed=seed, image_size=image_size)
    ]


def write_features(lake: str, stream: str, samples, ops: dict, *, trained: bool = False) -> pa.Table:
    """A features table holding ``samples`` (a drift ``Samples``: one row per present part, missing
    parts left out, error parts as error rows) as made by the operators ``ops`` (modality -> spec)."""
    import numpy as np
    from deltalake import write_deltalake

    from mmlake.preprocessing.drift.detector import ERROR, MISSING
    from mmlake.preprocessing.features import features_schema

    dim = next(e.shape[1] for e in samples.embeddings.values())
    rows = []
    for i, sid in enumerate(samples.ids):
        us = int(samples.times[i])
        for m, status in samples.status.items():
            if status[i] == MISSING:
                continue
            bad = status[i] == ERROR
            rows.append(
                {
                    "record_id": hashlib.sha256(f"{sid}|{m}".encode()).hexdigest(),
                    "sample_id": sid,
                    "modality": m,
                    "event_time": us,
                    "payload_sha256": None,
                    "embedding": None if bad else np.asarray(samples.embeddings[m][i], dtype=np.float32).tolist(),
                    "error_code": "undecodable" if bad else None,
                    "error": "test: part could not be decoded" if bad else None,
                    "op_name": ops[m].name,
                    "op_version": ops[m].version,
                    "op_sha256": ops[m].sha256,
                    "op_models": [],
                    "ort_version": "test",
                    "execution_provider": "CPUExecutionProvider",
                    "encoder_trained": trained,
                    "event_date": us // _US_PER_DAY,
                }
            )
    schema = features_schema(dim)
    arrays = [
        pa.array(
            [r[f.name] for r in rows],
            pa.int64() if f.name == "event_time" else pa.int32() if f.name == "event_date" else f.type,
        )
        for f in schema
    ]
    table = pa.Table.from_arrays(arrays, names=schema.names)
    table = table.set_column(
        schema.get_field_index("event_date"),
        "event_date",
        table.column("event_date").cast(pa.int32()).cast(pa.date32()),
    )
    table = table.cast(schema)
    dt = StreamTables(lake, stream).open("features")
    write_deltalake(
        dt if dt is not None else StreamTables(lake, stream).uri("features"),
        table,
        mode="append",
        partition_by=["event_date"],
    )
    return table
