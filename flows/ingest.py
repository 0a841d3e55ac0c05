"""The ingest flow: one Kafka topic into one stream's Delta tables, as a Prefect flow run.

The flow is thin: the work is :func:`ingest.run_ingest`, which is exactly-once, so Prefect's task
retries on transient broker errors are safe (a retry resumes from the offsets in the Delta log).
"""

from __future__ import annotations

import threading
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from ingest import BrokerUnavailableError, CommitConflictError, IngestSettings, IngestSummary, run_ingest
from lineage import LineageEmitter
from lineage.datasets import delta_output, kafka_input


#: Set by the CLI's signal handler: a following run finishes its current micro-batch and returns.
STOP = threading.Event()


def _is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a failed ingest task only for faults that a later attempt can get past."""
    try:
        state.result()
    except (BrokerUnavailableError, CommitConflictError):
        return True
    except Exception:
        return False
    return False


@task(
    name="ingest-micro-batches",
    retries=3,
    retry_delay_seconds=[2, 5, 15],
    retry_condition_fn=_is_transient,
)
def ingest_task(
    topic: str,
    stream: str,
    settings: IngestSettings,
    partitions: list[int] | None,
    follow: bool,
    max_records: int | None,
    lineage_parent: tuple[str, str] | None = None,
) -> IngestSummary:
    from prefect.runtime import task_run

    logger = get_run_logger()
    emitter = LineageEmitter(settings.lake)
    job = f"{lineage_parent[0]}.ingest-micro-batches" if lineage_parent else f"ingest-stream.{stream}.task"
    run_id = str(task_run.id)
    processing = "STREAMING" if follow else "BATCH"
    inputs = [kafka_input(settings.kafka_bootstrap, topic)]
    emitter.emit("START", job, run_id, job_type="TASK", processing=processing, parent=lineage_parent, inputs=inputs)

    def report(summary: IngestSummary) -> None:
        logger.info(summary.line())

    try:
        summary = run_ingest(
            topic,
            stream,
            settings,
            partitions=partitions,
            follow=follow,
            max_records=max_records,
            on_batch=report,
            stop=STOP,
        )
    except BaseException as err:
        emitter.emit("FAIL", job, run_id, job_type="TASK", processing=processing, parent=lineage_parent,
                     inputs=inputs, error=err)
        raise
    emitter.emit("COMPLETE", job, run_id, job_type="TASK", processing=processing, parent=lineage_parent,
                 inputs=[kafka_input(settings.kafka_bootstrap, topic, summary)],
                 outputs=stream_outputs(settings, stream, summary))
    return summary


def stream_outputs(settings: IngestSettings, stream: str, summary: IngestSummary | None) -> list[Any]:
    """raw, late and dlq as OpenLineage outputs at their current Delta versions."""
    from ingest.tables import StreamTables

    tables = StreamTables(settings.lake, stream, dict(settings.storage_options))
    rows = {"raw": summary.accepted, "late": summary.late, "dlq": summary.dead_lettered} if summary else {}
    size = summary.payload_bytes if summary else None
    return [delta_output(tables.uri(name), tables.open(name), rows.get(name), size if name == "raw" else None)
            for name in ("raw", "late", "dlq")]


@flow(name="ingest-stream", log_prints=False)
def ingest_stream(
    topic: str,
    stream: str,
    lake: str | None = None,
    bootstrap: str | None = None,
    partitions: list[int] | None = None,
    follow: bool = False,
    max_records: int | None = None,
    allowed_lateness_s: float | None = None,
) -> dict[str, Any]:
    """Ingest what ``topic`` holds now (or keep following it) into ``<lake>/<stream>``.

    Unset parameters come from the ``MMLAKE_...`` environment (see docs/configuration.md).
    Returns the run summary as a dict (accepted, late, duplicates, dead_lettered, offsets, ...).
    """
    from prefect.runtime import flow_run

    settings = IngestSettings().with_overrides(
        lake=lake, kafka_bootstrap=bootstrap, allowed_lateness_s=allowed_lateness_s
    )
    emitter = LineageEmitter(settings.lake)
    job, run_id = f"ingest-stream.{stream}", str(flow_run.id)
    processing = "STREAMING" if follow else "BATCH"
    inputs = [kafka_input(settings.kafka_bootstrap, topic)]
    emitter.emit("START", job, run_id, processing=processing, inputs=inputs)
    try:
        summary = ingest_task(topic, stream, settings, partitions, follow, max_records, (job, run_id))
    except BaseException as err:
        emitter.emit("FAIL", job, run_id, processing=processing, inputs=inputs, error=err)
        raise
    emitter.emit("COMPLETE", job, run_id, processing=processing,
                 inputs=[kafka_input(settings.kafka_bootstrap, topic, summary)],
                 outputs=stream_outputs(settings, stream, summary))
    create_markdown_artifact(
        key=f"ingest-{stream}".lower().replace("_", "-"),
        markdown=_summary_markdown(summary),
        description=summary.line(),
    )
    return summary.as_dict()


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
