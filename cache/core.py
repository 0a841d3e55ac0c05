"""SafeCache in-process: store KV tensors under an embedding, reuse them for near-identical prompts only.

Namespaces are tenant x model_id; nothing crosses them. A lookup hits only when the exact cosine of
the query with a stored entry's embedding is at least the threshold (the server floor, or a stricter
one the caller asks for); expired entries are never returned.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmlake.cache.errors import BadRequestError, PayloadTooLargeError
from mmlake.cache.index import VectorIndex
from mmlake.cache.lsh import HyperplaneLSH, normalise
from mmlake.cache.settings import CacheSettings
from mmlake.cache.tiers import Tensors, Tier, tensors_nbytes, tiers_from_settings

K = 2  # LRU-K


@dataclass
class Entry:
    id: str
    tenant: str
    model_id: str
    slot: int
    exact: str
    lsh_key: str
    nbytes: int
    expires_at: float
    tier: str
    accesses: list[float] = field(default_factory=list)  # most recent last, at most K
    reuse_similarity: float = 1.0
    source: str | None = None  # the stream the prompt came from, for invalidation on drift


@dataclass(frozen=True)
class PutResult:
    id: str | None
    lsh_key: str
    admitted: bool
    refreshed: bool = False
    reason: str | None = None


@dataclass(frozen=True)
class Hit:
    id: str
    similarity: float
    tensors: Tensors


@dataclass(frozen=True)
class Miss:
    best_similarity: float | None
    reason: str


@dataclass
class _BucketStats:
    pairs: int = 0
    confusable: int = 0


class SafeCache:
    """The cache. Thread-safe; every public method takes the tenant explicitly."""

    def __init__(
        self,
        settings: CacheSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        tiers: list[Tier] | None = None,
    ) -> None:
        self.settings = settings or CacheSettings()
        s = self.settings
        self.clock = clock
        self.tiers = tiers if tiers is not None else tiers_from_settings(s.gpu_bytes, s.cpu_bytes, s.disk_bytes,
                                                                                s.disk_dir)
        self._tier_by_name = {t.name: t for t in self.tiers}
        self._lock = threading.RLock()
        self._entries: dict[str, Entry] = {}
        self._indexes: dict[tuple[str, str], VectorIndex] = {}
        self._lsh: dict[int, HyperplaneLSH] = {}
        self._exact: dict[tuple[str, str], dict[str, str]] = {}
        self._bucket_stats: dict[tuple[str, str, int], _BucketStats] = {}
        self._counters: dict[str, dict[str, int]] = {}

    COUNTERS = ("hits", "misses", "rejected_below_threshold", "evictions", "expirations", "stores",
                "refreshes", "rejected_admission")

    def _count(self, tenant: str, name: str) -> None:
        per = self._counters.setdefault(tenant, dict.fromkeys(self.COUNTERS, 0))
        per[name] += 1

    def counters(self, tenant: str | None = None) -> dict[str, int]:
        """Counters of one tenant, or summed over all tenants."""
        with self._lock:
            rows = [self._counters.get(tenant, {})] if tenant is not None else list(self._counters.values())
            return {name: sum(r.get(name, 0) for r in rows) for name in self.COUNTERS}

    # -- helpers --------------------------------------------------------------------------------

    def lsh_for(self, dim: int) -> HyperplaneLSH:
        if dim not in self._lsh:
            s = self.settings
            self._lsh[dim] = HyperplaneLSH(dim, bits=s.lsh_bits, tables=s.lsh_tables, seed=s.lsh_seed)
        return self._lsh[dim]

    def _unit(self, embedding: Any, namespace: tuple[str, str] | None) -> np.ndarray:
        try:
            v = np.asarray(embedding, dtype=np.float32)
        except (TypeError, ValueError):
            raise BadRequestError("embedding must be a list of numbers") from None
        if v.ndim != 1 or v.size == 0:
            raise BadRequestError(f"embedding must be 1-D and non-empty, got shape {tuple(v.shape)}")
        if v.size > self.settings.max_embedding_dim:
            raise BadRequestError(f"embedding dimension {v.size} exceeds {self.settings.max_embedding_dim}")
        index = self._indexes.get(namespace) if namespace else None
        if index is not None and index.dim != v.size:
            raise BadRequestError(f"embedding dimension {v.size} does not match this model's {index.dim}")
        try:
            return normalise(v)
        except ValueError as err:
            raise BadRequestError(str(err)) from None

    @staticmethod
    def _exact_hash(unit: np.ndarray) -> str:
        return hashlib.sha256(unit.tobytes()).hexdigest()

    def _touch(self, entry: Entry, similarity: float) -> None:
        entry.accesses = (entry.accesses + [self.clock()])[-K:]
        entry.reuse_similarity = similarity

    def _eviction_key(self, entry: Entry) -> tuple[float, float]:
        """LRU-K (K=2): the entry whose K-th most recent access is oldest goes first (never re-used
        entries before any re-used one), each time pulled back by (1 - last reuse similarity) x weight."""
        penalty = (1.0 - entry.reuse_similarity) * self.settings.similarity_weight_s
        kth = entry.accesses[-K] if len(entry.accesses) >= K else float("-inf")
        return (kth - penalty, entry.accesses[-1] - penalty)

    def _drop(self, entry: Entry) -> None:
        self._entries.pop(entry.id, None)
        self._tier_by_name[entry.tier].remove(entry.id)
        namespace = (entry.tenant, entry.model_id)
        index = self._indexes[namespace]
        if index.remove(entry.slot):
            for eid, slot in index.slot_of().items():
                self._entries[eid].slot = slot
        exact = self._exact.get(namespace, {})
        if exact.get(entry.exact) == entry.id:
            del exact[entry.exact]

    def _expire(self, entry: Entry, now: float) -> bool:
        if entry.expires_at <= now:
            self._drop(entry)
            self._count(entry.tenant, "expirations")
            return True
        return False

    def sweep(self) -> int:
        """Drop every expired entry; returns how many."""
        with self._lock:
            now = self.clock()
            return sum(self._expire(e, now) for e in list(self._entries.values()))

    def _rebalance(self, protect: str | None = None) -> None:
        """Keep every tier within its budget: demote victims to the next tier, evict from the last.
        The entry just stored (``protect``) is the last candidate, not the first as plain LRU-K
        would make it (it has a single access)."""
        for position, tier in enumerate(self.tiers):
            lower = self.tiers[position + 1] if position + 1 < len(self.tiers) else None
            while tier.nbytes > tier.budget:
                here = [e for e in self._entries.values() if e.tier == tier.name and e.id != protect]
                if not here and protect in self._entries and self._entries[protect].tier == tier.name:
                    here = [self._entries[protect]]
                if not here:
                    break
                victim = min(here, key=self._eviction_key)
                if lower is not None and victim.nbytes <= lower.budget:
                    lower.put(victim.id, tier.get(victim.id))
                    tier.remove(victim.id)
                    victim.tier = lower.name
                else:
                    self._drop(victim)
                    self._count(victim.tenant, "evictions")

    # -- the operations -------------------------------------------------------------------------

    def put(
        self,
        tenant: str,
        model_id: str,
        embedding: Any,
        tensors: Tensors,
        *,
        ttl_s: float | None = None,
        source: str | None = None,
    ) -> PutResult:
        """Store ``tensors`` under ``embedding``. A near-duplicate of a live entry refreshes it; a bucket
        whose confusable-pair rate passed the bound refuses (``admitted=False``). Bad input raises
        :class:`BadRequestError` / :class:`PayloadTooLargeError` and changes nothing."""
        s = self.settings
        if not model_id:
            raise BadRequestError("model_id is required")
        if not tensors:
            raise BadRequestError("no KV tensors to store")
        if ttl_s is not None and not (0 < ttl_s <= s.max_ttl_s):
            raise BadRequestError(f"ttl_s must be in (0, {s.max_ttl_s:g}]")
        nbytes = tensors_nbytes(tensors)
        if nbytes > s.max_entry_bytes:
            raise PayloadTooLargeError(f"KV payload of {nbytes} bytes exceeds the entry limit {s.max_entry_bytes}")
        if nbytes > sum(t.budget for t in self.tiers):
            raise PayloadTooLargeError(f"KV payload of {nbytes} bytes exceeds the cache's total budget")
        namespace = (tenant, model_id)
        with self._lock:
            unit = self._unit(embedding, namespace)
            now = self.clock()
            index = self._indexes.get(namespace)
            if index is None:
                index = self._indexes[namespace] = VectorIndex(self.lsh_for(unit.size), s.lsh_probes)
            lsh = index.lsh
            primary, members = index.primary_bucket(unit)
            lsh_key = f"{primary:0{(lsh.bits + 3) // 4}x}"
            expires_at = now + (ttl_s if ttl_s is not None else s.ttl_s)

            # Near-duplicate: refresh the existing entry in place of a new one.
            slots = index.candidates(unit)
            sims = index.similarities(unit, slots)
            for slot, sim in sorted(zip(slots, sims), key=lambda x: -x[1]):
                if sim < s.refresh_similarity:
                    break
                entry = self._entries[index.entry(slot)]  # type: ignore[index]
                if self._expire(entry, now):
                    continue
                self._tier_by_name[entry.tier].remove(entry.id)
                self.tiers[0].put(entry.id, tensors)
                entry.tier, entry.nbytes, entry.expires_at = self.tiers[0].name, nbytes, expires_at
                entry.source = source if source is not None else entry.source
                self._touch(entry, float(sim))
                self._count(tenant, "refreshes")
                self._rebalance(protect=entry.id)
                return PutResult(entry.id, entry.lsh_key, admitted=True, refreshed=True)

            # A bucket where distinct entries are confusable (similar enough to answer for each other)
            # too often is not safe to add to.
            stats = self._bucket_stats.setdefault((tenant, model_id, primary), _BucketStats())
            if stats.pairs >= s.collision_min_pairs and stats.confusable / stats.pairs > s.collision_bound:
                self._count(tenant, "rejected_admission")
                return PutResult(None, lsh_key, admitted=False,
                                 reason=f"bucket {lsh_key} collision rate {stats.confusable / stats.pairs:.3f} "
                                        f"exceeds {s.collision_bound}")
            bucket_sims = index.similarities(unit, members[:64])
            stats.pairs += len(bucket_sims)
            stats.confusable += int(np.sum(bucket_sims >= s.min_similarity))

            entry_id = uuid.uuid4().hex
            exact = self._exact_hash(unit)
            slot = index.add(entry_id, unit)
            self.tiers[0].put(entry_id, tensors)
            entry = Entry(entry_id, tenant, model_id, slot, exact, lsh_key, nbytes, expires_at, self.tiers[0].name,
                          source=source)
            self._touch(entry, 1.0)
            self._entries[entry_id] = entry
            self._exact.setdefault(namespace, {})[exact] = entry_id
            self._count(tenant, "stores")
            self._rebalance(protect=entry_id)
            admitted = entry_id in self._entries
            return PutResult(entry_id if admitted else None, lsh_key, admitted=admitted,
                             reason=None if admitted else "evicted at once: budget too small")

    def lookup(
        self, tenant: str, model_id: str, embedding: Any, *, min_similarity: float | None = None
    ) -> Hit | Miss:
        """The stored KV of the most similar live entry at cosine >= the threshold, else a Miss
        carrying the best similarity seen among the LSH candidates."""
        floor = self.settings.min_similarity
        threshold = floor if min_similarity is None else float(min_similarity)
        if not np.isfinite(threshold) or threshold < floor or threshold > 1.0:
            raise BadRequestError(f"min_similarity must be in [{floor}, 1] (the server floor is {floor})")
        namespace = (tenant, model_id)
        with self._lock:
            index = self._indexes.get(namespace)
            unit = self._unit(embedding, namespace)
            if index is None or len(index) == 0:
                self._count(tenant, "misses")
                return Miss(None, "no entries for this model")
            now = self.clock()
            exact_id = self._exact.get(namespace, {}).get(self._exact_hash(unit))
            slots = index.candidates(unit)
            if exact_id is not None and exact_id in self._entries:
                slots = sorted(set(slots) | {self._entries[exact_id].slot})
            sims = index.similarities(unit, slots)
            best: float | None = None
            for slot, sim in sorted(zip(slots, sims), key=lambda x: -x[1]):
                entry = self._entries.get(index.entry(slot) or "")
                if entry is None or self._expire(entry, now):
                    continue
                best = float(sim) if best is None else best
                if sim >= threshold:
                    self._touch(entry, float(sim))
                    self._count(tenant, "hits")
                    return Hit(entry.id, float(sim), self._tier_by_name[entry.tier].get(entry.id))
                break
            self._count(tenant, "misses")
            if best is not None:
                self._count(tenant, "rejected_below_threshold")
                return Miss(best, f"best similarity {best:.4f} is below {threshold}")
            return Miss(None, "no candidate in the query's LSH buckets")

    def delete(self, tenant: str, entry_id: str) -> bool:
        """Remove an entry of ``tenant``; False if there is none (another tenant's id counts as none)."""
        with self._lock:
            entry = self._entries.get(entry_id)
            if entry is None or entry.tenant != tenant:
                return False
            self._drop(entry)
            return True

    def stats(self, tenant: str | None = None) -> dict[str, Any]:
        """Counters and sizes. With ``tenant``, entries and bytes are that tenant's only."""
        with self._lock:
            entries = [e for e in self._entries.values() if tenant is None or e.tenant == tenant]
            return {
                "entries": len(entries),
                "bytes": {t.name: sum(e.nbytes for e in entries if e.tier == t.name) for t in self.tiers},
                "budgets": {t.name: t.budget for t in self.tiers},
                **self.counters(tenant),
                "lsh": {str(dim): lsh.version for dim, lsh in self._lsh.items()},
            }

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def embedding_of(self, entry: Entry) -> np.ndarray:
        return self._indexes[(entry.tenant, entry.model_id)].vector(entry.slot).copy()

    def tensors_of(self, entry: Entry) -> Tensors:
        return self._tier_by_name[entry.tier].get(entry.id)

    def invalidate_source(self, tenant: str | None, source: str) -> int:
        """Drop the entries stored from ``source`` (of one tenant, or of all with ``None``)."""
        return self.invalidate(lambda e: e.source == source and (tenant is None or e.tenant == tenant))

    def invalidate(self, predicate: Callable[[Entry], bool]) -> int:
        """Drop every entry the predicate selects (e.g. all of a stream whose drift alarm is up)."""
        with self._lock:
            doomed = [e for e in self._entries.values() if predicate(e)]
            for e in doomed:
                self._drop(e)
            return len(doomed)

    def restore_entry(
        self,
        entry_id: str,
        tenant: str,
        model_id: str,
        unit: np.ndarray,
        tensors: Tensors,
        *,
        expires_at: float,
        accesses: list[float],
        reuse_similarity: float,
        source: str | None = None,
    ) -> bool:
        """Put back an entry from a snapshot with its id, expiry and access history; skips expired ones."""
        namespace = (tenant, model_id)
        with self._lock:
            if expires_at <= self.clock() or entry_id in self._entries:
                return False
            index = self._indexes.get(namespace)
            if index is None:
                index = self._indexes[namespace] = VectorIndex(self.lsh_for(unit.size), self.settings.lsh_probes)
            primary = index.lsh.keys(unit)[0]
            exact = self._exact_hash(unit)
            slot = index.add(entry_id, unit)
            self.tiers[0].put(entry_id, tensors)
            entry = Entry(entry_id, tenant, model_id, slot, exact, f"{primary:0{(index.lsh.bits + 3) // 4}x}",
                          tensors_nbytes(tensors), expires_at, self.tiers[0].name, list(accesses)[-K:],
                          reuse_similarity, source)
            self._entries[entry_id] = entry
            self._exact.setdefault(namespace, {})[exact] = entry_id
            self._rebalance()
            return entry_id in self._entries
