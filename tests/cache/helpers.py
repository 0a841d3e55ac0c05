"""Embeddings with a chosen cosine to a reference, and a clock the tests move by hand."""

from __future__ import annotations

import numpy as np
import torch

from mmlake.cache.lsh import HyperplaneLSH


class Clock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def unit(rng: np.random.Generator, dim: int = 64) -> np.ndarray:
    v = rng.standard_normal(dim).astype(np.float64)
    return v / np.linalg.norm(v)


def at_cosine(ref: np.ndarray, cosine: float, rng: np.random.Generator, lsh: HyperplaneLSH | None = None) -> np.ndarray:
    """A unit vector whose cosine with unit ``ref`` is exactly ``cosine`` (in float64). With ``lsh``,
    one that also shares ``ref``'s bucket in table 0, so the test is about the threshold, not LSH recall."""
    for _ in range(10_000):
        other = rng.standard_normal(ref.size)
        other -= other.dot(ref) * ref
        other /= np.linalg.norm(other)
        q = cosine * ref + np.sqrt(1 - cosine**2) * other
        if lsh is None or lsh.keys(q.astype(np.float32))[0] == lsh.keys(ref.astype(np.float32))[0]:
            return q
    raise AssertionError("no vector at that cosine shares the bucket")


def kv(seed: int, nbytes: int = 4096) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = nbytes // 8  # two float32 tensors
    return {"k": torch.randn(n, generator=g), "v": torch.randn(n, generator=g)}
