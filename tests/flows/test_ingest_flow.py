"""The Prefect ingest flow on one session-wide test API."""

from __future__ import annotations

import asyncio

import pytest

from mmlake.ingest import BrokerUnavailableError, IngestSettings
from mmlake.ingest.broker import free_port
from tests.fixtures.streams import produce_mixed

pytestmark = pytest.mark.slow


def _task_runs(flow_run_id):
    """The task runs of a flow run, read back from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))

    return asyncio.run(read())


def test_flow_ingests_and_reports(prefect_harness, producer, new_topic, settings) -> None:
    from mmlake.flows.ingest import ingest_stream

    topic = new_topic(partitions=2)
    exp = produce_mixed(producer, topic, partitions=2, per_partition=12)
    result = ingest_stream(topic=topic, stream="s", settings=settings.with_overrides(allowed_lateness_s=120))
    assert result.accepted == sum(exp.raw_ids.values())
    assert (result.late, result.dead_lettered, result.duplicates) == (
        sum(exp.late_ids.values()),
        exp.dlq,
        exp.duplicates,
    )
    again = ingest_stream(topic=topic, stream="s", settings=settings)
    assert again.accepted == 0 and again.batches == 0


def test_transient_broker_errors_are_retried_then_fail(prefect_harness, monkeypatch, tmp_path) -> None:
    import mmlake.flows.ingest as module

    monkeypatch.setenv("MMLAKE_KAFKA_TIMEOUT_S", "0.5")
    monkeypatch.setattr(module, "ingest_task", module.ingest_task.with_options(retry_delay_seconds=0))
    settings = IngestSettings(lake=str(tmp_path), kafka_bootstrap=f"127.0.0.1:{free_port()}")
    state = module.ingest_stream(topic="t", stream="s", settings=settings, return_state=True)
    assert state.is_failed()
    with pytest.raises(BrokerUnavailableError):
        state.result()

    (task_run,) = _task_runs(state.state_details.flow_run_id)
    assert task_run.run_count == 4  # the first attempt and three retries


def test_non_transient_errors_are_not_retried(prefect_harness, broker, monkeypatch, tmp_path) -> None:
    import mmlake.flows.ingest as module

    monkeypatch.setattr(module, "ingest_task", module.ingest_task.with_options(retry_delay_seconds=0))
    settings = IngestSettings(lake=str(tmp_path), kafka_bootstrap=broker.bootstrap)
    state = module.ingest_stream(topic="no-such-topic", stream="s", settings=settings, return_state=True)
    assert state.is_failed()

    (task_run,) = _task_runs(state.state_details.flow_run_id)
    assert task_run.run_count == 1


def test_deployment_runs_on_an_interval_one_at_a_time() -> None:
    from mmlake.flows.deployments import ingest_deployment

    deployment = ingest_deployment("t", "s", interval_s=45)
    (schedule,) = deployment.schedules
    assert schedule.schedule.interval.total_seconds() == 45
    assert deployment.concurrency_limit == 1 or deployment.concurrency_limit.limit == 1
    assert deployment.parameters["topic"] == "t" and deployment.parameters["stream"] == "s"


def test_prefect_yaml_points_at_the_flow() -> None:
    from pathlib import Path

    import yaml
    from prefect.flows import load_flow_from_entrypoint

    spec = yaml.safe_load((Path(__file__).parents[2] / "flows" / "prefect.yaml").read_text())
    names = {
        "mmlake.flows.pipeline.stream_pipeline": "stream-pipeline",
        "mmlake.flows.cache.cache_warmup": "cache-warmup",
        "mmlake.flows.backfill.backfill": "backfill",
    }
    assert {d["entrypoint"] for d in spec["deployments"]} == set(names)
    for deployment in spec["deployments"]:
        flow = load_flow_from_entrypoint(deployment["entrypoint"])  # as a Prefect worker loads it
        assert flow.name == names[deployment["entrypoint"]]
        if "schedules" in deployment:  # the backfill deployment runs on demand, with parameters
            assert deployment["schedules"][0]["interval"] > 0
        assert set(deployment["parameters"]) <= set(flow.parameters.properties)


def test_pipeline_and_cache_deployments_run_one_at_a_time() -> None:
    from mmlake.errors import InputError
    from mmlake.flows.deployments import cache_warmup_deployment, pipeline_deployment
    from mmlake.flows.stages import parse_pipeline_stages

    pipe = pipeline_deployment("t", "s", partitions=[0, 2], interval_s=30)
    assert pipe.name == "pipeline-s-p0-2" and pipe.parameters["partitions"] == [0, 2]
    assert pipe.parameters["stages"] == "ingest,preprocess,drift"
    assert pipe.concurrency_limit == 1 or pipe.concurrency_limit.limit == 1
    warm = cache_warmup_deployment("s", interval_s=120)
    assert warm.name == "cache-warmup-s"
    assert warm.concurrency_limit == 1 or warm.concurrency_limit.limit == 1
    assert parse_pipeline_stages("drift, ingest") == ["ingest", "drift"]
    with pytest.raises(InputError, match="unknown pipeline stage"):
        parse_pipeline_stages("ingest,train")
