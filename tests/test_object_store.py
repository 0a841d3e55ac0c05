"""The pipeline on an object-store lake (moto's S3 server, started by a session fixture) and a durable
embedded broker whose log lives in an S3 bucket: exactly once, lineage kept and queried, no local disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from deltalake import DeltaTable

from mmlake.ingest import EmbeddedBroker, IngestSettings, MultimodalProducer, ensure_topic, run_ingest
from tests.fixtures.streams import Expected, produce_mixed
from tests.lineage.schemas import SPEC_PRESENT, validate_event

pytestmark = pytest.mark.slow


def _rows(settings: IngestSettings, table: str, columns: list[str] | None = None) -> list[dict]:
    dt = DeltaTable(f"{settings.lake}/s/{table}", storage_options=dict(settings.storage_options))
    return dt.to_pyarrow_table(columns=columns).to_pylist()


def _assert_exactly_once(settings: IngestSettings, exp: Expected) -> None:
    assert Counter(r["record_id"] for r in _rows(settings, "raw", ["record_id"])) == exp.raw_ids
    assert Counter(r["record_id"] for r in _rows(settings, "late", ["record_id"])) == exp.late_ids
    assert len(_rows(settings, "dlq", ["kafka_offset"])) == exp.dlq
    positions = [
        (r["kafka_partition"], r["kafka_offset"])
        for t in ("raw", "late", "dlq")
        for r in _rows(settings, t, ["kafka_partition", "kafka_offset"])
    ]
    assert len(set(positions)) == len(positions)
    assert len(positions) + exp.duplicates == exp.sent


def _env(settings: IngestSettings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMLAKE_")}
    env.update(
        MMLAKE_LAKE=settings.lake,
        MMLAKE_STORAGE_OPTIONS=json.dumps(dict(settings.storage_options)),
        MMLAKE_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        MMLAKE_ALLOWED_LATENESS_S="120",
        MMLAKE_BATCH_MAX_RECORDS="7",
    )
    env.update(extra)
    return env


RUN = (
    "import sys; from mmlake.ingest import IngestSettings, run_ingest; "
    "print(run_ingest(sys.argv[1], 's', IngestSettings()).line())"
)


def test_ingest_into_s3_is_exactly_once_and_its_lineage_is_kept_there(
    prefect_harness, producer, new_topic, s3_settings, default_lineage, capsys, monkeypatch
) -> None:
    from mmlake.flows.cli import main
    from mmlake.flows.ingest import ingest_stream

    # The flows read the store's credentials from the environment, as a deployment's worker would.
    monkeypatch.setenv("MMLAKE_STORAGE_OPTIONS", json.dumps(dict(s3_settings.storage_options)))
    topic = new_topic(partitions=2)
    exp = produce_mixed(producer, topic, partitions=2, per_partition=24)
    settings = s3_settings.with_overrides(allowed_lateness_s=120)
    # Settings as a deployment passes them (JSON, no credentials): validated on the "worker", whose
    # environment gives the rest.
    first = ingest_stream(
        topic=topic,
        stream="s",
        settings={
            "lake": settings.lake,  # type: ignore[arg-type]
            "kafka_bootstrap": settings.kafka_bootstrap,
            "allowed_lateness_s": 120,
        },
    )
    assert first.accepted == sum(exp.raw_ids.values())
    again = run_ingest(topic, "s", settings)
    assert (again.accepted, again.batches) == (0, 0)
    _assert_exactly_once(settings, exp)

    # Lineage on the object store: an append-only Delta table beside the stream, every event valid.
    events = DeltaTable(f"{settings.lake}/_lineage/events", storage_options=dict(settings.storage_options))
    kept = [json.loads(e) for e in events.to_pyarrow_table(columns=["event"]).column("event").to_pylist()]
    assert sorted(e["eventType"] for e in kept) == ["COMPLETE", "COMPLETE", "START", "START"]
    if SPEC_PRESENT:
        for event in kept:
            validate_event(event)
    # ... and the lineage query reads it through the storage options (no local file anywhere).
    capsys.readouterr()
    assert main(["lineage", "graph", "--lake", settings.lake, "--dataset", "s/raw"]) == 0
    graph = capsys.readouterr().out
    assert f"kafka://{settings.kafka_bootstrap}:{topic}" in graph and "ingest-stream.s" in graph
    record = _rows(settings, "raw", ["record_id"])[0]["record_id"]
    assert main(["lineage", "explain", "--lake", settings.lake, "--stream", "s", "--record-id", record]) == 0
    explained = capsys.readouterr().out
    assert "delta: s/raw version 1" in explained and "written by: ingest-stream.s.ingest-micro-batches" in explained


def test_two_writers_and_a_kill_on_s3_stay_exactly_once(producer, new_topic, s3_settings) -> None:
    topic = new_topic(partitions=2)
    exp = produce_mixed(producer, topic, partitions=2, per_partition=60)
    # Killed inside its second batch, between commits; then two writers race for the rest.
    killed = subprocess.run(
        [sys.executable, "-c", RUN, topic],
        env=_env(s3_settings, MMLAKE_FAULT_KILL_AT="after_commit:raw:2"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RUN, topic],
            env=_env(s3_settings),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        assert out.startswith("ingested stream=s")
    _assert_exactly_once(s3_settings.with_overrides(allowed_lateness_s=120), exp)


def test_preprocess_drift_backfill_and_cache_warmup_on_s3(broker, new_topic, s3_settings, operator_cache) -> None:
    from mmlake.cache.warmup import new_drift_alarm, precompute_keys
    from mmlake.ingest import synth
    from mmlake.preprocessing import run_backfill, run_preprocess
    from mmlake.preprocessing.drift import DriftSettings, run_drift

    topic = new_topic(partitions=2)
    start_ms = 1_767_225_600_000
    with MultimodalProducer(broker.bootstrap) as producer:
        for part in synth.samples(60, start_ms=start_ms, span_ms=3_600_000, seed=3, image_size=32):
            producer.send(
                topic,
                part.payload,
                part.modality,
                event_time=part.event_time_ms,
                sample_id=part.sample_id,
                content_type=part.content_type,
            )
    ingested = run_ingest(topic, "s", s3_settings)
    options = dict(s3_settings.storage_options)
    features = run_preprocess(s3_settings.lake, "s", storage_options=options)
    assert features.rows == ingested.accepted and features.errors == 0
    assert run_preprocess(s3_settings.lake, "s", storage_options=options).rows == 0  # nothing missing
    drift_settings = DriftSettings(reference=32, window=8, step=4, codes=4)
    drift = run_drift(s3_settings.lake, "s", drift_settings, storage_options=options)
    assert drift.windows > 0 and drift.rows > 0
    assert run_drift(s3_settings.lake, "s", drift_settings, storage_options=options).rows == 0
    version = DeltaTable(f"{s3_settings.lake}/s/features", storage_options=options).version()
    redo = run_backfill(
        s3_settings.lake, "s", "2026-01-01T00:00:00Z", "2026-01-01T00:30:00Z", force=True, storage_options=options
    )
    assert redo.rows > 0 and redo.commits == 1
    rerun = run_backfill(s3_settings.lake, "s", "2026-01-01T00:00:00Z", "2026-01-01T00:30:00Z", storage_options=options)
    assert rerun.rows == 0 and rerun.skipped_ranges == 1
    assert DeltaTable(f"{s3_settings.lake}/s/features", storage_options=options).version() == version + 1
    keyed, versions = precompute_keys(s3_settings.lake, "s", storage_options=options)
    assert keyed == features.rows and len(versions) == 2  # image rows are 1280 wide, text and audio 384
    assert precompute_keys(s3_settings.lake, "s", storage_options=options)[0] == 0
    assert new_drift_alarm(s3_settings.lake, "s", storage_options=options) is bool(
        [r for r in _rows(s3_settings, "drift", ["alarm"]) if r["alarm"]]
    )


def test_a_durable_broker_killed_mid_stream_loses_nothing(s3_server, s3_bucket, tmp_path) -> None:
    bucket = s3_bucket()
    aws = {
        "AWS_ENDPOINT": s3_server,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }
    first = EmbeddedBroker(storage=f"s3://{bucket}/", env=aws).start()
    port = first.port
    settings = IngestSettings(lake=str(tmp_path / "lake"), kafka_bootstrap=first.bootstrap, batch_max_records=10)
    sent = 0
    try:
        ensure_topic(first.bootstrap, "durable", partitions=2)
        with MultimodalProducer(first.bootstrap) as producer:
            for i in range(40):
                producer.send("durable", f"r{i}".encode(), "text", event_time=1_767_225_600_000 + i, partition=i % 2)
                sent += 1
        assert run_ingest("durable", "s", settings, max_records=20).accepted == 20
    finally:
        assert first._proc is not None
        os.killpg(first._proc.pid, signal.SIGKILL)  # kill -9: nothing flushed on the way out
        first._proc.wait()
        first._proc = None
    second = EmbeddedBroker(port=port, storage=f"s3://{bucket}/", env=aws).start()
    try:
        with MultimodalProducer(second.bootstrap) as producer:
            for i in range(40, 60):
                producer.send("durable", f"r{i}".encode(), "text", event_time=1_767_225_600_000 + i, partition=i % 2)
                sent += 1
        deadline = time.monotonic() + 30
        total = 20
        while total < sent and time.monotonic() < deadline:
            total += run_ingest("durable", "s", settings).accepted
    finally:
        second.stop()
    payloads = sorted(
        r["payload"] for r in DeltaTable(f"{settings.lake}/s/raw").to_pyarrow_table(columns=["payload"]).to_pylist()
    )
    assert payloads == sorted(f"r{i}".encode() for i in range(60))
