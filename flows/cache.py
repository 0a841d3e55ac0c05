"""The cache warm-up flow: LSH keys for a stream's recent features, and invalidation on drift."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger


@flow(name="cache-warmup")
def cache_warmup(stream: str, lake: str | None = None, cache_url: str | None = None,
                 token: str | None = None) -> dict[str, Any]:
    """Key the stream's new feature rows; when the drift table raised an alarm since the last run,
    drop the cache entries stored from this stream (on the server at ``cache_url``, with ``token``)."""
    from cache.settings import CacheSettings
    from cache.warmup import new_drift_alarm, precompute_keys
    from ingest.settings import IngestSettings

    logger = get_run_logger()
    ingest_settings = IngestSettings().with_overrides(lake=lake)
    options = dict(ingest_settings.storage_options)
    keyed, versions = precompute_keys(ingest_settings.lake, stream, CacheSettings(), storage_options=options)
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
    return {"keyed": keyed, "lsh_versions": versions, "drift_alarm": alarm, "invalidated": invalidated}
