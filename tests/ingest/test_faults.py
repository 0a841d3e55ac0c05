"""Faults: a run killed with SIGKILL at every commit boundary (and at random moments), and two
ingest processes on one stream at once. Each must leave every record exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import Future
from typing import Any

import pytest

from mmlake.ingest import IngestSettings, engine, run_ingest
from mmlake.ingest.source import KafkaSource
from tests.fixtures.data import kafka_positions, table_rows
from tests.fixtures.streams import T0_MS, Expected, produce_mixed

RUN = (
    "import sys; from mmlake.ingest import IngestSettings, run_ingest; "
    "print(run_ingest(sys.argv[1], sys.argv[2], IngestSettings()).line())"
)

#: Every test here runs once per Kafka client (kafka-python, confluent-kafka).
pytestmark = pytest.mark.usefixtures("kafka_client")


def _env(settings: IngestSettings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMLAKE_")}
    env.update(
        MMLAKE_LAKE=settings.lake,
        MMLAKE_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        MMLAKE_KAFKA_CLIENT=settings.kafka_client,
        MMLAKE_ALLOWED_LATENESS_S="120",
        MMLAKE_BATCH_MAX_RECORDS="7",
    )
    env.update(extra)
    return env


def _ingest_process(settings: IngestSettings, topic: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", RUN, topic, "s"],
        env=_env(settings, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _assert_exactly_once(settings: IngestSettings, exp: Expected) -> None:
    assert Counter(r["record_id"] for r in table_rows(settings.lake, "s", "raw")) == exp.raw_ids
    assert Counter(r["record_id"] for r in table_rows(settings.lake, "s", "late")) == exp.late_ids
    assert len(table_rows(settings.lake, "s", "dlq")) == exp.dlq
    positions = kafka_positions(settings.lake, "s")
    assert len(set((p, o) for _, p, o in positions)) == len(positions)
    assert len(positions) + exp.duplicates == exp.sent


@pytest.mark.slow
@pytest.mark.parametrize("table", ["dlq", "late", "raw"])
@pytest.mark.parametrize("moment", ["before_commit", "after_commit"])
def test_kill_at_a_commit_boundary_then_rerun(producer, new_topic, settings, table, moment) -> None:
    topic = new_topic(partitions=2)
    exp = produce_mixed(producer, topic, partitions=2, per_partition=18)
    # Batches of 7 records: the second batch is killed between (or inside) its three commits.
    proc = _ingest_process(settings, topic, MMLAKE_FAULT_KILL_AT=f"{moment}:{table}:2")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    rerun = run_ingest(topic, "s", settings.with_overrides(allowed_lateness_s=120, batch_max_records=7))
    assert rerun.conflicts == 0
    _assert_exactly_once(settings, exp)


def _raw_version(lake: str) -> int:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(f"{lake}/s/raw").version()
    except TableNotFoundError:
        return -1


@pytest.mark.slow
def test_kill_at_random_moments_then_rerun(producer, new_topic, settings) -> None:
    topic = new_topic(partitions=3)
    exp = produce_mixed(producer, topic, partitions=3, per_partition=240)
    rng = random.Random(1234)
    kills = 0
    for _ in range(4):
        proc = _ingest_process(settings, topic)
        # Wait until this run has committed something, then kill it at a random moment soon after.
        start_version = _raw_version(settings.lake)
        deadline = time.monotonic() + 60
        while proc.poll() is None and _raw_version(settings.lake) <= start_version and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.15))
        if proc.poll() is None:
            proc.kill()
            kills += 1
        proc.communicate(timeout=60)
    run_ingest(topic, "s", settings.with_overrides(allowed_lateness_s=120, batch_max_records=7))
    assert kills >= 2
    _assert_exactly_once(settings, exp)


def _killed_after_raw(settings: IngestSettings, topic: str, batch: int) -> None:
    """One run whose first batch is committed to raw; it dies before late and dlq."""
    proc = _ingest_process(
        settings, topic, MMLAKE_BATCH_MAX_RECORDS=str(batch), MMLAKE_FAULT_KILL_AT="after_commit:raw:1"
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err


@pytest.mark.slow
def test_replay_keeps_the_ids_raw_holds_beyond_the_horizon(producer, new_topic, settings) -> None:
    """A partition resumes where its furthest-behind table stopped. The records raw already holds that it
    reads again stay known ids, even when another partition's progress puts them behind this run's
    horizon: a resend after them is still a duplicate."""
    topic = new_topic(partitions=2)
    lateness = settings.with_overrides(allowed_lateness_s=120)
    for i in range(30):  # partition 0 is half an hour ahead
        producer.send(topic, f"p0 {i}".encode(), "text", event_time=T0_MS + i * 60_000, partition=0)
    producer.flush()
    run_ingest(topic, "s", lateness, partitions=[0])
    for payload, minute in ((b"first", 6), (b"second", 7), (b"first", 6)):  # the third is a resend
        producer.send(topic, payload, "text", event_time=T0_MS + minute * 60_000, partition=1)
    producer.flush()
    _killed_after_raw(settings, topic, batch=2)
    rerun = run_ingest(topic, "s", lateness.with_overrides(batch_max_records=2))
    assert (rerun.accepted, rerun.duplicates) == (0, 1)
    raw = table_rows(settings.lake, "s", "raw", ["kafka_partition", "kafka_offset"])
    assert sorted(r["kafka_offset"] for r in raw if r["kafka_partition"] == 1) == [0, 1]
    assert table_rows(settings.lake, "s", "dlq") == []


class _OnePartitionAtATime:
    """A real source that reads the assigned partitions one after another, lowest first: one batch
    order among those a client may deliver, made repeatable."""

    def __init__(self, inner: KafkaSource) -> None:
        self.inner = inner
        self.topic, self.bootstrap = inner.topic, inner.bootstrap
        self.available_partitions = inner.available_partitions
        self.queue: list[tuple[int, int]] = []

    def assign(self, start: dict[int, int], *, bounded: bool) -> None:
        assert bounded
        self.queue = sorted(start.items())
        self.inner.assign(dict([self.queue.pop(0)]), bounded=True)

    def seek(self, start: dict[int, int]) -> None:
        raise AssertionError("a single writer never loses a commit race")

    def done(self) -> bool:
        while self.inner.done() and self.queue:
            self.inner.assign(dict([self.queue.pop(0)]), bounded=True)
        return self.inner.done()

    def submit_fetch(self, max_records: int, max_bytes: int, wait_s: float) -> Future[list[Any]]:
        return self.inner.submit_fetch(max_records, max_bytes, wait_s)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.slow
def test_replayed_rows_stay_known_after_the_horizon_passed_them(producer, new_topic, settings, monkeypatch) -> None:
    """As above, with the partition read again only after batches of another partition have moved the
    horizon past its rows (its own watermark is unknown until it is read): they become known ids again
    as they are read, as on the first attempt, and the re-send after them is a duplicate."""
    topic = new_topic(partitions=2)
    lateness = settings.with_overrides(allowed_lateness_s=120, batch_max_records=2)
    for payload, minute in ((b"first", 6), (b"second", 7), (b"first", 6)):  # the third is a re-send
        producer.send(topic, payload, "text", event_time=T0_MS + minute * 60_000, partition=1)
    producer.flush()
    _killed_after_raw(settings, topic, batch=2)
    for i in range(6):  # partition 0, half an hour ahead, is read first
        producer.send(topic, f"p0 {i}".encode(), "text", event_time=T0_MS + (30 + i) * 60_000, partition=0)
    producer.flush()
    opened = engine.open_source
    monkeypatch.setattr(engine, "open_source", lambda *a, **kw: _OnePartitionAtATime(opened(*a, **kw)))
    rerun = run_ingest(topic, "s", lateness)
    assert (rerun.accepted, rerun.duplicates, rerun.batches) == (6, 1, 5)
    raw = table_rows(settings.lake, "s", "raw", ["kafka_partition", "kafka_offset"])
    assert sorted(r["kafka_offset"] for r in raw if r["kafka_partition"] == 1) == [0, 1]


@pytest.mark.slow
def test_replayed_conflict_with_a_copy_beyond_the_horizon_is_dead_lettered(producer, new_topic, settings) -> None:
    """A record judged a conflict (its id already in raw with other bytes) whose run died before dlq is
    judged again by the next run, whose horizon no longer covers the copy (another writer moved that
    partition on): it still reaches dlq, once."""
    topic = new_topic(partitions=2)
    lateness = settings.with_overrides(allowed_lateness_s=120)
    producer.send(topic, b"kept", "text", event_time=T0_MS + 60_000, record_id="order-7", partition=0)
    producer.send(topic, b"later", "text", event_time=T0_MS + 3 * 60_000, partition=0)
    producer.flush()
    run_ingest(topic, "s", lateness, partitions=[0])
    producer.send(topic, b"other bytes", "text", event_time=T0_MS + 60 * 60_000, record_id="order-7", partition=1)
    producer.flush()
    _killed_after_raw(settings, topic, batch=1)
    producer.send(topic, b"much later", "text", event_time=T0_MS + 30 * 60_000, partition=0)
    producer.flush()
    run_ingest(topic, "s", lateness, partitions=[0])  # the horizon moves past the kept copy
    run_ingest(topic, "s", lateness)
    dlq = table_rows(settings.lake, "s", "dlq", ["kafka_partition", "kafka_offset", "error_code"])
    assert dlq == [{"kafka_partition": 1, "kafka_offset": 0, "error_code": "record_id_conflict"}]
    assert sorted(r["payload"] for r in table_rows(settings.lake, "s", "raw")) == [b"kept", b"later", b"much later"]


@pytest.mark.slow
def test_two_concurrent_runs_on_one_stream(producer, new_topic, settings) -> None:
    topic = new_topic(partitions=2)
    exp = produce_mixed(producer, topic, partitions=2, per_partition=90)
    procs = [_ingest_process(settings, topic) for _ in range(2)]
    outputs = [p.communicate(timeout=180) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
        assert out.startswith("ingested stream=s")
        print(out.strip())
    _assert_exactly_once(settings, exp)


@pytest.mark.slow
def test_kill_while_side_tables_trail_then_rerun(producer, new_topic, settings) -> None:
    topic = new_topic()
    for i in range(30):
        producer.send(topic, f"v{i}".encode(), "text", event_time=1_767_225_600_000 + i, partition=0)
    producer.flush()
    proc = _ingest_process(settings, topic, MMLAKE_FAULT_KILL_AT="after_commit:raw:3")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert len(table_rows(settings.lake, "s", "raw")) == 21  # three batches of 7 committed
    rerun = run_ingest(topic, "s", settings.with_overrides(batch_max_records=7))
    assert rerun.accepted == 9
    assert sorted(r["kafka_offset"] for r in table_rows(settings.lake, "s", "raw")) == list(range(30))


@pytest.mark.slow
@pytest.mark.services  # a broker of its own, stopped and started
def test_broker_that_goes_away_mid_run(tmp_path) -> None:
    """The run fails with a one-line BrokerUnavailableError; what it committed is consistent."""
    from deltalake import DeltaTable

    from mmlake.ingest import BrokerUnavailableError, EmbeddedBroker, IngestRun, MultimodalProducer, ensure_topic
    from mmlake.lake import offset_app_id

    broker = EmbeddedBroker().start()
    try:
        ensure_topic(broker.bootstrap, "t", 1)
        with MultimodalProducer(broker.bootstrap) as producer:
            # 1 MB records: more than one fetch response (32 MB), so the run needs the broker later.
            for i in range(50):
                payload = f"r{i}".encode().ljust(1_000_000, b".")
                producer.send("t", payload, "text", event_time=1_767_225_600_000 + i, partition=0)
        settings = IngestSettings(
            lake=str(tmp_path / "lake"), kafka_bootstrap=broker.bootstrap, batch_max_records=10, kafka_timeout_s=2
        )
        run = IngestRun("t", "s", settings, on_batch=lambda s: broker.stop() if s.batches == 1 else None)
        with pytest.raises(BrokerUnavailableError) as info:
            run.run()
        assert "\n" not in str(info.value)
    finally:
        broker.stop()
    rows = table_rows(settings.lake, "s", "raw")
    offsets = sorted(r["kafka_offset"] for r in rows)
    assert offsets == list(range(len(offsets))) and 10 <= len(offsets) < 50
    assert DeltaTable(f"{settings.lake}/s/raw").transaction_version(offset_app_id("t", 0)) == offsets[-1]


RUN_PARTITIONS = (
    "import sys; from mmlake.ingest import IngestSettings, run_ingest; "
    "s = run_ingest(sys.argv[1], sys.argv[2], IngestSettings(), partitions=[int(p) for p in sys.argv[3].split(',')]); "
    "print(sorted(s.offsets))"
)


@pytest.mark.slow
def test_two_workers_split_one_topic_by_partition(producer, new_topic, settings) -> None:
    """Scale-out: two workers at once, each with its own partitions (as two `mmlake serve --partitions`
    processes would be), on one stream: exactly once, and each read only its partitions."""
    topic = new_topic(partitions=4)
    exp = produce_mixed(producer, topic, partitions=4, per_partition=40)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RUN_PARTITIONS, topic, "s", parts],
            env=_env(settings),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for parts in ("0,2", "1,3")
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    assert [out.strip() for out, _ in outputs] == ["[0, 2]", "[1, 3]"]
    _assert_exactly_once(settings, exp)


def test_a_record_id_conflict_survives_a_kill_between_raw_and_dlq(broker, new_topic, settings) -> None:
    """Raw commits first: which copy of a reused record id is the original is pinned before the
    conflict is dead-lettered, so a replay that cuts its batches differently decides the same way."""
    from deltalake import DeltaTable

    from tests.fixtures.rawkafka import RawRecord, produce_raw

    topic = new_topic(partitions=2)
    base = 1_767_225_600_000
    text = [(b"mm-modality", b"text"), (b"mm-record-id", b"reused")]
    produce_raw(
        broker.bootstrap,
        topic,
        0,
        [RawRecord(b"the original", headers=[*text, (b"mm-event-time", str(base + 1).encode())], timestamp_ms=base)],
    )
    produce_raw(
        broker.bootstrap,
        topic,
        1,
        [RawRecord(b"the impostor", headers=[*text, (b"mm-event-time", str(base + 2).encode())], timestamp_ms=base)],
    )
    for p in (0, 1):
        produce_raw(
            broker.bootstrap,
            topic,
            p,
            [
                RawRecord(
                    f"normal {p}".encode(),
                    headers=[(b"mm-modality", b"text"), (b"mm-event-time", str(base + 10 + p).encode())],
                    timestamp_ms=base,
                )
            ],
        )
    proc = _ingest_process(settings, topic, MMLAKE_FAULT_KILL_AT="after_commit:raw:1", MMLAKE_BATCH_MAX_RECORDS="100")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    assert DeltaTable(f"{settings.lake}/s/dlq").to_pyarrow_table().num_rows == 0  # killed before dlq's commit
    rerun = run_ingest(topic, "s", settings.with_overrides(batch_max_records=1))  # other batch boundaries
    assert (rerun.accepted, rerun.dead_lettered) == (0, 1)
    raw = sorted(r["payload"] for r in table_rows(settings.lake, "s", "raw"))
    assert raw == [b"normal 0", b"normal 1", b"the original"]
    (dead,) = table_rows(settings.lake, "s", "dlq")
    assert (dead["payload"], dead["error_code"], dead["kafka_partition"]) == (b"the impostor", "record_id_conflict", 1)
    positions = kafka_positions(settings.lake, "s")
    assert sorted((p, o) for _, p, o in positions) == [(0, 0), (0, 1), (1, 0), (1, 1)]
