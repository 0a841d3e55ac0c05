"""What SafeCache stores and answers: an entry's record, the namespaces that keep tenants apart, the
results of a store and of a lookup, and the keys an entry is filed under (its LSH bucket and the exact
digest of its unit embedding)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from mmlake.cache.lsh import HyperplaneLSH
from mmlake.cache.tiers import Tensors

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

    def touch(self, now: float, similarity: float) -> None:
        """One more access at ``now``, which reused the entry at ``similarity``."""
        self.accesses = (self.accesses + [now])[-K:]
        self.reuse_similarity = similarity


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


def lsh_key(lsh: HyperplaneLSH, primary: int) -> str:
    """An entry's LSH key as clients see it: its table-0 bucket in hex, zero-padded to the LSH's bits."""
    return f"{primary:0{(lsh.bits + 3) // 4}x}"


def exact_hash(unit: np.ndarray) -> str:
    """The exact key of a unit embedding: the SHA-256 of its float32 bytes (the full digest, never cut)."""
    return hashlib.sha256(unit.tobytes()).hexdigest()
