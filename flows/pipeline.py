"""The scheduled pipeline of one stream: ingest, then preprocess, then drift, as subflow runs of one
parent run (so "after it" holds by construction: each stage starts when the one before finished)."""

from __future__ import annotations

from typing import Any

from prefect import flow

from mmlake.flows.stages import parse_pipeline_stages


@flow(name="stream-pipeline", flow_run_name="pipeline {stream}", log_prints=False)
def stream_pipeline(topic: str, stream: str, lake: str | None = None, bootstrap: str | None = None,
                    partitions: list[int] | None = None, stages: str = "ingest,preprocess,drift") -> dict[str, Any]:
    """What the topic holds now into ``<lake>/<stream>``, its new features, and the drift windows they
    complete. Every stage is incremental and exactly-once, so a run that finds nothing new writes nothing."""
    from prefect.runtime import flow_run

    from mmlake.flows.drift import drift_stream
    from mmlake.flows.ingest import ingest_stream
    from mmlake.flows.preprocess import preprocess_stream
    from mmlake.ingest.settings import IngestSettings
    from mmlake.lineage import LineageEmitter
    from mmlake.lineage.datasets import kafka_input, table_outputs

    chosen = parse_pipeline_stages(stages)
    settings = IngestSettings().with_overrides(lake=lake, kafka_bootstrap=bootstrap)
    tables = settings.tables(stream)
    inputs = [kafka_input(settings.kafka_bootstrap, topic)] if "ingest" in chosen else []
    out: dict[str, Any] = {"stream": stream, "stages": chosen}
    with LineageEmitter.for_lake(settings).run(f"stream-pipeline.{stream}", str(flow_run.id), inputs=inputs) as run:
        if "ingest" in chosen:
            out["ingest"] = ingest_stream(topic=topic, stream=stream, lake=lake, bootstrap=bootstrap,
                                          partitions=partitions)
        if "preprocess" in chosen:
            out["preprocess"] = (preprocess_stream(stream=stream, lake=lake) if tables.exists("raw")
                                 else {"status": "no raw table yet"})
        if "drift" in chosen:
            out["drift"] = (drift_stream(stream=stream, lake=lake) if tables.exists("features")
                            else {"status": "no features table yet"})
        run.complete(outputs=table_outputs(tables, ("raw", "features", "drift"), existing_only=True))
    return out
