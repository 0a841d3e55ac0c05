"""SafeCache's per-tenant event counters (hits, misses, stores, evictions, ...)."""

from __future__ import annotations

#: Every counter, in the order ``/v1/stats`` and ``/metrics`` list them.
COUNTERS = (
    "hits",
    "misses",
    "rejected_below_threshold",
    "evictions",
    "expirations",
    "stores",
    "refreshes",
    "rejected_admission",
)


class Counters:
    """Counts per tenant. Not thread-safe: the cache calls it under its lock."""

    def __init__(self) -> None:
        self._by_tenant: dict[str, dict[str, int]] = {}

    def count(self, tenant: str, name: str) -> None:
        per = self._by_tenant.setdefault(tenant, dict.fromkeys(COUNTERS, 0))
        per[name] += 1

    def tenants(self) -> set[str]:
        """The tenants anything was counted for."""
        return set(self._by_tenant)

    def totals(self, tenant: str | None = None) -> dict[str, int]:
        """The counters of one tenant, or summed over all tenants."""
        rows = [self._by_tenant.get(tenant, {})] if tenant is not None else list(self._by_tenant.values())
        return {name: sum(r.get(name, 0) for r in rows) for name in COUNTERS}
