"""The cache warm-up flow: LSH keys for a stream's recent features, and invalidation on drift."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import flow, get_run_logger

from mmlake.settings import LakeSettings


@dataclass(frozen=True)
class WarmupResult:
    """What a warm-up did: feature rows keyed (and the LSH versions used), whether a new drift alarm was
    seen, and how many cache entries it invalidated."""

    keyed: int
    lsh_versions: list[str]
    drift_alarm: bool
    invalidated: int


@flow(name="cache-warmup")
def cache_warmup(
    stream: str, lake: LakeSettings | None = None, cache_url: str | None = None, token: str | None = None
) -> WarmupResult:
    """Key the stream's new feature rows; when the drift table raised an alarm since the last run,
    drop the cache entries stored from this stream (on the server at ``cache_url``, with ``token``)."""
    from prefect.runtime import flow_run

    from mmlake.cache.settings import CacheSettings
    from mmlake.cache.warmup import new_drift_alarm, precompute_keys
    from mmlake.lineage import LineageEmitter
    from mmlake.lineage.datasets import table_inputs, table_outputs

    logger = get_run_logger()
    settings = lake or LakeSettings()
    options = dict(settings.storage_options)
    tables = settings.tables(stream)
    with LineageEmitter.for_lake(settings).run(
        f"cache-warmup.{stream}",
        str(flow_run.id),
        inputs=lambda: table_inputs(tables, ("features", "drift"), existing_only=True),
    ) as run:
        keyed, versions = precompute_keys(settings.lake, stream, CacheSettings(), storage_options=options)
        if not versions:
            logger.info("stream %s has no features table yet: nothing to key", stream)
        alarm = new_drift_alarm(settings.lake, stream, storage_options=options)
        invalidated = 0
        if alarm and cache_url and token:
            from mmlake.cache.client import SafeCacheClient

            with SafeCacheClient(cache_url, token) as client:
                invalidated = client.invalidate_source(stream)
            logger.warning("drift alarm on %s: invalidated %d cache entries", stream, invalidated)
        elif alarm:
            logger.warning("drift alarm on %s, but no cache_url/token to invalidate entries on", stream)
        run.complete(outputs=table_outputs(tables, ["cache_keys"], {"cache_keys": keyed}, existing_only=True))
    return WarmupResult(keyed, versions, alarm, invalidated)
