"""The scheduled pipeline of one stream: ingest, then preprocess, then drift, as subflow runs of one
parent run (so "after it" holds by construction: each stage starts when the one before finished)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prefect import flow

from mmlake.flows.stages import parse_pipeline_stages
from mmlake.ingest.settings import IngestSettings

if TYPE_CHECKING:
    from mmlake.flows.preprocess import PreprocessResult
    from mmlake.ingest.summary import IngestSummary
    from mmlake.preprocessing.drift.report import DriftResult


@dataclass
class PipelineResult:
    """What each stage of a pipeline run did; a stage that had nothing to work on says why in ``skipped``."""

    stream: str
    stages: list[str]
    ingest: IngestSummary | None = None
    preprocess: PreprocessResult | None = None
    drift: DriftResult | None = None
    skipped: dict[str, str] = field(default_factory=dict)


@flow(name="stream-pipeline", flow_run_name="pipeline {stream}", log_prints=False)
def stream_pipeline(
    topic: str,
    stream: str,
    settings: IngestSettings | None = None,
    partitions: list[int] | None = None,
    stages: str = "ingest,preprocess,drift",
) -> PipelineResult:
    """What the topic holds now into ``<lake>/<stream>``, its new features, and the drift windows they
    complete. Every stage is incremental and exactly-once, so a run that finds nothing new writes nothing.
    ``settings``: the lake and the broker (default: the ``MMLAKE_...`` environment)."""
    from prefect.runtime import flow_run

    from mmlake.flows.drift import drift_stream
    from mmlake.flows.ingest import ingest_stream
    from mmlake.flows.preprocess import preprocess_stream
    from mmlake.lineage import LineageEmitter
    from mmlake.lineage.datasets import kafka_input, table_outputs

    chosen = parse_pipeline_stages(stages)
    settings = settings or IngestSettings()
    tables = settings.tables(stream)
    inputs = [kafka_input(settings.kafka_bootstrap, topic)] if "ingest" in chosen else []
    out = PipelineResult(stream, chosen)
    with LineageEmitter.for_lake(settings).run(f"stream-pipeline.{stream}", str(flow_run.id), inputs=inputs) as run:
        if "ingest" in chosen:
            out.ingest = ingest_stream(topic=topic, stream=stream, settings=settings, partitions=partitions)
        if "preprocess" in chosen:
            if tables.exists("raw"):
                out.preprocess = preprocess_stream(stream=stream, lake=settings)
            else:
                out.skipped["preprocess"] = "no raw table yet"
        if "drift" in chosen:
            if tables.exists("features"):
                out.drift = drift_stream(stream=stream, lake=settings)
            else:
                out.skipped["drift"] = "no features table yet"
        run.complete(outputs=table_outputs(tables, ("raw", "features", "drift"), existing_only=True))
    return out
