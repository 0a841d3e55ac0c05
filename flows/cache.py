"""The cache warm-up flow: LSH keys for a stream's recent features, and invalidation on drift."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger


@flow(name="cache-warmup")
def cache_warmup(stream: str, lake: str | None = None, cache_url: str | None = None,
                 token: str | None = None) -> dict[str, Any]:
    """Key the stream's new feature rows; when the drift table raised an alarm since the last run,
    drop the cache entries stored from this stream (on the server at ``cache_url``, with ``token``)."""
    from prefect.runtime import flow_run

    from cache.settings import CacheSettings
    from cache.warmup import new_drift_alarm, precompute_keys
    from ingest.settings import IngestSettings
    from ingest.tables import StreamTables
    from lineage import LineageEmitter
    from lineage.datasets import delta_input, delta_output

    logger = get_run_logger()
    ingest_settings = IngestSettings().with_overrides(lake=lake)
    options = dict(ingest_settings.storage_options)
    tables = StreamTables(ingest_settings.lake, stream, options)
    emitter = LineageEmitter(ingest_settings.lake)
    job, run_id = f"cache-warmup.{stream}", str(flow_run.id)

    def inputs() -> list[Any]:
        return [delta_input(tables.uri(t), tables.open(t)) for t in ("features", "drift") if tables.open(t)]

    emitter.emit("START", job, run_id, inputs=inputs())
    try:
        keyed, versions = precompute_keys(ingest_settings.lake, stream, CacheSettings(), storage_options=options)
    except BaseException as err:
        emitter.emit("FAIL", job, run_id, inputs=inputs(), error=err)
        raise
    if not versions:
        logger.info("stream %s has no features table yet: nothing to key", stream)
    alarm = new_drift_alarm(ingest_settings.lake, stream, storage_options=options)
    invalidated = 0
    if alarm and cache_url and token:
        from cache.client import SafeCacheClient

        with SafeCacheClient(cache_url, token) as client:
            invalidated = client.invalidate_source(stream)
        logger.warning("drift alarm on %s: invalidated %d cache entries", stream, invalidated)
    elif alarm:
        logger.warning("drift alarm on %s, but no cache_url/token to invalidate entries on", stream)
    keys = tables.open("cache_keys")
    emitter.emit("COMPLETE", job, run_id, inputs=inputs(),
                 outputs=[delta_output(tables.uri("cache_keys"), keys, keyed)] if keys is not None else [])
    return {"keyed": keyed, "lsh_versions": versions, "drift_alarm": alarm, "invalidated": invalidated}
