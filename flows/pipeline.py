"""The scheduled pipeline of one stream: ingest, then preprocess, then drift, as subflow runs of one
parent run (so "after it" holds by construction: each stage starts when the one before finished)."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.deployments import parse_pipeline_stages as parse_stages


@flow(name="stream-pipeline", flow_run_name="pipeline {stream}", log_prints=False)
def stream_pipeline(topic: str, stream: str, lake: str | None = None, bootstrap: str | None = None,
                    partitions: list[int] | None = None, stages: str = "ingest,preprocess,drift") -> dict[str, Any]:
    """What the topic holds now into ``<lake>/<stream>``, its new features, and the drift windows they
    complete. Every stage is incremental and exactly-once, so a run that finds nothing new writes nothing."""
    from prefect.runtime import flow_run

    from flows.drift import drift_stream
    from flows.ingest import ingest_stream
    from flows.preprocess import preprocess_stream
    from ingest.settings import IngestSettings
    from ingest.tables import StreamTables
    from lineage import LineageEmitter
    from lineage.datasets import delta_output, kafka_input

    chosen = parse_stages(stages)
    settings = IngestSettings().with_overrides(lake=lake, kafka_bootstrap=bootstrap)
    tables = StreamTables(settings.lake, stream, dict(settings.storage_options))
    emitter = LineageEmitter(settings.lake)
    job, run_id = f"stream-pipeline.{stream}", str(flow_run.id)
    inputs = [kafka_input(settings.kafka_bootstrap, topic)] if "ingest" in chosen else []
    emitter.emit("START", job, run_id, inputs=inputs)
    out: dict[str, Any] = {"stream": stream, "stages": chosen}
    try:
        if "ingest" in chosen:
            out["ingest"] = ingest_stream(topic=topic, stream=stream, lake=lake, bootstrap=bootstrap,
                                          partitions=partitions)
        if "preprocess" in chosen:
            out["preprocess"] = (preprocess_stream(stream=stream, lake=lake) if tables.open("raw") is not None
                                 else {"status": "no raw table yet"})
        if "drift" in chosen:
            out["drift"] = (drift_stream(stream=stream, lake=lake) if tables.open("features") is not None
                            else {"status": "no features table yet"})
    except BaseException as err:
        emitter.emit("FAIL", job, run_id, inputs=inputs, error=err)
        raise
    outputs = [delta_output(tables.uri(t), dt) for t in ("raw", "features", "drift")
               if (dt := tables.open(t)) is not None]
    emitter.emit("COMPLETE", job, run_id, inputs=inputs, outputs=outputs)
    return out
