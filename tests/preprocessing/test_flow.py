"""The preprocessing and backfill flows end to end: broker -> ingest -> features, with lineage and artifacts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmlake.ingest import run_ingest
from mmlake.ingest.synth import samples
from mmlake.lake import StreamTables

ROOT = Path(__file__).parents[2]
T0_MS = 1_767_225_600_000
DAY_MS = 86_400_000


@pytest.fixture
def ingested(broker, producer, new_topic, settings, default_lineage):
    topic = new_topic(partitions=1)
    for part in samples(10, start_ms=T0_MS, span_ms=2 * DAY_MS, seed=11, image_size=40):
        producer.send(topic, part.payload, part.modality, event_time=part.event_time_ms, sample_id=part.sample_id)
    producer.flush()
    summary = run_ingest(topic, "demo", settings)
    assert summary.accepted > 0
    return settings, summary.accepted


def test_preprocess_and_backfill_flows_write_features_lineage_and_artifacts(prefect_harness, ingested) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from mmlake.flows.preprocess import backfill_features, preprocess_stream
    from mmlake.flows.stages import BackfillPlan
    from mmlake.preprocessing.settings import PreprocessSettings

    settings, accepted = ingested
    cpu = PreprocessSettings(provider="cpu", threads=2)
    result = preprocess_stream(stream="demo", lake=settings, settings=cpu).summary
    assert result.rows == accepted and result.errors == 0
    features = StreamTables(settings.lake, "demo").open("features")
    assert features is not None and features.to_pyarrow_table().num_rows == accepted
    again = preprocess_stream(stream="demo", lake=settings, settings=cpu).summary
    assert again.rows == 0

    start, end = "2026-01-01T12:00:00Z", "2026-01-02T12:00:00Z"
    version = features.version()
    back = backfill_features(stream="demo", plan=BackfillPlan(start=start, end=end), lake=settings, settings=cpu)
    assert back.rows == 0 and back.skipped_ranges == 2  # computed already: nothing rewritten
    assert StreamTables(settings.lake, "demo").open("features").version() == version

    import anyio

    async def runs() -> list:
        async with get_client() as client:
            return await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"backfill demo {start}..{end}"]))
            )

    assert len(anyio.run(runs)) == 1  # the run is named after its range

    events = [json.loads(line) for line in (Path(settings.lake) / "_lineage/events.jsonl").read_text().splitlines()]
    done = [e for e in events if e["job"]["name"] == "preprocess-stream.demo" and e["eventType"] == "COMPLETE"]
    assert done, "the preprocessing flow emitted COMPLETE"
    event = done[0]
    assert [i["name"] for i in event["inputs"]][0].endswith("/demo/raw")
    assert event["outputs"][0]["name"].endswith("/demo/features")
    operators = event["run"]["facets"]["mmlake_onnx_operators"]["operators"]
    assert {o["name"] for o in operators} >= {
        "image_preprocess",
        "efficientnet_lite0_in1k",
        "clip_text",
        "audio_logmel",
    }
    assert all(len(o["sha256"]) == 64 and o["executionProvider"] == "CPUExecutionProvider" for o in operators)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmlake.flows.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=240,
    )


def test_cli_errors_are_one_line(tmp_path: Path, operator_cache: str) -> None:
    import os

    env = {**os.environ, "MMLAKE_PREPROCESS_CACHE_DIR": operator_cache}
    missing = _cli("preprocess", "--stream", "nope", "--lake", str(tmp_path / "lake"), env=env)
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("mmlake: error: stream 'nope' has no raw table")
    backwards = _cli(
        "backfill",
        "--stream",
        "s",
        "--from",
        "2026-01-02T00:00:00Z",
        "--to",
        "2026-01-01T00:00:00Z",
        "--lake",
        str(tmp_path / "lake"),
        env=env,
    )
    assert backwards.returncode == 1 and backwards.stderr.strip() == (
        "mmlake: error: --from must be before --to (got 2026-01-02T00:00:00Z .. 2026-01-01T00:00:00Z)"
    )
    from tests.preprocessing.helpers import synth_parts, write_raw

    write_raw(str(tmp_path / "lake"), "s", synth_parts(1))
    unknown = _cli(
        "backfill",
        "--stream",
        "s",
        "--from",
        "2026-01-01T00:00:00Z",
        "--to",
        "2026-01-02T00:00:00Z",
        "--operator",
        "image_clip@9",
        "--lake",
        str(tmp_path / "lake"),
        env=env,
    )
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "mmlake: error: no operator image_clip@9; registered: image_clip@1"
