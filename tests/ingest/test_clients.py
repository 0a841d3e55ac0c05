"""The two Kafka clients a source is built on give the same tables for the same topic, record for
record, poison records included; an unknown client is refused in one line."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from mmlake.ingest import IngestSettings, run_ingest
from mmlake.ingest.errors import IngestError
from mmlake.ingest.source import SOURCES, open_source
from tests.fixtures.rawkafka import RawRecord, produce_raw
from tests.fixtures.streams import T0_MS, produce_mixed


def _table(lake: str, name: str) -> list[dict]:
    rows = DeltaTable(f"{lake}/s/{name}").to_pyarrow_table().to_pylist()
    for r in rows:
        r.pop("ingest_time", None)  # the wall clock of the run: the only column that may differ
    return sorted(rows, key=lambda r: (r["kafka_partition"], r["kafka_offset"]))


def test_both_clients_write_the_same_rows_for_the_same_records(broker, producer, new_topic, tmp_path) -> None:
    topic = new_topic(partitions=2)
    produce_mixed(producer, topic, partitions=2, per_partition=30)
    headers = [(b"mm-event-time", str(T0_MS + 1).encode()), (b"mm-modality", b"text")]
    produce_raw(
        broker.bootstrap,
        topic,
        1,
        [
            RawRecord(b"bad key", headers=[*headers, (b"\xff\xfek", b"v")], timestamp_ms=T0_MS),
            RawRecord(None, key=b"tomb", headers=headers, timestamp_ms=T0_MS),
            RawRecord(b"fine", headers=headers, timestamp_ms=T0_MS),
        ],
    )
    lakes = {}
    for client in sorted(SOURCES):
        lakes[client] = str(tmp_path / client)
        settings = IngestSettings(
            lake=lakes[client],
            kafka_bootstrap=broker.bootstrap,
            kafka_client=client,
            allowed_lateness_s=120,
            batch_max_records=7,
        )
        summary = run_ingest(topic, "s", settings)
        assert summary.accepted > 0 and summary.dead_lettered >= 2
    a, b = (lakes[c] for c in sorted(SOURCES))
    for name in ("raw", "late", "dlq"):
        assert _table(a, name) == _table(b, name), name
    reasons = {r["error_code"] for r in _table(a, "dlq")}
    assert {"undecodable_record", "missing_value"} <= reasons


def test_an_unknown_client_is_refused_in_one_line(broker) -> None:
    with pytest.raises(
        IngestError, match="^unknown Kafka client 'librdkafka': choose from confluent-kafka, kafka-python$"
    ):
        open_source("librdkafka", broker.bootstrap, "t")
    with pytest.raises(ValueError, match="kafka_client"):
        IngestSettings(kafka_client="librdkafka")


@pytest.mark.parametrize("client", sorted(SOURCES))
def test_fetches_cut_by_bytes_hand_out_every_record_once(broker, producer, new_topic, client) -> None:
    """A fetch stops once its records reach ``max_bytes``; what the client had consumed beyond is handed
    out by the next fetches, in offset order per partition, none skipped or repeated."""
    topic = new_topic(partitions=2)
    for i in range(60):
        producer.send(topic, bytes([65 + i % 26]) * (1000 + i), "text", event_time=T0_MS + i, partition=i % 2)
    producer.flush()
    source = open_source(client, broker.bootstrap, topic)
    try:
        source.assign({0: 0, 1: 0}, bounded=True)
        got: dict[int, list[int]] = {0: [], 1: []}
        fetches = 0
        while not source.done():
            batch = source.fetch(1000, 5_000, 1.0)
            fetches += 1
            assert fetches < 100
            if batch:
                assert sum(len(r.value) for r in batch[:-1]) < 5_000 or len(batch) == 1  # stops at the room
            for rec in batch:
                got[rec.partition].append(rec.offset)
                assert rec.value == bytes([65 + (2 * rec.offset + rec.partition) % 26]) * (
                    1000 + 2 * rec.offset + rec.partition
                )
    finally:
        source.close()
    assert got == {0: list(range(30)), 1: list(range(30))}
    assert fetches >= 12  # 60 records of ~1 KB, 5 KB a fetch
