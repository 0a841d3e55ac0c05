"""The ingest flow: one Kafka topic into one stream's Delta tables, as a Prefect flow run.

The flow is thin: the work is :func:`mmlake.ingest.run_ingest`, which is exactly-once, so Prefect's
task retries on transient broker errors are safe (a retry resumes from the offsets in the Delta log).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from mmlake.flows.retry import ingest_is_transient
from mmlake.flows.stages import artifact_key
from mmlake.ingest import IngestSettings, IngestSummary, run_ingest
from mmlake.lineage import LineageEmitter
from mmlake.lineage.datasets import kafka_input, table_outputs


@task(
    name="ingest-micro-batches",
    retries=3,
    retry_delay_seconds=[2, 5, 15],
    retry_condition_fn=ingest_is_transient,
    cache_policy=NO_CACHE,  # takes a cancel event; results are never reused anyway
)
def ingest_task(
    topic: str,
    stream: str,
    settings: IngestSettings,
    partitions: list[int] | None,
    follow: bool,
    max_records: int | None,
    lineage_parent: tuple[str, str] | None = None,
    cancel: Any = None,
) -> IngestSummary:
    from prefect.runtime import task_run

    logger = get_run_logger()
    job = f"{lineage_parent[0]}.ingest-micro-batches" if lineage_parent else f"ingest-stream.{stream}.task"
    inputs = [kafka_input(settings.kafka_bootstrap, topic)]
    with LineageEmitter.for_lake(settings).run(
        job,
        str(task_run.id),
        job_type="TASK",
        parent=lineage_parent,
        processing="STREAMING" if follow else "BATCH",
        inputs=inputs,
    ) as run:
        summary = run_ingest(
            topic,
            stream,
            settings,
            partitions=partitions,
            follow=follow,
            max_records=max_records,
            stop=cancel,
            on_batch=lambda s: logger.info(s.line()),
        )
        run.complete(
            inputs=[kafka_input(settings.kafka_bootstrap, topic, summary)],
            outputs=stream_outputs(settings, stream, summary),
        )
    return summary


def stream_outputs(settings: IngestSettings, stream: str, summary: IngestSummary | None) -> list[Any]:
    """raw, late and dlq as OpenLineage outputs at their current Delta versions."""
    rows = {"raw": summary.accepted, "late": summary.late, "dlq": summary.dead_lettered} if summary else {}
    sizes = {"raw": summary.payload_bytes} if summary else {}
    return table_outputs(settings.tables(stream), ("raw", "late", "dlq"), rows, sizes)


@flow(name="ingest-stream", log_prints=False)
def ingest_stream(
    topic: str,
    stream: str,
    settings: IngestSettings | None = None,
    partitions: list[int] | None = None,
    follow: bool = False,
    max_records: int | None = None,
    cancel: Any = None,
) -> IngestSummary:
    """Ingest what ``topic`` holds now (or keep following it) into ``<lake>/<stream>``.

    ``settings``: the lake, the broker and how to read it (default: the ``MMLAKE_...`` environment, see
    docs/configuration.md; a deployment passes the fields it sets, the worker's environment gives the
    rest and the storage credentials). ``cancel`` (a ``threading.Event``, in-process runs only): once
    set, a following run finishes its current micro-batch and returns. Returns the run's summary.
    """
    from prefect.runtime import flow_run

    settings = settings or IngestSettings()
    job = f"ingest-stream.{stream}"
    inputs = [kafka_input(settings.kafka_bootstrap, topic)]
    with LineageEmitter.for_lake(settings).run(
        job, str(flow_run.id), processing="STREAMING" if follow else "BATCH", inputs=inputs
    ) as run:
        summary = ingest_task(topic, stream, settings, partitions, follow, max_records, (job, str(flow_run.id)), cancel)
        run.complete(
            inputs=[kafka_input(settings.kafka_bootstrap, topic, summary)],
            outputs=stream_outputs(settings, stream, summary),
        )
    create_markdown_artifact(
        key=artifact_key("ingest", stream),
        markdown=_summary_markdown(summary),
        description=summary.line(),
    )
    return summary


def _summary_markdown(summary: IngestSummary) -> str:
    rows = [
        ("accepted", summary.accepted),
        ("late", summary.late),
        ("duplicates", summary.duplicates),
        ("dead-lettered", summary.dead_lettered),
        ("micro-batches", summary.batches),
        ("watermark", summary.watermark),
    ]
    lines = [f"### Ingest of `{summary.topic}` into `{summary.stream}`", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "| partition | first offset | last offset |", "|---|---|---|"]
    lines += [f"| {p} | {a} | {b} |" for p, (a, b) in sorted(summary.offsets.items())]
    return "\n".join(lines)
