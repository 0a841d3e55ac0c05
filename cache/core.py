"""SafeCache in-process: store KV tensors under an embedding, reuse them for near-identical prompts only.

Namespaces are tenant x model_id x salt; nothing crosses them. A lookup hits only when the exact cosine
of the query with a stored entry's embedding is at least the threshold (the server floor, or a stricter
one the caller asks for); expired entries are never returned. The LSH buckets only propose candidates:
they never decide a hit.

Eviction is fair between tenants: each tenant has a share of every tier (equal among the known
tenants unless set); when a tier is over its budget, the victim comes from a tenant over its share
whenever there is one, so a tenant within its share never loses entries to one over it, while a share a
tenant does not use is free for the others. A namespace's index is freed when its last entry goes, and
a tenant holds at most ``max_models_per_tenant`` namespaces, so index memory is bounded too.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmlake.cache.errors import BadRequestError, PayloadTooLargeError, QuotaExceededError
from mmlake.cache.index import VectorIndex
from mmlake.cache.lsh import HyperplaneLSH
from mmlake.cache.settings import CacheSettings
from mmlake.cache.tiers import Tensors, Tier, tensors_nbytes, tiers_from_settings

K = 2  # LRU-K
#: (tenant, model_id, salt): nothing of one namespace is visible from another.
Namespace = tuple[str, str, str]


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
    salt: str = ""  # partitions a tenant's entries further (as vLLM's cache_salt)

    @property
    def namespace(self) -> Namespace:
        return (self.tenant, self.model_id, self.salt)


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
    """The cache. Thread-safe; every public method takes the tenant explicitly.

    ``shares`` (tenant -> fraction of every tier) sets tenants' shares; a tenant not named shares what
    is left equally with the other unnamed tenants it knows of (``tenants``, and those holding entries).
    """

    def __init__(
        self,
        settings: CacheSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        tiers: list[Tier] | None = None,
        shares: Mapping[str, float] | None = None,
        tenants: list[str] | None = None,
    ) -> None:
        self.settings = settings or CacheSettings()
        s = self.settings
        self.clock = clock
        self.tiers = tiers if tiers is not None else tiers_from_settings(s.gpu_bytes, s.cpu_bytes, s.disk_bytes,
                                                                         s.disk_dir)
        self._tier_by_name = {t.name: t for t in self.tiers}
        self._lock = threading.RLock()
        self._entries: dict[str, Entry] = {}
        self._indexes: dict[Namespace, VectorIndex] = {}
        self._lsh: dict[int, HyperplaneLSH] = {}
        self._lsh_users: dict[int, int] = {}  # dim -> namespaces using that LSH (freed at 0)
        self._exact: dict[Namespace, dict[str, str]] = {}
        self._bucket_stats: dict[Namespace, dict[int, _BucketStats]] = {}
        self._models: dict[str, set[Namespace]] = {}  # tenant -> its namespaces
        self._usage: dict[tuple[str, str], int] = {}  # (tier, tenant) -> bytes
        self._counters: dict[str, dict[str, int]] = {}
        self._shares: dict[str, float] = {}
        self._known: set[str] = set(tenants or ())
        self.set_shares(shares or {})

    COUNTERS = ("hits", "misses", "rejected_below_threshold", "evictions", "expirations", "stores",
                "refreshes", "rejected_admission")

    # -- shares -----------------------------------------------------------------------------------

    def set_shares(self, shares: Mapping[str, float], tenants: list[str] | None = None) -> None:
        """Set tenants' shares (fractions of every tier, summing to at most 1) and the tenants known."""
        bad = {t: v for t, v in shares.items() if not (0 < float(v) <= 1)}
        if bad or sum(shares.values()) > 1 + 1e-9:
            raise BadRequestError(f"tenant shares must each be in (0, 1] and sum to at most 1, got {dict(shares)}")
        with self._lock:
            self._shares = {t: float(v) for t, v in shares.items()}
            self._known |= set(shares) | set(tenants or ())

    def share_of(self, tenant: str) -> float:
        """The fraction of each tier that ``tenant`` may hold without being first to lose entries."""
        with self._lock:
            if tenant in self._shares:
                return self._shares[tenant]
            unnamed = (self._known | {tenant}) - set(self._shares)  # every tenant that stored is known
            return max(0.0, 1.0 - sum(self._shares.values())) / len(unnamed)

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
        """The LSH of embeddings of dimension ``dim`` (one per dimension, shared by its namespaces)."""
        lsh = self._lsh.get(dim)
        if lsh is None:
            s = self.settings
            lsh = HyperplaneLSH(dim, bits=s.lsh_bits, tables=s.lsh_tables, seed=s.lsh_seed)
            self._lsh[dim] = lsh
        return lsh

    def _namespace_index(self, namespace: Namespace, dim: int) -> VectorIndex:
        """The namespace's index, created (within the tenant's bound on models) if it has none."""
        index = self._indexes.get(namespace)
        if index is not None:
            return index
        tenant = namespace[0]
        models = self._models.setdefault(tenant, set())
        limit = self.settings.max_models_per_tenant
        if len(models) >= limit:
            raise QuotaExceededError(f"tenant {tenant!r} already holds entries of {limit} models (and salts); "
                                     "delete some, or let them expire (MMLAKE_CACHE_MAX_MODELS_PER_TENANT)")
        index = self._indexes[namespace] = VectorIndex(self.lsh_for(dim), self.settings.lsh_probes)
        self._lsh_users[dim] = self._lsh_users.get(dim, 0) + 1
        models.add(namespace)
        return index

    def _free_namespace(self, namespace: Namespace) -> None:
        """Forget an empty namespace: its index, exact keys, bucket statistics, and its LSH if unused."""
        index = self._indexes.pop(namespace, None)
        self._exact.pop(namespace, None)
        self._bucket_stats.pop(namespace, None)
        models = self._models.get(namespace[0])
        if models is not None:
            models.discard(namespace)
            if not models:
                del self._models[namespace[0]]
        if index is not None:
            users = self._lsh_users.get(index.dim, 1) - 1
            if users <= 0:
                self._lsh_users.pop(index.dim, None)
                self._lsh.pop(index.dim, None)
            else:
                self._lsh_users[index.dim] = users

    def _unit(self, embedding: Any, namespace: Namespace | None) -> np.ndarray:
        """The float32 unit vector of ``embedding``, normalised in float64 (so that a finite vector whose
        float32 norm would under- or overflow is still one); BadRequestError for anything else."""
        try:
            v = np.asarray(embedding, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise BadRequestError("embedding must be a list of numbers") from None
        if v.ndim != 1 or v.size == 0:
            raise BadRequestError(f"embedding must be 1-D and non-empty, got shape {tuple(v.shape)}")
        if v.size > self.settings.max_embedding_dim:
            raise BadRequestError(f"embedding dimension {v.size} exceeds {self.settings.max_embedding_dim}")
        index = self._indexes.get(namespace) if namespace else None
        if index is not None and index.dim != v.size:
            raise BadRequestError(f"embedding dimension {v.size} does not match this model's {index.dim}")
        if not np.all(np.isfinite(v)):
            raise BadRequestError("embedding has NaN or infinite values")
        scale = float(np.max(np.abs(v)))
        if scale == 0.0:
            raise BadRequestError("embedding has zero norm")
        v = v / scale  # now in [-1, 1] with a 1 in it: the norm can neither overflow nor underflow
        return (v / np.linalg.norm(v)).astype(np.float32)

    @staticmethod
    def _exact_hash(unit: np.ndarray) -> str:
        return hashlib.sha256(unit.tobytes()).hexdigest()  # the full digest: never truncated

    def _touch(self, entry: Entry, similarity: float) -> None:
        entry.accesses = (entry.accesses + [self.clock()])[-K:]
        entry.reuse_similarity = similarity

    def _eviction_key(self, entry: Entry) -> tuple[float, float]:
        """LRU-K (K=2): the entry whose K-th most recent access is oldest goes first (never re-used
        entries before any re-used one), each time pulled back by (1 - last reuse similarity) x weight."""
        penalty = (1.0 - entry.reuse_similarity) * self.settings.similarity_weight_s
        kth = entry.accesses[-K] if len(entry.accesses) >= K else float("-inf")
        return (kth - penalty, entry.accesses[-1] - penalty)

    def _place(self, entry: Entry, tier: Tier, tensors: Tensors) -> None:
        tier.put(entry.id, tensors)
        entry.tier = tier.name
        key = (tier.name, entry.tenant)
        self._usage[key] = self._usage.get(key, 0) + entry.nbytes

    def _unplace(self, entry: Entry) -> None:
        self._tier_by_name[entry.tier].remove(entry.id)
        key = (entry.tier, entry.tenant)
        left = self._usage.get(key, 0) - entry.nbytes
        if left > 0:
            self._usage[key] = left
        else:
            self._usage.pop(key, None)

    def _drop(self, entry: Entry) -> None:
        self._entries.pop(entry.id, None)
        self._unplace(entry)
        namespace = entry.namespace
        index = self._indexes[namespace]
        if index.remove(entry.slot):
            for eid, slot in index.slot_of().items():
                self._entries[eid].slot = slot
        exact = self._exact.get(namespace, {})
        if exact.get(entry.exact) == entry.id:
            del exact[entry.exact]
        if len(index) == 0:
            self._free_namespace(namespace)

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

    def _over_share(self, tier: Tier) -> set[str]:
        """The tenants holding more of ``tier`` than their share of its budget."""
        return {tenant for (name, tenant), used in self._usage.items()
                if name == tier.name and used > self.share_of(tenant) * tier.budget}

    def _rebalance(self, protect: str | None = None) -> None:
        """Keep every tier within its budget: demote victims to the next tier, evict from the last.
        Victims come from tenants over their share of the tier when there are any (fair shares), and the
        entry just stored (``protect``) is the last candidate, not the first as plain LRU-K would make it
        (it has a single access)."""
        for position, tier in enumerate(self.tiers):
            lower = self.tiers[position + 1] if position + 1 < len(self.tiers) else None
            while tier.nbytes > tier.budget:
                here = [e for e in self._entries.values() if e.tier == tier.name and e.id != protect]
                if self.settings.fair_shares:
                    over = self._over_share(tier)
                    over_here = [e for e in here if e.tenant in over]
                    if over_here:
                        here = over_here
                if not here and protect in self._entries and self._entries[protect].tier == tier.name:
                    here = [self._entries[protect]]
                if not here:
                    break
                victim = min(here, key=self._eviction_key)
                if lower is not None and victim.nbytes <= lower.budget:
                    tensors = tier.get(victim.id)
                    self._unplace(victim)
                    self._place(victim, lower, tensors)
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
        salt: str | None = None,
    ) -> PutResult:
        """Store ``tensors`` under ``embedding``. A near-duplicate of a live entry refreshes it; a bucket
        whose confusable-pair rate passed the bound refuses (``admitted=False``). Bad input raises
        :class:`BadRequestError` / :class:`PayloadTooLargeError` / :class:`QuotaExceededError` and
        changes nothing."""
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
        namespace = (tenant, model_id, salt or "")
        with self._lock:
            unit = self._unit(embedding, namespace)
            now = self.clock()
            index = self._namespace_index(namespace, unit.size)
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
                    if namespace not in self._indexes:  # that was its last entry: the index is gone
                        break
                    continue
                self._unplace(entry)
                entry.nbytes, entry.expires_at = nbytes, expires_at
                self._place(entry, self.tiers[0], tensors)
                entry.source = source if source is not None else entry.source
                self._touch(entry, float(sim))
                self._count(tenant, "refreshes")
                self._rebalance(protect=entry.id)
                return PutResult(entry.id, entry.lsh_key, admitted=True, refreshed=True)
            index = self._namespace_index(namespace, unit.size)  # again: expiries above may have freed it
            primary, members = index.primary_bucket(unit)

            # A bucket where distinct entries are confusable (similar enough to answer for each other)
            # too often is not safe to add to.
            stats = self._bucket_stats.setdefault(namespace, {}).setdefault(primary, _BucketStats())
            if stats.pairs >= s.collision_min_pairs and stats.confusable / stats.pairs > s.collision_bound:
                self._count(tenant, "rejected_admission")
                if len(index) == 0:
                    self._free_namespace(namespace)
                return PutResult(None, lsh_key, admitted=False,
                                 reason=f"bucket {lsh_key} collision rate {stats.confusable / stats.pairs:.3f} "
                                        f"exceeds {s.collision_bound}")
            bucket_sims = index.similarities(unit, members[:64])
            stats.pairs += len(bucket_sims)
            stats.confusable += int(np.sum(bucket_sims >= s.min_similarity))

            entry_id = uuid.uuid4().hex
            exact = self._exact_hash(unit)
            slot = index.add(entry_id, unit)
            entry = Entry(entry_id, tenant, model_id, slot, exact, lsh_key, nbytes, expires_at, self.tiers[0].name,
                          source=source, salt=salt or "")
            self._place(entry, self.tiers[0], tensors)
            self._touch(entry, 1.0)
            self._entries[entry_id] = entry
            self._exact.setdefault(namespace, {})[exact] = entry_id
            self._known.add(tenant)
            self._count(tenant, "stores")
            self._rebalance(protect=entry_id)
            admitted = entry_id in self._entries
            return PutResult(entry_id if admitted else None, lsh_key, admitted=admitted,
                             reason=None if admitted else "evicted at once: budget too small")

    def lookup(
        self, tenant: str, model_id: str, embedding: Any, *, min_similarity: float | None = None,
        salt: str | None = None,
    ) -> Hit | Miss:
        """The stored KV of the most similar live entry of the namespace at cosine >= the threshold,
        else a Miss carrying the best similarity seen among the LSH candidates."""
        floor = self.settings.min_similarity
        try:
            threshold = floor if min_similarity is None else float(min_similarity)
        except (TypeError, ValueError, OverflowError):
            raise BadRequestError("min_similarity must be a number") from None
        if not np.isfinite(threshold) or threshold < floor or threshold > 1.0:
            raise BadRequestError(f"min_similarity must be in [{floor}, 1] (the server floor is {floor})")
        namespace = (tenant, model_id, salt or "")
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
                    if namespace not in self._indexes:  # that was its last entry
                        break
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
        """Counters and sizes. With ``tenant``, everything is that tenant's own: its entries and bytes
        per tier, its share of each tier, its models, the LSH versions of its own namespaces."""
        with self._lock:
            entries = [e for e in self._entries.values() if tenant is None or e.tenant == tenant]
            namespaces = [ns for ns in self._indexes if tenant is None or ns[0] == tenant]
            out: dict[str, Any] = {
                "entries": len(entries),
                "bytes": {t.name: sum(e.nbytes for e in entries if e.tier == t.name) for t in self.tiers},
                "budgets": {t.name: t.budget for t in self.tiers},
                **self.counters(tenant),
                "models": len(namespaces),
                "lsh": {str(dim): self._lsh[dim].version
                        for dim in sorted({self._indexes[ns].dim for ns in namespaces}) if dim in self._lsh},
            }
            if tenant is not None:
                share = self.share_of(tenant)
                out["share"] = {t.name: int(share * t.budget) for t in self.tiers}
            return out

    def tenant_stats(self) -> dict[str, dict[str, Any]]:
        """Per tenant: entries, bytes per tier, share, models (for operators, never for tenants)."""
        with self._lock:
            tenants = self._known | set(self._counters)
            return {t: self.stats(t) for t in sorted(tenants)}

    def index_overhead(self) -> dict[str, int]:
        """What the cache holds besides the tensors: namespaces, LSH dimensions, estimated index bytes."""
        with self._lock:
            planes = sum(lsh.planes.nbytes for lsh in self._lsh.values())
            vectors = sum(index.capacity_bytes() for index in self._indexes.values())
            return {"namespaces": len(self._indexes), "lsh_dims": len(self._lsh), "bytes": planes + vectors}

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def embedding_of(self, entry: Entry) -> np.ndarray:
        return self._indexes[entry.namespace].vector(entry.slot).copy()

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
        salt: str | None = None,
    ) -> bool:
        """Put back an entry from a snapshot with its id, expiry and access history; skips expired ones."""
        namespace = (tenant, model_id, salt or "")
        unit = np.asarray(unit, dtype=np.float32).reshape(-1)
        if unit.size == 0 or unit.size > self.settings.max_embedding_dim or not np.all(np.isfinite(unit)):
            raise BadRequestError(f"entry {entry_id}: its embedding is not a usable unit vector")
        with self._lock:
            if expires_at <= self.clock() or entry_id in self._entries:
                return False
            existing = self._indexes.get(namespace)
            if existing is not None and existing.dim != unit.size:
                raise BadRequestError(f"entry {entry_id}: dimension {unit.size} does not match its model's {existing.dim}")
            index = self._namespace_index(namespace, unit.size)
            primary = index.lsh.keys(unit)[0]
            exact = self._exact_hash(unit)
            slot = index.add(entry_id, unit)
            entry = Entry(entry_id, tenant, model_id, slot, exact, f"{primary:0{(index.lsh.bits + 3) // 4}x}",
                          tensors_nbytes(tensors), expires_at, self.tiers[0].name, list(accesses)[-K:],
                          reuse_similarity, source, salt or "")
            self._place(entry, self.tiers[0], tensors)
            self._entries[entry_id] = entry
            self._exact.setdefault(namespace, {})[exact] = entry_id
            self._known.add(tenant)
            self._rebalance()
            return entry_id in self._entries
