"""OpenLineage emission from the flows, validated against the spec, and the local lineage query."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from deltalake import DeltaTable
from jsonschema import ValidationError

from mmlake.ingest import IngestSettings
from mmlake.lineage import LineageEmitter, LineageSettings, default_events_path, static_run_id
from mmlake.lineage.query import LineageQueryError, explain_record, lineage_graph, load_events
from tests.fixtures.streams import produce_mixed
from tests.lineage.schemas import validate_event

pytestmark = pytest.mark.slow


def events_of(lake: str) -> list[dict]:
    return [json.loads(line) for line in Path(default_events_path(lake)).read_text().splitlines() if line.strip()]


@pytest.fixture
def ingested(prefect_harness, producer, new_topic, settings, default_lineage):
    from mmlake.flows.ingest import ingest_stream

    topic = new_topic(partitions=2)
    produce_mixed(producer, topic, partitions=2, per_partition=12)
    result = ingest_stream(topic=topic, stream="s", settings=settings.with_overrides(allowed_lateness_s=120))
    return settings, topic, result


def test_ingest_flow_events_validate_and_link(ingested) -> None:
    settings, topic, result = ingested
    events = events_of(settings.lake)
    assert [e["eventType"] for e in events] == ["START", "START", "COMPLETE", "COMPLETE"]
    for event in events:
        validate_event(event)
    flow_start, task_start, task_done, flow_done = events
    assert flow_start["run"]["runId"] == flow_done["run"]["runId"] != task_start["run"]["runId"]
    assert task_start["run"]["runId"] == task_done["run"]["runId"]
    parent = task_done["run"]["facets"]["parent"]
    assert parent["run"]["runId"] == flow_start["run"]["runId"]
    assert parent["job"]["name"] == flow_start["job"]["name"] == "ingest-stream.s"
    assert parent["root"]["run"]["runId"] == flow_start["run"]["runId"]
    assert flow_start["job"]["namespace"] == "mmlake"
    assert task_done["job"]["facets"]["jobType"]["jobType"] == "TASK"
    # Datasets by the naming spec: the topic under kafka://host:port, tables by absolute path under file.
    (kafka,) = task_done["inputs"]
    assert (kafka["namespace"], kafka["name"]) == (f"kafka://{settings.kafka_bootstrap}", topic)
    facet = kafka["inputFacets"]["mmlake_kafka"]
    assert (facet["accepted"], facet["late"], facet["duplicates"], facet["deadLettered"]) == (
        result.accepted,
        result.late,
        result.duplicates,
        result.dead_lettered,
    )
    assert {(p["partition"], p["firstOffset"], p["lastOffset"]) for p in facet["partitions"]} == {
        (0, 0, 11),
        (1, 0, 11),
    }
    outputs = {o["name"]: o for o in task_done["outputs"]}
    raw_path = str(Path(settings.lake, "s", "raw").resolve())
    assert set(outputs) == {raw_path, raw_path[:-3] + "late", raw_path[:-3] + "dlq"}
    raw = outputs[raw_path]
    assert raw["namespace"] == "file"
    assert raw["facets"]["version"]["datasetVersion"] == str(DeltaTable(raw_path).version())
    assert raw["facets"]["storage"]["storageLayer"] == "delta"
    assert "payload" in {f["name"] for f in raw["facets"]["schema"]["fields"]}
    assert raw["outputFacets"]["outputStatistics"]["rowCount"] == result.accepted


def test_graph_and_explain(ingested) -> None:
    settings, topic, _ = ingested
    graph = lineage_graph(load_events(settings.lake), "s/raw", depth=1)
    kafka = f"dataset:kafka://{settings.kafka_bootstrap}:{topic}"
    job = "job:mmlake:ingest-stream.s.ingest-micro-batches"
    raw = f"dataset:file:{Path(settings.lake, 's', 'raw').resolve()}"
    assert (kafka, job) in graph["edges"] and (job, raw) in graph["edges"]
    with pytest.raises(LineageQueryError, match="no dataset"):
        lineage_graph(load_events(settings.lake), "nowhere")

    row = (
        DeltaTable(raw[len("dataset:file:") :])
        .to_pyarrow_table(columns=["record_id", "kafka_partition", "kafka_offset"])
        .to_pylist()[3]
    )
    info = explain_record(settings.lake, "s", row["record_id"])
    assert info["kafka"] == {"topic": topic, "partition": row["kafka_partition"], "offset": row["kafka_offset"]}
    history = DeltaTable(raw[len("dataset:file:") :]).history()
    writes = [h["version"] for h in history if h.get("operationMetrics", {}).get("num_added_rows", 0) > 0]
    assert info["delta_version"] in writes
    assert info["written_by"]["job"] == "ingest-stream.s.ingest-micro-batches"
    assert info["features"] is None and info["drift_windows"] is None
    with pytest.raises(LineageQueryError, match="neither raw nor late"):
        explain_record(settings.lake, "s", "no-such-record")

    # With features and drift tables in the shapes ARCHITECTURE.md gives them, explain follows on.
    import pyarrow as pa
    from deltalake import write_deltalake

    event_time = (
        DeltaTable(raw[len("dataset:file:") :])
        .to_pyarrow_table(columns=["record_id", "event_time"])
        .to_pylist()[3]["event_time"]
    )
    write_deltalake(
        f"{settings.lake}/s/features",
        pa.table(
            {
                "record_id": [row["record_id"], "other"],
                "op_name": ["clip-image", "clip-image"],
                "op_version": ["1", "1"],
                "op_sha256": ["ab" * 32, "ab" * 32],
            }
        ),
    )
    ts = pa.timestamp("us", tz="UTC")
    from datetime import timedelta

    write_deltalake(
        f"{settings.lake}/s/drift",
        pa.table(
            {
                "window_start": pa.array([event_time - timedelta(minutes=1), event_time + timedelta(minutes=1)], ts),
                "window_end": pa.array([event_time + timedelta(minutes=1), event_time + timedelta(minutes=2)], ts),
                "metric": ["mi", "mi"],
                "value": [0.5, 0.4],
                "alarm": [False, True],
            }
        ),
    )
    info = explain_record(settings.lake, "s", row["record_id"])
    assert info["features"] == 1 and info["operators"] == [("clip-image", "1", "ab" * 32)]
    assert len(info["drift_windows"]) == 1 and info["drift_windows"][0]["alarm"] is False


def test_failed_flow_emits_fail_with_the_error(prefect_harness, broker, tmp_path, default_lineage, monkeypatch) -> None:
    import mmlake.flows.ingest as module

    monkeypatch.setattr(module, "ingest_task", module.ingest_task.with_options(retry_delay_seconds=0))
    settings = IngestSettings(lake=str(tmp_path), kafka_bootstrap=broker.bootstrap)
    state = module.ingest_stream(topic="no-such-topic", stream="s", settings=settings, return_state=True)
    assert state.is_failed()
    events = events_of(str(tmp_path))
    assert [e["eventType"] for e in events] == ["START", "START", "FAIL", "FAIL"]
    for event in events:
        validate_event(event)
    assert "does not exist" in events[2]["run"]["facets"]["errorMessage"]["message"]


def test_custom_facet_schemas_reject_bad_values() -> None:
    from mmlake.lineage.facets import MmlakeOnnxOperatorsRunFacet
    from tests.lineage.schemas import MISSING, REGISTRY, SPEC_PRESENT

    if not SPEC_PRESENT:
        pytest.skip(MISSING)
    from jsonschema import Draft202012Validator
    from openlineage.client.serde import Serde

    good = {
        "name": "clip-image",
        "version": "1",
        "sha256": "a" * 64,
        "opset": 18,
        "ortVersion": "1.20",
        "executionProvider": "CPUExecutionProvider",
    }
    facet = json.loads(Serde.to_json(MmlakeOnnxOperatorsRunFacet(operators=[good])))
    validator = Draft202012Validator({"$ref": facet["_schemaURL"]}, registry=REGISTRY)
    validator.validate(facet)
    facet["operators"][0]["sha256"] = "not-a-hash"
    with pytest.raises(ValidationError):
        validator.validate(facet)


def test_dead_endpoint_does_not_hold_a_run(tmp_path, monkeypatch, default_lineage) -> None:
    """An HTTP endpoint that accepts and never answers costs at most the timeout per event."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    threading.Thread(target=hold, daemon=True).start()
    monkeypatch.setenv("OPENLINEAGE_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        emitter = LineageEmitter(str(tmp_path), LineageSettings(timeout_s=0.5))
        started = time.monotonic()
        for _ in range(3):
            emitter.emit("START", "job", "01890000-0000-7000-8000-000000000000")
        assert time.monotonic() - started < 3 * 0.5 + 1.0
        assert accepted, "the HTTP transport did connect"
        assert not Path(default_events_path(str(tmp_path))).exists()  # configured: no file fallback
    finally:
        stop.set()
        listener.close()


def test_disabled_emits_nothing(tmp_path, monkeypatch, default_lineage) -> None:
    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    LineageEmitter(str(tmp_path)).emit("START", "job", "01890000-0000-7000-8000-000000000000")
    assert not Path(default_events_path(str(tmp_path))).exists()


def test_static_run_ids_identify_backfill_reruns() -> None:
    a, b = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    assert static_run_id("backfill.s", a, b) == static_run_id("backfill.s", a, b)
    assert static_run_id("backfill.s", a, b) != static_run_id("backfill.s", a, datetime(2026, 1, 3, tzinfo=UTC))
    assert static_run_id("backfill.s", a, b) != static_run_id("backfill.t", a, b)


def test_kafka_transport_against_the_embedded_broker(broker, new_topic, tmp_path, monkeypatch, default_lineage) -> None:
    from kafka import KafkaConsumer, TopicPartition

    topic = new_topic()
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "kafka")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TOPIC", topic)
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__CONFIG", json.dumps({"bootstrap.servers": broker.bootstrap}))
    emitter = LineageEmitter(str(tmp_path))
    run_id = "01890000-0000-7000-8000-000000000001"
    emitter.emit("START", "kafka-transport-job", run_id)
    emitter.emit("COMPLETE", "kafka-transport-job", run_id)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    got: list[dict] = []
    deadline = time.monotonic() + 15
    while len(got) < 2 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got += [json.loads(r.value) for r in records]
    consumer.close()
    assert [e["eventType"] for e in got] == ["START", "COMPLETE"]
    for event in got:
        validate_event(event)
    assert not Path(default_events_path(str(tmp_path))).exists()


