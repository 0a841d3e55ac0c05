"""Where entries' tensors lie, and who loses entries when a tier is full.

Eviction is fair between tenants: each tenant has a share of every tier (equal among the known tenants
unless set); when a tier is over its budget, the victim comes from a tenant over its share whenever there
is one, so a tenant within its share never loses entries to one over it, while a share a tenant does not
use is free for the others. Among the candidates, LRU-K (K=2) pulled back by each entry's last reuse
similarity picks the victim, which moves to the next tier or, from the last, is evicted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from mmlake.cache.entries import Entry, K
from mmlake.cache.errors import BadRequestError
from mmlake.cache.tiers import Tensors, Tier


class FairShares:
    """Tenants' shares of every tier: set ones, and an equal split of the rest among the other tenants
    known (named up front, or holding entries)."""

    def __init__(self) -> None:
        self.shares: dict[str, float] = {}
        self.known: set[str] = set()

    def set(self, shares: Mapping[str, float], tenants: Iterable[str] = ()) -> None:
        """Set tenants' shares (fractions of every tier, summing to at most 1) and the tenants known."""
        bad = {t: v for t, v in shares.items() if not (0 < float(v) <= 1)}
        if bad or sum(shares.values()) > 1 + 1e-9:
            raise BadRequestError(f"tenant shares must each be in (0, 1] and sum to at most 1, got {dict(shares)}")
        self.shares = {t: float(v) for t, v in shares.items()}
        self.known |= set(shares) | set(tenants)

    def of(self, tenant: str) -> float:
        """The fraction of each tier that ``tenant`` may hold without being first to lose entries."""
        if tenant in self.shares:
            return self.shares[tenant]
        unnamed = (self.known | {tenant}) - set(self.shares)  # every tenant that stored is known
        return max(0.0, 1.0 - sum(self.shares.values())) / len(unnamed)


class Placement:
    """The tiers (fastest first), the bytes each tenant holds in each, and the rebalancing that keeps
    every tier within its budget. Not thread-safe: the cache calls it under its lock."""

    def __init__(self, tiers: list[Tier], shares: FairShares, *, fair: bool, similarity_weight_s: float) -> None:
        self.tiers = tiers
        self.by_name = {t.name: t for t in tiers}
        self.shares = shares
        self.fair = fair
        self.similarity_weight_s = similarity_weight_s
        self.usage: dict[tuple[str, str], int] = {}  # (tier, tenant) -> bytes

    def budget(self) -> int:
        """The bytes all tiers hold together."""
        return sum(t.budget for t in self.tiers)

    def place(self, entry: Entry, tensors: Tensors, tier: Tier | None = None) -> None:
        """Put ``entry``'s tensors into ``tier`` (default: the fastest)."""
        tier = tier or self.tiers[0]
        tier.put(entry.id, tensors)
        entry.tier = tier.name
        key = (tier.name, entry.tenant)
        self.usage[key] = self.usage.get(key, 0) + entry.nbytes

    def unplace(self, entry: Entry) -> None:
        """Take ``entry``'s tensors out of their tier."""
        self.by_name[entry.tier].remove(entry.id)
        key = (entry.tier, entry.tenant)
        left = self.usage.get(key, 0) - entry.nbytes
        if left > 0:
            self.usage[key] = left
        else:
            self.usage.pop(key, None)

    def tensors(self, entry: Entry) -> Tensors:
        return self.by_name[entry.tier].get(entry.id)

    def eviction_key(self, entry: Entry) -> tuple[float, float]:
        """LRU-K (K=2): the entry whose K-th most recent access is oldest goes first (never re-used
        entries before any re-used one), each time pulled back by (1 - last reuse similarity) x weight."""
        penalty = (1.0 - entry.reuse_similarity) * self.similarity_weight_s
        kth = entry.accesses[-K] if len(entry.accesses) >= K else float("-inf")
        return (kth - penalty, entry.accesses[-1] - penalty)

    def over_share(self, tier: Tier) -> set[str]:
        """The tenants holding more of ``tier`` than their share of its budget."""
        return {
            tenant
            for (name, tenant), used in self.usage.items()
            if name == tier.name and used > self.shares.of(tenant) * tier.budget
        }

    def rebalance(
        self, entries: Mapping[str, Entry], evict: Callable[[Entry], None], protect: str | None = None
    ) -> None:
        """Keep every tier within its budget: demote victims to the next tier, ``evict`` them from the
        last. Victims come from tenants over their share of the tier when there are any (fair shares), and
        the entry just stored (``protect``) is the last candidate, not the first as plain LRU-K would make
        it (it has a single access)."""
        for position, tier in enumerate(self.tiers):
            lower = self.tiers[position + 1] if position + 1 < len(self.tiers) else None
            while tier.nbytes > tier.budget:
                here = [e for e in entries.values() if e.tier == tier.name and e.id != protect]
                if self.fair:
                    over = self.over_share(tier)
                    over_here = [e for e in here if e.tenant in over]
                    if over_here:
                        here = over_here
                kept = entries.get(protect) if protect is not None else None
                if not here and kept is not None and kept.tier == tier.name:
                    here = [kept]
                if not here:
                    break
                victim = min(here, key=self.eviction_key)
                if lower is not None and victim.nbytes <= lower.budget:
                    tensors = tier.get(victim.id)
                    self.unplace(victim)
                    self.place(victim, tensors, lower)
                else:
                    evict(victim)
