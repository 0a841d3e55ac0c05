"""SafeCache in-process: store KV tensors under an embedding, reuse them for near-identical prompts only.

Namespaces are tenant x model_id x salt; nothing crosses them. A lookup hits only when the exact cosine
of the query with a stored entry's embedding is at least the threshold (the server floor, or a stricter
one the caller asks for); expired entries are never returned. The LSH buckets only propose candidates:
they never decide a hit.

The cache is the namespaces' indexes and the entries; its collaborators hold the rest: where tensors
lie and who loses entries when a tier is full (:mod:`mmlake.cache.eviction`: fair shares between
tenants), which buckets are safe to add to (:mod:`mmlake.cache.admission`), and the counters
(:mod:`mmlake.cache.counters`). A namespace's index is freed when its last entry goes, and a tenant
holds at most ``max_models_per_tenant`` namespaces, so index memory is bounded too.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mmlake.cache.admission import COMPARED_MEMBERS, Admission
from mmlake.cache.counters import COUNTERS, Counters
from mmlake.cache.entries import Entry, Hit, K, Miss, Namespace, PutResult, exact_hash, lsh_key
from mmlake.cache.errors import BadRequestError, PayloadTooLargeError, QuotaExceededError
from mmlake.cache.eviction import FairShares, Placement
from mmlake.cache.index import VectorIndex
from mmlake.cache.lsh import HyperplaneLSH
from mmlake.cache.settings import CacheSettings
from mmlake.cache.tiers import Tensors, Tier, tensors_nbytes, tiers_from_settings

__all__ = ["Entry", "Hit", "Miss", "Namespace", "PutResult", "SafeCache"]


class SafeCache:
    """The cache. Thread-safe; every public method takes the tenant explicitly.

    ``shares`` (tenant -> fraction of every tier) sets tenants' shares; a tenant not named shares what
    is left equally with the other unnamed tenants it knows of (``tenants``, and those holding entries).
    """

    COUNTERS = COUNTERS

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
        self.tiers = (
            tiers if tiers is not None else tiers_from_settings(s.gpu_bytes, s.cpu_bytes, s.disk_bytes, s.disk_dir)
        )
        self._lock = threading.RLock()
        self._entries: dict[str, Entry] = {}
        self._indexes: dict[Namespace, VectorIndex] = {}
        self._lsh: dict[int, HyperplaneLSH] = {}
        self._lsh_users: dict[int, int] = {}  # dim -> namespaces using that LSH (freed at 0)
        self._exact: dict[Namespace, dict[str, str]] = {}
        self._models: dict[str, set[Namespace]] = {}  # tenant -> its namespaces
        self._shares = FairShares()
        self._shares.known |= set(tenants or ())
        self._placement = Placement(
            self.tiers, self._shares, fair=s.fair_shares, similarity_weight_s=s.similarity_weight_s
        )
        self._admission = Admission(s.collision_bound, s.collision_min_pairs, s.min_similarity)
        self._counters = Counters()
        self.set_shares(shares or {})

    # -- shares -----------------------------------------------------------------------------------

    def set_shares(self, shares: Mapping[str, float], tenants: list[str] | None = None) -> None:
        """Set tenants' shares (fractions of every tier, summing to at most 1) and the tenants known."""
        with self._lock:
            self._shares.set(shares, tenants or ())

    def share_of(self, tenant: str) -> float:
        """The fraction of each tier that ``tenant`` may hold without being first to lose entries."""
        with self._lock:
            return self._shares.of(tenant)

    def counters(self, tenant: str | None = None) -> dict[str, int]:
        """Counters of one tenant, or summed over all tenants."""
        with self._lock:
            return self._counters.totals(tenant)

    # -- namespaces -------------------------------------------------------------------------------

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
            raise QuotaExceededError(
                f"tenant {tenant!r} already holds entries of {limit} models (and salts); "
                "delete some, or let them expire (MMLAKE_CACHE_MAX_MODELS_PER_TENANT)"
            )
        index = self._indexes[namespace] = VectorIndex(self.lsh_for(dim), self.settings.lsh_probes)
        self._lsh_users[dim] = self._lsh_users.get(dim, 0) + 1
        models.add(namespace)
        return index

    def _free_namespace(self, namespace: Namespace) -> None:
        """Forget an empty namespace: its index, exact keys, bucket statistics, and its LSH if unused."""
        index = self._indexes.pop(namespace, None)
        self._exact.pop(namespace, None)
        self._admission.forget(namespace)
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

    def _drop(self, entry: Entry) -> None:
        self._entries.pop(entry.id, None)
        self._placement.unplace(entry)
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

    def _evict(self, entry: Entry) -> None:
        self._drop(entry)
        self._counters.count(entry.tenant, "evictions")

    def _rebalance(self, protect: str | None = None) -> None:
        self._placement.rebalance(self._entries, self._evict, protect)

    def _expire(self, entry: Entry, now: float) -> bool:
        if entry.expires_at <= now:
            self._drop(entry)
            self._counters.count(entry.tenant, "expirations")
            return True
        return False

    def sweep(self) -> int:
        """Drop every expired entry; returns how many."""
        with self._lock:
            now = self.clock()
            return sum(self._expire(e, now) for e in list(self._entries.values()))

    def _refresh(
        self,
        namespace: Namespace,
        index: VectorIndex,
        unit: np.ndarray,
        tensors: Tensors,
        nbytes: int,
        now: float,
        expires_at: float,
        source: str | None,
    ) -> Entry | None:
        """A live entry of the namespace near-identical to ``unit`` (at ``refresh_similarity``), given the
        new tensors, expiry and source in place of a new entry; None when there is none (expired ones met
        on the way are dropped, which may free the namespace's index)."""
        slots = index.candidates(unit)
        sims = index.similarities(unit, slots)
        for slot, sim in sorted(zip(slots, sims), key=lambda x: -x[1]):
            if sim < self.settings.refresh_similarity:
                return None
            entry = self._entries[index.entry(slot)]  # type: ignore[index]
            if self._expire(entry, now):
                if namespace not in self._indexes:  # that was its last entry: the index is gone
                    return None
                continue
            self._placement.unplace(entry)
            entry.nbytes, entry.expires_at = nbytes, expires_at
            self._placement.place(entry, tensors)
            entry.source = source if source is not None else entry.source
            entry.touch(now, float(sim))
            self._counters.count(entry.tenant, "refreshes")
            self._rebalance(protect=entry.id)
            return entry
        return None

    def _add(
        self,
        entry_id: str,
        namespace: Namespace,
        index: VectorIndex,
        unit: np.ndarray,
        tensors: Tensors,
        *,
        expires_at: float,
        accesses: list[float],
        reuse_similarity: float,
        source: str | None,
        primary: int | None = None,
    ) -> Entry:
        """File a new entry: its vector in the namespace's index, its keys (LSH and exact), its tensors in
        the fastest tier. The one place an :class:`Entry` is made (a store and a restore alike).
        ``primary``: the vector's table-0 bucket, where the caller has it already."""
        tenant, model_id, salt = namespace
        exact = exact_hash(unit)
        slot = index.add(entry_id, unit)
        key = lsh_key(index.lsh, index.lsh.keys(unit)[0] if primary is None else primary)
        entry = Entry(
            entry_id,
            tenant,
            model_id,
            slot,
            exact,
            key,
            tensors_nbytes(tensors),
            expires_at,
            self.tiers[0].name,
            accesses[-K:],
            reuse_similarity,
            source,
            salt,
        )
        self._placement.place(entry, tensors)
        self._entries[entry_id] = entry
        self._exact.setdefault(namespace, {})[exact] = entry_id
        self._shares.known.add(tenant)
        return entry

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
        if nbytes > self._placement.budget():
            raise PayloadTooLargeError(f"KV payload of {nbytes} bytes exceeds the cache's total budget")
        namespace = (tenant, model_id, salt or "")
        with self._lock:
            unit = self._unit(embedding, namespace)
            now = self.clock()
            index = self._namespace_index(namespace, unit.size)
            primary, members = index.primary_bucket(unit)
            key = lsh_key(index.lsh, primary)
            expires_at = now + (ttl_s if ttl_s is not None else s.ttl_s)

            refreshed = self._refresh(namespace, index, unit, tensors, nbytes, now, expires_at, source)
            if refreshed is not None:
                return PutResult(refreshed.id, refreshed.lsh_key, admitted=True, refreshed=True)
            index = self._namespace_index(namespace, unit.size)  # again: expiries there may have freed it
            primary, members = index.primary_bucket(unit)

            # A bucket where distinct entries are confusable (similar enough to answer for each other)
            # too often is not safe to add to.
            refusal = self._admission.refusal(namespace, primary, key)
            if refusal is not None:
                self._counters.count(tenant, "rejected_admission")
                if len(index) == 0:
                    self._free_namespace(namespace)
                return PutResult(None, key, admitted=False, reason=refusal)
            self._admission.record(namespace, primary, index.similarities(unit, members[:COMPARED_MEMBERS]))

            entry = self._add(
                uuid.uuid4().hex,
                namespace,
                index,
                unit,
                tensors,
                expires_at=expires_at,
                accesses=[now],
                reuse_similarity=1.0,
                source=source,
                primary=primary,
            )
            self._counters.count(tenant, "stores")
            self._rebalance(protect=entry.id)
            admitted = entry.id in self._entries
            return PutResult(
                entry.id if admitted else None,
                key,
                admitted=admitted,
                reason=None if admitted else "evicted at once: budget too small",
            )

    def lookup(
        self,
        tenant: str,
        model_id: str,
        embedding: Any,
        *,
        min_similarity: float | None = None,
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
                self._counters.count(tenant, "misses")
                return Miss(None, "no entries for this model")
            now = self.clock()
            exact_id = self._exact.get(namespace, {}).get(exact_hash(unit))
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
                    entry.touch(now, float(sim))
                    self._counters.count(tenant, "hits")
                    return Hit(entry.id, float(sim), self._placement.tensors(entry))
                break
            self._counters.count(tenant, "misses")
            if best is not None:
                self._counters.count(tenant, "rejected_below_threshold")
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
                "lsh": {
                    str(dim): self._lsh[dim].version
                    for dim in sorted({self._indexes[ns].dim for ns in namespaces})
                    if dim in self._lsh
                },
            }
            if tenant is not None:
                share = self.share_of(tenant)
                out["share"] = {t.name: int(share * t.budget) for t in self.tiers}
            return out

    def tenant_stats(self) -> dict[str, dict[str, Any]]:
        """Per tenant: entries, bytes per tier, share, models (for operators, never for tenants)."""
        with self._lock:
            tenants = self._shares.known | self._counters.tenants()
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
        with self._lock:
            return self._placement.tensors(entry)

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
                raise BadRequestError(
                    f"entry {entry_id}: dimension {unit.size} does not match its model's {existing.dim}"
                )
            index = self._namespace_index(namespace, unit.size)
            self._add(
                entry_id,
                namespace,
                index,
                unit,
                tensors,
                expires_at=expires_at,
                accesses=list(accesses),
                reuse_similarity=reuse_similarity,
                source=source,
            )
            self._rebalance()
            return entry_id in self._entries
