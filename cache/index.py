"""The vectors of one namespace (tenant x model): LSH buckets for candidates, FAISS for inner products.

FAISS GPU indexes cannot remove ids, so ids are managed here: a vector lives in a slot; deleting
tombstones the slot, and the index is rebuilt from the live slots once tombstones pass half of them.
Candidate similarities are computed exactly with ``faiss.pairwise_distances`` (inner product of unit
vectors = cosine); the whole-index scan (``flat_search``) uses a flat IP index, on the GPU when FAISS
sees one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmlake.cache.lsh import HyperplaneLSH


def _flat_index(dim: int) -> Any:
    import faiss

    if faiss.get_num_gpus() > 0:
        resources = faiss.StandardGpuResources()
        index = faiss.GpuIndexFlatIP(resources, dim)
        index.referenced_resources = resources  # type: ignore[attr-defined]  # keep them alive with the index
        return index
    return faiss.IndexFlatIP(dim)


class VectorIndex:
    """Slots of unit vectors with LSH buckets; not thread-safe (SafeCache holds the lock)."""

    def __init__(self, lsh: HyperplaneLSH, probes: int) -> None:
        self.lsh = lsh
        self.dim = lsh.dim
        self.probes = probes
        self._vectors = np.zeros((1, self.dim), dtype=np.float32)  # grows by doubling
        self._ids: list[str | None] = []
        self._keys: list[list[int]] = []
        self._buckets: list[dict[int, set[int]]] = [{} for _ in range(lsh.tables)]
        self._flat = _flat_index(self.dim)
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def capacity_bytes(self) -> int:
        """Bytes this index holds for its vectors (the slot array and FAISS's copy), an estimate."""
        return int(self._vectors.nbytes + len(self._ids) * self.dim * 4 + len(self._ids) * 200)

    def add(self, entry_id: str, unit: np.ndarray, keys: list[int] | None = None) -> int:
        slot = len(self._ids)
        if slot == len(self._vectors):
            grown = np.zeros((2 * len(self._vectors), self.dim), dtype=np.float32)
            grown[:slot] = self._vectors[:slot]
            self._vectors = grown
        self._vectors[slot] = unit
        keys = keys if keys is not None else self.lsh.keys(unit)
        self._ids.append(entry_id)
        self._keys.append(keys)
        for table, key in enumerate(keys):
            self._buckets[table].setdefault(key, set()).add(slot)
        self._flat.add(unit.reshape(1, -1))
        self._live += 1
        return slot

    def add_batch(self, entry_ids: list[str], units: np.ndarray) -> list[int]:
        """Add many unit vectors at once (restores and bulk loads); returns their slots."""
        start = len(self._ids)
        need = start + len(units)
        if need > len(self._vectors):
            grown = np.zeros((max(need, 2 * len(self._vectors)), self.dim), dtype=np.float32)
            grown[:start] = self._vectors[:start]
            self._vectors = grown
        self._vectors[start:need] = units
        keys = self.lsh.keys_batch(units).tolist()
        for offset, (entry_id, row) in enumerate(zip(entry_ids, keys)):
            slot = start + offset
            self._ids.append(entry_id)
            self._keys.append(row)
            for table, key in enumerate(row):
                self._buckets[table].setdefault(key, set()).add(slot)
        self._flat.add(np.ascontiguousarray(units, dtype=np.float32))
        self._live += len(units)
        return list(range(start, need))

    def replace(self, slot: int, unit: np.ndarray) -> int:
        """Move a slot's vector (a refreshed entry): tombstone it, add the vector again, return the new slot."""
        entry_id = self._ids[slot]
        assert entry_id is not None
        self.remove(slot)
        return self.add(entry_id, unit)

    def remove(self, slot: int) -> bool:
        """Tombstone a slot; returns True when that triggered a rebuild (slot numbers changed)."""
        if self._ids[slot] is None:
            return False
        for table, key in enumerate(self._keys[slot]):
            members = self._buckets[table].get(key)
            if members is not None:
                members.discard(slot)
                if not members:
                    del self._buckets[table][key]
        self._ids[slot] = None
        self._live -= 1
        dead = len(self._ids) - self._live
        if dead > 1024 and dead > self._live:
            self._rebuild()
            return True
        return False

    def _rebuild(self) -> None:
        live = [s for s, i in enumerate(self._ids) if i is not None]
        vectors = self._vectors[live].copy()
        ids = [self._ids[s] for s in live]
        keys = [self._keys[s] for s in live]
        self.__init__(self.lsh, self.probes)  # type: ignore[misc]
        for entry_id, vec, k in zip(ids, vectors, keys):
            assert entry_id is not None
            self.add(entry_id, vec, k)

    def slot_of(self) -> dict[str, int]:
        return {i: s for s, i in enumerate(self._ids) if i is not None}

    def entry(self, slot: int) -> str | None:
        return self._ids[slot]

    def vector(self, slot: int) -> np.ndarray:
        return self._vectors[slot]

    def primary_bucket(self, unit: np.ndarray) -> tuple[int, list[int]]:
        """The table-0 key of a vector and the live slots in that bucket."""
        key = self.lsh.keys(unit)[0]
        return key, sorted(self._buckets[0].get(key, ()))

    def candidates(self, unit: np.ndarray) -> list[int]:
        """Live slots sharing a probed bucket with ``unit`` in any table."""
        found: set[int] = set()
        for table, keys in enumerate(self.lsh.probe_keys(unit, self.probes)):
            buckets = self._buckets[table]
            for key in keys:
                members = buckets.get(key)
                if members:
                    found.update(members)
        return sorted(found)

    def similarities(self, unit: np.ndarray, slots: list[int]) -> np.ndarray:
        """Exact cosine of ``unit`` with the vectors in ``slots`` (FAISS inner product)."""
        import faiss

        if not slots:
            return np.zeros(0, dtype=np.float32)
        return faiss.pairwise_distances(unit.reshape(1, -1), self._vectors[slots], faiss.METRIC_INNER_PRODUCT)[0]

    def flat_search(self, unit: np.ndarray, k: int = 8) -> list[tuple[int, float]]:
        """The ``k`` best live slots by a scan of every stored vector (the baseline LSH is measured against)."""
        scores, slots = self._flat.search(unit.reshape(1, -1), k + (len(self._ids) - self._live))
        return [(int(s), float(d)) for s, d in zip(slots[0], scores[0]) if s >= 0 and self._ids[s] is not None][:k]
