"""The scheduled pipeline's flow, run once in process: ingest, then preprocess, then drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmlake.ingest.synth import samples
from mmlake.lake import StreamTables

T0_MS = 1_767_225_600_000


@pytest.mark.slow
def test_pipeline_runs_its_stages_in_order_and_emits_lineage(
    prefect_harness, producer, new_topic, settings, default_lineage
) -> None:
    from mmlake.flows.pipeline import stream_pipeline

    topic = new_topic(partitions=1)
    for part in samples(8, start_ms=T0_MS, span_ms=60_000, seed=2, image_size=32):
        producer.send(topic, part.payload, part.modality, event_time=part.event_time_ms, sample_id=part.sample_id)
    producer.flush()
    out = stream_pipeline(topic=topic, stream="p", settings=settings)
    assert out.stages == ["ingest", "preprocess", "drift"]
    assert out.ingest is not None and out.preprocess is not None and out.drift is not None
    assert out.ingest.accepted == 8 * 2 + 2
    assert out.preprocess.summary.rows == out.ingest.accepted
    assert out.drift.summary.status.startswith("collecting the reference: 8 of 1024")
    tables = StreamTables(settings.lake, "p")
    assert tables.open("features").to_pyarrow_dataset().count_rows() == 18

    again = stream_pipeline(topic=topic, stream="p", settings=settings)
    assert again.ingest is not None and again.preprocess is not None
    assert again.ingest.accepted == 0 and again.preprocess.summary.rows == 0  # nothing new: nothing written

    events = [json.loads(line) for line in (Path(settings.lake) / "_lineage/events.jsonl").read_text().splitlines()]
    done = [e for e in events if e["job"]["name"] == "stream-pipeline.p" and e["eventType"] == "COMPLETE"]
    assert len(done) == 2
    assert {o["name"].rsplit("/", 1)[-1] for o in done[0]["outputs"]} == {"raw", "features"}
    assert done[0]["inputs"][0]["name"] == topic
