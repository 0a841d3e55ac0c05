"""Nothing a producer sends stops a stream: each record the contract does not allow goes to dlq with its
own error_code, among normal records on several partitions, and the stream goes on.

Records are produced with the raw protocol (tests/fixtures/rawkafka.py), so that their bytes, Kafka
timestamps and even header keys are exactly what the test says, including what no client would write.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from deltalake import DeltaTable

from mmlake.ingest import IngestSettings, read_table, run_ingest
from mmlake.lake import format_us
from tests.fixtures.data import png
from tests.fixtures.rawkafka import RawRecord, produce_raw

#: Every test here runs once per Kafka client (kafka-python, confluent-kafka).
pytestmark = pytest.mark.usefixtures("kafka_client")

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
PARTITIONS = 3


def _text(
    payload: bytes,
    event_time: bytes | None,
    *,
    extra: list | None = None,
    ts: int | None = None,
    rid: bytes | None = None,
) -> RawRecord:
    headers = [(b"mm-modality", b"text")]
    if event_time is not None:
        headers.append((b"mm-event-time", event_time))
    if rid is not None:
        headers.append((b"mm-record-id", rid))
    return RawRecord(
        payload, key=b"k", headers=headers + (extra or []), timestamp_ms=int(time.time() * 1000) if ts is None else ts
    )


#: outcome class -> (the poison record(s), the error_code each gets, how many duplicates they add)
CASES = {
    "year 33658 (epoch ms)": ([_text(b"far", b"1000000000000000")], ["event_time_out_of_range"], 0),
    "epoch ms past int64 us": ([_text(b"huge", b"10000000000000000")], ["event_time_out_of_range"], 0),
    "negative epoch ms past int64 us": ([_text(b"neg", b"-10000000000000000")], ["event_time_out_of_range"], 0),
    "RFC 3339 that is year 10000 in UTC": (
        [_text(b"y10k", b"9999-12-31T23:00:00-05:00")],
        ["event_time_out_of_range"],
        0,
    ),
    "ISO basic format": ([_text(b"basic", b"20260101T000000Z")], ["bad_event_time"], 0),
    "ISO week date": ([_text(b"week", b"2026-W01-4T00:00:00Z")], ["bad_event_time"], 0),
    "full-width digits": ([_text(b"wide", "２０２６-01-01T00:00:00Z".encode())], ["bad_event_time"], 0),
    "full-width epoch ms": ([_text(b"wide-ms", "１７６７２２５６００００".encode())], ["bad_event_time"], 0),
    "far future (year 9999)": ([_text(b"future", b"9999-12-31T23:59:59Z")], ["event_time_in_future"], 0),
    "a tombstone": (
        [
            RawRecord(
                None,
                key=b"k",
                headers=[(b"mm-event-time", str(T0_MS).encode()), (b"mm-modality", b"text")],
                timestamp_ms=T0_MS,
            )
        ],
        ["missing_value"],
        0,
    ),
    "a header key that is not UTF-8": (
        [_text(b"badkey", str(T0_MS + 5).encode(), extra=[(b"\xff\xfekey", b"v")])],
        ["undecodable_record"],
        0,
    ),
    "a header value that is not UTF-8": (
        [_text(b"badval", str(T0_MS + 5).encode(), extra=[(b"note", b"\xff")])],
        ["bad_header"],
        0,
    ),
    "a null event time header": (
        [_text(b"nullhdr", None, extra=[(b"mm-event-time", None)])],
        ["missing_event_time"],
        0,
    ),
    "a record id reused with other bytes": (
        [
            _text(b"original", str(T0_MS + 7).encode(), rid=b"same-id"),
            _text(b"impostor", str(T0_MS + 8).encode(), rid=b"same-id"),
            _text(b"original", str(T0_MS + 7).encode(), rid=b"same-id"),
        ],
        ["record_id_conflict"],
        1,
    ),
}


def _normal(p: int, i: int) -> RawRecord:
    if i % 2:
        return RawRecord(
            png(seed=p * 100 + i),
            key=f"s{p}-{i}".encode(),
            headers=[(b"mm-event-time", str(T0_MS + i * 1000).encode()), (b"mm-modality", b"image")],
            timestamp_ms=int(time.time() * 1000),
        )
    return _text(f"p{p} normal {i}".encode(), str(T0_MS + i * 1000).encode())


def _versions(lake: str, stream: str) -> dict[str, int]:
    return {t: DeltaTable(f"{lake}/{stream}/{t}").version() for t in ("raw", "late", "dlq")}


@pytest.mark.parametrize("case", list(CASES))
def test_a_poison_record_is_dead_lettered_and_the_stream_goes_on(
    broker, new_topic, settings: IngestSettings, case: str
) -> None:
    poison, codes, duplicates = CASES[case]
    topic = new_topic(partitions=PARTITIONS)
    for p in range(PARTITIONS):
        produce_raw(broker.bootstrap, topic, p, [_normal(p, 0), _normal(p, 1)])
    poison_at = produce_raw(broker.bootstrap, topic, 1, [*poison, _normal(1, 2)])
    for p in range(PARTITIONS):  # normal records after the poison, in every partition
        produce_raw(broker.bootstrap, topic, p, [_normal(p, 3)])
        produce_raw(broker.bootstrap, topic, p, [_normal(p, 4), _normal(p, 5)])
    produced = PARTITIONS * 5 + 1 + len(poison)

    first = run_ingest(topic, "s", settings)
    assert first.dead_lettered == len(codes) and first.duplicates == duplicates
    assert first.accepted + first.late + first.dead_lettered + first.duplicates == produced
    dlq = DeltaTable(f"{settings.lake}/s/dlq").to_pyarrow_table().to_pylist()
    assert [r["error_code"] for r in dlq] == codes
    poison_offsets = {poison_at + i for i in range(len(poison))}
    assert {(r["kafka_partition"], r["kafka_offset"]) for r in dlq} <= {(1, o) for o in poison_offsets}
    for row in dlq:
        assert row["error"] and "\n" not in row["error"]
        if row["error_code"] != "missing_value":
            assert row["payload"], "the dead letter keeps the record's bytes"
    # Every record in exactly one table or counted as a duplicate.
    positions = Counter()
    for table in ("raw", "late", "dlq"):
        for r in (
            DeltaTable(f"{settings.lake}/s/{table}")
            .to_pyarrow_table(columns=["kafka_partition", "kafka_offset"])
            .to_pylist()
        ):
            positions[(r["kafka_partition"], r["kafka_offset"])] += 1
    assert max(positions.values()) == 1
    assert len(positions) + duplicates == produced
    # The normal records after the poison are in raw (a far-future one moved no watermark), and raw
    # reads back as a dataset and in event-time order.
    raw = DeltaTable(f"{settings.lake}/s/raw").to_pyarrow_dataset().to_table()
    normal_after = {f"p{p} normal 4".encode() for p in range(PARTITIONS)}
    assert normal_after <= set(raw.column("payload").to_pylist())
    assert first.late == 0
    ordered = read_table(settings.lake, "s", columns=["event_time"]).column("event_time").to_pylist()
    assert ordered == sorted(ordered) and len(ordered) == first.accepted
    # The watermark is the newest normal record's (T0 + 5 s) minus the lateness: no poison moved it.
    assert first.watermark_us == (T0_MS + 5000) * 1000 - int(settings.allowed_lateness_s * 1e6)
    assert f"watermark={format_us(first.watermark_us)}" in first.line()

    # The next run succeeds too, and writes nothing.
    before = _versions(settings.lake, "s")
    again = run_ingest(topic, "s", settings)
    assert (again.accepted, again.dead_lettered, again.batches) == (0, 0, 0)
    assert _versions(settings.lake, "s") == before


def test_future_guard_uses_the_kafka_timestamp_so_a_replay_decides_alike(broker, new_topic, settings) -> None:
    """An event time up to MMLAKE_MAX_FUTURE_SKEW past the record's own Kafka timestamp is accepted,
    beyond it dead-lettered, however late the record is read; a record without a timestamp is held to
    its partition's newest event time. Dead-lettered records move no watermark."""
    topic = new_topic()
    written = T0_MS  # the Kafka timestamp: when the records claim to have been written (long ago)
    hour = 3_600_000
    produce_raw(
        broker.bootstrap,
        topic,
        0,
        [
            _text(b"in an hour", str(written + hour).encode(), ts=written),
            _text(b"an hour and a ms", str(written + hour + 1).encode(), ts=written),
            _text(b"no timestamp, a day past the newest", str(written + hour + 86_400_001).encode(), ts=-1),
            _text(b"no timestamp, 10 ms past the newest", str(written + hour + 10).encode(), ts=-1),
        ],
    )
    skewed = settings.with_overrides(max_future_skew=3600.0)
    summary = run_ingest(topic, "s", skewed)
    dlq = DeltaTable(f"{skewed.lake}/s/dlq").to_pyarrow_table(columns=["payload", "error_code", "kafka_timestamp"])
    assert dlq.column("payload").to_pylist() == [b"an hour and a ms", b"no timestamp, a day past the newest"]
    assert dlq.column("error_code").to_pylist() == ["event_time_in_future"] * 2
    assert dlq.column("kafka_timestamp").to_pylist()[1] is None
    raw = DeltaTable(f"{skewed.lake}/s/raw").to_pyarrow_table(columns=["payload"]).column("payload").to_pylist()
    assert sorted(raw) == [b"in an hour", b"no timestamp, 10 ms past the newest"]
    assert summary.watermark_us == (written + hour + 10) * 1000 - 600_000_000
    assert format_us(summary.watermark_us) == "2026-01-01T00:50:00.010000Z"
