"""SafeCache's Prometheus metrics: per-tenant counters, bytes and entries read from the cache when
scraped, the index's estimated size, and the server's lookup latency."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from mmlake.cache.core import SafeCache

#: Lookup latency histogram buckets (seconds): the target is 1 ms, so most resolution lies below it.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class CacheMetrics:
    """One registry per server: :meth:`observe_lookup` after each lookup, :meth:`text` for ``/metrics``."""

    def __init__(self, cache: SafeCache) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        self.cache = cache
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "safecache_lookup_seconds",
            "Lookup latency inside the server",
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.registry.register(self)  # a collector is anything with collect()

    def observe_lookup(self, seconds: float) -> None:
        self.latency.observe(seconds)

    def text(self) -> str:
        """The Prometheus text exposition of every series."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

    def collect(self) -> Iterator[Metric]:
        """The cache's own series, read when scraped."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from mmlake.cache.core import SafeCache

        cache = self.cache
        per_tenant = cache.tenant_stats()
        for name in SafeCache.COUNTERS:
            family = CounterMetricFamily(f"safecache_{name}", f"SafeCache {name.replace('_', ' ')}", labels=["tenant"])
            for tenant, stats in per_tenant.items():
                family.add_metric([tenant], stats[name])
            yield family
        tier_bytes = GaugeMetricFamily(
            "safecache_bytes", "Bytes of KV tensors per tier and tenant", labels=["tier", "tenant"]
        )
        entries = GaugeMetricFamily("safecache_entries", "Live entries per tenant", labels=["tenant"])
        for tenant, stats in per_tenant.items():
            for tier, value in stats["bytes"].items():
                tier_bytes.add_metric([tier, tenant], value)
            entries.add_metric([tenant], stats["entries"])
        yield tier_bytes
        yield entries
        index = GaugeMetricFamily("safecache_index_bytes", "Estimated bytes of the LSH and vector indexes")
        index.add_metric([], cache.index_overhead()["bytes"])
        yield index
