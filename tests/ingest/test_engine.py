"""The ingest engine against the real embedded broker and real Delta tables."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from mmlake.ingest import (
    BrokerUnavailableError,
    IngestRun,
    IngestSettings,
    TopicNotFoundError,
    run_ingest,
)
from mmlake.ingest.wire import Reason
from mmlake.lake import max_event_app_id, offset_app_id
from tests.fixtures.data import kafka_positions, png, record_id, table_rows, wav
from tests.fixtures.streams import T0_MS, produce_mixed

#: Every test here runs once per Kafka client (kafka-python, confluent-kafka).
pytestmark = pytest.mark.usefixtures("kafka_client")

LATENESS_S = 120


@pytest.fixture
def cfg(settings: IngestSettings) -> IngestSettings:
    return settings.with_overrides(allowed_lateness_s=LATENESS_S)


def test_routing_of_a_mixed_stream(producer, new_topic, cfg) -> None:
    topic = new_topic(partitions=2)
    exp = produce_mixed(producer, topic, partitions=2, per_partition=24)
    summary = run_ingest(topic, "s", cfg)

    assert summary.accepted == sum(exp.raw_ids.values())
    assert summary.late == sum(exp.late_ids.values())
    assert summary.dead_lettered == exp.dlq
    assert summary.duplicates == exp.duplicates
    assert Counter(r["record_id"] for r in table_rows(cfg.lake, "s", "raw")) == exp.raw_ids
    assert Counter(r["record_id"] for r in table_rows(cfg.lake, "s", "late")) == exp.late_ids
    # Every record is in exactly one table, or was a counted duplicate.
    positions = kafka_positions(cfg.lake, "s")
    assert len(set((p, o) for _, p, o in positions)) == len(positions)
    assert len(positions) + exp.duplicates == exp.sent
    # The offsets live in the Delta log of every table, as the last offset read per partition.
    for table in ("raw", "late", "dlq"):
        dt = DeltaTable(f"{cfg.lake}/s/{table}")
        assert [dt.transaction_version(offset_app_id(topic, p)) for p in (0, 1)] == [23, 23]


def test_late_boundary_and_watermark_column(producer, new_topic, cfg) -> None:
    topic = new_topic()
    last_ms = T0_MS + 600_000
    watermark_ms = last_ms - LATENESS_S * 1000
    for t_ms, text in [
        (T0_MS, "first"),
        (last_ms, "newest"),
        (watermark_ms, "at watermark"),
        (watermark_ms - 1, "just behind"),
    ]:
        producer.send(topic, text.encode(), "text", event_time=t_ms, partition=0)
    producer.flush()
    summary = run_ingest(topic, "s", cfg)
    assert (summary.accepted, summary.late) == (3, 1)
    late = table_rows(cfg.lake, "s", "late")
    assert [r["payload"] for r in late] == [b"just behind"]
    assert int(late[0]["watermark"].timestamp() * 1000) == watermark_ms
    assert summary.watermark_us == watermark_ms * 1000


def test_resume_dedup_and_watermark_across_runs(producer, new_topic, cfg) -> None:
    topic = new_topic()
    for i in range(5):
        producer.send(topic, f"r{i}".encode(), "text", event_time=T0_MS + i * 60_000, partition=0)
    producer.flush()
    assert run_ingest(topic, "s", cfg).accepted == 5
    again = run_ingest(topic, "s", cfg)
    assert (again.accepted, again.batches, again.offsets) == (0, 0, {})

    # A later run: one new record, one re-send of an old one, one behind the persisted watermark.
    producer.send(topic, b"r5", "text", event_time=T0_MS + 5 * 60_000, partition=0)
    producer.send(topic, b"r3", "text", event_time=T0_MS + 3 * 60_000, partition=0)
    producer.send(topic, b"old", "text", event_time=T0_MS, partition=0)
    producer.flush()
    third = run_ingest(topic, "s", cfg)
    assert (third.accepted, third.duplicates, third.late) == (1, 1, 1)
    assert third.offsets == {0: [5, 7]}
    ids = [r["record_id"] for r in table_rows(cfg.lake, "s", "raw")]
    assert sorted(ids) == sorted(record_id("text", (T0_MS + i * 60_000) * 1000, f"r{i}".encode()) for i in range(6))
    raw = DeltaTable(f"{cfg.lake}/s/raw")
    assert raw.transaction_version(max_event_app_id(topic, 0)) == (T0_MS + 5 * 60_000) * 1000


def test_every_malformed_class_goes_to_dlq_with_its_bytes(producer, new_topic, cfg) -> None:
    topic = new_topic()
    t = str(T0_MS).encode()
    cases = {
        Reason.MISSING_EVENT_TIME: (b"a", [("mm-modality", b"text")]),
        Reason.BAD_EVENT_TIME: (b"b", [("mm-event-time", b"noon"), ("mm-modality", b"text")]),
        Reason.MISSING_MODALITY: (b"c", [("mm-event-time", t)]),
        Reason.UNKNOWN_MODALITY: (b"d", [("mm-event-time", t), ("mm-modality", b"smell")]),
        Reason.BAD_HEADER: (b"e", [("mm-event-time", t), ("mm-modality", b"\xfftext")]),
        Reason.CONTENT_TYPE_MISMATCH: (
            b"f",
            [("mm-event-time", t), ("mm-modality", b"text"), ("content-type", b"audio/wav")],
        ),
        Reason.OVERSIZE: (b"g" * 2000, [("mm-event-time", t), ("mm-modality", b"text")]),
        Reason.UNDECODABLE_IMAGE: (png()[:-30], [("mm-event-time", t), ("mm-modality", b"image")]),
        Reason.UNDECODABLE_AUDIO: (wav()[:-50], [("mm-event-time", t), ("mm-modality", b"audio")]),
        Reason.INVALID_TEXT: (b"\xc3\x28", [("mm-event-time", t), ("mm-modality", b"text")]),
    }
    for value, headers in cases.values():
        producer.send_raw(topic, value, headers, key=b"k", partition=0)
    producer.flush()
    summary = run_ingest(topic, "s", cfg.with_overrides(max_payload_bytes=1000))
    assert (summary.dead_lettered, summary.accepted) == (len(cases), 0)
    rows = sorted(table_rows(cfg.lake, "s", "dlq"), key=lambda r: r["kafka_offset"])
    assert [r["error_code"] for r in rows] == [reason.value for reason in cases]
    for row, (value, headers) in zip(rows, cases.values()):
        assert row["payload"] == value
        assert [(h["key"], h["value"]) for h in row["headers"]] == headers
        assert row["kafka_key"] == b"k" and row["kafka_topic"] == topic
        assert row["error"] and "\n" not in row["error"]


def test_max_records_and_partition_subset(producer, new_topic, cfg) -> None:
    topic = new_topic(partitions=3)
    for p in range(3):
        for i in range(10):
            producer.send(topic, f"{p}-{i}".encode(), "text", event_time=T0_MS + i, partition=p)
    producer.flush()
    first = run_ingest(topic, "s", cfg, partitions=[0, 2], max_records=12)
    assert first.accepted == 12
    assert set(first.offsets) <= {0, 2}
    rest = run_ingest(topic, "s", cfg, partitions=[0, 2])
    assert first.accepted + rest.accepted == 20
    assert {r["kafka_partition"] for r in table_rows(cfg.lake, "s", "raw")} == {0, 2}
    third = run_ingest(topic, "s", cfg)
    assert third.accepted == 10 and set(third.offsets) == {1}


def test_commits_are_sorted_by_event_time_and_partitioned_by_date(producer, new_topic, cfg) -> None:
    topic = new_topic(partitions=2)
    day = 86_400_000
    # Two days, written out of event-time order within and across partitions.
    for i, offset_ms in enumerate([day + 5, 3, day + 1, 7, 2, day + 9]):
        producer.send(topic, f"x{i}".encode(), "text", event_time=T0_MS + offset_ms, partition=i % 2)
    producer.flush()
    run_ingest(topic, "s", cfg.with_overrides(allowed_lateness_s=2 * 86_400))
    dt = DeltaTable(f"{cfg.lake}/s/raw")
    assert dt.metadata().partition_columns == ["event_date"]
    files = dt.file_uris()
    assert sorted({f.split("event_date=")[1].split("/")[0] for f in files}) == ["2026-01-01", "2026-01-02"]
    for uri in files:
        times = pq.read_table(uri.removeprefix("file://"), columns=["event_time"]).column("event_time").to_pylist()
        assert times == sorted(times)


def test_unreachable_broker_fails_fast_and_commits_nothing(tmp_path) -> None:
    from mmlake.ingest.broker import free_port

    settings = IngestSettings(
        lake=str(tmp_path / "lake"), kafka_bootstrap=f"127.0.0.1:{free_port()}", kafka_timeout_s=1.0
    )
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match="cannot reach Kafka"):
        run_ingest("t", "s", settings)
    assert time.monotonic() - started < 10
    assert not (tmp_path / "lake").exists()


def test_missing_topic(broker, cfg) -> None:
    with pytest.raises(TopicNotFoundError, match="does not exist"):
        run_ingest("no-such-topic", "s", cfg)


def test_lost_commit_race_is_retried_without_duplicates(producer, new_topic, cfg) -> None:
    topic = new_topic(partitions=2)
    exp = produce_mixed(producer, topic, partitions=2, per_partition=12)
    rival: list = []

    racing = IngestRun(topic, "s", cfg)
    commit = racing.writer.commit

    def rival_first(batch):  # the rival commits the same offsets first
        if not rival:
            rival.append(run_ingest(topic, "s", cfg))
        return commit(batch)

    racing.writer.commit = rival_first
    loser = racing.run()
    assert loser.conflicts == 1
    assert rival[0].accepted + loser.accepted == sum(exp.raw_ids.values())
    assert Counter(r["record_id"] for r in table_rows(cfg.lake, "s", "raw")) == exp.raw_ids
    assert Counter(r["record_id"] for r in table_rows(cfg.lake, "s", "late")) == exp.late_ids
    positions = kafka_positions(cfg.lake, "s")
    assert len(set((p, o) for _, p, o in positions)) == len(positions)


def test_follow_mode_picks_up_new_records_until_stopped(producer, new_topic, cfg) -> None:
    topic = new_topic()
    stop = threading.Event()
    seen: list[int] = []
    run = IngestRun(
        topic,
        "s",
        cfg.with_overrides(idle_timeout_s=0.2),
        follow=True,
        stop=stop,
        on_batch=lambda s: seen.append(s.accepted),
    )
    worker = threading.Thread(target=run.run)
    worker.start()
    try:
        for i in range(3):
            producer.send(topic, f"f{i}".encode(), "text", event_time=T0_MS + i, partition=0)
            producer.flush()
            deadline = time.monotonic() + 20
            while (not seen or seen[-1] < i + 1) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()
    assert run.summary.accepted == 3
    assert len(table_rows(cfg.lake, "s", "raw")) == 3


@pytest.mark.parametrize("lag", [0, 50_000])
def test_side_table_offsets_trail_raw_by_a_bounded_lag(producer, new_topic, cfg, lag) -> None:
    topic = new_topic()
    for i in range(40):
        producer.send(topic, f"v{i}".encode(), "text", event_time=T0_MS + i, partition=0)
    producer.flush()
    summary = run_ingest(topic, "s", cfg.with_overrides(batch_max_records=10, side_table_lag_records=lag))
    assert (summary.accepted, summary.batches) == (40, 4)
    for table in ("raw", "late", "dlq"):
        assert DeltaTable(f"{cfg.lake}/s/{table}").transaction_version(offset_app_id(topic, 0)) == 39
    late = DeltaTable(f"{cfg.lake}/s/late")
    # Created, then either one offsets-only commit per batch or one flush at the end of the run.
    assert late.version() == (4 if lag == 0 else 1)
    assert run_ingest(topic, "s", cfg).batches == 0
