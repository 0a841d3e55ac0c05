"""Scheduled deployments of the flows (``mmlake serve``; ``flows/prefect.yaml`` for ``prefect deploy``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from mmlake.errors import MmlakeError


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
    from mmlake.flows.ingest import ingest_stream

    return _scheduled(
        ingest_stream,
        f"ingest-{stream}",
        interval_s,
        {"topic": topic, "stream": stream, "settings": _given(lake=lake, kafka_bootstrap=bootstrap)},
        "ingest",
        f"Kafka topic {topic} -> Delta stream {stream}, every {interval_s}s (available-now runs).",
    )


def _given(**fields: Any) -> dict[str, Any]:
    """A settings parameter as a deployment stores it: the fields given, nothing else (the worker's
    environment gives the rest, and the storage credentials, which are never a parameter)."""
    return {name: value for name, value in fields.items() if value is not None}


def _scheduled(flow: Any, name: str, interval_s: int, parameters: dict[str, Any], tag: str, description: str) -> Any:
    """``flow`` as a deployment every ``interval_s`` seconds, one run at a time (``concurrency_limit=1``,
    ENQUEUE: a later run waits, a slow run is never doubled). The entrypoint is the flow's module path
    in the installed package (``mmlake.flows.ingest.ingest_stream``), so a worker needs the package
    installed, not the repository checked out."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.deployments.runner import EntrypointType

    return flow.to_deployment(
        name=name,
        interval=timedelta(seconds=interval_s),
        parameters=parameters,
        concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE),
        tags=["mmlake", tag],
        entrypoint_type=EntrypointType.MODULE_PATH,
        description=description,
    )


def pipeline_deployment(
    topic: str,
    stream: str,
    *,
    lake: str | None = None,
    bootstrap: str | None = None,
    partitions: list[int] | None = None,
    stages: str = "ingest,preprocess,drift",
    interval_s: int = 60,
) -> Any:
    """The stream's pipeline (ingest, then preprocess, then drift) every ``interval_s`` seconds, one run
    at a time (a slow run is never doubled: the next one waits)."""
    from mmlake.flows.pipeline import stream_pipeline

    suffix = "" if partitions is None else "-p" + "-".join(str(p) for p in sorted(partitions))
    return _scheduled(
        stream_pipeline,
        f"pipeline-{stream}{suffix}",
        interval_s,
        {
            "topic": topic,
            "stream": stream,
            "settings": _given(lake=lake, kafka_bootstrap=bootstrap),
            "partitions": partitions,
            "stages": stages,
        },
        "pipeline",
        f"Kafka topic {topic} -> {stream}: {stages}, every {interval_s}s.",
    )


def cache_warmup_deployment(
    stream: str,
    *,
    lake: str | None = None,
    interval_s: int = 300,
    cache_url: str | None = None,
    token: str | None = None,
) -> Any:
    """The cache warm-up of ``stream`` every ``interval_s`` seconds, one run at a time."""
    from mmlake.flows.cache import cache_warmup

    return _scheduled(
        cache_warmup,
        f"cache-warmup-{stream}",
        interval_s,
        {"stream": stream, "lake": _given(lake=lake), "cache_url": cache_url, "token": token},
        "cache",
        f"LSH keys for {stream}'s new features; drop its cache entries on a drift alarm; every {interval_s}s.",
    )


def serve_pipeline(
    topic: str,
    stream: str,
    *,
    lake: str | None = None,
    bootstrap: str | None = None,
    partitions: list[int] | None = None,
    stages: str = "ingest,preprocess,drift",
    interval_s: int = 60,
    cache_interval_s: int = 300,
    cache_url: str | None = None,
    token: str | None = None,
) -> None:
    """Serve every flow of the stream in this process until interrupted: the pipeline (ingest, then
    preprocess, then drift) every ``interval_s`` and the cache warm-up every ``cache_interval_s``
    (0: not served). Needs a Prefect server with its scheduler, as :func:`serve_ingest`."""
    with local_prefect_server():  # before the deployments are built: building one may talk to the API
        from prefect import serve

        deployments = [
            pipeline_deployment(
                topic,
                stream,
                lake=lake,
                bootstrap=bootstrap,
                partitions=partitions,
                stages=stages,
                interval_s=interval_s,
            )
        ]
        if cache_interval_s:
            deployments.append(
                cache_warmup_deployment(
                    stream, lake=lake, interval_s=cache_interval_s, cache_url=cache_url, token=token
                )
            )
        serve(*deployments)


def serve_ingest(topic: str, stream: str, **kwargs: Any) -> None:
    """Serve the ingest deployment in this process until interrupted.

    Schedules need a Prefect server with its scheduler service (the per-process ephemeral API has none).
    With ``PREFECT_API_URL`` set, that server is used; without it, a local ``prefect server start`` is
    run for as long as this process serves, and stopped with it.
    """
    with local_prefect_server():
        from prefect import serve

        serve(ingest_deployment(topic, stream, **kwargs))


@contextlib.contextmanager
def local_prefect_server(timeout_s: float = 120.0) -> Iterator[str | None]:
    """Yield the API URL in use: the configured one, or that of a local server started here."""
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    from mmlake.ingest.broker import free_port

    port = free_port()
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
    # The scheduler's default loop is a minute; a short one makes the first scheduled run prompt.
    env.setdefault("PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS", "5")
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if server.poll() is not None:
                raise MmlakeError(f"the local Prefect server exited with code {server.returncode}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise MmlakeError(f"the local Prefect server did not answer within {timeout_s:g}s")
            time.sleep(0.5)
        os.environ["PREFECT_API_URL"] = url
        print(f"started a local Prefect server at {url} (set PREFECT_API_URL to use your own)", flush=True)
        yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
