"""Random-hyperplane LSH over L2-normalised embeddings (cosine similarity), seeded and versioned."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

LSH_SCHEME = "hplsh-v1"


def normalise(vector: np.ndarray) -> np.ndarray:
    """The float32 unit vector of ``vector``; raises ValueError for NaN, infinity or zero norm."""
    v = np.asarray(vector, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(v)):
        raise ValueError("embedding has NaN or infinite values")
    norm = float(np.linalg.norm(v))
    if norm == 0.0 or not np.isfinite(norm):
        raise ValueError("embedding has zero norm")
    return v / norm


def at_cosine(vector: np.ndarray, cosine: float, rng: np.random.Generator) -> np.ndarray:
    """A float32 unit vector at exactly ``cosine`` from ``vector`` (a random direction otherwise): a
    near-duplicate query for tests, benchmarks and the demo."""
    u = normalise(vector)
    noise = rng.standard_normal(u.shape)
    noise -= (noise @ u) * u
    noise /= np.linalg.norm(noise)
    return (cosine * u + np.sqrt(1 - cosine**2) * noise).astype(np.float32)


@dataclass(frozen=True)
class HyperplaneLSH:
    """``tables`` independent sets of ``bits`` hyperplanes drawn from a seeded normal distribution.

    The key of a vector in a table is the bit pattern of the signs of its projections. Two unit vectors
    at angle θ agree on each bit with probability 1 - θ/π, so near-duplicates share buckets.
    """

    dim: int
    bits: int = 13
    tables: int = 12
    seed: int = 20260101
    planes: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, self.dim, self.bits, self.tables])
        planes = rng.standard_normal((self.tables * self.bits, self.dim)).astype(np.float32)
        object.__setattr__(self, "planes", planes)

    @property
    def version(self) -> str:
        """Everything that determines the keys; snapshots refuse to restore under another version."""
        return f"{LSH_SCHEME}:d{self.dim}:b{self.bits}:t{self.tables}:s{self.seed}"

    def _projections(self, unit: np.ndarray) -> np.ndarray:
        return (self.planes @ unit).reshape(self.tables, self.bits)

    def keys(self, unit: np.ndarray) -> list[int]:
        """One bucket key per table for a unit vector."""
        bits = self._projections(unit) > 0
        weights = 1 << np.arange(self.bits, dtype=np.uint64)
        return [int(k) for k in (bits.astype(np.uint64) * weights).sum(axis=1)]

    def keys_batch(self, units: np.ndarray) -> np.ndarray:
        """Keys of many unit vectors at once: shape (n, tables)."""
        proj = (units @ self.planes.T).reshape(len(units), self.tables, self.bits) > 0
        weights = 1 << np.arange(self.bits, dtype=np.uint64)
        return (proj.astype(np.uint64) * weights).sum(axis=2)

    def probe_keys(self, unit: np.ndarray, probes: int) -> list[list[int]]:
        """Per table: the query's key, then the keys with each of its ``probes`` least certain bits flipped
        (query-directed multi-probe: the bits whose projection is nearest zero are likeliest to differ)."""
        proj = self._projections(unit)
        out = []
        for t in range(self.tables):
            key = int(sum(1 << b for b in range(self.bits) if proj[t, b] > 0))
            keys = [key]
            if probes:
                for b in np.argsort(np.abs(proj[t]))[:probes]:
                    keys.append(key ^ (1 << int(b)))
            out.append(keys)
        return out