def test_lineage_cli(ingested, capsys) -> None:
    from mmlake.flows.cli import main

    settings, topic, _ = ingested
    assert main(["lineage", "graph", "--lake", settings.lake, "--dataset", "s/raw"]) == 0
    out = capsys.readouterr().out
    assert (
        f"dataset:kafka://{settings.kafka_bootstrap}:{topic} -> job:mmlake:ingest-stream.s.ingest-micro-batches" in out
    )
    record = DeltaTable(f"{settings.lake}/s/raw").to_pyarrow_table(columns=["record_id"]).column(0)[0].as_py()
    assert main(["lineage", "explain", "--lake", settings.lake, "--stream", "s", "--record-id", record]) == 0
    out = capsys.readouterr().out
    assert f"kafka: topic {topic} partition" in out and "written by: ingest-stream.s.ingest-micro-batches" in out
    assert main(["lineage", "explain", "--lake", settings.lake, "--stream", "s", "--record-id", "nope"]) == 1
    assert capsys.readouterr().err.strip().startswith("mmlake: error: record 'nope'")


def test_run_context_emits_start_then_complete_or_fail(tmp_path, default_lineage) -> None:
    """Every flow and task wraps its work in LineageEmitter.run: START on entry, then COMPLETE with what
    the block reported, or FAIL with the error (which still propagates)."""
    from mmlake.lineage.datasets import delta_output
    from mmlake.lineage.naming import storage_dataset

    lake = str(tmp_path / "lake")
    emitter = LineageEmitter(lake)
    calls = iter(range(100))

    def inputs() -> list:  # evaluated when each event is built
        from openlineage.client.event_v2 import InputDataset

        return [InputDataset(namespace="file", name=f"read-{next(calls)}")]

    out = delta_output(f"{lake}/s/raw", None, rows=3)
    with emitter.run("job.ok", "0190e2a4-0000-7000-8000-000000000001", inputs=inputs) as run:
        run.complete(outputs=[out])
    with (
        pytest.raises(RuntimeError, match="boom"),
        emitter.run(
            "job.bad",
            "0190e2a4-0000-7000-8000-000000000002",
            job_type="TASK",
            parent=("job.ok", "0190e2a4-0000-7000-8000-000000000001"),
            inputs=inputs,
        ),
    ):
        raise RuntimeError("boom")
    events = events_of(lake)
    assert [(e["eventType"], e["job"]["name"]) for e in events] == [
        ("START", "job.ok"),
        ("COMPLETE", "job.ok"),
        ("START", "job.bad"),
        ("FAIL", "job.bad"),
    ]
    assert [e["inputs"][0]["name"] for e in events] == ["read-0", "read-1", "read-2", "read-3"]
    assert events[1]["outputs"][0]["name"] == storage_dataset(f"{lake}/s/raw")[1]
    assert events[1]["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 3
    assert events[3]["run"]["facets"]["errorMessage"]["message"] == "boom"
    assert events[3]["run"]["facets"]["parent"]["run"]["runId"] == events[0]["run"]["runId"]
    assert events[2]["job"]["facets"]["jobType"]["jobType"] == "TASK"
