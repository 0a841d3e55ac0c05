"""Scheduled deployments of the flows (``mmlake serve``; ``flows/prefect.yaml`` for ``prefect deploy``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def ingest_deployment(
    topic: str,
    stream: str,
    *,
    lake: str | None = None,
    bootstrap: str | None = None,
    interval_s: int = 60,
) -> Any:
    """The ingest flow as a deployment that runs every ``interval_s`` seconds.

    One run at a time per deployment (``concurrency_limit=1``, later runs wait): a slow micro-batch
    run is never doubled. Overlap would still be safe (Delta's txn check), only wasted work.
    """
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    from flows.ingest import ingest_stream

    return ingest_stream.to_deployment(
        name=f"ingest-{stream}",
        interval=timedelta(seconds=interval_s),
        parameters={"topic": topic, "stream": stream, "lake": lake, "bootstrap": bootstrap},
        concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE),
        tags=["mmlake", "ingest"],
        description=f"Kafka topic {topic} -> Delta stream {stream}, every {interval_s}s (available-now runs).",
    )


def serve_ingest(topic: str, stream: str, **kwargs: Any) -> None:
    """Serve the ingest deployment in this process until interrupted."""
    from prefect import serve

    serve(ingest_deployment(topic, stream, **kwargs))
